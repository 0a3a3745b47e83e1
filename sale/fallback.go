package sale

import (
	"context"
	"errors"
	"math/rand/v2"

	"github.com/stockgate/stockgate/breaker"
	"time"

	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

var (
	ansBusy = fail(ErrBusy)
	// ansLedgerBusy: the ledger could not take the request within the wait
	// budget (see batcher); nothing moved.
	ansLedgerBusy = fail(refuse(ErrBusy, "the ledger is committing at its capacity; retry with the same Idempotency-Key"))
	// ansInFlightBusy: the replica has as many takes in flight as it
	// answers within the wait budget; nothing moved.
	ansInFlightBusy = fail(refuse(ErrBusy, "this replica has as many requests in flight as it can answer in time; retry with the same Idempotency-Key"))
)

// takeDirect sells or holds straight from the ledger while Redis cannot.
// The ledger's batches of takes around the gate lock the SKU row, decide
// each take against it and commit at the row's version, so this replica's
// buyers of a SKU share one transaction and never conflict with each
// other; another replica's batch of the same SKU waits for the row. At
// most FallbackConcurrency of these run at once, so a Redis outage turns
// into a bounded load on the ledger and 503s beyond it, never a pile-up. A
// sold-out answer is cached like one from Redis, so a sold-out SKU costs
// the ledger nothing. Each one bumps the SKU's bypass_seq: Redis is
// rebuilt from the ledger before it serves the SKU again.
func (s *Service) takeDirect(ctx context.Context, w want, st ledger.SKUState) answer {
	release, ok := s.fallbackSlot()
	if !ok {
		return s.counted(pathLedger, ansBusy)
	}
	defer release()
	a, err := s.commit(ctx, w, st, "", max(st.Version, 0), -1)
	switch {
	case err == nil:
		// Before this replica lets Redis serve the SKU again it reads the
		// row afresh, which shows the gate stale (see bypassed).
		s.bypassed.Store(w.sku, struct{}{})
		s.count(pathLedger, "sold")
		return a
	case errors.Is(err, ledger.ErrDuplicate):
		a.replayed = true
		return a
	case errors.Is(err, ledger.ErrKeyReused):
		return ansKeyReused
	case errors.Is(err, ledger.ErrSeatedTake):
		return s.directRefused(ctx, w, fail(ErrSeated), false)
	case errors.Is(err, stock.ErrSoldOut):
		st, rerr := s.ledger.SKU(ctx, w.sku)
		return s.directRefused(ctx, w, ansSoldOut, rerr == nil && st.Remaining() == 0)
	case errors.Is(err, stock.ErrLimit):
		return s.directRefused(ctx, w, ansLimit, false)
	case errors.Is(err, stock.ErrSaleEnded):
		return s.directRefused(ctx, w, ansSaleEnded, false)
	case errors.Is(err, ledger.ErrCodeUsedUp):
		return s.directRefused(ctx, w, ansCodeUsedUp, false)
	case errors.Is(err, ledger.ErrCodeInvalid):
		return s.directRefused(ctx, w, fail(ErrCodeInvalid), false)
	case errors.Is(err, errLedgerBusy):
		return s.counted(pathLedger, ansLedgerBusy)
	case errors.Is(err, ledger.ErrNotCommitted):
		s.log.ErrorContext(ctx, "fallback commit", "sku", w.sku.String(), "err", err)
		return s.counted(pathLedger, ansUnavailable)
	}
	// COMMIT failed: it may have landed. The request's row tells.
	s.log.ErrorContext(ctx, "fallback commit", "sku", w.sku.String(), "err", err)
	return s.counted(pathLedger, s.lookupOr(ctx, w.req, ansUnavailable))
}

// gateFresh is st, read afresh when this replica sold the SKU around the
// gate since it last looked and the breaker lets Redis serve again: the
// fresh row shows the gate stale, so Redis is rebuilt before it serves.
func (s *Service) gateFresh(ctx context.Context, sku stock.SKU, st ledger.SKUState) (ledger.SKUState, error) {
	if s.breaker.State() != breaker.Closed {
		return st, nil
	}
	if _, ok := s.bypassed.LoadAndDelete(sku); !ok {
		return st, nil
	}
	s.settings.Invalidate(sku)
	return s.settings.Get(ctx, sku)
}

// fallbackSlot takes one of the FallbackConcurrency places of the ledger
// fallback; ok is false when all are taken (answer 503 overloaded).
func (s *Service) fallbackSlot() (release func(), ok bool) {
	select {
	case s.fallback <- struct{}{}:
		return func() { <-s.fallback }, true
	default:
		return nil, false
	}
}

// fallbackPause waits before fallback attempt n (none before the first):
// a jittered pause growing with n. It is false when ctx ended first.
func (s *Service) fallbackPause(ctx context.Context, n int) bool {
	if n == 0 {
		return true
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(time.Duration(rand.Int64N(int64(s.opts.FallbackBackoff) << n))):
		return true
	}
}

// directRefused answers a request the ledger cannot supply: the replay of
// what this request committed before, if anything, the refusal otherwise.
// empty remembers the SKU as sold out (only when nothing at all is left).
func (s *Service) directRefused(ctx context.Context, w want, refusal answer, empty bool) answer {
	if empty {
		s.markSoldOut(w.sku)
	}
	return s.counted(pathLedger, s.lookupOr(ctx, w.req, refusal))
}

// markSoldOut remembers the SKU as sold out on this replica, and makes the
// next unknown key read the ledger's committed requests again.
func (s *Service) markSoldOut(sku stock.SKU) {
	s.cache.MarkSoldOut(sku)
	s.replays.unseal(sku)
}

// Purchase paths, for the metric.
const (
	pathGate   = "gate"
	pathLedger = "ledger"
)

func (s *Service) count(path, result string) { s.metrics.purchases.WithLabelValues(path, result).Inc() }

// counted counts an error answer under its kind's code and returns it.
func (s *Service) counted(path string, a answer) answer {
	s.count(path, Code(a.err))
	return a
}

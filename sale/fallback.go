package sale

import (
	"context"
	"time"

	"github.com/stockgate/stockgate/cache"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

var (
	// ansBusy: the replica's takes around the gate are at their bound.
	// This attempt moved nothing, but a copy of the request may hold its
	// units at the gate on another replica, or be committing around it:
	// nothing here can see it, so the outcome is unknown (helper-74 #2).
	ansBusy = fail(refuse(ErrBusyShared, "this replica's sales around the gate are at their bound, and another attempt of this request may still commit it; retry with the same Idempotency-Key"))
	// ansLedgerBusy: the ledger could not take the request within the wait
	// budget (see batcher); nothing moved.
	ansLedgerBusy = fail(refuse(ErrBusy, "the ledger is committing at its capacity; retry with the same Idempotency-Key"))
	// ansLedgerBusyShared: as ansLedgerBusy, when another attempt of the
	// request (a copy on another replica) may still commit it: a take's
	// that holds its deduction, or any copy of a hold's or order's action,
	// which nothing here can see. The outcome is unknown.
	ansLedgerBusyShared = fail(refuse(ErrBusyShared, "the ledger is committing at its capacity, and another attempt of this request may still commit it; retry with the same Idempotency-Key"))
	// ansInFlightBusy: the replica has as many takes in flight as it
	// answers within the wait budget. Shed before the gate, this attempt
	// moved nothing; the request's outcome is unknown as ansBusy's is: a
	// client that gave up on a slow attempt elsewhere sends its retry
	// here, and it said "unchanged" while that attempt committed.
	ansInFlightBusy = fail(refuse(ErrBusyShared, "this replica has as many requests in flight as it can answer in time, and another attempt of this request may still commit it; retry with the same Idempotency-Key"))
)

// gateFresh is st, read afresh when this replica sold the SKU around the
// gate since it last looked and a rebuild of its gate may be tried: the
// fresh row shows the gate stale, so Redis is rebuilt before it serves.
// While a rebuild is not due (one failed within a breaker period: the
// SKU's master is out) the cached row, stale already, is good enough.
func (s *Service) gateFresh(ctx context.Context, sku stock.SKU, st ledger.SKUState) (ledger.SKUState, error) {
	if !s.rebuildDue(sku) {
		return st, nil
	}
	if _, ok := s.bypassed.LoadAndDelete(sku); !ok {
		return st, nil
	}
	s.settings.Invalidate(sku)
	return s.settings.Get(ctx, sku)
}

// fallbackWait is how long a take waits for a place in the ledger
// fallback when all are taken. A master's death sends every take that
// waited out its Redis timeout there at once: a burst the places drain
// in a fraction of a second, which refused outright cost 0.2-1 % of a
// sale's buyers a 503 (e2e/nodefaults TestFaultKillOneMasterCostsItsSlots).
// A fallback slower than its demand still answers 503 after the wait.
const fallbackWait = 250 * time.Millisecond

// fallbackSlot takes one of the FallbackConcurrency places of the ledger
// fallback, waiting up to fallbackWait (and no longer than ctx) for one;
// ok is false when none came free (answer 503 overloaded).
func (s *Service) fallbackSlot(ctx context.Context) (release func(), ok bool) {
	select {
	case s.fallback <- struct{}{}:
		return func() { <-s.fallback }, true
	default:
	}
	t := time.NewTimer(fallbackWait)
	defer t.Stop()
	select {
	case s.fallback <- struct{}{}:
		return func() { <-s.fallback }, true
	case <-t.C:
	case <-ctx.Done():
	}
	return nil, false
}

// markSoldOut remembers the SKU as sold out on this replica, as a read
// begun at since found it (cache.Cache.MarkSoldOut), and makes the next
// unknown key read the ledger's committed requests again.
func (s *Service) markSoldOut(sku stock.SKU, since cache.Since) {
	s.cache.MarkSoldOut(sku, since)
	s.replays.unseal(sku, false)
}

// clearSoldOut drops sku's sold-out flag: stock is back, and its next
// sell-out is a new one for the committed keys' in-flight window too.
func (s *Service) clearSoldOut(sku stock.SKU) {
	s.cache.ClearSoldOut(sku)
	s.replays.unseal(sku, true)
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

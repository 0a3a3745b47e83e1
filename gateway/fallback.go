package gateway

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

var ansBusy = answer{status: http.StatusServiceUnavailable, kind: "overloaded",
	detail: "Redis is unavailable and the ledger is at its fallback capacity; retry with the same Idempotency-Key", retryAfter: 1}

// buyDirect sells straight from the ledger while Redis cannot: read the SKU
// row, commit with an update conditional on its version, and on a conflict
// read again after a jittered, growing pause, a bounded number of times.
// At most FallbackConcurrency of these run at once, so a Redis outage turns
// into a bounded load on the ledger and 503s beyond it, never a pile-up. A
// sold-out answer is cached like one from Redis, so a sold-out SKU costs
// the ledger nothing. Each sale bumps the SKU's bypass_seq: Redis is
// rebuilt from the ledger before it serves the SKU again.
func (s *Server) buyDirect(ctx context.Context, o ledger.Order) answer {
	select {
	case s.fallback <- struct{}{}:
		defer func() { <-s.fallback }()
	default:
		return s.counted(pathLedger, ansBusy)
	}
	for attempt := range s.opts.FallbackAttempts {
		if attempt > 0 {
			pause := time.Duration(rand.Int64N(int64(s.opts.FallbackBackoff) << attempt))
			select {
			case <-ctx.Done():
				return ansUnavailable
			case <-time.After(pause):
			}
		}
		st, err := s.ledger.SKU(ctx, o.SKU)
		if err != nil {
			s.log.Error("fallback read sku", "sku", o.SKU.String(), "err", err)
			return s.counted(pathLedger, ansUnavailable)
		}
		if st.Remaining() < o.Quantity {
			return s.directSoldOut(ctx, o)
		}
		done, err := s.ledger.PurchaseDirect(ctx, o, st.Version)
		switch {
		case err == nil:
			// This replica's cached settings must show the gate stale now, so
			// it rebuilds Redis before using it for this SKU again.
			s.settings.Invalidate(o.SKU)
			s.count(pathLedger, "sold")
			return answer{status: http.StatusCreated, order: done}
		case errors.Is(err, ledger.ErrDuplicate):
			return replay(done, o.RequestHash)
		case errors.Is(err, ledger.ErrConflict):
			continue
		case errors.Is(err, stock.ErrSoldOut):
			return s.directSoldOut(ctx, o)
		case errors.Is(err, ledger.ErrNotCommitted):
			s.log.Error("fallback purchase", "sku", o.SKU.String(), "err", err)
			return s.counted(pathLedger, ansUnavailable)
		}
		// COMMIT failed: it may have landed. The key's order row tells.
		s.log.Error("fallback purchase commit", "sku", o.SKU.String(), "err", err)
		if prev, lerr := s.ledger.OrderByKey(ctx, o.IdempotencyKey); lerr == nil {
			return replay(prev, o.RequestHash)
		}
		return s.counted(pathLedger, ansUnavailable)
	}
	return s.counted(pathLedger, ansBusy)
}

// directSoldOut answers a purchase the ledger cannot supply: the replay of
// its order if this key already bought, sold out otherwise.
func (s *Server) directSoldOut(ctx context.Context, o ledger.Order) answer {
	if prev, err := s.ledger.OrderByKey(ctx, o.IdempotencyKey); err == nil {
		return replay(prev, o.RequestHash)
	}
	s.cache.MarkSoldOut(o.SKU)
	return s.counted(pathLedger, ansSoldOut)
}

// Purchase paths, for the metric.
const (
	pathGate   = "gate"
	pathLedger = "ledger"
)

func (s *Server) count(path, result string) { s.metrics.purchases.WithLabelValues(path, result).Inc() }

// counted counts an error answer under its problem type and returns it.
func (s *Server) counted(path string, a answer) answer {
	s.count(path, a.kind)
	return a
}

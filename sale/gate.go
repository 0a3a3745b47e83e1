package sale

import (
	"context"
	"errors"
	"time"

	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
	"github.com/stockgate/stockgate/tracing"
)

// isOutcome reports the gate errors that are answers from a working Redis
// (anything that is not Redis failing); the breaker counts them as
// successes. Classifying failures rather than listing answers means a new
// kind of answer cannot trip the breaker.
func isOutcome(err error) bool { return !shard.Failed(err) }

// notRun reports that a gate call certainly moved nothing: the breaker
// refused it, or it failed before any script ran. Such a purchase may go to
// the ledger at once.
func notRun(err error) bool {
	return errors.Is(err, breaker.ErrOpen) || shard.NotRun(err) ||
		errors.Is(err, stock.ErrNotSeeded) || errors.Is(err, stock.ErrFenced)
}

// redis runs one gate call with its own deadline. Each of its commands
// goes through its node's breaker (Options.Breakers), which refuses a
// failing master's at once with breaker.ErrOpen.
//
// With tracing on, the call is a span named op (a constant at each call
// site, so naming it costs nothing when tracing is off).
func (s *Service) redis(ctx context.Context, op string, f func(ctx context.Context) error) (err error) {
	ctx, span := tracing.StartClient(ctx, op)
	defer func() { tracing.End(span, err) }()
	ctx, cancel := context.WithTimeout(ctx, s.opts.RedisTimeout)
	defer cancel()
	return f(ctx)
}

// deduct takes a purchase's stock from Redis. When Redis lost the SKU's
// shards (not seeded) or a re-seed holds them closed (fenced), it rebuilds
// or waits for the rebuild and tries again; if the gate is still closed it
// returns that error, which notRun reports as safe to take elsewhere.
func (s *Service) deduct(ctx context.Context, req shard.Request) (shard.Deduction, error) {
	for attempt := 0; ; attempt++ {
		var d shard.Deduction
		err := s.redis(ctx, "gate.deduct", func(ctx context.Context) (err error) {
			d, err = s.gate.Deduct(ctx, req)
			return err
		})
		if d.GaveBack {
			// Units it took for a moment are back (a short assembly):
			// whoever found the SKU empty meanwhile hears so.
			s.notifyBack(ctx, req.SKU)
		}
		closed := errors.Is(err, stock.ErrNotSeeded) || errors.Is(err, stock.ErrFenced)
		if !closed || attempt == 2 {
			return d, err
		}
		reason := reasonNotSeeded
		if errors.Is(err, stock.ErrFenced) {
			reason = reasonFenced
		}
		if rerr := s.reseed(ctx, req.SKU, reason, false); rerr != nil {
			s.log.WarnContext(ctx, "gate closed and not rebuilt", "sku", req.SKU.String(), "err", rerr)
			return d, err
		}
		// The rebuild may have changed the layout (a resize): these shards
		// may be retired ones. Ask with the SKU's current shard count.
		s.settings.Invalidate(req.SKU)
		if st, serr := s.settings.Get(ctx, req.SKU); serr == nil {
			req.Shards = st.Shards
		}
	}
}

// restoreAttempts bounds giveBack's tries of a failing Redis call.
const restoreAttempts = 3

// giveBack lets holder (an attempt of a purchase) go of the stock it
// took, or found another attempt had taken (Replayed), when it did not
// commit. The units move when no attempt holds them any more
// (shard.Store.Restore): a copy of the request on another replica may be
// committing on them. shard.AllHolders moves them whoever holds them: the
// request committed on other units, or no attempt may still commit it.
// held reports units that stayed taken for another attempt holding them.
func (s *Service) giveBack(ctx context.Context, sku stock.SKU, key keys.ID, holder string, parts []shard.Part) (held bool) {
	// A request out of its time budget still gives back what it took:
	// each call has its own Redis timeout.
	ctx = context.WithoutCancel(ctx)
	var err error
	for attempt := range restoreAttempts {
		if attempt > 0 {
			// A call that timed out on a busy node may have restored some
			// parts: a part already given back is refused, so a repeat
			// moves each unit at most once.
			time.Sleep(time.Duration(attempt) * 50 * time.Millisecond)
		}
		err = s.redis(ctx, "gate.restore", func(ctx context.Context) error {
			h, err := s.gate.Restore(ctx, sku, key, holder, parts)
			held = held || h
			return err
		})
		if err == nil || errors.Is(err, breaker.ErrOpen) || isOutcome(err) {
			break
		}
	}
	if err != nil {
		// The units stay taken in Redis; the ledger is unaffected, and the
		// drift check or the next re-seed gives them back.
		s.metrics.restoreFailed.Inc()
		s.log.ErrorContext(ctx, "restore after refused commit", "sku", sku.String(), "err", err)
		// A try that failed part-way may have given some parts back: the
		// notice goes with the next ones (a notice too many costs a
		// re-check; one too few, a false sold-out).
		s.restocksOwed.mark(sku)
	} else if len(parts) > 0 {
		// The units are back: a replica that found the SKU empty while
		// they were out keeps its sold-out flag until it hears so. Told
		// even when a part stays held for another attempt: the others
		// may have come back, and a notice too many costs a re-check.
		s.notifyBack(ctx, sku)
	}
	return held
}

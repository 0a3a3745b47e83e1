package sale

import (
	"context"
	"errors"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/shard"
)

// returnOwed finishes a return the ledger just made (a cancel, a refund),
// if it owes Redis anything.
func (s *Service) returnOwed(ctx context.Context, kind string, id keys.ID) {
	r, ok, err := s.ledger.RestoreOwed(ctx, kind, id)
	if err != nil {
		s.log.WarnContext(ctx, "restore owed; a sweeper will do it", "kind", kind, "id", id, "err", err)
		return
	}
	if ok {
		s.returnToRedis(ctx, r, refillWaits)
	}
}

// returnFound is returnOwed for a return found by reading rather than
// made by the caller's own COMMIT: a replay's (ledger.ErrDuplicate), the
// sweeper's, a late payment's. Its row may stand on a COMMIT that
// applied on the primary alone (its backend ended while it waited for
// the synchronous standby, its reply lost): a failover takes it back,
// and units given to Redis for it are units the ledger does not have,
// sold at the gate and refused by the ledger (helper-111). So the units
// go back once ledger.RestoreDurable says the row is on the standby;
// unknown, they stay owed and a sweep gives them back once it is, and
// returnFound reports false: what else the end gives back (a hold
// budget's count) waits too, and the answer is 503 (Service.durable). A
// take's replay checks its request row the same way before its
// give-backs (take.commit, recorded).
func (s *Service) returnFound(ctx context.Context, kind string, id keys.ID) bool {
	if err := s.ledger.RestoreDurable(ctx, kind, id); err != nil {
		s.log.WarnContext(ctx, "restore not known to be on the standby; a sweeper will do it", "kind", kind, "id", id, "err", err)
		return false
	}
	s.returnOwed(ctx, kind, id)
	return true
}

// refillWaits are the pauses before asking a gate again that is being
// built to the return's epoch (a resize or a rebuild: milliseconds behind
// its fence): waited out here, the units are back at once rather than
// after the sweeper's RestoreGrace, and no buyer meets a false sold-out.
var refillWaits = []time.Duration{10 * time.Millisecond, 40 * time.Millisecond, 150 * time.Millisecond}

// refill gives the return's units to the gate of its epoch, pausing
// waits for a gate not at that epoch yet; NotYet after them.
func (s *Service) refill(ctx context.Context, r ledger.Restore, waits []time.Duration) (int, error) {
	id := keys.MustID(r.Kind + "-" + r.ID.String())
	if t, ok := s.refillStale.Load(r.SKU); ok && time.Since(t.(time.Time)) < time.Second {
		// Its gate outlasted the waits a moment ago (a rebuild failing,
		// Redis lost): a batch of expiries waits once, not each.
		waits = nil
	}
	for i := 0; ; i++ {
		var outcome int
		err := s.redis(ctx, "gate.refill", func(ctx context.Context) (err error) {
			outcome, err = s.gate.Refill(ctx, r.SKU, max(r.Shards, 1), id, r.Epoch, r.Quantity)
			return err
		})
		if err != nil || outcome != shard.NotYet || i == len(waits) {
			if outcome == shard.NotYet && len(waits) > 0 {
				s.refillStale.Store(r.SKU, time.Now())
			}
			return outcome, err
		}
		select {
		case <-ctx.Done():
			return outcome, nil
		case <-time.After(waits[i]):
		}
	}
}

// returnToRedis gives Redis the stock the ledger took back (a cancelled or
// expired hold, a refund) and the buyer's counts, then clears the ledger's
// pending mark. Counted units go to the gate of the epoch the return was
// made under, once (refill.lua): a gate rebuilt since counts them already,
// one not yet rebuilt to that epoch is tried again by the sweeper. Seats
// are freed by their owner id. If Redis cannot be reached the mark stays
// and a sweeper retries; every step is idempotent.
func (s *Service) returnToRedis(ctx context.Context, r ledger.Restore, waits []time.Duration) {
	if seats.IsGate(r.Gate) && !seats.ValidGate(r.Gate) {
		// A seat record that does not decode: never refill it as counted
		// stock. It stays pending, and the seat consistency check rewrites
		// the seats from the ledger.
		s.log.ErrorContext(ctx, "malformed seat gate record; left pending", "kind", r.Kind, "id", r.ID)
		return
	}
	if section, ids, ok := seats.DecodeGate(r.Gate); ok && s.seats != nil {
		// Seats come back free, whether held or sold through the hold.
		err := s.redis(ctx, "gate.seats_release", func(ctx context.Context) error {
			if _, err := s.seats.Release(ctx, r.SKU, section, r.RequestID, ids); err != nil {
				return err
			}
			_, err := s.seats.ReleaseSold(ctx, r.SKU, section, r.RequestID, ids)
			return err
		})
		// A seated SKU's stock view reads the ledger, which has the seats
		// back whether or not Redis has yet: every replica's view goes
		// (it stood for NoticeMaxAge, helper-70 #8).
		s.stockChanged(r.SKU)
		if err != nil {
			s.log.WarnContext(ctx, "release seats in redis; a sweeper will retry", "kind", r.Kind, "id", r.ID, "err", err)
			return
		}
	} else if !ok {
		outcome := shard.Counted // units owed to no gate: only the counts go back
		var err error
		if !r.CountsOnly {
			outcome, err = s.refill(ctx, r, waits)
		}
		// The counts go back even when the units must wait for their
		// epoch's gate: the ledger has taken the units from the buyer, who
		// would otherwise be refused at the cap until the sweeper's grace
		// ran out (found with self-sized shards, which rebuild a hot SKU
		// as often as each second).
		if err == nil {
			err = s.redis(ctx, "gate.release_counts", func(ctx context.Context) error {
				// The request stays known (no key id): a retry of it at
				// the cap is looked up, and replayed.
				if err := s.gate.ReleaseQuota(ctx, r.SKU.Base(), r.Buyer, r.RequestID, keys.ID{}); err != nil {
					return err
				}
				if r.CodeHash != "" {
					// The code's use comes back with the units.
					if err := s.gate.ReleaseQuota(ctx, codeScope(r.SKU), keys.MustID(r.CodeHash), r.RequestID, keys.ID{}); err != nil {
						return err
					}
				}
				return s.gate.ReleaseQuota(ctx, r.SKU.Whole(), r.Buyer, r.RequestID, keys.ID{})
			})
		}
		if err != nil {
			s.log.WarnContext(ctx, "restore to redis; a sweeper will retry", "kind", r.Kind, "id", r.ID, "err", err)
			if !r.CountsOnly {
				// The ledger has the units back even so: a stock view
				// read from it (Redis unreachable) must not stand on,
				// nor a sold-out flag, while the sweeper retries. The
				// refill may have run (the counts failed after it, or
				// its reply was lost): its retry will find it done and
				// tell no one, so the other replicas are told
				// (helper-80 #3), with the next change notices: one
				// notice per SKU however many restores fail each sweep
				// (helper-81 #2).
				s.clearSoldOut(r.SKU)
				s.stockChanged(r.SKU)
				s.restocksOwed.mark(r.SKU)
			}
			return
		}
		if outcome == shard.NotYet && !r.CountsOnly {
			passed, left := s.notYetRow(ctx, r)
			if left {
				// The gate of the return's epoch is still being built, or
				// a rebuild that fenced it failed: the replicas are told,
				// so a flag from before does not keep buyers from the
				// gate, whose next rebuild counts the units (helper-81
				// #1); only while the ledger has stock, or every sweep
				// would let a storm past the flags for nothing
				// (helper-82 #1).
				s.clearSoldOut(r.SKU)
				s.restocksOwed.mark(r.SKU)
			}
			if !passed {
				return // the sweeper comes back
			}
			outcome = shard.Counted
		}
		if !r.CountsOnly {
			s.clearSoldOut(r.SKU)
			s.stockChanged(r.SKU)
		}
		if outcome == shard.Refilled || outcome == shard.Unseeded && !r.CountsOnly {
			// Unseeded: Redis lost the gate, and another replica's sold-out
			// flag from before the loss would stand for its max age (no
			// take reaches the gate to seed it while the flag refuses
			// them all; a cart never asks past the flag).
			s.notifyRestocked(ctx, r.SKU)
		}
	}
	if err := s.ledger.RestoreDone(ctx, r.Kind, r.ID); err != nil {
		s.log.WarnContext(ctx, "mark restore done; a sweeper will repeat it", "kind", r.Kind, "id", r.ID, "err", err)
	}
}

// notYetRow reads r's SKU row for a return its gate is not ready for:
// passed, the ledger's gate epoch is past the one r was stamped with (the
// facts any later epoch's seed reads count r's units: the return and the
// epoch's move both write the SKU row), so a gate of r's own epoch still
// not built (a layout a failed resize left fenced and empty) owes it
// nothing, and r does not wait for it forever (helper-81 #3); left, the
// ledger has stock to sell. Read afresh: a rare path (a return racing a
// rebuild, or a rebuild that failed), retried each sweep.
func (s *Service) notYetRow(ctx context.Context, r ledger.Restore) (passed, left bool) {
	st, err := s.ledger.SKU(ctx, r.SKU)
	if err != nil {
		s.log.WarnContext(ctx, "read a returned SKU; a sweeper will retry", "sku", r.SKU.String(), "err", err)
		return false, false
	}
	return st.GateEpoch > r.Epoch, st.Remaining() > 0
}

// RunSweeper expires due holds and finishes restores other replicas left
// unfinished, every SweepEvery until ctx is done. Any number of replicas
// run it at once: the ledger gives each hold's stock back once, and the
// Redis side of a restore is idempotent.
func (s *Service) RunSweeper(ctx context.Context) {
	t := time.NewTicker(s.opts.SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.sweep(ctx)
	}
}

// expireDue expires h, read held and past its expiry, as the sweeper
// would, and reads it again. Whoever sees a hold past its expiry ends it
// first: a confirm, cancel or extension that read the hold live before
// its expiry but has not reached the hold's row yet then finds it ended
// (and a confirm pays late), never a hold a read already called expired.
// A hold confirmed or extended meanwhile is read as it is now.
func (s *Service) expireDue(ctx context.Context, h ledger.Hold) (ledger.Hold, error) {
	_, changed, err := s.ledger.ExpireHold(ctx, h.ID)
	switch {
	case errors.Is(err, ledger.ErrHoldConfirmed):
		// Confirmed meanwhile: read below.
	case err != nil:
		return h, err
	case changed:
		s.metrics.expired.Inc()
		s.expired(ctx, h)
	}
	return s.ledger.HoldByID(ctx, h.ID)
}

// expired finishes an expiry of h the ledger just committed (and its
// caller counted): the buyer's and the gate's records of it ended, Redis
// given its units.
func (s *Service) expired(ctx context.Context, h ledger.Hold) {
	s.holdEnded(ctx, h.SKU.Program, h.Buyer, h.IdempotencyKey)
	s.returnOwed(ctx, "hold", h.ID)
}

func (s *Service) sweep(ctx context.Context) {
	s.expireHolds(ctx)
	// Work left by a replica that died between the ledger and Redis halves,
	// or found too early for its epoch's gate.
	pending, err := s.ledger.PendingRestores(ctx, s.opts.RestoreGrace, 200)
	if err != nil {
		s.log.WarnContext(ctx, "pending restores", "err", err)
	}
	// Found by reading, as a replay's (returnFound). A standby that does
	// not answer holds the sweep a request's time once per program: the
	// program's other restores wait for the next sweep, and those of every
	// other program (on a fleet, other primaries, whose rows came after
	// the silent one's: helper-112) are given back in this one.
	silent := map[keys.ID]bool{}
	for _, r := range pending {
		if silent[r.SKU.Program] {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, s.opts.WorkTimeout)
		err := s.ledger.RestoreDurable(dctx, r.Kind, r.ID)
		cancel()
		if err != nil {
			s.log.WarnContext(ctx, "pending restore not known to be on the standby", "kind", r.Kind, "id", r.ID, "err", err)
			silent[r.SKU.Program] = true
			continue
		}
		s.returnToRedis(ctx, r, nil) // a gate still not built waits for the next sweep, not here
	}
	slow := owedSlowPerSweep
	s.releaseOwedQuota(ctx, &slow)
	s.retryOwedBudgets(ctx, &slow)
	s.closeDuePools(ctx)
	s.settleResales(ctx)
}

// expireHolds expires the holds past their expiry (by the ledger's
// clock), 200 at a time, and gives their units back.
func (s *Service) expireHolds(ctx context.Context) {
	for {
		done, err := s.ledger.ExpireDue(ctx, 200)
		if err != nil {
			s.log.WarnContext(ctx, "expire holds", "err", err)
		}
		// Counted at once, as the ledger expired them: the Redis half
		// below takes a while for 200 holds.
		s.metrics.expired.Add(float64(len(done)))
		for _, h := range done {
			s.expired(ctx, h)
		}
		if err != nil || len(done) < 200 {
			return
		}
	}
}

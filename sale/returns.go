package sale

import (
	"context"
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
		s.returnToRedis(ctx, r)
	}
}

// returnToRedis gives Redis the stock the ledger took back (a cancelled or
// expired hold, a refund) and the buyer's counts, then clears the ledger's
// pending mark. Counted units go to the gate of the epoch the return was
// made under, once (refill.lua): a gate rebuilt since counts them already,
// one not yet rebuilt to that epoch is tried again by the sweeper. Seats
// are freed by their owner id. If Redis cannot be reached the mark stays
// and a sweeper retries; every step is idempotent.
func (s *Service) returnToRedis(ctx context.Context, r ledger.Restore) {
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
		if err != nil {
			s.log.WarnContext(ctx, "release seats in redis; a sweeper will retry", "kind", r.Kind, "id", r.ID, "err", err)
			return
		}
	} else if !ok {
		outcome := shard.Counted // units owed to no gate: only the counts go back
		err := s.redis(ctx, "gate.refill", func(ctx context.Context) (err error) {
			if !r.CountsOnly {
				outcome, err = s.gate.Refill(ctx, r.SKU, max(r.Shards, 1), keys.MustID(r.Kind+"-"+r.ID.String()), r.Epoch, r.Quantity)
				if err != nil || outcome == shard.NotYet {
					return err
				}
			}
			// The request stays known (no key id): a retry of it at the
			// cap is looked up, and replayed.
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
		if err != nil {
			s.log.WarnContext(ctx, "restore to redis; a sweeper will retry", "kind", r.Kind, "id", r.ID, "err", err)
			return
		}
		if outcome == shard.NotYet && !r.CountsOnly {
			return // the gate of this epoch is still being built; the sweeper comes back
		}
		if !r.CountsOnly {
			s.cache.ClearSoldOut(r.SKU)
			s.stock.Invalidate(r.SKU)
		}
		if outcome == shard.Refilled {
			s.notifyRestocked(ctx, r.SKU)
		}
	}
	if err := s.ledger.RestoreDone(ctx, r.Kind, r.ID); err != nil {
		s.log.WarnContext(ctx, "mark restore done; a sweeper will repeat it", "kind", r.Kind, "id", r.ID, "err", err)
	}
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

func (s *Service) sweep(ctx context.Context) {
	for {
		done, err := s.ledger.ExpireDue(ctx, 200)
		if err != nil {
			s.log.WarnContext(ctx, "expire holds", "err", err)
		}
		s.metrics.expired.Add(float64(len(done)))
		for _, h := range done {
			s.holdEnded(ctx, h.SKU.Program, h.Buyer, h.IdempotencyKey)
			s.returnOwed(ctx, "hold", h.ID)
		}
		if err != nil || len(done) < 200 {
			break
		}
	}
	// Work left by a replica that died between the ledger and Redis halves,
	// or found too early for its epoch's gate.
	pending, err := s.ledger.PendingRestores(ctx, s.opts.RestoreGrace, 200)
	if err != nil {
		s.log.WarnContext(ctx, "pending restores", "err", err)
	}
	for _, r := range pending {
		s.returnToRedis(ctx, r)
	}
	s.closeDuePools(ctx)
	s.settleResales(ctx)
}

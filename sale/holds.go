package sale

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

var (
	ansHoldExpired   = fail(ErrHoldExpired)
	ansHoldCancelled = fail(ErrHoldCancelled)
	ansNotOwner      = fail(ErrNotOwner)
	ansNoHold        = fail(ErrUnknownHold)
	ansNoOrder       = fail(ErrUnknownOrder)
	ansHoldConfirmed = fail(ErrHoldConfirmed)
)

// confirm makes the hold an order, once; a retry gets the same order.
func (s *Service) confirm(ctx context.Context, id, buyer keys.ID, r request) answer {
	o, err := s.confirmLedger(ctx, id, buyer, r.ledger())
	switch {
	case err == nil:
		s.sellSeats(ctx, o)
		return answer{order: o}
	case errors.Is(err, ledger.ErrDuplicate):
		return answer{order: o, replayed: true}
	case errors.Is(err, ledger.ErrHoldEnded):
		h, herr := s.ledger.HoldByID(ctx, id)
		if herr == nil && h.State == ledger.Cancelled {
			return ansHoldCancelled
		}
		return ansHoldExpired
	}
	return s.ownerError(ctx, err, ansNoHold)
}

// cancel ends the hold; its stock goes back, once.
func (s *Service) cancel(ctx context.Context, id, buyer keys.ID, r request) answer {
	h, changed, err := s.cancelLedger(ctx, id, buyer, r.ledger())
	switch {
	case errors.Is(err, ledger.ErrDuplicate):
		return answer{hold: &h, replayed: true}
	case errors.Is(err, ledger.ErrHoldConfirmed):
		return ansHoldConfirmed
	case err != nil:
		return s.ownerError(ctx, err, ansNoHold)
	}
	if changed {
		s.returnOwed(ctx, "hold", h.ID)
	}
	return answer{hold: &h}
}

// refund gives the order's stock back once; a second refund answers the
// same and moves nothing.
func (s *Service) refund(ctx context.Context, id, buyer keys.ID, r request) answer {
	o, changed, err := s.refundLedger(ctx, id, buyer, r.ledger())
	switch {
	case errors.Is(err, ledger.ErrDuplicate):
		return answer{order: o, replayed: true}
	case err != nil:
		return s.ownerError(ctx, err, ansNoOrder)
	}
	if changed {
		s.returnOwed(ctx, "order", o.ID)
	}
	return answer{order: o}
}

func (s *Service) ownerError(ctx context.Context, err error, notFound answer) answer {
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return notFound
	case errors.Is(err, ledger.ErrNotOwner):
		return ansNotOwner
	case errors.Is(err, ledger.ErrInCart):
		return fail(ErrInCart)
	case errors.Is(err, ledger.ErrKeyReused):
		return ansKeyReused
	case errors.Is(err, errLedgerBusy):
		return ansLedgerBusy
	}
	s.log.ErrorContext(ctx, "hold or order action", "err", err)
	return ansUnavailable
}

// errOverCap: one request asks for more than the program's per-buyer cap
// (no count needed to refuse it).
var errOverCap = fmt.Errorf("%w: one request over the cap", stock.ErrLimit)

// errCodeUsedUp: the request's access code has no uses left at the gate.
var errCodeUsedUp = errors.New("sale: access code used up at the gate")

// quotaScope is one count a request makes at the gate: a buyer's units of
// a ticket or a program, or a code's uses (its "buyer" the code).
type quotaScope struct {
	sku   stock.SKU
	buyer keys.ID
}

// quotaTicket is a request's counts against its buyer's caps at the gate
// (the SKU's, the program's) and its access code's uses; release gives
// them back when the request did not end in a commit.
type quotaTicket struct {
	s        *Service
	scopes   []quotaScope
	fresh    []quotaScope // the scopes this attempt counted (not counted before)
	key      keys.ID      // the request's gate id
	keyID    keys.ID      // the client key's id (see quota.lua); zero: keep it known
	released bool
}

// release gives back the request's counts: it did not commit.
func (q *quotaTicket) release(ctx context.Context) {
	if q == nil || q.released {
		return
	}
	q.released = true
	q.s.releaseQuota(ctx, q.scopes, q.key, q.keyID)
}

// keepKey makes release leave the key's mark: the request may still commit.
func (q *quotaTicket) keepKey() {
	if q != nil {
		q.keyID = keys.ID{}
	}
}

// replayed gives back the counts this attempt made for a request that had
// committed before: its own counts stand (or were given back with its
// stock, by a refund or a cancel), so a count made again is one too many.
func (q *quotaTicket) replayed(ctx context.Context) {
	if q == nil || q.released || len(q.fresh) == 0 {
		return
	}
	q.released = true
	q.s.releaseQuota(ctx, q.fresh, q.key, keys.ID{}) // the key stays known: it committed
}

func (s *Service) releaseQuota(ctx context.Context, scopes []quotaScope, key, keyID keys.ID) {
	ctx = context.WithoutCancel(ctx) // as giveBack: a give-back outlives the request's budget
	for _, sc := range scopes {
		if err := s.redis(ctx, "gate.release_quota", func(ctx context.Context) error {
			return s.gate.ReleaseQuota(ctx, sc.sku, sc.buyer, key, keyID)
		}); err != nil {
			s.log.WarnContext(ctx, "release quota", "scope", sc.sku.String(), "err", err)
		}
	}
}

// takeQuota counts the request against the buyer's caps in Redis (the
// SKU's, then the program's) and against its access code's uses, so a
// flood from one buyer, or for one code, is turned away there with no
// ledger call per request. The ledger checks all of them again when it
// commits. No cap and no code, no call.
func (s *Service) takeQuota(ctx context.Context, w want, st ledger.SKUState) (*quotaTicket, error) {
	programCap, err := s.programs.Get(ctx, w.sku.Program)
	if err != nil {
		return nil, err
	}
	if programCap > 0 && w.q > programCap {
		return nil, errOverCap
	}
	t := &quotaTicket{s: s, key: w.req.gateID(), keyID: w.req.keyID()}
	counts := []struct {
		scope quotaScope
		cap   int64
		q     int64
	}{{quotaScope{w.sku.Base(), w.buyer}, st.PerBuyer, w.q}, {quotaScope{stock.SKU{Program: w.sku.Program}, w.buyer}, programCap, w.q}}
	if w.code != nil {
		counts = append(counts, struct {
			scope quotaScope
			cap   int64
			q     int64
		}{quotaScope{codeScope(w.sku), w.code.id}, w.code.max, 1})
	}
	for _, c := range counts {
		if c.cap == 0 {
			continue
		}
		var fresh bool
		err := s.redis(ctx, "gate.take_quota", func(ctx context.Context) (err error) {
			fresh, err = s.gate.TakeQuota(ctx, c.scope.sku, c.scope.buyer, w.req.gateID(), w.req.keyID(), c.q, c.cap)
			return err
		})
		if err != nil {
			// Only the counts this attempt made: a count found (another
			// attempt of this request, in flight or committed) is not ours.
			if errors.Is(err, stock.ErrLimit) && len(t.scopes) > len(t.fresh) {
				// A scope counted this request before: another cap refuses
				// what may be a retry of a committed request (a cap lowered
				// since). Look it up, as for a key counted before.
				err = shard.ErrKeyCounted
			}
			if errors.Is(err, shard.ErrKeyCounted) {
				t.keyID = keys.ID{} // the key may be a committed request's: keep its mark
			}
			t.scopes = t.fresh
			t.release(ctx)
			if w.code != nil && c.scope == (quotaScope{codeScope(w.sku), w.code.id}) &&
				(errors.Is(err, stock.ErrLimit) || errors.Is(err, shard.ErrKeyCounted)) {
				return nil, errCodeUsedUp
			}
			return nil, err
		}
		t.scopes = append(t.scopes, c.scope)
		if fresh {
			t.fresh = append(t.fresh, c.scope)
		}
	}
	if len(t.scopes) == 0 {
		return nil, nil
	}
	return t, nil
}

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

// RunSweeper expires due holds and finishes restores other gateways left
// unfinished, every SweepEvery until ctx is done. Any number of gateways
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
			s.returnOwed(ctx, "hold", h.ID)
		}
		if err != nil || len(done) < 200 {
			break
		}
	}
	// Work left by a gateway that died between the ledger and Redis halves,
	// or found too early for its epoch's gate.
	pending, err := s.ledger.PendingRestores(ctx, s.opts.RestoreGrace, 200)
	if err != nil {
		s.log.WarnContext(ctx, "pending restores", "err", err)
	}
	for _, r := range pending {
		s.returnToRedis(ctx, r)
	}
	s.closeDuePools(ctx)
}

// EndSale ends a SKU's sale behind the fence, so no replica's gate admits
// anyone after it; holds and orders already made stay.
func (s *Service) EndSale(ctx context.Context, sku stock.SKU) (SKUState, error) {
	ctx, cancel := s.detach(ctx)
	defer cancel()
	if _, err := s.ledger.SKU(ctx, sku); errors.Is(err, stock.ErrUnknownSKU) {
		return SKUState{}, ErrUnknownSKU
	}
	var st ledger.SKUState
	_, err := s.rebuildWith(ctx, sku, reasonAdmin, true, s.opts.ReseedWait, func(ctx context.Context) (err error) {
		st, err = s.ledger.EndSale(ctx, sku)
		return err
	})
	s.settings.Invalidate(sku)
	s.stock.Invalidate(sku)
	if st.Program.IsZero() {
		s.log.ErrorContext(ctx, "end sale", "sku", sku.String(), "err", err)
		return SKUState{}, refuse(ErrUnavailable, "could not end the sale; repeat the request")
	}
	if err != nil {
		s.log.ErrorContext(ctx, "end sale: gate not rebuilt", "sku", sku.String(), "err", err)
	}
	if err := s.endPools(ctx, sku); err != nil {
		s.log.ErrorContext(ctx, "end sale: pools", "sku", sku.String(), "err", err)
		return SKUState{}, refuse(ErrUnavailable, "the ticket's sale ended but not every pool's yet; repeat the request")
	}
	whole, err := s.ticketState(ctx, st)
	if err != nil {
		return skuStateOf(st), nil
	}
	return whole, nil
}

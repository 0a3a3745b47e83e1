package sale

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
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
		s.holdEnded(ctx, o.SKU.Program, o.Buyer, o.GateRequest())
		return answer{order: o}
	case errors.Is(err, ledger.ErrDuplicate):
		// The first answer may never have been given (a batch whose
		// COMMIT's outcome was unknown, decided again alone): its hold's
		// budget count ends now, not at its expiry (helper-55). Ending an
		// ended entry changes nothing.
		s.holdEnded(ctx, o.SKU.Program, o.Buyer, o.GateRequest())
		return answer{order: o, replayed: true}
	case errors.Is(err, ledger.ErrHoldEnded):
		return s.confirmEnded(ctx, id, buyer, 0, r, 1)
	case errors.Is(err, ledger.ErrKeyReused):
		return s.confirmReusedKey(ctx, id, buyer, 0, r)
	}
	return s.ownerError(ctx, err, ansNoHold)
}

// confirmReusedKey answers a confirm whose key the ledger found taken by
// another request. A late payment records its client key after its
// order, so another request under the same key sent at the same moment
// can take it in between; the payment is answered its order, and so must
// its retry be, or the 422 ("nothing moved") had the platform refund an
// order that stands (helper-50). The payment then records which key it
// was made under, under a key derived from the hold (lateKeyTaken): that
// key's confirm answers the order; any other reuse, and a late payment
// refused, is 422 (helper-52, helper-53). A window of time around the
// order decided this before, and answered the order to the key of any
// request the buyer made about then (helper-75, helper-76).
func (s *Service) confirmReusedKey(ctx context.Context, id, buyer keys.ID, keep int64, r request) answer {
	h, err := s.ledger.HoldByID(ctx, id)
	if err != nil || h.Buyer != buyer || h.State != ledger.Expired {
		return ansKeyReused
	}
	a, ok, err := s.paidLate(ctx, h)
	switch {
	case err != nil:
		return ansUnavailable // an order may stand: not "nothing moved"
	case !ok || a.err != nil || a.order.ID.IsZero():
		return ansKeyReused
	}
	rec, err := s.ledger.RequestByKey(ctx, h.SKU.Program, r.scope, lateKeyTaken(h))
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return ansKeyReused // paid under a key of its own, recorded beside the order
	case err != nil:
		return ansUnavailable
	case rec.Fingerprint != r.key.String():
		return ansKeyReused // another key's payment
	}
	return s.currentOrder(ctx, s.sameQuantity(ctx, a, keep))
}

// confirmEnded answers a confirm the ledger found the hold ended for: a
// cancelled hold is ErrHoldCancelled; an expired one (or past its expiry)
// may still be paid late, for keep of its units (0: all of them). One
// found held and not due was extended while the confirm looked: it is
// confirmed again, at most again times, and never paid late beside
// itself (two orders of one hold's units for one buyer).
func (s *Service) confirmEnded(ctx context.Context, id, buyer keys.ID, keep int64, r request, again int) answer {
	h, err := s.ledger.HoldByID(ctx, id)
	switch {
	case err != nil:
		return s.ownerError(ctx, err, ansNoHold)
	case h.State == ledger.Cancelled:
		return ansHoldCancelled
	case h.State == ledger.Confirmed:
		// Seen held and past its expiry by a transaction that began
		// before another confirm (made just before the expiry) committed:
		// on PostgreSQL's READ COMMITTED the row read first is older than
		// this one. The hold is confirmed: ask the ledger again, which
		// answers a confirm of a confirmed hold as any other, its order
		// (recorded as this request's answer), or 409 for another
		// quantity; never "expired", nor a 409 a retry would not get.
		// The ledger checked ownership before it saw the hold ended.
		return s.confirmConfirmed(ctx, h, keep, r)
	}
	a := s.lateConfirm(ctx, h, keep, r) // expired, or past its expiry
	if !errors.Is(a.err, errStillHeld) {
		return a
	}
	if again <= 0 {
		s.log.WarnContext(ctx, "confirm: the hold was extended under every attempt", "hold", id.String())
		return ansUnavailable // a retry with the key confirms it
	}
	return s.confirmKeep(ctx, id, buyer, keep, r, again-1)
}

// confirmConfirmed answers a confirm of hold h, found confirmed, as the
// ledger answers a confirm of a confirmed hold.
func (s *Service) confirmConfirmed(ctx context.Context, h ledger.Hold, keep int64, r request) answer {
	o, err := s.ledger.ConfirmPart(ctx, h.ID, h.Buyer, keep, r.ledger())
	switch {
	case err == nil:
		return answer{order: o}
	case errors.Is(err, ledger.ErrDuplicate):
		return answer{order: o, replayed: true}
	case errors.Is(err, ledger.ErrHoldConfirmed):
		return fail(refuse(ErrHoldConfirmed, "the hold was confirmed "+strings.TrimPrefix(err.Error(), ledger.ErrHoldConfirmed.Error()+": ")+
			"; a confirm under another key changes nothing"))
	case errors.Is(err, ledger.ErrHoldEnded):
		// Confirmed, then not: the ledger never moves a hold back.
		return fail(refuse(ErrHoldConfirmed, "the hold became order "+h.OrderID.String()))
	}
	return s.ownerError(ctx, err, ansNoHold)
}

// confirmPart confirms keep of the hold's units alone (not batched: the
// rest's return is a cancel's work), then gives the rest to Redis.
func (s *Service) confirmPart(ctx context.Context, id, buyer keys.ID, keep int64, r request) answer {
	return s.confirmKeep(ctx, id, buyer, keep, r, 1)
}

// confirmKeep is confirmPart, which confirms an ended hold found held
// again at most again times more (see confirmEnded).
func (s *Service) confirmKeep(ctx context.Context, id, buyer keys.ID, keep int64, r request, again int) answer {
	o, err := s.ledger.ConfirmPart(ctx, id, buyer, keep, r.ledger())
	switch {
	case err == nil:
		// A seat hold confirmed by a quantity naming all its seats is a
		// whole confirm: its seats are sold in Redis's map as confirm's are.
		s.sellSeats(ctx, o)
		s.holdEnded(ctx, o.SKU.Program, o.Buyer, o.GateRequest())
		s.returnOwed(ctx, "hold", id)
		if h, err := s.ledger.HoldByID(ctx, id); err == nil && h.Quantity > o.Quantity {
			s.metrics.afterSale.WithLabelValues("released").Add(float64(h.Quantity - o.Quantity))
		}
		return answer{order: o}
	case errors.Is(err, ledger.ErrDuplicate):
		// The first answer may never have been given (its COMMIT reply
		// lost): the rest it owes Redis is returned now, not at a sweep,
		// and its budget count ends (as confirm's replay).
		if !s.returnFound(ctx, "hold", id) {
			return ansUnavailable // its budget count too waits for the standby
		}
		s.holdEnded(ctx, o.SKU.Program, o.Buyer, o.GateRequest())
		return answer{order: o, replayed: true}
	case errors.Is(err, stock.ErrInvalid):
		return fail(refuse(ErrInvalid, "quantity is more than the hold has"))
	case errors.Is(err, ledger.ErrSeatedTake):
		return fail(refuse(ErrInvalid, "a seat hold is confirmed whole: leave quantity out"))
	case errors.Is(err, ledger.ErrHoldConfirmed):
		return fail(refuse(ErrHoldConfirmed, "the hold was confirmed "+strings.TrimPrefix(err.Error(), ledger.ErrHoldConfirmed.Error()+": ")+
			"; a confirm under another key changes nothing"))
	case errors.Is(err, ledger.ErrHoldEnded):
		return s.confirmEnded(ctx, id, buyer, keep, r, again)
	case errors.Is(err, ledger.ErrKeyReused):
		return s.confirmReusedKey(ctx, id, buyer, keep, r)
	}
	return s.ownerError(ctx, err, ansNoHold)
}

// extend moves the hold's expiry (ttl 0: its SKU's hold TTL).
func (s *Service) extend(ctx context.Context, id, buyer keys.ID, ttl time.Duration, r request) answer {
	if ttl == 0 {
		h, err := s.ledger.HoldByID(ctx, id)
		if err != nil {
			return s.ownerError(ctx, err, ansNoHold)
		}
		st, err := s.settings.Get(ctx, h.SKU)
		if err != nil {
			return s.ownerError(ctx, err, ansNoHold)
		}
		ttl = st.HoldTTL
	}
	return s.extendBy(ctx, id, buyer, ttl, r, 1)
}

// extendBy is extend's ledger call with its ttl, which extends a hold
// found ended but then held (another extension committed while it
// looked) again, at most again times more.
func (s *Service) extendBy(ctx context.Context, id, buyer keys.ID, ttl time.Duration, r request, again int) answer {
	h, err := s.ledger.Extend(ctx, id, buyer, ttl, r.ledger())
	switch {
	case err == nil:
		s.holdExtended(ctx, h)
		s.metrics.extended.Inc()
		return answer{hold: &h}
	case errors.Is(err, ledger.ErrDuplicate):
		// The first answer may never have been given (its replica gone
		// after the commit, or its budget call failed): the budget's
		// count moves with the expiry now (idempotent, and never
		// earlier; an ended hold's count is gone and stays gone).
		s.holdExtended(ctx, h)
		return answer{hold: &h, replayed: true}
	case errors.Is(err, ledger.ErrHoldConfirmed):
		return ansHoldConfirmed
	case errors.Is(err, ledger.ErrAtMaxLifetime):
		return fail(refuse(ErrHoldAtMax, "it expires at "+h.ExpiresAt.UTC().Format(time.RFC3339)))
	case errors.Is(err, ledger.ErrHoldEnded):
		// "Expired" only once the ledger has it expired (expireDue, as a
		// read of the hold does): a confirm begun before the expiry and
		// still committing holds the row, and is told as what it made.
		// (A cart's hold never gets here: Extend refuses it, ErrInCart.)
		cur, herr := s.ledger.HoldByID(ctx, id)
		if herr == nil && cur.State == ledger.Held {
			cur, herr = s.expireDue(ctx, cur)
		}
		switch {
		case herr != nil:
			return s.ownerError(ctx, herr, ansNoHold)
		case cur.State == ledger.Cancelled:
			return ansHoldCancelled
		case cur.State == ledger.Confirmed:
			return ansHoldConfirmed
		case cur.State == ledger.Held && again > 0:
			// Not due: another extension committed while this one looked.
			return s.extendBy(ctx, id, buyer, ttl, r, again-1)
		case cur.State == ledger.Held:
			return ansUnavailable // extended under every attempt: a retry extends it
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
		if !s.returnFound(ctx, "hold", h.ID) { // as confirmKeep's replay
			return ansUnavailable
		}
		s.holdEnded(ctx, h.SKU.Program, h.Buyer, h.IdempotencyKey)
		return answer{hold: &h, replayed: true}
	case errors.Is(err, ledger.ErrHoldConfirmed):
		return ansHoldConfirmed
	case err != nil:
		return s.ownerError(ctx, err, ansNoHold)
	}
	if changed {
		s.holdEnded(ctx, h.SKU.Program, h.Buyer, h.IdempotencyKey)
		s.returnOwed(ctx, "hold", h.ID)
	}
	return answer{hold: &h}
}

// refund gives the order's stock back once; a second refund answers the
// same and moves nothing.
func (s *Service) refund(ctx context.Context, id, buyer keys.ID, r request) answer {
	o, changed, err := s.refundLedger(ctx, id, buyer, r.ledger())
	if err == nil || errors.Is(err, ledger.ErrDuplicate) {
		// The order the refund returns has no units (where its tickets
		// went: began, resold, refunded); every answer that carries an
		// order tells them (API.md), so answer it as a read shows it. A
		// refunded order changes no more, so a replay tells the same.
		if full, rerr := s.ledger.OrderByID(ctx, o.ID); rerr == nil {
			o = full
		}
	}
	switch {
	case errors.Is(err, ledger.ErrDuplicate):
		if !s.returnFound(ctx, "order", o.ID) { // as confirmKeep's replay
			return ansUnavailable
		}
		return answer{order: o, replayed: true}
	case errors.Is(err, ledger.ErrListed):
		return fail(ErrOrderListed)
	case errors.Is(err, ledger.ErrResold):
		return fail(ErrOrderResold)
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
	case errors.Is(err, ledger.ErrInCart) && notFound.err == ErrUnknownOrder:
		return fail(refuse(ErrInCart, "this order is a line of a cart: the cart is refunded whole, and its lines are not moved or listed alone"))
	case errors.Is(err, ledger.ErrInCart):
		return fail(ErrInCart)
	case errors.Is(err, ledger.ErrKeyReused):
		return ansKeyReused
	case errors.Is(err, errLedgerBusy):
		// This attempt moved nothing, but a copy of the request on another
		// replica may be committing it, and nothing here can tell (a take
		// can: its deduction is shared, take.undo): the outcome is unknown.
		return ansLedgerBusyShared
	}
	s.log.ErrorContext(ctx, "hold or order action", "err", err)
	return ansUnavailable
}

// EndSale ends a SKU's sale behind the fence, so no replica's gate admits
// anyone after it; holds and orders already made stay.
func (s *Service) EndSale(ctx context.Context, sku stock.SKU) (SKUState, error) {
	ctx, cancel := s.detach(ctx)
	defer cancel()
	cur, err := s.ledger.SKU(ctx, sku)
	if errors.Is(err, stock.ErrUnknownSKU) {
		return SKUState{}, ErrUnknownSKU
	}
	var st ledger.SKUState
	ran := false
	if err == nil && !cur.EndedAt.IsZero() {
		// Ended already (this request's retry, its reply lost, or an end
		// on another replica): no gate to close for it, only its pools'
		// ends to finish. Closing it again, with a master out, said
		// "unchanged" of a sale that had ended (helper-77 #4).
		st, ran, err = cur, true, nil
	} else {
		_, err = s.rebuildWith(ctx, sku, reasonAdmin, true, s.opts.ReseedWait, func(ctx context.Context) (err error) {
			ran = true
			st, err = s.ledger.EndSale(ctx, sku)
			return err
		})
	}
	s.settings.Invalidate(sku)
	s.stockChanged(sku)
	switch {
	case !ran:
		// The gate could not be closed (a master of the SKU out of
		// reach): the ledger was never asked, so nothing changed, and
		// the answer says so rather than "unknown" (helper-67).
		s.log.ErrorContext(ctx, "end sale: gate not closed", "sku", sku.String(), "err", err)
		return SKUState{}, ErrGateNotClosed
	case st.Program.IsZero():
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

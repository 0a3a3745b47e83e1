package sale

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// errStillHeld is latePaid's answer for a hold that turned out held and
// not due; confirmEnded confirms it instead. It never reaches a client.
var errStillHeld = errors.New("sale: the hold is held again")

// lateConfirm answers the confirm of a hold whose expiry has passed: within
// Options.LatePayment of it (the buyer paid while the hold ran out), its
// units are taken again for its buyer, through the gate and the ledger as
// a purchase is, under a request key derived from the hold (so a retry,
// on any replica, buys once and answers that order); if they are gone,
// ErrLateRefused, a refusal the platform refunds against. Past the window,
// or with late payments off, the hold is simply expired (ErrHoldExpired).
// keep is the quantity the confirm named (0: the hold's): a late payment
// buys keep of the hold's units, once per hold. The derived key names the
// hold (its fingerprint the quantity too, see latePaid), so a second late
// payment under another client key gets the order the first made, or
// ErrHoldConfirmed when it asks for another quantity (as a confirm of a
// confirmed hold does).
func (s *Service) lateConfirm(ctx context.Context, h ledger.Hold, keep int64, r request) answer {
	// "Expired, nothing was sold" (410), or "refund the payment" (409),
	// only once the ledger has the hold expired, as a read of it does: a
	// confirm begun before the expiry may still be committing
	// (PostgreSQL's READ COMMITTED read showed the row as it was before
	// it), and its order is then this answer, not a refusal beside it
	// (issue 39); or it has not claimed the row yet, and finds it
	// expired. A hold an extension kept is confirmed instead. Such an
	// answer is the ledger's to a confirm of the hold, under the
	// client's key already: recorded again below, it read as a replay
	// (Idempotent-Replayed) on its first and only answer (helper-64).
	if h.State == ledger.Held {
		if a, done := s.expireBeforeLate(ctx, h, keep, r); done {
			return a
		}
	}
	a := s.currentOrder(ctx, s.latePaid(ctx, h, keep))
	if a.err != nil || a.order.ID.IsZero() || r.key.IsZero() {
		return a
	}
	// The client's key remembers the order too: a retry under it, past
	// the window or on another replica, gets it, and the key can't be
	// reused for another request. Unrecorded, the key would answer 410
	// past the window and take another request: the payment is answered
	// 503 instead (outcome unknown), and its retry, which finds the
	// order under the hold's key, records the client's key again.
	switch got, err := s.ledger.AnswerWith(ctx, r.ledger(), a.order); {
	case err == nil:
	case errors.Is(err, ledger.ErrDuplicate):
		// Another copy recorded the key first: its answer is the key's.
		a.replayed, a.order = true, got
	case errors.Is(err, ledger.ErrKeyReused):
		// Another request took the key between the late order and this
		// record (the client sent two under one key at once). The order
		// stands, so it is the answer: a 422 says nothing moved, and a
		// platform refunding on it gave the tickets away (helper-49).
		// The key stays the other request's; which key paid is recorded
		// under one derived from the hold, for this key's retries
		// (confirmReusedKey). The first such key is the hold's.
		s.log.WarnContext(ctx, "late payment: its client key was taken by another request meanwhile; answered with the order",
			"hold", h.ID.String(), "order", a.order.ID.String())
		taken := r.ledger()
		taken.Key, taken.Fingerprint = lateKeyTaken(h), r.key.String()
		if _, err := s.ledger.AnswerWith(ctx, taken, a.order); err != nil &&
			!errors.Is(err, ledger.ErrDuplicate) && !errors.Is(err, ledger.ErrKeyReused) {
			// This answer is still the order (it stands); only a retry of
			// it, should this reply be lost too, is told 422.
			s.log.WarnContext(ctx, "late payment: the key it was paid under not recorded", "hold", h.ID.String(), "err", err)
		}
		return a
	default:
		s.log.WarnContext(ctx, "late payment: client key not recorded", "hold", h.ID.String(), "err", err)
		return ansUnavailable
	}
	return a
}

// currentOrder is a, with the order a late payment's row answered (found
// under the hold's key: the order as it was then) read as it is now. The
// client's key is not a replay (it would have been answered before the
// hold was read), so it hears the order as it is now, as a confirm of a
// confirmed hold does: a transfer or a resale since is not told as the
// buyer's standing order.
func (s *Service) currentOrder(ctx context.Context, a answer) answer {
	if a.err != nil || !a.replayed || a.order.ID.IsZero() {
		return a
	}
	o, err := s.ledger.OrderByID(ctx, a.order.ID)
	if err != nil {
		return ansUnavailable
	}
	a.order = o
	return a
}

// latePaid is lateConfirm's payment, under the key derived from the hold.
func (s *Service) latePaid(ctx context.Context, h ledger.Hold, keep int64) answer {
	if s.opts.LatePayment <= 0 || s.now().Sub(h.ExpiresAt) > s.opts.LatePayment {
		// Paid within the window, and answered 503 (its COMMIT's reply
		// lost, its client key not recorded): the retry that comes after
		// the window gets the order, not 410 "nothing was sold" beside
		// it, nor does a confirm under another key (or with late
		// payments turned off since).
		a, ok, err := s.paidLate(ctx, h)
		switch {
		case err != nil:
			return ansUnavailable // an order may stand: not "nothing was sold"
		case ok:
			return s.sameQuantity(ctx, a, keep)
		}
		return ansHoldExpired
	}
	if why := notTakenAgain(h); why != "" {
		// Recorded, so a retry past the window, or a payment under
		// another key, is told "refund" again, not 410 "nothing was
		// sold" (helper-46): the same request, one answer.
		return s.refuseLate(ctx, h, ledger.LateRefusal{Quantity: h.Quantity, Why: why, Final: true}, 0)
	}
	// Behind a waiting room, an expired hold's tickets go to the next
	// buyer in line: the room admits one for each, and a late payment
	// taking it past the line had that buyer meet sold out (helper-51).
	switch queued, err := s.queued(ctx, h.SKU.Program); {
	case err != nil:
		return ansUnavailable
	case queued:
		return s.refuseLate(ctx, h, ledger.LateRefusal{Quantity: h.Quantity, Final: true,
			Why: "a program behind a waiting room gives an expired hold's tickets to the next buyer in line: refund the payment"}, 0)
	}
	// Expired by a sweeper, a read or an extension that has not given
	// its units to Redis yet (a batch restored one by one, a failed call
	// its grace retries, a restore still under way): the units are the
	// buyer's and the ledger has them, so they go back first, or the gate
	// refuses them and the platform refunds a payment for units that
	// were there. Found by reading: once the expiry is on the standby
	// (returnFound). Nothing owed (this call expired it and gave them
	// back): a rewrite of no row and one read. Not known to be on the
	// standby: 503, so no refusal is recorded for units the ledger has.
	if !s.returnFound(ctx, "hold", h.ID) {
		return ansUnavailable
	}
	named := keep
	if keep == 0 {
		keep = h.Quantity
	}
	if keep > h.Quantity {
		return fail(refuse(ErrInvalid, "quantity is more than the hold has"))
	}
	switch a, ok, err := s.paidLate(ctx, h); {
	case err != nil:
		return ansUnavailable
	case ok:
		return s.sameQuantity(ctx, a, named)
	}
	// The key is derived (keys.Derived): no client's Idempotency-Key can
	// take it, so a buyer's own request can never block the late payment.
	// The quantity is in the fingerprint, so a late payment of another
	// quantity has gate records of its own (gateID): were it to replay
	// this one's deduction at the gate, the order it commits of keep
	// units would stand on a deduction of another size, and the
	// difference would never come back to Redis. The ledger's row under
	// the derived key still lets one of them commit, once per hold; the
	// other is refused as a reuse of the key (its own deduction given
	// back) and answered with the order made.
	key := lateKey(h)
	w := want{sku: h.SKU, buyer: h.Buyer, q: keep, held: h.Quantity,
		req: newRequest(h.Buyer, key, ledger.OpPurchase, "late", h.ID.String(), strconv.FormatInt(keep, 10)).on(h.SKU.Program)}
	a := s.takeOne(ctx, w)
	if a.err == nil && a.replayed {
		a = s.sameQuantity(ctx, a, named)
	}
	if errors.Is(a.err, ErrKeyReused) {
		// Paid late before for another quantity (or by a build whose
		// fingerprint named none): its order is the hold's. Or refused
		// meanwhile, on another replica: its refusal is.
		rec, err := s.ledger.RequestByKey(ctx, w.req.program, w.req.scope, w.req.key)
		if err != nil {
			return ansUnavailable
		}
		if a, ok := lateAnswer(rec); ok {
			return s.sameQuantity(ctx, a, named)
		}
		return ansUnavailable
	}
	if unitsGone(a.err) {
		return s.refuseLate(ctx, h, ledger.LateRefusal{Quantity: keep,
			Why: "the hold expired and its units are gone: nothing was sold; refund the payment"}, named)
	}
	if why := settingsRefuse(a.err); why != "" {
		// The ticket's settings changed since the hold (a seat map
		// loaded, a lower maximum per order): the buyer did nothing
		// wrong, and the payment is refused for good, as a seat hold's
		// is, not told 409 seated now and 410 past the window
		// (helper-47).
		return s.refuseLate(ctx, h, ledger.LateRefusal{Quantity: keep, Why: why, Final: true}, named)
	}
	if a.err == nil && !a.replayed {
		s.metrics.latePayments.WithLabelValues("sold").Inc()
	}
	return a
}

// expireBeforeLate expires h, held past its expiry and not swept yet,
// before a late payment takes its units again, so they are back (and
// counted once) first. done says the hold was found otherwise, and a is
// the answer then.
func (s *Service) expireBeforeLate(ctx context.Context, h ledger.Hold, keep int64, r request) (a answer, done bool) {
	cur, err := s.expireDue(ctx, h)
	if err != nil {
		return s.ownerError(ctx, err, ansNoHold), true
	}
	switch cur.State {
	case ledger.Cancelled:
		return ansHoldCancelled, true
	case ledger.Confirmed:
		// A confirm made before the expiry committed while this one
		// looked: answered as a confirm of a confirmed hold (its
		// order, or 409 for another quantity), as a retry would be.
		return s.confirmConfirmed(ctx, cur, keep, r), true
	case ledger.Held:
		// Not due: an extension committed while this confirm looked
		// (its transaction read the expiry the extension replaced).
		// A late payment now would sell the buyer a second order
		// beside the hold, which a confirm then makes its own
		// (TestModelConcurrent/two-primaries): confirmEnded confirms
		// the hold instead.
		return answer{err: errStillHeld}, true
	}
	return answer{}, false
}

// unitsGone reports a take refused because the units are not there for
// the buyer (sold out, over the buyer's cap, the sale ended): a late
// payment is then refused, to be refunded.
func unitsGone(err error) bool {
	return isAny(err, stock.ErrSoldOut, ErrSoldOut, ErrLimit, ErrSaleEnded, stock.ErrLimit, stock.ErrSaleEnded)
}

// lateKey is the request key of h's late payment, derived from the hold
// (keys.Derived): its order, or its refusal, is the row under it.
func lateKey(h ledger.Hold) keys.ID { return keys.Derived("late", h.ID) }

// lateKeyTaken names the record of the client key a late payment of h
// was made under when another request took that key meanwhile: its
// fingerprint is the key.
func lateKeyTaken(h ledger.Hold) keys.ID { return keys.Derived("late-key", h.ID) }

// paidLate answers the late payment h's buyer made, under the key
// derived from it or a build's before (lateBefore), or its refusal
// (refuseLate); false when there was none, an error when the ledger
// could not say.
func (s *Service) paidLate(ctx context.Context, h ledger.Hold) (answer, bool, error) {
	r := newRequest(h.Buyer, lateKey(h), ledger.OpPurchase).on(h.SKU.Program)
	rec, err := s.ledger.RequestByKey(ctx, r.program, r.scope, r.key)
	switch {
	case err == nil:
		if a, ok := lateAnswer(rec); ok {
			if err := s.lateDurable(ctx, h); err != nil {
				return answer{}, false, err
			}
			return a, true, nil
		}
	case !errors.Is(err, ledger.ErrNotFound):
		return answer{}, false, err
	}
	a, ok := s.lateBefore(ctx, h)
	return a, ok, nil
}

// notTakenAgain is why h's units are never taken again by a late payment
// ("": they may be): a seat hold's seats, a pool's or a code's hold (the
// access rule applies), a waitlist offer (its units went down the line).
func notTakenAgain(h ledger.Hold) string {
	switch {
	case h.IsOffer():
		return "a waitlist offer that expired passed to the next buyer: refund the payment"
	case len(h.SeatIDs) > 0:
		return "a seat hold's seats are not taken again: refund the payment"
	case !h.SKU.Pool().IsZero() || h.CodeHash != "":
		return "a pool's or an access code's hold is not taken again (its access rule applies): refund the payment"
	}
	return ""
}

// settingsRefuse is why a late payment's take was refused by the
// ticket's settings as they are now ("": it was not).
func settingsRefuse(err error) string {
	switch {
	case errors.Is(err, ErrSeated), errors.Is(err, ErrNoSeating):
		return "the ticket sells specific seats since the hold was made: nothing was sold; refund the payment"
	case errors.Is(err, ErrOverMax):
		return "the ticket's maximum per order is below the hold's quantity now: nothing was sold; refund the payment"
	}
	return ""
}

// lateAnswer is the answer a late payment's row under the hold's derived
// key gives: the order it made, or its refusal.
func lateAnswer(rec ledger.Recorded) (answer, bool) {
	switch {
	case rec.Order != nil:
		return replayed(rec), true
	case rec.Refused != "":
		return fail(refuse(ErrLateRefused, rec.Refused)), true
	}
	return answer{}, false
}

// refuseLate answers a late payment of h whose take was refused (its
// units gone: unitsGone; or a hold never taken again: notTakenAgain)
// with ErrLateRefused, recorded under the hold's derived key first, when
// the ledger bears it out in the same transaction (ledger.RefuseLate:
// the units sold, the sale ended, the buyer's cap reached) or the
// refusal is final: the platform refunds on it, so no later late payment
// of the hold, under any key or quantity, may sell. A refusal the ledger
// does not bear out (a gate behind it: a return on its way to Redis, a
// replica's flag outliving a notice it missed, a buyer's count not given
// back yet) is not final: 503, nothing moved, and the retry finds the
// units. Unrecorded for a ledger failing, it is not final either: 503.
// lr says the quantity asked and why; named is what the confirm named.
func (s *Service) refuseLate(ctx context.Context, h ledger.Hold, lr ledger.LateRefusal, named int64) answer {
	r := newRequest(h.Buyer, lateKey(h), ledger.OpConfirm, "late refused", h.ID.String())
	lr.Req, lr.SKU, lr.Buyer = r.ledger(), h.SKU, h.Buyer
	rec, err := s.ledger.RefuseLate(ctx, lr)
	switch {
	case err == nil:
		s.metrics.latePayments.WithLabelValues("refused").Inc()
	case errors.Is(err, ledger.ErrDuplicate):
		// Another replica's late payment of the hold came first: its
		// answer, once its row is known to survive a failover.
		if err := s.lateDurable(ctx, h); err != nil {
			return ansUnavailable
		}
	case errors.Is(err, ledger.ErrUnitsThere):
		return ansUnavailable
	default:
		s.log.WarnContext(ctx, "late payment: refusal not recorded", "hold", h.ID.String(), "err", err)
		return ansUnavailable
	}
	if a, ok := lateAnswer(rec); ok {
		return s.sameQuantity(ctx, a, named)
	}
	return ansUnavailable
}

// lateDurable returns once the row under h's derived key is known to be
// on the synchronous standby (see durable): a refusal or an order read
// from a row a failover could take back is not answered, or a platform
// refunds on a refusal the promoted standby lacks, and the next payment
// sells.
func (s *Service) lateDurable(ctx context.Context, h ledger.Hold) error {
	r := newRequest(h.Buyer, lateKey(h), ledger.OpPurchase).on(h.SKU.Program)
	if err := s.ledger.RequestDurable(ctx, r.program, r.scope, r.key); err != nil && !errors.Is(err, ledger.ErrNotFound) {
		s.log.WarnContext(ctx, "late payment: its row not known to be on the standby", "hold", h.ID.String(), "err", err)
		return err
	}
	return nil
}

// lateBefore answers a late payment that a build before keys.Derived
// made under the key "late-" and the hold id, so a retry across an
// upgrade buys once. The fingerprint tells it from a client's purchase
// under that key (which fingerprints its SKU and quantity, never "late").
func (s *Service) lateBefore(ctx context.Context, h ledger.Hold) (answer, bool) {
	old, err := keys.ParseID("late-" + h.ID.String())
	if err != nil {
		return answer{}, false
	}
	r := newRequest(h.Buyer, old, ledger.OpPurchase, "late", h.ID.String()).on(h.SKU.Program)
	rec, err := s.ledger.RequestByKey(ctx, r.program, r.scope, r.key)
	if err != nil || rec.Fingerprint != r.ledger().Fingerprint || rec.Order == nil {
		return answer{}, false
	}
	return replayed(rec), true
}

// sameQuantity is a's order as the answer to a confirm that asked for
// keep units: ErrHoldConfirmed when the hold was paid for another
// quantity (nothing moves; the order stands as it is). The quantity paid
// for is what the order began with, not what it has now (a transfer or a
// resale since takes units out of it).
func (s *Service) sameQuantity(ctx context.Context, a answer, keep int64) answer {
	if a.err != nil || keep == 0 {
		return a
	}
	began := a.order.Quantity
	if o, err := s.ledger.OrderByID(ctx, a.order.ID); err == nil {
		_, _, began = orderOf(o).Told()
	}
	if began == keep {
		return a
	}
	return fail(refuse(ErrHoldConfirmed, fmt.Sprintf("the hold was paid as order %s of %d tickets; a confirm of %d under another key changes nothing",
		a.order.ID, began, keep)))
}

package sale_test

import (
	"errors"
	"time"

	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
)

// Expiry and late payments in the unit model (TestServiceAgainstAModel):
// the sale's and the ledger's clock move only by step; a hold past its
// expiry is expired at the step's start, as the sweeper would, its units
// given back; its buyer's confirm within modelLateWindow of the expiry
// buys its units again if they are there (an order, once per hold: a
// confirm of it again answers that order, or refuses another quantity),
// and is refused, to be refunded, if they are not (for good); past the
// window the hold is expired and nothing moves.

const (
	// modelStep is how far the clock moves at each step: past
	// ledger.ResaleHorizon, so a settle counts every sale before it.
	modelStep = ledger.ResaleHorizon + time.Second
	// modelLateWindow is Options.LatePayment in the model: 20 steps.
	modelLateWindow = 20 * modelStep
)

// modelTTLs are the single holds' lives, by chance: most outlive the
// run (200 steps), some expire in a few steps (not on a step's time, so
// no expiry falls on the instant a step reads).
var modelTTLs = []time.Duration{time.Hour, 10 * time.Second, 20 * time.Second}

// expire expires the holds past their expiry, as the sweeper does, and
// the model with them.
func (m *model) expire() {
	sale.ExpireHolds(m.svc)
	now := m.now()
	for _, h := range m.holds {
		if h.state != "held" || now.Before(h.expires) {
			continue
		}
		if h.cart != nil {
			m.fail("cart hold %v expired: a cart's holds outlive the run", h.id)
		}
		h.state = "expired"
		m.skus[h.sku].on -= h.q
		m.skus[h.sku].remaining += h.q
		m.count["expired"]++
	}
}

// paidLate holds the answer to a confirm of keep units (0: the whole
// hold, as a confirm names none) of the expired hold h by its buyer to
// the model, and follows it. A whole confirm of a hold paid late answers
// its order, as one of a confirmed hold does, whatever it kept.
func (m *model) paidLate(h *modelHold, keep int64, res sale.Result, err error) {
	s := &m.skus[h.sku]
	whole := keep == 0
	if whole {
		keep = h.q
	}
	// Past the window only what was paid (or refused) is told; within
	// it, more than the hold is refused first.
	past := m.now().Sub(h.expires) > modelLateWindow
	switch {
	case !past && keep > h.q:
		if !errors.Is(err, sale.ErrInvalid) {
			m.fail("got %+v, %v; want invalid", res, err)
		}
	case h.late == "paid" && (whole || keep == h.lateKept):
		if err != nil || res.Order == nil || res.Order.ID != h.lateOrder {
			m.fail("got %+v, %v; want the late order %v again", res, err, h.lateOrder)
		}
	case h.late == "paid":
		if !errors.Is(err, sale.ErrHoldConfirmed) {
			m.fail("got %+v, %v; want hold confirmed (paid late for %d)", res, err, h.lateKept)
		}
	case h.late == "refused":
		if !errors.Is(err, sale.ErrLateRefused) {
			m.fail("got %+v, %v; want the late payment refused again", res, err)
		}
	case past:
		if !errors.Is(err, sale.ErrHoldExpired) {
			m.fail("got %+v, %v; want hold expired (past the late window)", res, err)
		}
	case s.remaining < keep:
		if !errors.Is(err, sale.ErrLateRefused) {
			m.fail("got %+v, %v; want the late payment refused (%d left)", res, err, s.remaining)
		}
		h.late = "refused"
		m.count["late refused"]++
	case err != nil:
		m.fail("refused: %v", err)
	case res.Order == nil || res.Order.Quantity != keep || res.Order.Buyer != h.buyer:
		m.fail("answered %+v; want a late order of %d", res, keep)
	default:
		h.late, h.lateOrder, h.lateKept = "paid", res.Order.ID, keep
		s.remaining -= keep
		s.sales += keep // a purchase's order
		m.orders = append(m.orders, &modelOrder{id: res.Order.ID, sku: h.sku, buyer: h.buyer, q: keep})
		m.count["late"]++
	}
}

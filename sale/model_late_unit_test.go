package sale_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// Expiry and late payments in the unit model (TestServiceAgainstAModel):
// the sale's and the ledger's clock move only by step; a hold past its
// expiry is expired by a sweep at the start of one step in two, or first
// thing by its buyer's confirm or cancel, its units given back; its buyer's confirm within modelLateWindow of the expiry
// buys its units again if they are there (an order, once per hold: a
// confirm of it again answers that order, or refuses another quantity),
// and is refused, to be refunded, if they are not (for good); past the
// window the hold is expired and nothing moves.

const (
	// modelStep is how far the clock moves at most steps: past
	// ledger.ResaleHorizon, so a settle counts every sale before it.
	modelStep = ledger.ResaleHorizon + time.Second
	// modelShortStep is one step in two's: a settle after a few of
	// them leaves their sales to the next.
	modelShortStep = 500 * time.Millisecond
	// modelLateWindow is Options.LatePayment in the model: 60 s, about
	// 34 steps.
	modelLateWindow = 20 * modelStep
)

// modelTTLs are the single holds' lives, by chance: most outlive the
// run (200 steps), some expire in a few steps. With steps of 3 s and
// 0.5 s an expiry may fall on the instant a step reads: the model and the
// ledger both take a hold as expired from that instant on.
var modelTTLs = []time.Duration{time.Hour, 10 * time.Second, 20 * time.Second}

// expire expires the holds past their expiry, as the sweeper does, and
// the model with them, at one step in two: at the others a hold past its
// expiry stays held (its units taken) until the sweep or its buyer's
// confirm or cancel, which expires it first.
func (m *model) expire() {
	if m.rnd.IntN(2) == 0 {
		return
	}
	sale.ExpireHolds(m.svc)
	for _, h := range m.holds {
		m.expireDue(h)
	}
}

// expireDue expires h in the model if it is held past its expiry.
func (m *model) expireDue(h *modelHold) {
	if h.state != "held" || m.now().Before(h.expires) {
		return
	}
	if h.cart != nil {
		m.fail("cart hold %v expired: a cart's holds outlive the run", h.id)
	}
	h.state = "expired"
	m.skus[h.sku].on -= h.q
	m.skus[h.sku].remaining += h.q
	m.count["expired"]++
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
	// Within the window more than the hold is refused first, paid or
	// not (e2e/holds TestLatePaymentOfAQuantity); past it, only what was
	// paid or refused is told.
	past := m.now().Sub(h.expires) > modelLateWindow
	switch {
	case !past && keep > h.q:
		if !errors.Is(err, sale.ErrInvalid) {
			m.fail("got %+v, %v; want invalid", res, err)
		}
	case h.late == "paid" && (whole || keep == h.lateKept):
		if err != nil || res.Order == nil || res.Order.ID != h.lateOrder || res.Order.SKU != s.sku {
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
	case res.Order == nil || res.Order.Quantity != keep || res.Order.Buyer != h.buyer || res.Order.SKU != s.sku || res.Replayed:
		m.fail("answered %+v; want a late order of %d", res, keep)
	default:
		h.late, h.lateOrder, h.lateKept = "paid", res.Order.ID, keep
		s.remaining -= keep
		m.sold(h.sku, keep, nil) // a purchase's order
		m.orders = append(m.orders, &modelOrder{id: res.Order.ID, sku: h.sku, buyer: h.buyer, q: keep})
		m.count["late"]++
	}
}

// A confirm of a hold paid late answers that payment: another quantity
// is 409 hold-confirmed, the same one its order; within the window, more
// than the hold is 422 invalid first, paid or not (as e2e/holds
// TestLatePaymentOfAQuantity pins through HTTP). Here in the unit tier.
func TestPaidLateAnswersItsPayment(t *testing.T) {
	var ahead atomic.Int64
	start := time.Now().Truncate(time.Second)
	now := func() time.Time { return start.Add(time.Duration(ahead.Load())) }
	svc, _ := sale.TestServiceAt(t, shardmem.New(), nil, now, func(o *sale.Options) { o.Now, o.LatePayment = now, time.Minute })
	ctx := context.Background()
	sku := stock.SKU{Program: keys.MustID("late"), Ticket: keys.MustID("t")}
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	ann := keys.MustID("ann")
	held, err := svc.Hold(ctx, sale.Take{Ask: sale.Ask{Buyer: ann, Key: keys.MustID("hold")}, SKU: sku, Quantity: 3, TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ahead.Add(int64(20 * time.Second)) // expired 10 s ago: inside the minute's window
	paid, err := svc.ConfirmPart(ctx, held.Hold.ID, sale.Ask{Buyer: ann, Key: keys.MustID("pay")}, 2)
	if err != nil || paid.Order == nil || paid.Order.Quantity != 2 {
		t.Fatalf("late payment of 2: %+v, %v; want an order of 2", paid, err)
	}
	for keep, want := range map[int64]error{4: sale.ErrInvalid, 3: sale.ErrHoldConfirmed, 1: sale.ErrHoldConfirmed} {
		res, err := svc.ConfirmPart(ctx, held.Hold.ID, sale.Ask{Buyer: ann, Key: keys.MustID(fmt.Sprintf("again-%d", keep))}, keep)
		if !errors.Is(err, want) {
			t.Errorf("confirm of %d after the late payment of 2: %+v, %v; want %v", keep, res, err, want)
		}
	}
	again, err := svc.ConfirmPart(ctx, held.Hold.ID, sale.Ask{Buyer: ann, Key: keys.MustID("again-2")}, 2)
	if err != nil || again.Order == nil || again.Order.ID != paid.Order.ID {
		t.Errorf("confirm of 2 again: %+v, %v; want order %v", again, err, paid.Order.ID)
	}
}

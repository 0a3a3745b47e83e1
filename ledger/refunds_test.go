package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// A batch of refunds refunds every plain refund in it together, counted
// orders and an order of a confirmed seat hold alike, giving back sold
// stock, buyer counts and seats and marking what Redis is owed; each
// refund that is not plain is split out with nothing written, for Refund
// to answer alone.
func TestRefundBatch(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		// Caps (never reached) make the ledger count every buyer's units.
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 20, Shards: 1, MaxPerOrder: 4, PerBuyer: 20}); err != nil {
			t.Fatal(err)
		}
		if err := l.PutProgram(ctx, sku.Program, 100); err != nil {
			t.Fatal(err)
		}
		stalls := putStalls(t, l, 4)
		buy := func(key, buyer string, q int64) ledger.Order {
			t.Helper()
			o, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID(key), SKU: sku, Buyer: keys.MustID(buyer), Quantity: q,
				Gate: `[{"shards":1}]`, Req: req(buyer, key, "buy "+key, ledger.OpPurchase)})
			if err != nil {
				t.Fatal(err)
			}
			return o
		}
		a, b, cc, e, x := buy("p-a", "ann", 2), buy("p-b", "bob", 3), buy("p-c", "cat", 1), buy("p-e", "eve", 1), buy("p-x", "gus", 1)
		seatHold, err := l.Hold(ctx, ledger.Hold{IdempotencyKey: keys.MustID("h-s"), SKU: stalls, Buyer: keys.MustID("sid"), Quantity: 2,
			SeatIDs: []keys.ID{keys.MustID("A-01"), keys.MustID("A-02")}, ExpiresAt: c.now().Add(time.Minute), Gate: "seats:A:A-01,A-02"}, -1)
		if err != nil {
			t.Fatal(err)
		}
		seated, err := l.Confirm(ctx, seatHold.ID, seatHold.Buyer, req("sid", "c-s", "confirm", ledger.OpConfirm))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := l.Refund(ctx, e.ID, e.Buyer, req("eve", "r-e", "refund", ledger.OpRefund)); err != nil {
			t.Fatal(err)
		}
		before, _ := l.SKU(ctx, sku)

		batch := []ledger.OrderRequest{
			{OrderID: a.ID, Buyer: a.Buyer, Req: req("ann", "r-a", "refund a", ledger.OpRefund)},
			{OrderID: b.ID, Buyer: b.Buyer, Req: req("bob", "r-b", "refund b", ledger.OpRefund)},
			{OrderID: cc.ID, Buyer: keys.MustID("eve"), Req: req("eve", "r-c", "refund c", ledger.OpRefund)},    // not hers
			{OrderID: e.ID, Buyer: e.Buyer, Req: req("eve", "r-e2", "refund e", ledger.OpRefund)},               // refunded before
			{OrderID: a.ID, Buyer: a.Buyer, Req: req("ann", "r-a2", "refund a", ledger.OpRefund)},               // named twice
			{OrderID: x.ID, Buyer: x.Buyer, Req: req("gus", "p-x", "refund x", ledger.OpRefund)},                // key used
			{OrderID: seated.ID, Buyer: seated.Buyer, Req: req("sid", "r-s", "refund s", ledger.OpRefund)},      // seats
			{OrderID: keys.MustID("nope"), Buyer: a.Buyer, Req: req("ann", "r-n", "refund n", ledger.OpRefund)}, // no such order
		}
		res, err := l.RefundBatch(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			plain := i == 0 || i == 1 || i == 6
			switch {
			case plain && (r.Err != nil || r.Order.ID != batch[i].OrderID || r.Order.RefundedAt.IsZero()):
				t.Errorf("refund %d = %+v, %v; want the refunded order", i, r.Order, r.Err)
			case !plain && !errors.Is(r.Err, ledger.ErrSplit):
				t.Errorf("refund %d = %+v, %v; want ErrSplit", i, r.Order, r.Err)
			}
		}
		after, _ := l.SKU(ctx, sku)
		if after.Sold != before.Sold-5 || after.Held != before.Held {
			t.Errorf("sold %d→%d held %d→%d, want sold -5 and held unchanged", before.Sold, after.Sold, before.Held, after.Held)
		}
		if st, _ := l.SKU(ctx, stalls); st.Sold != 0 {
			t.Errorf("stalls sold %d after its seat order was refunded", st.Sold)
		}
		for _, s := range mustSeats(t, l, stalls) {
			if s.State != "free" {
				t.Errorf("seat %s is %s after the refund", s.ID, s.State)
			}
		}
		for _, who := range []struct {
			sku   stock.SKU
			buyer string
		}{{sku, "ann"}, {sku, "bob"}, {stalls, "sid"}, {sku.Whole(), "ann"}, {stalls.Whole(), "sid"}} {
			if n, _ := l.BuyerUnits(ctx, who.sku, keys.MustID(who.buyer)); n != 0 {
				t.Errorf("%s still counts %d units of %s", who.buyer, n, who.sku)
			}
		}
		if n, _ := l.BuyerUnits(ctx, sku, keys.MustID("cat")); n != 1 {
			t.Errorf("cat counts %d units, want her 1 (her order was not refunded)", n)
		}
		for _, o := range []ledger.Order{a, b, seated} {
			if _, owed, err := l.RestoreOwed(ctx, "order", o.ID); err != nil || !owed {
				t.Errorf("order %s: Redis owed %v (%v), want owed", o.ID, owed, err)
			}
		}
		again, _, err := l.Refund(ctx, a.ID, a.Buyer, batch[0].Req)
		if !errors.Is(err, ledger.ErrDuplicate) || again.ID != a.ID || !again.RefundedAt.Equal(res[0].Order.RefundedAt) {
			t.Errorf("retry of a batched refund = %+v, %v; want ErrDuplicate with the refunded order", again, err)
		}
		for i, want := range map[int]error{2: ledger.ErrNotOwner, 5: ledger.ErrKeyReused, 7: ledger.ErrNotFound} {
			if _, _, err := l.Refund(ctx, batch[i].OrderID, batch[i].Buyer, batch[i].Req); !errors.Is(err, want) {
				t.Errorf("refund %d alone = %v, want %v", i, err, want)
			}
		}
		if o, changed, err := l.Refund(ctx, e.ID, e.Buyer, batch[3].Req); err != nil || changed || o.RefundedAt.IsZero() {
			t.Errorf("second refund of e alone = %+v changed %v, %v; want it as it is", o, changed, err)
		}
		if st, _ := l.SKU(ctx, sku); st.Sold != after.Sold {
			t.Errorf("the split refunds moved stock: sold %d, want %d", st.Sold, after.Sold)
		}
	})
}

// A take around the gate returned at the gate's epoch owes Redis no units
// (the next rebuild reads them from the ledger) but still owes the buyer's
// counts: an attempt the gate admitted counted them before it met a
// rebuilt gate, and its retake went around the gate keeping them. Owed
// nothing, the buyer was refused at the cap after refunding its only
// order (TestAttackAutoShardsRefundFreesCap, 3 runs in 15 under load).
func TestReturnAroundTheGateOwesCounts(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 20, Shards: 1, MaxPerOrder: 4, PerBuyer: 2}); err != nil {
			t.Fatal(err)
		}
		st, err := l.SKU(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		o, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("p-around"), SKU: sku, Buyer: keys.MustID("ann"), Quantity: 2,
			TakeEpoch: st.GateEpoch, Req: req("ann", "p-around", "buy", ledger.OpPurchase)})
		if err != nil {
			t.Fatal(err)
		}
		h, err := l.Hold(ctx, ledger.Hold{IdempotencyKey: keys.MustID("h-around"), SKU: sku, Buyer: keys.MustID("bob"), Quantity: 1,
			TakeEpoch: st.GateEpoch, ExpiresAt: c.now().Add(time.Minute)}, -1)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := l.Refund(ctx, o.ID, o.Buyer, req("ann", "r-around", "refund", ledger.OpRefund)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := l.Cancel(ctx, h.ID, h.Buyer, req("bob", "c-around", "cancel", ledger.OpCancel)); err != nil {
			t.Fatal(err)
		}
		for _, x := range []struct {
			kind string
			id   keys.ID
			rid  keys.ID
		}{{"order", o.ID, o.IdempotencyKey}, {"hold", h.ID, h.IdempotencyKey}} {
			r, ok, err := l.RestoreOwed(ctx, x.kind, x.id)
			if err != nil || !ok || !r.CountsOnly || r.RequestID != x.rid {
				t.Errorf("%s around the gate: owed %+v, %v, %v; want its counts (request %s), not its units", x.kind, r, ok, err, x.rid)
			}
		}
	})
}

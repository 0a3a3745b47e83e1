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

// A batch of cancels ends every plain cancel in it together, counted and
// seat holds alike, giving back held stock, buyer counts and seats, and
// marking what Redis is owed; each cancel that is not plain is split out
// with nothing written, for Cancel to answer alone.
func TestCancelBatch(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 20, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		stalls := putStalls(t, l, 4)
		exp := c.now().Add(time.Minute)
		mk := func(h ledger.Hold) ledger.Hold {
			t.Helper()
			got, err := l.Hold(ctx, h, -1)
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		a, b, cc := mk(hold("h-a", "ann", 2, exp)), mk(hold("h-b", "bob", 3, exp)), mk(hold("h-c", "cat", 1, exp))
		f, e, x := mk(hold("h-f", "fay", 1, exp)), mk(hold("h-e", "eve", 1, exp)), mk(hold("h-x", "gus", 1, exp))
		seat := mk(ledger.Hold{IdempotencyKey: keys.MustID("h-s"), SKU: stalls, Buyer: keys.MustID("sid"), Quantity: 2,
			SeatIDs: []keys.ID{keys.MustID("A-01"), keys.MustID("A-02")}, ExpiresAt: exp, Gate: "seats:A:A-01,A-02"})
		if _, err := l.Confirm(ctx, f.ID, f.Buyer, req("fay", "c-f", "confirm", ledger.OpConfirm)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := l.Cancel(ctx, e.ID, e.Buyer, req("eve", "x-e", "cancel", ledger.OpCancel)); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("p-gus"), SKU: sku, Buyer: keys.MustID("gus"), Quantity: 1,
			Req: req("gus", "used", "a purchase", ledger.OpPurchase)}); err != nil {
			t.Fatal(err)
		}
		before, _ := l.SKU(ctx, sku)

		batch := []ledger.HoldRequest{
			{HoldID: a.ID, Buyer: a.Buyer, Req: req("ann", "x-a", "cancel a", ledger.OpCancel)},
			{HoldID: b.ID, Buyer: b.Buyer, Req: req("bob", "x-b", "cancel b", ledger.OpCancel)},
			{HoldID: cc.ID, Buyer: keys.MustID("eve"), Req: req("eve", "x-c", "cancel c", ledger.OpCancel)}, // not hers
			{HoldID: f.ID, Buyer: f.Buyer, Req: req("fay", "x-f", "cancel f", ledger.OpCancel)},             // confirmed
			{HoldID: e.ID, Buyer: e.Buyer, Req: req("eve", "x-e2", "cancel e", ledger.OpCancel)},            // cancelled before
			{HoldID: a.ID, Buyer: a.Buyer, Req: req("ann", "x-a2", "cancel a", ledger.OpCancel)},            // named twice
			{HoldID: x.ID, Buyer: x.Buyer, Req: req("gus", "used", "cancel x", ledger.OpCancel)},            // key used
			{HoldID: seat.ID, Buyer: seat.Buyer, Req: req("sid", "x-s", "cancel s", ledger.OpCancel)},       // a seat hold
		}
		res, err := l.CancelBatch(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			plain := i == 0 || i == 1 || i == 7
			switch {
			case plain && (r.Err != nil || r.Hold.ID != batch[i].HoldID || r.Hold.State != ledger.Cancelled):
				t.Errorf("cancel %d = %+v, %v; want the cancelled hold", i, r.Hold, r.Err)
			case !plain && !errors.Is(r.Err, ledger.ErrSplit):
				t.Errorf("cancel %d = %+v, %v; want ErrSplit", i, r.Hold, r.Err)
			}
		}
		after, _ := l.SKU(ctx, sku)
		if after.Held != before.Held-5 || after.Sold != before.Sold {
			t.Errorf("held %d→%d sold %d→%d, want held -5 and sold unchanged", before.Held, after.Held, before.Sold, after.Sold)
		}
		if st, _ := l.SKU(ctx, stalls); st.Held != 0 {
			t.Errorf("stalls held %d after its seat hold was cancelled", st.Held)
		}
		for _, s := range mustSeats(t, l, stalls) {
			if s.State != "free" {
				t.Errorf("seat %s is %s after the cancel", s.ID, s.State)
			}
		}
		for _, who := range []struct {
			sku   stock.SKU
			buyer string
		}{{sku, "ann"}, {sku, "bob"}, {stalls, "sid"}, {sku.Whole(), "ann"}} {
			if n, _ := l.BuyerUnits(ctx, who.sku, keys.MustID(who.buyer)); n != 0 {
				t.Errorf("%s still counts %d units of %s", who.buyer, n, who.sku)
			}
		}
		for _, h := range []ledger.Hold{a, b, seat} {
			if _, owed, err := l.RestoreOwed(ctx, "hold", h.ID); err != nil || !owed {
				t.Errorf("hold %s: Redis owed %v (%v), want owed", h.ID, owed, err)
			}
		}
		again, _, err := l.Cancel(ctx, a.ID, a.Buyer, batch[0].Req)
		if !errors.Is(err, ledger.ErrDuplicate) || again.State != ledger.Cancelled || again.ID != a.ID {
			t.Errorf("retry of batched cancel = %+v, %v; want ErrDuplicate with the cancelled hold", again, err)
		}
		for i, want := range map[int]error{2: ledger.ErrNotOwner, 3: ledger.ErrHoldConfirmed, 6: ledger.ErrKeyReused} {
			if _, _, err := l.Cancel(ctx, batch[i].HoldID, batch[i].Buyer, batch[i].Req); !errors.Is(err, want) {
				t.Errorf("cancel %d alone = %v, want %v", i, err, want)
			}
		}
		if h, changed, err := l.Cancel(ctx, e.ID, e.Buyer, batch[4].Req); err != nil || changed || h.State != ledger.Cancelled {
			t.Errorf("second cancel of e alone = %+v changed %v, %v; want it as it is", h, changed, err)
		}
		if st, _ := l.SKU(ctx, sku); st.Held != after.Held {
			t.Errorf("the split cancels moved stock: held %d, want %d", st.Held, after.Held)
		}
	})
}

func mustSeats(t *testing.T, l *ledger.Ledger, s stock.SKU) []ledger.Seat {
	t.Helper()
	all, err := l.Seats(context.Background(), s, keys.ID{})
	if err != nil {
		t.Fatal(err)
	}
	return all
}

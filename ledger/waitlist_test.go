package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// TestWaitlistOffers walks a waitlist through its rules: joining only a
// sold-out SKU, once per buyer, in line order; a cancel's units offered in
// its own transaction to the entries that fit, under their caps, what is
// offered owed to Redis no more; an expired offer passing on; a refund's
// units offered; a leaver skipped; and every offer an event.
func TestWaitlistOffers(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 4, Shards: 1, MaxPerOrder: 4, PerBuyer: 3}); err != nil {
			t.Fatal(err)
		}
		id := keys.MustID
		ttl := time.Minute
		if _, _, err := l.JoinWaitlist(ctx, sku, id("bob"), 1, ttl); !errors.Is(err, ledger.ErrNotSoldOut) {
			t.Fatalf("join with stock left: %v, want ErrNotSoldOut", err)
		}
		big, err := l.Hold(ctx, hold("h-ann", "ann", 3, c.now().Add(time.Hour)), -1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: id("o-zed"), SKU: sku, Buyer: id("zed"), Quantity: 1,
			Gate: `[{"shards":1}]`}); err != nil {
			t.Fatal(err)
		}
		// Sold out. bob 1, carl 2, dora 1 (who leaves), eve 3 (over
		// what comes back), finn 1 (at his cap by then).
		for i, w := range []struct {
			buyer string
			q     int64
		}{{"bob", 1}, {"carl", 2}, {"dora", 1}, {"eve", 3}, {"finn", 1}} {
			e, created, err := l.JoinWaitlist(ctx, sku, id(w.buyer), w.q, ttl)
			if err != nil || !created || e.Ahead != int64(i) || e.State != ledger.Waiting {
				t.Fatalf("join %s: %+v created %v err %v, want %d ahead", w.buyer, e, created, err, i)
			}
		}
		if e, created, err := l.JoinWaitlist(ctx, sku, id("carl"), 1, ttl); err != nil || created || e.Quantity != 2 || e.Ahead != 1 {
			t.Fatalf("join again: %+v created %v err %v, want the entry as it was", e, created, err)
		}
		if _, _, err := l.JoinWaitlist(ctx, sku, id("gus"), 4, ttl); !errors.Is(err, stock.ErrLimit) {
			t.Fatalf("join over the cap: %v, want ErrLimit", err)
		}
		if e, err := l.LeaveWaitlist(ctx, sku, id("dora")); err != nil || e.State != ledger.Left {
			t.Fatalf("leave: %+v %v", e, err)
		}
		if n, err := l.WaitlistLength(ctx, sku); err != nil || n != 4 {
			t.Fatalf("length %d %v, want 4", n, err)
		}
		// finn at his cap: he holds 3 (a hold of another of his requests).
		c.advance(time.Second)
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 7, Shards: 1, MaxPerOrder: 4, PerBuyer: 3}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Hold(ctx, hold("h-finn", "finn", 3, c.now().Add(time.Hour)), -1); err != nil {
			t.Fatal(err)
		}

		// ann cancels 3: bob gets 1, carl 2; eve (3) does not fit in
		// what is left (0), finn is at his cap.
		if _, changed, err := l.Cancel(ctx, big.ID, id("ann"), ledger.Request{}); err != nil || !changed {
			t.Fatalf("cancel: %v %v", changed, err)
		}
		offers := map[string]ledger.WaitEntry{}
		for _, b := range []string{"bob", "carl"} {
			e, err := l.WaitEntryOf(ctx, sku, id(b))
			if err != nil || e.State != ledger.Offered || e.Offer == nil || e.Offer.State != ledger.Held ||
				e.Offer.Buyer != id(b) || e.Offer.Quantity != e.Quantity || !e.Offer.IsOffer() ||
				!e.Offer.ExpiresAt.Equal(c.now().Add(ttl).Truncate(time.Millisecond)) {
				t.Fatalf("%s after the cancel: %+v (offer %+v) %v", b, e, e.Offer, err)
			}
			offers[b] = e
		}
		if e, err := l.WaitEntryOf(ctx, sku, id("eve")); err != nil || e.State != ledger.Waiting || e.Ahead != 0 {
			t.Fatalf("eve: %+v %v, want first in line", e, err)
		}
		st, err := l.SKU(ctx, sku)
		if err != nil || st.Held != 6 || st.Sold != 1 {
			t.Fatalf("sku %+v %v, want held 6 (finn 3 + offers 3) sold 1", st, err)
		}
		// Every unit went to the line: Redis is owed the counts only.
		if r, ok, err := l.RestoreOwed(ctx, "hold", big.ID); err != nil || !ok || !r.CountsOnly || r.Quantity != 0 {
			t.Fatalf("restore of the cancelled hold: %+v %v %v, want counts only", r, ok, err)
		}
		if u, err := l.BuyerUnits(ctx, sku, id("carl")); err != nil || u != 2 {
			t.Fatalf("carl's units %d %v, want 2 (his offer counts toward his cap)", u, err)
		}

		// Both offers expire in one sweep: their 3 units fit eve's 3
		// (finn is still capped), and nothing is owed to Redis.
		c.advance(ttl + time.Second)
		if _, err := l.Confirm(ctx, offers["bob"].Offer.ID, id("bob"), ledger.Request{}); !errors.Is(err, ledger.ErrHoldEnded) {
			t.Fatalf("confirm of an expired offer: %v", err)
		}
		done, err := l.ExpireDue(ctx, 100)
		if err != nil || len(done) != 2 {
			t.Fatalf("expire: %d %v, want both offers", len(done), err)
		}
		for _, b := range []string{"bob", "carl"} {
			if r, ok, err := l.RestoreOwed(ctx, "hold", offers[b].Offer.ID); err != nil || !ok || !r.CountsOnly {
				t.Fatalf("restore of %s's expired offer: %+v %v %v, want counts only", b, r, ok, err)
			}
			if e, err := l.WaitEntryOf(ctx, sku, id(b)); err != nil || e.State != ledger.Offered || e.Offer.State != ledger.Expired {
				t.Fatalf("%s after expiry: %+v %v", b, e, err)
			}
		}
		if e, err := l.WaitEntryOf(ctx, sku, id("eve")); err != nil || e.State != ledger.Offered || e.Offer.Quantity != 3 {
			t.Fatalf("eve after the expiry: %+v %v", e, err)
		}
		// carl may join again, at the back (behind finn).
		if e, created, err := l.JoinWaitlist(ctx, sku, id("carl"), 1, ttl); err != nil || !created || e.Ahead != 1 {
			t.Fatalf("carl joins again: %+v %v %v, want behind finn", e, created, err)
		}
		// eve cancels her offer: finn is capped, carl (1) is offered 1,
		// the other 2 are owed to Redis.
		eve, _ := l.WaitEntryOf(ctx, sku, id("eve"))
		if _, changed, err := l.Cancel(ctx, eve.Offer.ID, id("eve"), ledger.Request{}); err != nil || !changed {
			t.Fatalf("cancel eve's offer: %v %v", changed, err)
		}
		if r, ok, err := l.RestoreOwed(ctx, "hold", eve.Offer.ID); err != nil || !ok || r.CountsOnly || r.Quantity != 2 {
			t.Fatalf("restore of eve's cancelled offer: %+v %v %v, want 2 units", r, ok, err)
		}
		carl, err := l.WaitEntryOf(ctx, sku, id("carl"))
		if err != nil || carl.State != ledger.Offered || carl.Offer.Quantity != 1 {
			t.Fatalf("carl after eve's cancel: %+v %v", carl, err)
		}
		if _, err := l.Confirm(ctx, carl.Offer.ID, id("carl"), ledger.Request{}); err != nil {
			t.Fatalf("confirm carl's offer: %v", err)
		}
		// The 2 owed to Redis are taken again; ivy joins.
		if _, err := l.Hold(ctx, hold("h-hal", "hal", 2, c.now().Add(time.Hour)), -1); err != nil {
			t.Fatal(err)
		}
		if _, created, err := l.JoinWaitlist(ctx, sku, id("ivy"), 1, ttl); err != nil || !created {
			t.Fatalf("ivy joins: %v %v", created, err)
		}

		// zed's refund of 1: finn is capped, ivy (1) is offered it.
		// zed's refund of 1: eve (3) does not fit, finn is capped, carl
		// (1) is offered it.
		o, err := l.OrderByKey(ctx, id("o-zed"))
		if err != nil {
			t.Fatal(err)
		}
		if _, changed, err := l.Refund(ctx, o.ID, id("zed"), ledger.Request{}); err != nil || !changed {
			t.Fatalf("refund: %v %v", changed, err)
		}
		if e, err := l.WaitEntryOf(ctx, sku, id("ivy")); err != nil || e.State != ledger.Offered || e.Offer.Quantity != 1 {
			t.Fatalf("ivy after the refund: %+v %v", e, err)
		}
		if r, ok, err := l.RestoreOwed(ctx, "order", o.ID); err != nil || !ok || !r.CountsOnly {
			t.Fatalf("restore of the refund: %+v %v %v, want counts only", r, ok, err)
		}

		events, err := l.Events(ctx, keys.ID{}, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		count := map[string]int{}
		for _, e := range events {
			count[e.Type]++
		}
		if count[ledger.EventOfferMade] != 5 || count[ledger.EventOfferExpired] != 2 || count[ledger.EventWaitlistJoined] != 7 ||
			count[ledger.EventWaitlistLeft] != 1 {
			t.Fatalf("events %v", count)
		}
	})
}

// A pool past the end of its window, not closed yet by the sweeper (which
// may be seconds away, or stuck on a master out of reach), takes no join
// and makes no offer: a unit back then went to a buyer of a pool that
// sells nothing any more, and never reached the line the close moves it
// to (helper-68). Its waiting entries read closed.
func TestWaitlistOfAPoolPastItsWindow(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, clk *clock) {
		ctx := context.Background()
		fans, h := heldPoolWithALine(t, l, "window", ledger.PoolRule{ClosesAt: clk.now().Add(time.Hour)}, clk.now())
		clk.advance(90 * time.Minute) // past the window, before any close
		if _, _, err := l.JoinWaitlist(ctx, fans, keys.MustID("w2"), 1, time.Minute); !errors.Is(err, ledger.ErrPoolClosed) {
			t.Errorf("a join past the pool's window = %v, want ErrPoolClosed", err)
		}
		if e, err := l.WaitEntryOf(ctx, fans, keys.MustID("w1")); err != nil || !e.Closed {
			t.Errorf("w1's entry past the window = %+v, %v; want closed", e, err)
		}
		if _, _, err := l.Cancel(ctx, h.ID, h.Buyer, ledger.Request{}); err != nil {
			t.Fatal(err)
		}
		if e, err := l.WaitEntryOf(ctx, fans, keys.MustID("w1")); err != nil || e.State != ledger.Waiting {
			t.Errorf("w1 after the pool's unit came back past its window = %+v, %v; want still waiting, no offer", e, err)
		}
	})
}

// A pool whose window an admin moved later, after buyers joined its line,
// makes no offer until it opens: every buyer is told pool-not-open, and
// an offer would sell past the window (helper-84). The unit goes back to
// the pool's stock, and the entry waits on (it is not closed: the pool
// will open).
func TestWaitlistOfAPoolMovedToOpenLater(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, clk *clock) {
		ctx := context.Background()
		fans, h := heldPoolWithALine(t, l, "later", ledger.PoolRule{ClosesAt: clk.now().Add(48 * time.Hour)}, clk.now())
		later := ledger.PoolRule{OpensAt: clk.now().Add(24 * time.Hour), ClosesAt: clk.now().Add(48 * time.Hour)}
		if _, err := l.PutPool(ctx, ledger.PoolConfig{SKU: fans, Allotment: 1, Shards: 1, Rule: later}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := l.Cancel(ctx, h.ID, h.Buyer, ledger.Request{}); err != nil {
			t.Fatal(err)
		}
		e, err := l.WaitEntryOf(ctx, fans, keys.MustID("w1"))
		if err != nil || e.State != ledger.Waiting || e.Closed {
			t.Errorf("w1 after a unit came back before the pool opens = %+v, %v; want waiting (not closed), no offer", e, err)
		}
		if st, err := l.SKU(ctx, fans); err != nil || st.Held != 0 || st.Remaining() != 1 {
			t.Errorf("the pool after the cancel = %+v, %v; want its unit back in stock, none held for an offer", st, err)
		}
	})
}

// heldPoolWithALine makes a pool of one unit under rule, held by "fan"
// for two hours from now, and "w1" waiting on its line for one.
func heldPoolWithALine(t *testing.T, l *ledger.Ledger, name string, rule ledger.PoolRule, now time.Time) (stock.SKU, ledger.Hold) {
	t.Helper()
	ctx := context.Background()
	ga := stock.SKU{Program: keys.MustID(fmt.Sprintf("%s%d", name, time.Now().UnixNano())), Ticket: keys.MustID("ga")}
	fans := ga.InPool(keys.MustID("fans"))
	if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: ga, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	if err := putPool(l, fans, 1, rule); err != nil {
		t.Fatal(err)
	}
	h, err := l.Hold(ctx, ledger.Hold{IdempotencyKey: keys.MustID("fan-h1"), SKU: fans, Buyer: keys.MustID("fan"), Quantity: 1,
		ExpiresAt: now.Add(2 * time.Hour), Gate: `[{"shards":1}]`}, -1)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.JoinWaitlist(ctx, fans, keys.MustID("w1"), 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	return fans, h
}

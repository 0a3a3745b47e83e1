package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// replayEvents folds an event log into what it says each SKU has sold and
// holds, and fails on an order or hold with two events of one kind.
func replayEvents(t *testing.T, events []ledger.Event) map[stock.SKU][2]int64 {
	t.Helper()
	out := map[stock.SKU][2]int64{}
	seen := map[string]bool{}
	var last int64
	for _, e := range events {
		if e.Seq <= last {
			t.Fatalf("event %d after %d: the log is not in order", e.Seq, last)
		}
		last = e.Seq
		if !e.Subject.IsZero() {
			k := e.Type + " " + e.Subject.String()
			if seen[k] {
				t.Errorf("%s twice", k)
			}
			seen[k] = true
		}
		c := out[e.SKU]
		switch e.Type {
		case ledger.EventOrderCreated:
			c[0] += e.Quantity
		case ledger.EventOrderRefunded:
			c[0] -= e.Quantity
		case ledger.EventHoldCreated, ledger.EventOfferMade:
			c[1] += e.Quantity
		case ledger.EventHoldConfirmed:
			c[1] -= e.Quantity
			c[0] += e.Quantity
		case ledger.EventHoldCancelled, ledger.EventHoldExpired, ledger.EventOfferExpired:
			c[1] -= e.Quantity
		}
		out[e.SKU] = c
	}
	return out
}

// Random purchases, holds, carts, confirms, cancels, expiries and refunds,
// alone and in batches: every change has one event, written with it, and
// the event log replayed gives each SKU's sold and held as the ledger has
// them. A refused change writes none.
func TestEventsReplayTheLedger(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, clk *clock) {
		ctx := context.Background()
		p := keys.MustID("show-ev")
		var skus []stock.SKU
		for i, total := range []int64{12, 30} {
			s := stock.SKU{Program: p, Ticket: keys.MustID(fmt.Sprintf("t%d", i))}
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: total, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
			skus = append(skus, s)
		}
		rng := rand.New(rand.NewPCG(3, 9))
		var holds []ledger.Hold
		var orders []ledger.Order
		n := 0
		id := func(prefix string) keys.ID {
			n++
			return keys.MustID(fmt.Sprintf("%s-%d", prefix, n))
		}
		buyer := func() keys.ID { return keys.MustID(fmt.Sprintf("b%d", rng.IntN(5))) }
		req := func(b keys.ID, op string) ledger.Request {
			k := id("req")
			return ledger.Request{Scope: b, Key: k, Fingerprint: "fp-" + k.String(), Op: op}
		}
		for range 300 {
			s := skus[rng.IntN(len(skus))]
			b := buyer()
			switch r := rng.IntN(10); {
			case r < 2:
				o, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: id("o"), SKU: s, Buyer: b, Quantity: 1 + rng.Int64N(3), Req: req(b, ledger.OpPurchase)})
				if err == nil {
					orders = append(orders, o)
				}
			case r < 3:
				var takes []ledger.Take
				for range 1 + rng.IntN(4) {
					b := buyer()
					if rng.IntN(2) == 0 {
						takes = append(takes, ledger.HoldTake(ledger.Hold{IdempotencyKey: id("h"), SKU: s, Buyer: b, Quantity: 1 + rng.Int64N(2),
							ExpiresAt: clk.now().Add(time.Duration(1+rng.IntN(3)) * time.Minute), Req: req(b, ledger.OpHold)}))
					} else {
						takes = append(takes, ledger.PurchaseTake(ledger.Order{IdempotencyKey: id("o"), SKU: s, Buyer: b, Quantity: 1 + rng.Int64N(2),
							Req: req(b, ledger.OpPurchase)}))
					}
				}
				for _, r := range l.Commit(ctx, takes, rng.IntN(2) == 0) {
					if r.Err == nil {
						holds = append(holds, r.Holds...)
						orders = append(orders, r.Orders...)
					}
				}
			case r < 4:
				h, err := l.Hold(ctx, ledger.Hold{IdempotencyKey: id("h"), SKU: s, Buyer: b, Quantity: 1 + rng.Int64N(3),
					ExpiresAt: clk.now().Add(time.Minute), Req: req(b, ledger.OpHold)}, -1)
				if err == nil {
					holds = append(holds, h)
				}
			case r < 5:
				c := ledger.Cart{Program: p, Buyer: b, Req: req(b, ledger.OpCart)}
				for _, s := range skus {
					c.Orders = append(c.Orders, ledger.Order{IdempotencyKey: id("l"), SKU: s, Buyer: b, Quantity: 1})
				}
				if got, err := l.PurchaseCart(ctx, c, rng.IntN(2) == 0); err == nil {
					orders = append(orders, got.Orders...)
				}
			case r < 7 && len(holds) > 0:
				h := holds[rng.IntN(len(holds))]
				if rng.IntN(2) == 0 {
					if o, err := l.Confirm(ctx, h.ID, h.Buyer, req(h.Buyer, ledger.OpConfirm)); err == nil {
						orders = append(orders, o)
					}
				} else if _, err := l.CancelBatch(ctx, []ledger.HoldRequest{{HoldID: h.ID, Buyer: h.Buyer, Req: req(h.Buyer, ledger.OpCancel)}}); err != nil {
					t.Fatal(err)
				}
			case r < 8 && len(holds) > 0:
				var cs []ledger.HoldRequest
				for range 3 {
					h := holds[rng.IntN(len(holds))]
					cs = append(cs, ledger.HoldRequest{HoldID: h.ID, Buyer: h.Buyer, Req: req(h.Buyer, ledger.OpConfirm)})
				}
				res, err := l.ConfirmBatch(ctx, cs)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range res {
					if r.Err == nil {
						orders = append(orders, r.Order)
					}
				}
			case r < 9 && len(orders) > 0:
				o := orders[rng.IntN(len(orders))]
				if rng.IntN(2) == 0 {
					_, _, _ = l.Refund(ctx, o.ID, o.Buyer, req(o.Buyer, ledger.OpRefund))
				} else if _, err := l.RefundBatch(ctx, []ledger.OrderRequest{{OrderID: o.ID, Buyer: o.Buyer, Req: req(o.Buyer, ledger.OpRefund)}}); err != nil {
					t.Fatal(err)
				}
			default:
				clk.advance(time.Duration(rng.IntN(90)) * time.Second)
				if _, err := l.ExpireDue(ctx, 50); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := l.EndSale(ctx, skus[0]); err != nil {
			t.Fatal(err)
		}
		var events []ledger.Event
		for after := int64(0); ; {
			page, err := l.Events(ctx, p, after, 100)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			events = append(events, page...)
			after = page[len(page)-1].Seq
		}
		got := replayEvents(t, events)
		kinds := map[string]int{}
		for _, e := range events {
			kinds[e.Type]++
		}
		for _, s := range skus {
			st, err := l.SKU(ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			if c := got[s]; c[0] != st.Sold || c[1] != st.Held {
				t.Errorf("%s: the events say sold %d held %d, the ledger %d and %d", s, c[0], c[1], st.Sold, st.Held)
			}
		}
		if kinds[ledger.EventSaleEnded] != 1 || kinds[ledger.EventSaleSoldOut] == 0 || kinds[ledger.EventHoldExpired] == 0 ||
			kinds[ledger.EventOrderRefunded] == 0 || kinds[ledger.EventHoldConfirmed] == 0 || kinds[ledger.EventHoldCancelled] == 0 {
			t.Errorf("events by kind %v: want every kind of change", kinds)
		}
		t.Logf("%d events: %v", len(events), kinds)
	})
}

// KnownEvents says which of a list of event ids the ledger has: those of
// its changes, not ids it never wrote (a failover's lost commits look
// like those), and refuses more than a page at once.
func TestKnownEvents(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, clk *clock) {
		ctx := context.Background()
		s := stock.SKU{Program: keys.MustID("show-known"), Ticket: keys.MustID("t")}
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			b := keys.MustID("b")
			k := keys.MustID(fmt.Sprintf("k%d", i))
			if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: k, SKU: s, Buyer: b, Quantity: 1,
				Req: ledger.Request{Scope: b, Key: k, Fingerprint: "fp-" + k.String(), Op: ledger.OpPurchase}}); err != nil {
				t.Fatal(err)
			}
		}
		evs, err := l.Events(ctx, s.Program, 0, 100)
		if err != nil || len(evs) != 3 {
			t.Fatalf("events = %d, %v; want 3", len(evs), err)
		}
		ids := []keys.ID{ledger.NewID(), evs[0].ID, evs[2].ID, ledger.NewID()}
		got, err := l.KnownEvents(ctx, ids)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || !slices.Contains(got, evs[0].ID) || !slices.Contains(got, evs[2].ID) {
			t.Errorf("known of %v = %v, want %v and %v", ids, got, evs[0].ID, evs[2].ID)
		}
		if got, err := l.KnownEvents(ctx, nil); err != nil || len(got) != 0 {
			t.Errorf("known of none = %v, %v", got, err)
		}
		many := make([]keys.ID, ledger.MaxKnownEvents+1)
		for i := range many {
			many[i] = ledger.NewID()
		}
		if _, err := l.KnownEvents(ctx, many); !errors.Is(err, stock.ErrInvalid) {
			t.Errorf("known of %d ids: %v, want %v", len(many), err, stock.ErrInvalid)
		}
		if got, err := l.KnownEvents(ctx, many[:ledger.MaxKnownEvents]); err != nil || len(got) != 0 {
			t.Errorf("known of %d new ids = %d, %v; want none", ledger.MaxKnownEvents, len(got), err)
		}
	})
}

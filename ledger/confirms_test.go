package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// A batch of confirms commits every plain confirm in it together and
// splits out, with nothing written, each one that is not plain: a foreign
// buyer, an ended hold, a hold confirmed before, a hold named twice, a key
// used before. Confirm alone then gives each its own answer.
func TestConfirmBatch(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		vip := stock.SKU{Program: sku.Program, Ticket: keys.MustID("vip")}
		for _, s := range []stock.SKU{sku, vip} {
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 20, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
		}
		exp := c.now().Add(time.Minute)
		mk := func(s stock.SKU, key, buyer string, q int64, exp time.Time) ledger.Hold {
			t.Helper()
			h := hold(key, buyer, q, exp)
			h.SKU = s
			got, err := l.Hold(ctx, h, -1)
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		a, b, cc := mk(sku, "h-a", "ann", 2, exp), mk(sku, "h-b", "bob", 3, exp), mk(sku, "h-c", "cat", 1, exp)
		d := mk(vip, "h-d", "dan", 2, exp)
		stalls := putStalls(t, l, 4)
		seat, err := l.Hold(ctx, ledger.Hold{IdempotencyKey: keys.MustID("h-s"), SKU: stalls, Buyer: keys.MustID("sid"), Quantity: 2,
			SeatIDs: []keys.ID{keys.MustID("A-01"), keys.MustID("A-02")}, ExpiresAt: exp, Gate: "seats:A:A-01,A-02"}, -1)
		if err != nil {
			t.Fatal(err)
		}
		e := mk(sku, "h-e", "eve", 1, c.now().Add(time.Second))
		f := mk(sku, "h-f", "fay", 1, exp)
		x := mk(sku, "h-x", "gus", 1, exp)
		if _, err := l.Confirm(ctx, f.ID, f.Buyer, req("fay", "c-f", "confirm f", ledger.OpConfirm)); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("p-gus"), SKU: sku, Buyer: keys.MustID("gus"), Quantity: 1,
			Req: req("gus", "used", "a purchase", ledger.OpPurchase)}); err != nil {
			t.Fatal(err)
		}
		c.advance(2 * time.Second) // e has expired (not swept yet)
		before, _ := l.SKU(ctx, sku)

		batch := []ledger.HoldRequest{
			{HoldID: a.ID, Buyer: a.Buyer, Req: req("ann", "c-a", "confirm a", ledger.OpConfirm)},
			{HoldID: b.ID, Buyer: b.Buyer, Req: req("bob", "c-b", "confirm b", ledger.OpConfirm)},
			{HoldID: cc.ID, Buyer: keys.MustID("eve"), Req: req("eve", "c-c", "confirm c", ledger.OpConfirm)},      // not hers
			{HoldID: d.ID, Buyer: d.Buyer, Req: req("dan", "c-d", "confirm d", ledger.OpConfirm)},                  // another SKU
			{HoldID: e.ID, Buyer: e.Buyer, Req: req("eve", "c-e", "confirm e", ledger.OpConfirm)},                  // expired
			{HoldID: f.ID, Buyer: f.Buyer, Req: req("fay", "c-f2", "confirm f", ledger.OpConfirm)},                 // confirmed before
			{HoldID: a.ID, Buyer: a.Buyer, Req: req("ann", "c-a2", "confirm a", ledger.OpConfirm)},                 // named twice
			{HoldID: x.ID, Buyer: x.Buyer, Req: req("gus", "used", "confirm x", ledger.OpConfirm)},                 // key used
			{HoldID: keys.MustID("nohold"), Buyer: a.Buyer, Req: req("ann", "c-n", "confirm n", ledger.OpConfirm)}, // no such hold
			{HoldID: seat.ID, Buyer: seat.Buyer, Req: req("sid", "c-s", "confirm s", ledger.OpConfirm)},            // seats
		}
		res, err := l.ConfirmBatch(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			plain := i == 0 || i == 1 || i == 3 || i == 9
			switch {
			case plain && (r.Err != nil || r.Order.HoldID != batch[i].HoldID || r.Order.ID.IsZero()):
				t.Errorf("confirm %d = %+v, %v; want its order", i, r.Order, r.Err)
			case !plain && !errors.Is(r.Err, ledger.ErrSplit):
				t.Errorf("confirm %d = %+v, %v; want ErrSplit", i, r.Order, r.Err)
			}
		}
		after, _ := l.SKU(ctx, sku)
		if after.Sold != before.Sold+5 || after.Held != before.Held-5 {
			t.Errorf("sku sold %d→%d held %d→%d, want +5 and -5", before.Sold, after.Sold, before.Held, after.Held)
		}
		if st, _ := l.SKU(ctx, vip); st.Sold != 2 || st.Held != 0 {
			t.Errorf("vip sold %d held %d, want 2 and 0", st.Sold, st.Held)
		}
		if st, _ := l.SKU(ctx, stalls); st.Sold != 2 || st.Held != 0 {
			t.Errorf("stalls sold %d held %d, want 2 and 0", st.Sold, st.Held)
		}
		for _, st := range mustSeats(t, l, stalls) {
			if want := map[bool]string{true: "sold", false: "free"}[st.HoldID == seat.ID]; st.State != want {
				t.Errorf("seat %s is %s (hold %q), want %s", st.ID, st.State, st.HoldID, want)
			}
		}
		// What committed is what Confirm and the requests table answer.
		for _, i := range []int{0, 1, 3, 9} {
			o := res[i].Order
			h, err := l.HoldByID(ctx, batch[i].HoldID)
			if err != nil || h.State != ledger.Confirmed || h.OrderID != o.ID {
				t.Errorf("hold %d after the batch: %+v, %v", i, h, err)
			}
			if got, err := l.OrderByID(ctx, o.ID); err != nil || got.Quantity != h.Quantity || got.Buyer != h.Buyer {
				t.Errorf("order %d: %+v, %v", i, got, err)
			}
			again, err := l.Confirm(ctx, batch[i].HoldID, batch[i].Buyer, batch[i].Req)
			if !errors.Is(err, ledger.ErrDuplicate) || again.ID != o.ID {
				t.Errorf("retry of batched confirm %d = %v, %v; want ErrDuplicate with %s", i, again.ID, err, o.ID)
			}
		}
		// The split ones, decided alone.
		for i, want := range map[int]error{2: ledger.ErrNotOwner, 4: ledger.ErrHoldEnded, 7: ledger.ErrKeyReused, 8: ledger.ErrNotFound} {
			if _, err := l.Confirm(ctx, batch[i].HoldID, batch[i].Buyer, batch[i].Req); !errors.Is(err, want) {
				t.Errorf("confirm %d alone = %v, want %v", i, err, want)
			}
		}
		if o, err := l.Confirm(ctx, f.ID, f.Buyer, batch[5].Req); err != nil || o.HoldID != f.ID {
			t.Errorf("second confirm of f alone = %+v, %v; want its order", o, err)
		}
		if st, _ := l.SKU(ctx, sku); st.Sold != after.Sold || st.Held != after.Held {
			t.Errorf("the split confirms moved stock: sold %d held %d, want %d %d", st.Sold, st.Held, after.Sold, after.Held)
		}
	})
}

// Confirm batches race single confirms, cancels (batched and alone) and
// expiry waves over the same
// holds from two ledgers on one database: every hold ends at most once,
// every confirmed hold has exactly one order, the SKU row agrees with the
// rows, and nothing deadlocks into an error a caller cannot recover from.
func TestConfirmBatchRacing(t *testing.T) {
	for _, driver := range []string{ledger.SQLite, ledger.Postgres} {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			ls, c, _ := openLedgers(t, driver, 2)
			const n = 300
			// A cap (never reached) makes the ledger count every buyer's units.
			if _, err := ls[0].PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: n, Shards: 1, MaxPerOrder: 4, PerBuyer: n}); err != nil {
				t.Fatal(err)
			}
			holds := make([]ledger.Hold, n)
			for i := range n {
				// Lifetimes spread over 20s: the sweeper ends some while
				// they are being confirmed.
				h, err := ls[i%2].Hold(ctx, hold(fmt.Sprintf("h%d", i), fmt.Sprintf("b%d", i), 1, c.now().Add(time.Duration(1+i%20)*time.Second)), -1)
				if err != nil {
					t.Fatal(err)
				}
				holds[i] = h
			}
			var mu sync.Mutex
			confirmed := map[keys.ID]keys.ID{} // hold → order, as answered
			answered := func(hold, order keys.ID) {
				mu.Lock()
				defer mu.Unlock()
				if prev, ok := confirmed[hold]; ok && prev != order {
					t.Errorf("hold %s confirmed as %s and as %s", hold, prev, order)
				}
				confirmed[hold] = order
			}
			alone := func(l *ledger.Ledger, cr ledger.HoldRequest) {
				o, err := l.Confirm(ctx, cr.HoldID, cr.Buyer, cr.Req)
				switch {
				case err == nil, errors.Is(err, ledger.ErrDuplicate):
					answered(cr.HoldID, o.ID)
				case errors.Is(err, ledger.ErrHoldEnded), errors.Is(err, ledger.ErrHoldConfirmed):
				default:
					t.Errorf("confirm alone: %v", err)
				}
			}
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Go(func() {
					l := ls[g%2]
					for round := range 30 {
						var batch []ledger.HoldRequest
						for range 1 + rand.IntN(20) {
							h := holds[rand.IntN(n)]
							// The same key for a hold from every worker: a
							// second worker's confirm is a retry.
							batch = append(batch, ledger.HoldRequest{HoldID: h.ID, Buyer: h.Buyer,
								Req: req(h.Buyer.String(), "c-"+h.ID.String(), "confirm", ledger.OpConfirm)})
						}
						res, err := l.ConfirmBatch(ctx, batch)
						if err != nil {
							// A failed batch (a deadlock, a lost race) wrote
							// nothing or its outcome is unknown: each confirm is
							// asked again alone, which replays what committed.
							t.Logf("worker %d round %d: batch failed, deciding alone: %v", g, round, err)
							for _, cr := range batch {
								alone(l, cr)
							}
							continue
						}
						for i, r := range res {
							if errors.Is(r.Err, ledger.ErrSplit) {
								alone(l, batch[i])
							} else if r.Err != nil {
								t.Errorf("batch confirm: %v", r.Err)
							} else {
								answered(batch[i].HoldID, r.Order.ID)
							}
						}
					}
				})
			}
			wg.Go(func() { // cancels, in batches and alone
				for round := range 12 {
					var batch []ledger.HoldRequest
					for range 1 + rand.IntN(8) {
						h := holds[rand.IntN(n)]
						batch = append(batch, ledger.HoldRequest{HoldID: h.ID, Buyer: h.Buyer,
							Req: req(h.Buyer.String(), "x-"+h.ID.String(), "cancel", ledger.OpCancel)})
					}
					res, err := ls[1].CancelBatch(ctx, batch)
					for i, cr := range batch {
						if err == nil && !errors.Is(res[i].Err, ledger.ErrSplit) {
							continue
						}
						_, _, err := ls[round%2].Cancel(ctx, cr.HoldID, cr.Buyer, cr.Req)
						if err != nil && !errors.Is(err, ledger.ErrHoldConfirmed) && !errors.Is(err, ledger.ErrDuplicate) {
							t.Errorf("cancel: %v", err)
						}
					}
				}
			})
			wg.Go(func() { // the sweeper, with time moving on
				for range 25 {
					c.advance(time.Second)
					if _, err := ls[0].ExpireDue(ctx, 50); err != nil {
						t.Errorf("expire: %v", err)
					}
				}
			})
			wg.Wait()

			st, _ := ls[0].SKU(ctx, sku)
			orders, units, _ := ls[0].OrderTotals(ctx, sku)
			var nConfirmed, nHeld int64
			for _, h := range holds {
				got, err := ls[0].HoldByID(ctx, h.ID)
				if err != nil {
					t.Fatal(err)
				}
				switch got.State {
				case ledger.Confirmed:
					nConfirmed++
					if o, ok := confirmed[h.ID]; !ok || o != got.OrderID {
						t.Errorf("hold %s confirmed as order %s, answered %s (%v)", h.ID, got.OrderID, o, ok)
					}
				case ledger.Held:
					nHeld++
				}
				if got.State != ledger.Confirmed {
					if o, ok := confirmed[h.ID]; ok {
						t.Errorf("hold %s is %s but a confirm answered order %s", h.ID, got.State, o)
					}
				}
			}
			if st.Sold != nConfirmed || orders != nConfirmed || units != nConfirmed || st.Held != nHeld || st.Sold+st.Held > st.Total {
				t.Errorf("sold %d held %d; rows: %d confirmed holds, %d held, %d orders of %d units", st.Sold, st.Held,
					nConfirmed, nHeld, orders, units)
			}
			var counted int64
			for _, h := range holds {
				u, err := ls[0].BuyerUnits(ctx, sku, h.Buyer)
				if err != nil {
					t.Fatal(err)
				}
				counted += u
			}
			if counted != st.Sold+st.Held {
				t.Errorf("buyers count %d units, the SKU has %d sold + %d held", counted, st.Sold, st.Held)
			}
			t.Logf("%s: %d confirmed, %d still held, %d ended", driver, nConfirmed, nHeld, n-nConfirmed-nHeld)
		})
	}
}

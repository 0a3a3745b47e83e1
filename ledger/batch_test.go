package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

func TestPurchaseBatch(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		a, b := sku, stock.SKU{Program: sku.Program, Ticket: keys.MustID("vip")}
		for _, s := range []stock.SKU{a, b} {
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 5, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("taken"), SKU: a, Buyer: keys.MustID("x"), Quantity: 1}); err != nil {
			t.Fatal(err)
		}
		order := func(key string, s stock.SKU, buyer string) ledger.Order {
			return ledger.Order{IdempotencyKey: keys.MustID(key), SKU: s, Buyer: keys.MustID(buyer), Quantity: 1}
		}
		// a has 4 left: 3 new + 1 duplicate fit; b: 2 fit.
		res, err := l.PurchaseBatch(ctx, []ledger.Order{order("a1", a, "p"), order("b1", b, "q"), order("taken", a, "x"),
			order("a2", a, "r"), order("b2", b, "s"), order("a3", a, "t")}, false)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			want := error(nil)
			if i == 2 {
				want = ledger.ErrDuplicate
			}
			if !errors.Is(r.Err, want) || r.Order.ID.IsZero() {
				t.Errorf("result %d = %+v, want err %v", i, r, want)
			}
		}
		expectSold := func(s stock.SKU, want int64) {
			t.Helper()
			st, _ := l.SKU(ctx, s)
			_, units, _ := l.OrderTotals(ctx, s)
			if st.Sold != want || units != want {
				t.Errorf("%s sold %d, order units %d, want %d", s, st.Sold, units, want)
			}
		}
		expectSold(a, 4)
		expectSold(b, 2)
		// a has 1 left: its 2 orders are split out and written nowhere; b's commit.
		res, err = l.PurchaseBatch(ctx, []ledger.Order{order("a4", a, "u"), order("b3", b, "v"), order("a5", a, "w")}, false)
		if err != nil {
			t.Fatal(err)
		}
		if !errors.Is(res[0].Err, ledger.ErrSplit) || res[1].Err != nil || !errors.Is(res[2].Err, ledger.ErrSplit) {
			t.Errorf("results %+v, want split, ok, split", res)
		}
		if _, err := l.OrderByKey(ctx, keys.MustID("a4")); !errors.Is(err, ledger.ErrNotFound) {
			t.Errorf("a split order was written: %v", err)
		}
		expectSold(a, 4)
		expectSold(b, 3)
	})
}

// Batches racing on the same SKUs, half of them direct (optimistic): no
// deadlock, never more than the total, every acknowledged order stored.
func TestPurchaseBatchRacing(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		skus := []stock.SKU{sku, {Program: sku.Program, Ticket: keys.MustID("vip")}, {Program: keys.MustID("other"), Ticket: keys.MustID("ga")}}
		for _, s := range skus {
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 100, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		ok := map[stock.SKU]int64{}
		for g := range 8 {
			wg.Go(func() {
				for round := range 5 {
					var batch []ledger.Order
					for i := range 12 {
						s := skus[(g+i)%3]
						batch = append(batch, ledger.Order{IdempotencyKey: keys.MustID(fmt.Sprintf("g%d-r%d-%d", g, round, i)), SKU: s, Buyer: keys.MustID("b"), Quantity: 1})
					}
					res, err := l.PurchaseBatch(ctx, batch, g%2 == 1)
					if errors.Is(err, ledger.ErrConflict) {
						continue // a direct batch lost the race: nothing written
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					for i, r := range res {
						if r.Err == nil {
							ok[batch[i].SKU]++
						}
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		for _, s := range skus {
			st, _ := l.SKU(ctx, s)
			_, units, _ := l.OrderTotals(ctx, s)
			if st.Sold > st.Total || st.Sold != ok[s] || units != ok[s] {
				t.Errorf("%s: sold %d, order units %d, acknowledged %d, total %d", s, st.Sold, units, ok[s], st.Total)
			}
		}
	})
}

// Batches over different SKUs of one program, whose buyers come in
// different orders, never deadlock on the program's buyer rows: every row
// of the program cap is locked in one order (SKU rows first, then program
// rows, each sorted), so on PostgreSQL no batch is aborted as a deadlock
// victim and every order commits.
func TestBatchProgramRowsDeadlock(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		var skus []stock.SKU
		for _, tk := range []string{"a", "b", "c", "d"} {
			s := stock.SKU{Program: sku.Program, Ticket: keys.MustID(tk)}
			skus = append(skus, s)
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 100_000, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.PutProgram(ctx, sku.Program, 1_000_000); err != nil {
			t.Fatal(err)
		}
		buyers := []keys.ID{keys.MustID("x"), keys.MustID("y"), keys.MustID("z")}
		var wg sync.WaitGroup
		var failed atomic.Int64
		for g := range 8 {
			wg.Go(func() {
				for round := range 25 {
					// Two SKUs per batch, each SKU's buyer a different one,
					// rotating so batches meet the program rows in every order.
					var batch []ledger.Order
					for j := range 2 {
						s := skus[(g+j)%len(skus)]
						b := buyers[(g+round+2*j)%len(buyers)]
						batch = append(batch, ledger.Order{IdempotencyKey: keys.MustID(fmt.Sprintf("d%d-%d-%d", g, round, j)), SKU: s, Buyer: b, Quantity: 1})
					}
					res, err := l.PurchaseBatch(ctx, batch, false)
					if err != nil {
						failed.Add(1)
						t.Logf("batch %d/%d: %v", g, round, err)
						continue
					}
					for _, r := range res {
						if r.Err != nil {
							t.Errorf("an order of a batch: %v", r.Err)
						}
					}
				}
			})
		}
		wg.Wait()
		if n := failed.Load(); n > 0 {
			t.Errorf("%d of 200 batches failed (deadlock victims), want none", n)
		}
		var units int64
		for _, b := range buyers {
			n, _ := l.ProgramUnits(ctx, sku.Program, b)
			units += n
		}
		if units != 400-2*failed.Load() {
			t.Errorf("program rows count %d units, want %d", units, 400-2*failed.Load())
		}
	})
}

// A batch mixing purchases and holds over several SKUs commits them in one
// transaction: held and sold move by their sums, hold rows are live holds a
// confirm can take, retries replay what they stored, a reused key is
// refused, and a hold the SKU cannot cover (over the stock, over a buyer's
// cap, on an ended sale) is split out without failing its neighbours.
func TestCommitBatchMixesPurchasesAndHolds(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		vip := stock.SKU{Program: sku.Program, Ticket: keys.MustID("vip")}
		tight := stock.SKU{Program: sku.Program, Ticket: keys.MustID("tight")}
		ended := stock.SKU{Program: sku.Program, Ticket: keys.MustID("ended")}
		for _, s := range []struct {
			sku      stock.SKU
			total    int64
			perBuyer int64
		}{{sku, 20, 0}, {vip, 20, 2}, {tight, 2, 0}, {ended, 5, 0}} {
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s.sku, Total: s.total, Shards: 1, MaxPerOrder: 4, PerBuyer: s.perBuyer}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.EndSale(ctx, ended); err != nil {
			t.Fatal(err)
		}
		exp := c.now().Add(time.Minute)
		h := func(s stock.SKU, key, buyer string, q int64) ledger.Take {
			return ledger.Take{Hold: &ledger.Hold{IdempotencyKey: keys.MustID("row-" + key), SKU: s, Buyer: keys.MustID(buyer), Quantity: q,
				ExpiresAt: exp, Gate: `[{"shards":1}]`, Req: req(buyer, key, "hold "+key, ledger.OpHold)}}
		}
		p := func(s stock.SKU, key, buyer string, q int64) ledger.Take {
			return ledger.Take{Order: ledger.Order{IdempotencyKey: keys.MustID("row-" + key), SKU: s, Buyer: keys.MustID(buyer), Quantity: q,
				Req: req(buyer, key, "buy "+key, ledger.OpPurchase)}}
		}
		takes := []ledger.Take{
			h(sku, "h1", "ann", 2), p(sku, "p1", "bob", 3), h(vip, "h2", "cat", 2), p(vip, "p2", "dan", 1),
			h(tight, "h3", "eve", 3), // over the stock: split
			h(ended, "h4", "fay", 1), // ended: split
			h(sku, "h5", "gus", 1),
		}
		res, err := l.CommitBatch(ctx, takes, false)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			split := i == 4 || i == 5
			switch {
			case split && !errors.Is(r.Err, ledger.ErrSplit):
				t.Errorf("take %d = %v, want ErrSplit", i, r.Err)
			case !split && r.Err != nil:
				t.Errorf("take %d = %v", i, r.Err)
			case !split && takes[i].Hold != nil && (r.Hold.ID.IsZero() || r.Hold.State != ledger.Held || r.Hold.TakeEpoch != 0):
				t.Errorf("hold %d = %+v", i, r.Hold)
			case !split && takes[i].Hold == nil && r.Order.ID.IsZero():
				t.Errorf("order %d = %+v", i, r.Order)
			}
		}
		for _, w := range []struct {
			sku        stock.SKU
			sold, held int64
		}{{sku, 3, 3}, {vip, 1, 2}, {tight, 0, 0}, {ended, 0, 0}} {
			if st, _ := l.SKU(ctx, w.sku); st.Sold != w.sold || st.Held != w.held {
				t.Errorf("%s: sold %d held %d, want %d %d", w.sku, st.Sold, st.Held, w.sold, w.held)
			}
		}
		if n, _ := l.BuyerUnits(ctx, vip, keys.MustID("cat")); n != 2 {
			t.Errorf("cat counts %d units of vip, want 2 (a hold counts)", n)
		}
		// A batched hold is a hold like any other: confirm it.
		if o, err := l.Confirm(ctx, res[0].Hold.ID, keys.MustID("ann"), req("ann", "c1", "confirm", ledger.OpConfirm)); err != nil || o.Quantity != 2 {
			t.Errorf("confirm of a batched hold = %+v, %v", o, err)
		}
		// Retries replay, in a batch or alone; a reused key is refused; a
		// hold over the buyer's cap is split out.
		again, err := l.CommitBatch(ctx, []ledger.Take{h(sku, "h5", "gus", 1), p(sku, "p1", "bob", 3),
			{Hold: &ledger.Hold{IdempotencyKey: keys.MustID("row-h6"), SKU: sku, Buyer: keys.MustID("gus"), Quantity: 1, ExpiresAt: exp,
				Req: req("gus", "h5", "another hold", ledger.OpHold)}},
			h(vip, "h7", "cat", 1)}, false)
		if err != nil {
			t.Fatal(err)
		}
		if !errors.Is(again[0].Err, ledger.ErrDuplicate) || again[0].Hold.ID != res[6].Hold.ID {
			t.Errorf("retried hold = %+v, %v; want ErrDuplicate with %s", again[0].Hold, again[0].Err, res[6].Hold.ID)
		}
		if !errors.Is(again[1].Err, ledger.ErrDuplicate) || again[1].Order.ID != res[1].Order.ID {
			t.Errorf("retried purchase = %+v, %v; want ErrDuplicate with %s", again[1].Order, again[1].Err, res[1].Order.ID)
		}
		if !errors.Is(again[2].Err, ledger.ErrKeyReused) {
			t.Errorf("reused key = %v, want ErrKeyReused", again[2].Err)
		}
		if !errors.Is(again[3].Err, ledger.ErrSplit) || !errors.Is(again[3].Err, stock.ErrLimit) {
			t.Errorf("hold over the cap = %v, want ErrSplit (limit)", again[3].Err)
		}
		if st, _ := l.SKU(ctx, sku); st.Sold != 5 || st.Held != 1 {
			t.Errorf("after the retries sku sold %d held %d, want 5 and 1", st.Sold, st.Held)
		}
	})
}

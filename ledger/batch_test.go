package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

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

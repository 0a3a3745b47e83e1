package purchase_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard"
)

// TestRetryAfterCrashBetweenRedisAndLedger: a gateway took stock in Redis
// for a key and died before committing. The client's retry (to any replica)
// commits that same stock: one movement, not two.
func TestRetryAfterCrashBetweenRedisAndLedger(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 10, 4, 4)
		d, err := e.Gate.Deduct(context.Background(), shard.Request{SKU: sku, Shards: 4, RequestID: sale.PurchaseGateID(sale.Ask{Buyer: keys.MustID("bob"), Key: keys.MustID("crashed")}, sku, 2), Quantity: 2, MaxQuantity: 4})
		if err != nil || d.Replayed {
			t.Fatalf("Deduct = %+v, %v", d, err)
		}
		r := e.Buy(t, sku, "crashed", "bob", 2)
		if r.Status != 201 {
			t.Fatalf("retry = %d %s, want 201", r.Status, r.Body)
		}
		got := e.State(t, sku)
		if got.Sold != 2 || got.Orders != 1 || got.RedisRemaining != 8 {
			t.Errorf("state = %+v, want sold 2, 1 order, redis remaining 8", got)
		}
	})
}

// TestLedgerRefusalGivesStockBack: Redis believes in more stock than the
// ledger has (a lost write, a stale seed). The ledger refuses the excess,
// buyers get 409, and the stock Redis took for them goes back.
func TestLedgerRefusalGivesStockBack(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 5, 1, 4)
		// Redis now claims 20 units; the ledger has 5.
		if err := e.Gate.Seed(context.Background(), sku, 1, 20, e.Epoch(t, sku), true); err != nil {
			t.Fatal(err)
		}
		counts := systest.BuyAll(40, 40, func(i int) systest.Reply {
			return e.Buy(t, sku, fmt.Sprintf("over-%d", i), "b", 1)
		})
		got := e.State(t, sku)
		if counts[201] != 5 || got.Sold != 5 || got.Orders != 5 {
			t.Errorf("answers %v, state %+v; want exactly 5 sold", counts, got)
		}
		if counts[201]+counts[409] != 40 {
			t.Errorf("answers %v, want only 201 and 409", counts)
		}
		// 20 seeded − 5 committed; every refused take was given back.
		if got.RedisRemaining != 15 {
			t.Errorf("redis remaining = %d, want 15 (refused takes given back)", got.RedisRemaining)
		}
	})
}

// TestRestockClearsSoldOut: after Redis says sold out, further buyers are
// answered from memory; and a restock clears the flag at once.
func TestRestockClearsSoldOut(t *testing.T) {
	e := systest.New(t, ledger.SQLite)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 1, 1, 4)
	if r := e.Buy(t, sku, "one", "b", 1); r.Status != 201 {
		t.Fatalf("buy = %d", r.Status)
	}
	if r := e.Buy(t, sku, "two", "b", 1); r.Status != 409 {
		t.Fatalf("buy after sell-out = %d, want 409", r.Status)
	}
	e.PutSKU(t, sku, 2, 1, 4)
	if r := e.Buy(t, sku, "three", "b", 1); r.Status != 201 {
		t.Errorf("buy after restock = %d %s, want 201", r.Status, r.Body)
	}
}

// TestDriftCheckRepairs: Redis shows less than the ledger (stock stranded
// by a restore that never happened) or more (a write the ledger refused to
// count): the drift check exports the difference and, once it has held
// still for two checks, rebuilds the SKU from the ledger.
func TestDriftCheckRepairs(t *testing.T) {
	for _, redisLeft := range []int64{5, 15} {
		t.Run(fmt.Sprintf("redis=%d", redisLeft), func(t *testing.T) {
			e := systest.Start(t, systest.Options{Driver: ledger.SQLite, Drift: true})
			sku := systest.NewSKU(t)
			e.PutSKU(t, sku, 10, 2, 4)
			if err := e.Gate.Seed(context.Background(), sku, 2, redisLeft, e.Epoch(t, sku), true); err != nil {
				t.Fatal(err)
			}
			sawDrift := 0.0
			systest.WaitFor(t, 5*time.Second, "a drift repair", func() bool {
				sawDrift = max(sawDrift, systest.Counter(t, e.Registry, "stockgate_drift_units", nil))
				return systest.Counter(t, e.Registry, "stockgate_drift_repairs_total", nil) >= 1
			})
			if sawDrift != float64(abs(10-redisLeft)) {
				t.Errorf("drift gauge showed %v, want %d", sawDrift, abs(10-redisLeft))
			}
			if left := e.State(t, sku).RedisRemaining; left != 10 {
				t.Errorf("redis remaining %d after the repair, want 10", left)
			}
		})
	}
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// A purchase that sold the last unit, retried while the SKU's sold-out flag
// is cached, gets its own 201 back (replayed), not a 409.
func TestRetryOfTheLastSaleIsReplayed(t *testing.T) {
	e := systest.New(t, ledger.SQLite)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 1, 1, 4)
	first := e.Buy(t, sku, "last-one", "ann", 1)
	if first.Status != 201 {
		t.Fatalf("buy = %d", first.Status)
	}
	if r := e.Buy(t, sku, "too-late", "bob", 1); r.Status != 409 {
		t.Fatalf("next buyer = %d, want 409 (and the flag cached)", r.Status)
	}
	again := e.Buy(t, sku, "last-one", "ann", 1)
	if again.Status != 201 || again.Header.Get("Idempotent-Replayed") != "true" || string(again.Body) != string(first.Body) {
		t.Errorf("retry of the last sale = %d %s, want the same 201 replayed", again.Status, again.Body)
	}
	if r := e.Buy(t, sku, "last-one", "ann", 2); r.Status != 422 {
		t.Errorf("the same key for another request = %d, want 422", r.Status)
	}
}

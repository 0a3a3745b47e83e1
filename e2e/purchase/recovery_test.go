package gateway_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard"
)

// TestRetryAfterCrashBetweenRedisAndLedger: a gateway took stock in Redis
// for a key and died before committing. The client's retry (to any replica)
// commits that same stock: one movement, not two.
func TestRetryAfterCrashBetweenRedisAndLedger(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver)
		sku := newSKU(t)
		e.putSKU(t, sku, 10, 4, 4)
		d, err := e.gate.Deduct(context.Background(), shard.Request{SKU: sku, Shards: 4, RequestID: sale.PurchaseGateID(sale.Ask{Buyer: keys.MustID("bob"), Key: keys.MustID("crashed")}, sku, 2), Quantity: 2, MaxQuantity: 4})
		if err != nil || d.Replayed {
			t.Fatalf("Deduct = %+v, %v", d, err)
		}
		r := e.buy(t, sku, "crashed", "bob", 2)
		if r.status != 201 {
			t.Fatalf("retry = %d %s, want 201", r.status, r.body)
		}
		got := e.state(t, sku)
		if got.Sold != 2 || got.Orders != 1 || got.RedisRemaining != 8 {
			t.Errorf("state = %+v, want sold 2, 1 order, redis remaining 8", got)
		}
	})
}

// TestLedgerRefusalGivesStockBack: Redis believes in more stock than the
// ledger has (a lost write, a stale seed). The ledger refuses the excess,
// buyers get 409, and the stock Redis took for them goes back.
func TestLedgerRefusalGivesStockBack(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver)
		sku := newSKU(t)
		e.putSKU(t, sku, 5, 1, 4)
		// Redis now claims 20 units; the ledger has 5.
		if err := e.gate.Seed(context.Background(), sku, 1, 20, e.epoch(t, sku), true); err != nil {
			t.Fatal(err)
		}
		counts := e.buyAll(40, 40, func(i int) reply {
			return e.buy(t, sku, fmt.Sprintf("over-%d", i), "b", 1)
		})
		got := e.state(t, sku)
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
	e := newEnv(t, ledger.SQLite)
	sku := newSKU(t)
	e.putSKU(t, sku, 1, 1, 4)
	if r := e.buy(t, sku, "one", "b", 1); r.status != 201 {
		t.Fatalf("buy = %d", r.status)
	}
	if r := e.buy(t, sku, "two", "b", 1); r.status != 409 {
		t.Fatalf("buy after sell-out = %d, want 409", r.status)
	}
	e.putSKU(t, sku, 2, 1, 4)
	if r := e.buy(t, sku, "three", "b", 1); r.status != 201 {
		t.Errorf("buy after restock = %d %s, want 201", r.status, r.body)
	}
}

// TestDriftCheckRepairs: Redis shows less than the ledger (stock stranded
// by a restore that never happened) or more (a write the ledger refused to
// count): the drift check exports the difference and, once it has held
// still for two checks, rebuilds the SKU from the ledger.
func TestDriftCheckRepairs(t *testing.T) {
	for _, redisLeft := range []int64{5, 15} {
		t.Run(fmt.Sprintf("redis=%d", redisLeft), func(t *testing.T) {
			e := startEnv(t, envOptions{driver: ledger.SQLite, drift: true})
			sku := newSKU(t)
			e.putSKU(t, sku, 10, 2, 4)
			if err := e.gate.Seed(context.Background(), sku, 2, redisLeft, e.epoch(t, sku), true); err != nil {
				t.Fatal(err)
			}
			sawDrift := 0.0
			waitFor(t, 5*time.Second, "a drift repair", func() bool {
				sawDrift = max(sawDrift, counter(t, e.reg, "stockgate_drift_units", nil))
				return counter(t, e.reg, "stockgate_drift_repairs_total", nil) >= 1
			})
			if sawDrift != float64(abs(10-redisLeft)) {
				t.Errorf("drift gauge showed %v, want %d", sawDrift, abs(10-redisLeft))
			}
			if left := e.state(t, sku).RedisRemaining; left != 10 {
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
	e := newEnv(t, ledger.SQLite)
	sku := newSKU(t)
	e.putSKU(t, sku, 1, 1, 4)
	first := e.buy(t, sku, "last-one", "ann", 1)
	if first.status != 201 {
		t.Fatalf("buy = %d", first.status)
	}
	if r := e.buy(t, sku, "too-late", "bob", 1); r.status != 409 {
		t.Fatalf("next buyer = %d, want 409 (and the flag cached)", r.status)
	}
	again := e.buy(t, sku, "last-one", "ann", 1)
	if again.status != 201 || again.header.Get("Idempotent-Replayed") != "true" || string(again.body) != string(first.body) {
		t.Errorf("retry of the last sale = %d %s, want the same 201 replayed", again.status, again.body)
	}
	if r := e.buy(t, sku, "last-one", "ann", 2); r.status != 422 {
		t.Errorf("the same key for another request = %d, want 422", r.status)
	}
}

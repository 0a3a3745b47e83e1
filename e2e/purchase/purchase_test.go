package purchase_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
)

// TestFlashSale: 2,000 concurrent buyers of one ticket each, stock 100.
func TestFlashSale(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		for _, shards := range []int{1, 8} {
			t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
				e := systest.New(t, driver)
				sku := systest.NewSKU(t)
				e.PutSKU(t, sku, 100, shards, 4)
				// A buyer's client sends a 503 again with its key, as
				// docs/API.md tells it to: on a busy machine a winner can
				// wait past the ledger's wait budget and be shed.
				var shed atomic.Int64
				counts := systest.BuyAll(2000, 200, func(i int) systest.Reply {
					r, tries := e.Retried(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", fmt.Sprintf("flash-%d", i),
						fmt.Sprintf(`{"buyer":"buyer-%d","quantity":1}`, i))
					shed.Add(int64(tries))
					if r.Status != http.StatusCreated && r.Status != http.StatusConflict {
						t.Logf("flash-%d = %d %s", i, r.Status, r.Body)
					}
					return r
				})
				got := e.State(t, sku)
				t.Logf("%s shards=%d: answers %v (%d shed and sent again); ledger orders %d sold %d; redis remaining %d",
					driver, shards, counts, shed.Load(), got.Orders, got.Sold, got.RedisRemaining)
				if counts[201] != 100 || counts[409] != 1900 || len(counts) != 2 {
					t.Errorf("answers = %v, want 100×201 and 1900×409", counts)
				}
				// Every 503 is one the replica counted as shed, or one
				// a Redis fault explains.
				if n := systest.Counter(t, e.Registry, "stockgate_ledger_shed_total", nil); shed.Load() > int64(n) && !e.RedisFaulted(t) {
					t.Errorf("%d answers were 503, %v counted as shed and no Redis fault", shed.Load(), n)
				}
				if got.Orders != 100 || got.Sold != 100 || got.OrderUnits != 100 || got.RedisRemaining != 0 {
					t.Errorf("state = %+v, want 100 orders, sold 100, redis remaining 0", got)
				}
			})
		}
	})
}

// TestMixedQuantities: q in 1..4 racing for 50 units over 8 shards.
func TestMixedQuantities(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 50, 8, 4)
		var mu sync.Mutex
		var units int64
		var created []string
		var wg sync.WaitGroup
		for i := range 300 {
			wg.Go(func() {
				key := fmt.Sprintf("mixed-%d", i)
				q := int64(i%4 + 1)
				// 300 at once can time Redis calls out on a busy machine,
				// and the open breaker sheds: sent again with the key.
				r, _ := e.Retried(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", key, fmt.Sprintf(`{"buyer":"b","quantity":%d}`, q))
				switch r.Status {
				case 201:
					var o struct {
						OrderID  string `json:"order_id"`
						Quantity int64  `json:"quantity"`
					}
					if err := json.Unmarshal(r.Body, &o); err != nil || o.Quantity != q {
						t.Errorf("201 body %s: %v", r.Body, err)
					}
					mu.Lock()
					units += q
					created = append(created, key)
					mu.Unlock()
				case 409:
				default:
					t.Errorf("purchase = %d %s", r.Status, r.Body)
				}
			})
		}
		wg.Wait()
		got := e.State(t, sku)
		if got.Sold > 50 || got.Sold != units || got.OrderUnits != units {
			t.Errorf("sold %d, order units %d, acknowledged units %d; want equal and <= 50", got.Sold, got.OrderUnits, units)
		}
		switch {
		case got.Sold+got.RedisRemaining == 50:
		case e.RedisFaulted(t):
			// Takes went around an open breaker (the ledger alone), or a
			// give-back failed: the gate is repaired later, by design.
			t.Logf("sold %d + redis remaining %d != 50 after a Redis fault", got.Sold, got.RedisRemaining)
		default:
			t.Errorf("sold %d + redis remaining %d != 50", got.Sold, got.RedisRemaining)
		}
		for _, key := range created {
			if _, err := systest.OrderOf(context.Background(), e.Ledger, "b", key); err != nil {
				t.Errorf("201 for key %s but no order row: %v", key, err)
			}
		}
		t.Logf("%s: %d units sold in %d orders, redis remaining %d", driver, units, len(created), got.RedisRemaining)
	})
}

// TestSameKeyConcurrently: 20 copies of one request at once.
func TestSameKeyConcurrently(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 10, 2, 4)
		replies := make([]systest.Reply, 20)
		var wg sync.WaitGroup
		for i := range replies {
			wg.Go(func() { replies[i] = e.Buy(t, sku, "same-key", "alice", 3) })
		}
		wg.Wait()
		var first []byte
		for i, r := range replies {
			if r.Status != 201 {
				t.Fatalf("copy %d = %d %s, want 201", i, r.Status, r.Body)
			}
			if first == nil {
				first = r.Body
			}
			if diff := cmp.Diff(string(first), string(r.Body)); diff != "" {
				t.Errorf("copy %d differs (-first +this):\n%s", i, diff)
			}
		}
		// A later retry replays the stored answer.
		r := e.Buy(t, sku, "same-key", "alice", 3)
		if r.Status != 201 || !bytes.Equal(r.Body, first) || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry = %d %s (replayed %q), want the first answer", r.Status, r.Body, r.Header.Get("Idempotent-Replayed"))
		}
		// The same key for a different request is refused and moves nothing.
		before := e.State(t, sku)
		if r := e.Buy(t, sku, "same-key", "alice", 2); r.Status != 422 {
			t.Errorf("reused key = %d %s, want 422", r.Status, r.Body)
		}
		got := e.State(t, sku)
		if got != before || got.Sold != 3 || got.Orders != 1 || got.RedisRemaining != 7 {
			t.Errorf("state = %+v, want one order of 3 and redis remaining 7 (before %+v)", got, before)
		}
	})
}

func TestAdminValidation(t *testing.T) {
	e := systest.New(t, ledger.SQLite)
	sku := systest.NewSKU(t)
	path := "/v1/admin/skus/" + sku.Program.String() + "/" + sku.Ticket.String()
	for _, body := range []string{`{"total":-1}`, `{"total":10,"shards":0}`, `{"total":10,"shards":257}`,
		`{"total":10,"max_per_order":0}`, `{}`, `{"total":1.5}`, `[`} {
		if r := e.Do(t, http.MethodPut, path, nil, body); r.Status < 400 || r.Status >= 500 {
			t.Errorf("PUT %s = %d %s, want 4xx", body, r.Status, r.Body)
		}
	}
	if r := e.Do(t, http.MethodGet, path, nil, ""); r.Status != 404 {
		t.Errorf("GET after refused PUTs = %d, want 404 (nothing created)", r.Status)
	}
	e.PutSKU(t, sku, 5, 1, 4)
	e.MustBuy(t, sku, "a1", "b", 3)
	if r := e.Do(t, http.MethodPut, path, nil, `{"total":2}`); r.Status != 409 {
		t.Errorf("PUT total below sold = %d %s, want 409", r.Status, r.Body)
	}
	// Restock: the new units are buyable at once.
	e.PutSKU(t, sku, 10, 2, 4)
	if got := e.State(t, sku); got.RedisRemaining != 7 || got.Sold != 3 {
		t.Errorf("after restock state = %+v, want redis remaining 7, sold 3", got)
	}
}

func TestStockRead(t *testing.T) {
	e := systest.New(t, ledger.SQLite)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 12, 3, 4)
	r := e.Do(t, http.MethodGet, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/stock", nil, "")
	var v struct {
		Remaining int64 `json:"remaining"`
		SoldOut   bool  `json:"sold_out"`
	}
	if r.Status != 200 || json.Unmarshal(r.Body, &v) != nil || v.Remaining != 12 || v.SoldOut {
		t.Errorf("GET stock = %d %s, want remaining 12", r.Status, r.Body)
	}
	if r := e.Do(t, http.MethodGet, "/v1/skus/"+sku.Program.String()+"/nope/stock", nil, ""); r.Status != 404 {
		t.Errorf("GET stock of unknown sku = %d, want 404", r.Status)
	}
	if r := e.Do(t, http.MethodGet, "/livez", nil, ""); r.Status != 200 {
		t.Errorf("livez = %d", r.Status)
	}
	if r := e.Do(t, http.MethodGet, "/readyz", nil, ""); r.Status != 200 {
		t.Errorf("readyz = %d", r.Status)
	}
}

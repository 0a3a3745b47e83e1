package purchase_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// slowTakes makes the ledger commit takes at a pace of perTake each: a
// ledger with less capacity than the load it gets.
type slowTakes struct {
	sale.Ledger
	perTake time.Duration
}

func (l slowTakes) Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult {
	time.Sleep(time.Duration(len(takes)) * l.perTake) // time under test: a ledger slower than the load
	return l.Ledger.Commit(ctx, takes, direct)
}

// Purchases beyond what the ledger can commit within the wait budget are
// refused at once, 503 overloaded with Retry-After, and move nothing: their
// units go back to the gate, so the ledger sells exactly the purchases
// answered 201 and Redis holds the rest. The refused ones, retried with
// their keys once the storm is over, all sell.
func TestOverloadShedsAtTheLedger(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		// The drift check runs: a shed take whose give-back met Redis timing
		// out (a busy machine opens the breaker, and the give-back stops at
		// an open breaker) is repaired by it, as in production; what the
		// ledger sold is the answers' alone.
		e := systest.Start(t, systest.Options{Driver: driver, Drift: true, Tune: func(o *app.Options) {
			o.Sale.LedgerWaitBudget = 100 * time.Millisecond
			o.Sale.CommitLanes = 1
			o.Sale.BatchMax = 16 // full batches: the lane learns its pace
			o.WrapLedger = func(l sale.Ledger) sale.Ledger { return slowTakes{Ledger: l, perTake: 2 * time.Millisecond} }
		}})
		sku := stock.SKU{Program: keys.MustID("shed-" + driver), Ticket: keys.MustID("ga")}
		const total, n = 1000, 600
		e.PutSKU(t, sku, total, 4, 4)
		var mu sync.Mutex
		var refused []int
		counts := systest.BuyAll(n, 200, func(i int) systest.Reply {
			r := e.Buy(t, sku, fmt.Sprintf("k%d", i), fmt.Sprintf("b%d", i), 1)
			if r.Status == http.StatusServiceUnavailable {
				var p struct{ Type string }
				_ = json.Unmarshal(r.Body, &p)
				if p.Type != "https://stockgate.dev/problems/overloaded" || r.Header.Get("Retry-After") == "" {
					t.Errorf("a refusal = %s (Retry-After %q), want overloaded with Retry-After", r.Body, r.Header.Get("Retry-After"))
				}
				mu.Lock()
				refused = append(refused, i)
				mu.Unlock()
			}
			return r
		})
		if counts[http.StatusCreated]+counts[http.StatusServiceUnavailable] != n || counts[http.StatusServiceUnavailable] == 0 {
			t.Fatalf("answers %v, want %d of 201 and 503, some 503", counts, n)
		}
		sold := int64(counts[http.StatusCreated])
		// Bounded; on time-out the check below says what stands.
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) { // poll interval
			if s := e.State(t, sku); s.Sold == sold && s.RedisRemaining == total-sold {
				break
			}
		}
		if s := e.State(t, sku); s.Sold != sold || s.Orders != sold || s.RedisRemaining != total-sold {
			t.Fatalf("after the storm %+v, want %d sold and %d in Redis", s, sold, total-sold)
		}
		t.Logf("%s: %d sold, %d shed", driver, sold, len(refused))
		for _, i := range refused {
			// Bounded; a retry still shed at the end is reported with its answer.
			var r systest.Reply
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) { // poll interval
				r = e.Buy(t, sku, fmt.Sprintf("k%d", i), fmt.Sprintf("b%d", i), 1)
				if r.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
					break
				}
			}
			if r.Status != http.StatusCreated {
				t.Fatalf("retry of shed purchase %d = %d %s", i, r.Status, r.Body)
			}
		}
		if s := e.State(t, sku); s.Sold != n || s.RedisRemaining != total-n {
			t.Errorf("after the retries %+v, want %d sold", s, n)
		}
	})
}

// A replica with more takes in flight than it answers within the wait
// budget refuses the next at once, before the gate: 503 overloaded, with
// Retry-After, nothing taken. With a floor of 8 takes in flight and a
// slow ledger, 100 buyers at once: every answer 201 or 503, the ledger
// sells the 201s, Redis still holds everything else, and each refused
// buyer buys on retry.
func TestOverloadShedsAtTheDoor(t *testing.T) {
	e := systest.Start(t, systest.Options{Driver: ledger.SQLite, Tune: func(o *app.Options) {
		o.Sale.TakesInFlight = 8
		o.Sale.LedgerWaitBudget = time.Hour // only the door sheds here
		o.WrapLedger = func(l sale.Ledger) sale.Ledger { return slowTakes{Ledger: l, perTake: 20 * time.Millisecond} }
	}})
	sku := stock.SKU{Program: keys.MustID("door"), Ticket: keys.MustID("ga")}
	const total, n = 500, 100
	e.PutSKU(t, sku, total, 2, 4)
	var mu sync.Mutex
	var refused []int
	counts := systest.BuyAll(n, n, func(i int) systest.Reply {
		r := e.Buy(t, sku, fmt.Sprintf("d%d", i), fmt.Sprintf("b%d", i), 1)
		if r.Status == http.StatusServiceUnavailable {
			if r.Header.Get("Retry-After") == "" || !strings.Contains(string(r.Body), "in flight") {
				t.Errorf("a refusal = %s (Retry-After %q), want overloaded, in flight, with Retry-After", r.Body, r.Header.Get("Retry-After"))
			}
			mu.Lock()
			refused = append(refused, i)
			mu.Unlock()
		}
		return r
	})
	if counts[http.StatusCreated]+counts[http.StatusServiceUnavailable] != n || len(refused) == 0 {
		t.Fatalf("answers %v, want 201s and some 503", counts)
	}
	sold := int64(counts[http.StatusCreated])
	if s := e.State(t, sku); s.Sold != sold || s.RedisRemaining != total-sold {
		t.Fatalf("after the burst %+v, want %d sold and the rest in Redis", s, sold)
	}
	for _, i := range refused {
		var r systest.Reply
		systest.WaitFor(t, 10*time.Second, "a refused buyer buys on retry", func() bool {
			r = e.Buy(t, sku, fmt.Sprintf("d%d", i), fmt.Sprintf("b%d", i), 1)
			return r.Status != http.StatusServiceUnavailable
		})
		if r.Status != http.StatusCreated {
			t.Fatalf("retry of refused purchase %d = %d %s", i, r.Status, r.Body)
		}
	}
	if s := e.State(t, sku); s.Sold != n || s.RedisRemaining != total-n {
		t.Errorf("after the retries %+v, want %d sold", s, n)
	}
}

package failover_test

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
)

// TestFaultLedgerSlowShedsAtOnce: PostgreSQL answers, but half a second
// slower per round trip (a saturated or distant primary). A commit then
// takes longer than the wait budget (250 ms), and a request queued behind
// one would wait it out and then its own: the replica refuses such
// requests at once, 503 overloaded with Retry-After (stock given back),
// instead of answering them seconds later. Counted: of 240 purchases from
// 24 clients, at least 80 % are refused at the lane's door, the queue
// never holds a request past the budget beyond one per client at the
// fault's onset, no answer is a 5xx other than 503 or a client's error,
// and nothing is sold twice or lost: once the link is fast again the
// refused purchases, sent again with their keys, sell exactly once, and
// Redis equals the ledger.
func TestFaultLedgerSlowShedsAtOnce(t *testing.T) {
	systest.FullTier(t)
	link, dsn := systest.LedgerLink(t, systest.LedgerDSN(t, ledger.Postgres))
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: func(o *app.Options) {
		o.Sale.SettingsTTL = time.Minute // every purchase reaches the commit
		o.Sale.LedgerWaitBudget = 250 * time.Millisecond
	}})
	sku := systest.NewSKU(t)
	const total, warm, during, clients = 1000, 40, 240, 24
	e.PutSKU(t, sku, total, 2, 4)
	// The warm-up is sent as a client sends it: at production's 250 ms
	// budget a loaded make test shed 2 of 40 before the fault; a 503 is
	// sent again with its key.
	if got := systest.BuyAll(warm, 8, func(i int) systest.Reply {
		r, _ := e.Retried(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", fmt.Sprintf("warm-%d", i), `{"buyer":"b","quantity":1}`)
		return r
	}); got[http.StatusCreated] != warm {
		t.Fatalf("before the fault: %v", got)
	}
	queuedPast := func() uint64 { return waitedPast(t, e, "takes", 0.25) }
	before := queuedPast()

	link.Latency(t, 250*time.Millisecond) // each way: a round trip pays 500 ms more
	var mu sync.Mutex
	kinds := map[string]int{}
	noRetryAfter := 0
	var took []time.Duration
	got := systest.BuyAll(during, clients, func(i int) systest.Reply {
		began := time.Now()
		r := e.Buy(t, sku, fmt.Sprintf("slow-%d", i), "b", 1)
		mu.Lock()
		defer mu.Unlock()
		took = append(took, time.Since(began))
		kinds[systest.ProblemKind(r)]++
		if r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") == "" {
			noRetryAfter++
		}
		return r
	})
	past := queuedPast() - before
	link.Heal(t)
	slices.Sort(took)
	t.Logf("PostgreSQL 500 ms slower: answers %v %v; queued past the budget %d; answer time median %v, p90 %v, slowest %v",
		got, kinds, past, took[len(took)/2].Round(time.Millisecond), took[len(took)*9/10].Round(time.Millisecond),
		took[len(took)-1].Round(time.Millisecond))
	for status := range got {
		if status != http.StatusCreated && status != http.StatusServiceUnavailable {
			t.Errorf("answered %d with the ledger slow (%v): want 201 or 503", status, got)
		}
	}
	if kinds["overloaded"] < during*8/10 || noRetryAfter != 0 {
		t.Errorf("refused as overloaded %d of %d (%v), %d 503s without Retry-After; want at least 80 %% at once, each with it",
			kinds["overloaded"], during, kinds, noRetryAfter)
	}
	if past > clients {
		t.Errorf("%d requests waited in the queue past the budget; want at most one per client (%d), at the fault's onset", past, clients)
	}

	sold := got[http.StatusCreated]
	for i := range during {
		r, _ := e.Retried(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", fmt.Sprintf("slow-%d", i), `{"buyer":"b","quantity":1}`)
		if r.Status != http.StatusCreated {
			t.Errorf("slow-%d sent again once the link was fast = %d %s", i, r.Status, r.Body)
		}
	}
	st := e.State(t, sku)
	if st.Orders != warm+during || st.Sold != warm+during || st.OrderUnits != st.Sold {
		t.Errorf("ledger %+v after %d + %d purchases (%d sold in the fault), want each once", st, warm, during, sold)
	}
	systest.RedisConsistent(t, e, sku)
}

// waitedPast is how many requests of the work waited in a ledger lane's
// queue longer than bound seconds (a bucket bound of the histogram).
func waitedPast(t *testing.T, e *systest.Env, work string, bound float64) uint64 {
	t.Helper()
	n, ok := systest.Histogram(t, e.Registry, "stockgate_ledger_queue_wait_seconds", map[string]string{"work": work}).Past(bound)
	if !ok {
		t.Fatalf("stockgate_ledger_queue_wait_seconds has no bucket at %v", bound)
	}
	return n
}

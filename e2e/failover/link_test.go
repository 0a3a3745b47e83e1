package failover_test

import (
	"fmt"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
)

// TestFaultLedgerLinkBlackHole: the link to PostgreSQL dies silently
// mid-sale (every byte dropped, no connection closed, as when a network
// path or a primary's host vanishes) and comes back. While it is cut,
// every purchase is answered 503 with Retry-After, none 201 and none a
// client's error, none at the door (a program's waiting-room setting is
// answered as last read); a Redis breaker never opens (the fault is the
// ledger's); afterwards each refused purchase sent again with its key is
// sold exactly once (a COMMIT whose reply the cut swallowed answers its
// order), the ledger, Redis and the answers agree, the connection pool
// the fault left behind shrinks back to what a quiet replica holds, and
// no goroutine the cut started is left running.
func TestFaultLedgerLinkBlackHole(t *testing.T) {
	systest.FullTier(t)
	link, dsn := systest.LedgerLink(t, systest.LedgerDSN(t, ledger.Postgres))
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: func(o *app.Options) {
		o.Ledger.IdleTimeout = 300 * time.Millisecond
		o.Sale.WorkTimeout = 1500 * time.Millisecond
		o.Sale.SettingsTTL = time.Minute // every purchase reaches the commit
	}})
	sku := systest.NewSKU(t)
	const total, before, during = 400, 60, 120
	e.PutSKU(t, sku, total, 2, 4)
	if got := systest.BuyAll(before, 12, func(i int) systest.Reply {
		return e.Buy(t, sku, fmt.Sprintf("before-%d", i), "b", 1)
	}); got[http.StatusCreated] != before {
		t.Fatalf("before the cut: %v", got)
	}
	// The goroutines of a replica at work, less the test client's idle
	// connections (each holds some on both ends); the tests of this
	// package run one at a time, so the count is this one's.
	e.Client.CloseIdleConnections()
	base := runtime.NumGoroutine()

	link.Cut(t)
	var mu sync.Mutex
	noRetryAfter := 0
	kinds := map[string]int{}
	door := 0
	var slowest time.Duration
	cut := systest.BuyAll(during, 24, func(i int) systest.Reply {
		began := time.Now()
		r := e.Buy(t, sku, fmt.Sprintf("cut-%d", i), "b", 1)
		mu.Lock()
		defer mu.Unlock()
		slowest = max(slowest, time.Since(began))
		kinds[systest.ProblemKind(r)]++
		if strings.Contains(string(r.Body), "ledger unavailable; repeat the request") {
			door++
		}
		if r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") == "" {
			noRetryAfter++
		}
		return r
	})
	// /readyz follows the ledger: not ready while it takes no writes
	// (the load balancer sends elsewhere), ready again once it does.
	ready := func() int { return e.Do(t, http.MethodGet, "/readyz", nil, "").Status }
	systest.WaitFor(t, 15*time.Second, "/readyz to fail with the ledger's link cut", func() bool {
		return ready() == http.StatusServiceUnavailable
	})
	if w := systest.Counter(t, e.Registry, "stockgate_ledger_writable", map[string]string{"primary": "main"}); w != 0 {
		t.Errorf("stockgate_ledger_writable = %v with the link cut, want 0", w)
	}
	link.Heal(t)
	systest.WaitFor(t, 15*time.Second, "/readyz to pass once the link heals", func() bool { return ready() == http.StatusOK })
	if w := systest.Counter(t, e.Registry, "stockgate_ledger_writable", map[string]string{"primary": "main"}); w != 1 {
		t.Errorf("stockgate_ledger_writable = %v once the link healed, want 1", w)
	}
	t.Logf("with the link cut: %v %v, the slowest answered in %v", cut, kinds, slowest.Round(time.Millisecond))
	if cut[http.StatusServiceUnavailable] != during || noRetryAfter != 0 {
		t.Errorf("with the link cut: answers %v, %d 503s without Retry-After; want %d x 503 with it", cut, noRetryAfter, during)
	}
	// The door answers from the program's waiting-room setting as last
	// read: none is refused there for the ledger (each such refusal held
	// its buyer for the read's 5 s first).
	if door > 0 {
		t.Errorf("with the link cut: %d purchases refused at the door (the waiting-room setting unread), want 0", door)
	}

	// Sent again with their keys, as a platform's workers do.
	sold := 0
	for i := range during {
		r, _ := e.Retried(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", fmt.Sprintf("cut-%d", i), `{"buyer":"b","quantity":1}`)
		if r.Status != http.StatusCreated {
			t.Errorf("cut-%d sent again after the link healed = %d %s", i, r.Status, r.Body)
			continue
		}
		sold++
	}
	got := e.State(t, sku)
	if got.Orders != before+int64(sold) || got.Sold != before+int64(sold) || got.OrderUnits != got.Sold {
		t.Errorf("ledger %+v after %d + %d purchases answered 201", got, before, sold)
	}
	systest.RedisConsistent(t, e, sku)
	if n := systest.Counter(t, e.Registry, "stockgate_breaker_transitions_total", map[string]string{"to": "open"}); n != 0 {
		t.Errorf("a Redis breaker opened %v times while the ledger's link was cut", n)
	}

	// The pool: connections the cut broke are dropped, and those a burst
	// opened close after IdleTimeout; a quiet replica keeps at most a
	// couple.
	open := func() float64 {
		return systest.Counter(t, e.Registry, "go_sql_open_connections", map[string]string{"db_name": "ledger"})
	}
	// Reads of an order over a slow link, 32 at once, open one
	// connection each.
	order := systest.OrderID(e.Buy(t, sku, "cut-0", "b", 1))
	link.Latency(t, 20*time.Millisecond)
	var peak float64
	systest.BuyAll(320, 32, func(int) systest.Reply {
		r := e.Do(t, http.MethodGet, "/v1/orders/"+order, nil, "")
		mu.Lock()
		peak = max(peak, open())
		mu.Unlock()
		return r
	})
	link.Heal(t)
	if peak <= 2 {
		t.Errorf("the slow reads opened %v connections at most: the shrink below is not shown", peak)
	}
	systest.WaitUntil(30*time.Second, func() bool { return open() <= 2 })
	closedIdle := systest.Counter(t, e.Registry, "go_sql_max_idle_time_closed_total", map[string]string{"db_name": "ledger"})
	t.Logf("ledger connections: %v at most in a burst of slow reads, %v when quiet (%v closed idle)", peak, open(), closedIdle)
	if n := open(); n > 2 {
		t.Errorf("%v ledger connections open 30s after the fault on a quiet replica, want at most 2", n)
	}

	// Nothing the cut started is left running: every request that waited
	// on the silent link, its batch, its retries and its timers ended.
	goroutinesBackTo(t, e, base)
}

// goroutinesBackTo waits up to 30 s for the test process to run no more
// than two goroutines beyond base, the count before a fault, and fails
// with every stack if it does not: nothing the fault started (a request
// waiting on a silent link, its batch, its retries, its timers) is left.
// The tests of this package run one at a time, so the count is the
// test's own.
func goroutinesBackTo(t *testing.T, e *systest.Env, base int) {
	t.Helper()
	e.Client.CloseIdleConnections()
	systest.WaitUntil(30*time.Second, func() bool { return runtime.NumGoroutine() <= base+2 })
	t.Logf("goroutines: %d before the fault, %d after it", base, runtime.NumGoroutine())
	if n := runtime.NumGoroutine(); n > base+2 {
		var stacks strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		t.Errorf("%d goroutines 30 s after the fault, %d before it:\n%s", n, base, stacks.String())
	}
}

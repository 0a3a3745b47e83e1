package security_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/ledger"
)

// Two replicas behind one load balancer draw on one budget per client,
// kept in Redis: 60 quick requests from one client, alternating between
// them, at 1 a second with bursts of 20, are limited as 60 to one
// replica would be (about the 40 over the burst), not as 30 to each
// (about 20 over two bursts). Each 429 is problem+json with the wait in
// Retry-After. With Redis out (every node paused), each replica's own
// limiter decides, and says so in its metrics.
func TestRateLimitSharedByReplicas(t *testing.T) {
	c := testenv.NewCluster(t, testenv.ClusterOptions{})
	dsn := systest.LedgerDSN(t, ledger.SQLite)
	scope := testenv.ID(t, "rate")
	start := func() *systest.Env {
		return systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Cluster: c, RateScope: scope,
			Tune: func(o *app.Options) { o.HTTP.RatePerClient, o.HTTP.RateBurst = 1, 20 }})
	}
	a, b := start(), start()
	sku := systest.NewSKU(t)
	a.PutSKU(t, sku, 10, 1, 4)
	send := func(n int) (limited int) {
		for i := range n {
			e := []*systest.Env{a, b}[i%2]
			r := e.Do(t, http.MethodGet, systest.SKUPath(sku)+"/stock", nil, "")
			switch r.Status {
			case http.StatusTooManyRequests:
				limited++
				if r.Header.Get("Content-Type") != "application/problem+json" || r.Header.Get("Retry-After") == "" {
					t.Errorf("429 with Content-Type %q, Retry-After %q", r.Header.Get("Content-Type"), r.Header.Get("Retry-After"))
				}
			case http.StatusOK:
			default:
				t.Errorf("stock read = %d %s", r.Status, r.Body)
			}
		}
		return limited
	}
	// A token a second refills a shared budget by one per second of the
	// run and two replicas' own by two: 30 separates them for runs of up
	// to 10 s.
	limited := send(60)
	t.Logf("Redis up: %d of 60 limited", limited)
	if limited < 30 {
		t.Errorf("%d of 60 requests to two replicas limited, want at least 30 (one budget for the client)", limited)
	}
	// A budget call that Redis doesn't answer within the limiter's 50 ms
	// is decided by the replica's own bucket, by design: on a busy 2-core
	// machine one in 60 did (CI, 2026-11-29). The 30 limited above is what
	// shows one shared budget; the local ones must stay a rare exception.
	local := 0.0
	for _, e := range []*systest.Env{a, b} {
		local += systest.Counter(t, e.Registry, "stockgate_http_rate_local_total", nil)
	}
	if local > 3 {
		t.Errorf("%v of 60 decisions made by a replica's own limiter with Redis up, want at most 3", local)
	}

	for _, n := range c.Nodes {
		if err := n.Pause(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Resume() })
	}
	// Redis out: each replica's own bucket (20 each, unused so far).
	limited = send(60)
	t.Logf("Redis out: %d of 60 limited", limited)
	for i, e := range []*systest.Env{a, b} {
		if n := systest.Counter(t, e.Registry, "stockgate_http_rate_local_total", nil); n == 0 {
			t.Errorf("replica %d: no decision by its own limiter with Redis out", i)
		}
	}
	if limited < 10 || limited > 30 {
		t.Errorf("%d of 60 requests limited with Redis out, want those over two replicas' own bursts of 20 (about 20)", limited)
	}
}

// TestRateLimitRetryAfterIsTheWait: a client over a budget of one token
// every 10 s (bursts of 2) is told in Retry-After to come back when its
// next token comes, spread up to twice that (gateway's retryAfter), not a
// fixed second: between 9 and 20 s, from the shared budget with Redis up
// and from the replica's own with Redis out.
func TestRateLimitRetryAfterIsTheWait(t *testing.T) {
	c := testenv.NewCluster(t, testenv.ClusterOptions{})
	e := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: systest.LedgerDSN(t, ledger.SQLite), Cluster: c,
		Tune: func(o *app.Options) { o.HTTP.RatePerClient, o.HTTP.RateBurst = 0.1, 2 }})
	path := systest.SKUPath(systest.NewSKU(t)) + "/stock"
	local := func() float64 { return systest.Counter(t, e.Registry, "stockgate_http_rate_local_total", nil) }
	// over sends requests until one is limited: at least least of them
	// pass (the burst of 2, less what the replica's own budget spent
	// before) and at most shared + the replica's own decisions, up to its
	// burst (with Redis up a shared decision can still fail, Redis slow on
	// a busy machine: the replica's own budget decides that request, and
	// the two bursts add up). It returns how many requests its own budget
	// decided.
	over := func(what string, least, shared int) int {
		t.Helper()
		before := local()
		var r systest.Reply
		for n := 1; ; n++ {
			r = e.Do(t, http.MethodGet, path, nil, "")
			if r.Status == http.StatusTooManyRequests {
				if n <= least {
					t.Fatalf("%s: request %d limited; want %d to pass first", what, n, least)
				}
				break
			}
			if most := shared + min(2, int(local()-before)); n > most {
				t.Fatalf("%s: request %d = %d %s, with %v decisions by the replica's own limiter; want 429",
					what, n, r.Status, r.Body, local()-before)
			}
		}
		ra, err := strconv.Atoi(r.Header.Get("Retry-After"))
		if err != nil || ra < 9 || ra > 20 {
			t.Errorf("%s: Retry-After %q; want the wait for the next token, 9 to 20 s", what, r.Header.Get("Retry-After"))
		}
		t.Logf("%s: Retry-After %d", what, ra)
		return int(local() - before)
	}
	spent := over("shared budget", 2, 2)
	if spent != 0 {
		t.Logf("%d decisions by the replica's own limiter with Redis up", spent)
	}
	for _, n := range c.Nodes {
		if err := n.Pause(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Resume() })
	}
	over("own budget, Redis out", 2-min(spent, 2), 0)
	if n := systest.Counter(t, e.Registry, "stockgate_http_rate_local_total", nil); n == 0 {
		t.Error("no decision by the replica's own limiter with Redis out")
	}
}

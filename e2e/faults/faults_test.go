package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/cluster"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// faultEnv is a gateway on a 3-master + 3-replica cluster of the test's own
// (it will be damaged), a PostgreSQL ledger, and the drift check running.
func faultEnv(t *testing.T, tune func(*app.Options)) (*env, *testenv.Cluster) {
	c := testenv.NewCluster(t, testenv.ClusterOptions{ReplicasPerMaster: 1})
	e := startEnv(t, envOptions{driver: ledger.Postgres, cluster: c, drift: true, sweep: true, tune: tune})
	return e, c
}

// slowDirect slows the takes around the Redis gate (the breaker-open
// fallback) by per each.
type slowDirect struct {
	sale.Ledger
	per time.Duration
}

func (l slowDirect) Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult {
	if direct {
		time.Sleep(time.Duration(len(takes)) * l.per)
	}
	return l.Ledger.Commit(ctx, takes, direct)
}

// Scenario 1: kill -9 the master holding the SKU during a flash sale.
func TestFaultKillMaster(t *testing.T) {
	for _, shards := range []int{1, 4} {
		t.Run(map[int]string{1: "shards=1", 4: "shards=4"}[shards], func(t *testing.T) {
			// A narrow, slow ledger fallback (one take at a time, 10 ms each:
			// at most 100 a second), so the sale outlasts the failover
			// however busy the machine, and Redis is seen selling again after
			// it: a gate whose rebuild failed while its master was dead is
			// back once the replica is promoted, not a breaker period later.
			e, c := faultEnv(t, func(o *app.Options) {
				o.Sale.FallbackConcurrency = 1
				o.WrapLedger = func(l sale.Ledger) sale.Ledger { return slowDirect{Ledger: l, per: 10 * time.Millisecond} }
			})
			sku := newSKU(t)
			const total = 4000
			e.putSKU(t, sku, total, shards, 4)
			ctx := context.Background()
			victim, err := c.MasterOf(ctx, keys.Shard(sku.Program, sku.Ticket, 0, shards).Slot())
			if err != nil {
				t.Fatal(err)
			}
			w := watchBreaker(t, e)
			s := startSale(t, []*env{e}, sku, total, 32)
			s.waitSold(total/5, 30*time.Second)
			fault := time.Now()
			gateKill := counter(t, e.reg, "stockgate_purchases_total", map[string]string{"path": "gate", "result": "sold"})
			victim.Kill()
			if err := c.WaitFailover(ctx, keys.Shard(sku.Program, sku.Ticket, 0, shards).Slot(), victim, 30*time.Second); err != nil {
				t.Fatalf("no failover: %v", err)
			}
			healthy := time.Since(fault)
			gateBefore := counter(t, e.reg, "stockgate_purchases_total", map[string]string{"path": "gate", "result": "sold"})
			s.waitSold(total, 60*time.Second)
			done := time.Since(fault)
			st := s.oracle()
			if st.Sold != total {
				t.Errorf("sold %d, want %d", st.Sold, total)
			}
			gateAfter := counter(t, e.reg, "stockgate_purchases_total", map[string]string{"path": "gate", "result": "sold"})
			switch {
			case shards == 1 && gateAfter == gateBefore:
				t.Error("no sale went through Redis after the failover")
			case shards > 1 && gateAfter == gateKill:
				// Its shards on the other masters keep their gate: sales go
				// on through Redis while the dead one's is probed past.
				t.Error("no sale went through Redis after the kill")
			}
			redisConsistent(t, e, sku)
			opened, _ := w.reached(breaker.Open)
			t.Logf("fault→replica promoted and cluster healthy %v; breaker opened %v after the kill; first 201 after the kill %v later; "+
				"fault→sold out %v; Redis admitted, ledger refused: %v; sold through the ledger %v; through Redis after the failover %v; re-seeds %v",
				healthy, sinceOrNever(opened, fault), s.firstOKAfter(fault), done,
				counter(t, e.reg, "stockgate_gate_ledger_refusals_total", nil),
				counter(t, e.reg, "stockgate_purchases_total", map[string]string{"path": "ledger", "result": "sold"}),
				gateAfter-gateBefore, counter(t, e.reg, "stockgate_reseeds_total", nil))
			if shards == 1 {
				s.linearizable(false)
			}
		})
	}
}

// Scenario 2: SIGSTOP a master for longer than the node timeout, so its
// replica is promoted, then SIGCONT it: the old master comes back believing
// it is master until it hears otherwise (a zombie).
func TestFaultZombieMaster(t *testing.T) {
	e, c := faultEnv(t, nil)
	sku := newSKU(t)
	const total = 1500
	e.putSKU(t, sku, total, 1, 4)
	ctx := context.Background()
	victim, err := c.MasterOf(ctx, keys.Shard(sku.Program, sku.Ticket, 0, 1).Slot())
	if err != nil {
		t.Fatal(err)
	}
	s := startSale(t, []*env{e}, sku, total, 32)
	s.waitSold(total/3, 30*time.Second)
	fault := time.Now()
	if err := victim.Pause(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // node timeout is 2s
	if err := victim.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(ctx, 30*time.Second); err != nil {
		t.Fatalf("cluster did not settle: %v", err)
	}
	settled := time.Since(fault)
	s.waitSold(total, 60*time.Second)
	st := s.oracle()
	if st.Sold != total {
		t.Errorf("sold %d, want %d", st.Sold, total)
	}
	cl := victim.Client()
	defer cl.Close()
	role, _ := cl.Do(ctx, "ROLE").Slice()
	if len(role) == 0 || role[0] != "slave" {
		t.Errorf("the resumed master's role is %v, want a replica of the promoted one", role)
	}
	t.Logf("pause 5s; fault→cluster settled %v; first 201 after the pause began %v later; Redis admitted, ledger refused: %v; ledger-path sales %v",
		settled, s.firstOKAfter(fault),
		counter(t, e.reg, "stockgate_gate_ledger_refusals_total", nil),
		counter(t, e.reg, "stockgate_purchases_total", map[string]string{"path": "ledger", "result": "sold"}))
	s.linearizable(false)
}

// Scenario 3: every Redis node stops mid-sale. The breaker opens and sales
// go on through the ledger; Redis comes back empty, the shards are rebuilt
// from the ledger before Redis serves again, and the sale ends at exactly
// the total.
func TestFaultAllRedisDown(t *testing.T) {
	e, c := faultEnv(t, func(o *app.Options) {
		o.Sale.Breaker = breaker.Options{OpenFor: 500 * time.Millisecond}
		o.Sale.FallbackConcurrency = 1 // keep the sale going until Redis is back
	})
	sku := newSKU(t)
	const total = 3000
	e.putSKU(t, sku, total, 4, 4)
	ctx := context.Background()
	w := watchBreaker(t, e)
	s := startSale(t, []*env{e}, sku, total, 32)
	s.waitSold(total/4, 30*time.Second)
	fault := time.Now()
	for _, n := range c.Nodes {
		n.Kill()
	}
	// 100 sales through the ledger alone.
	waitCounter(t, e, "stockgate_purchases_total", map[string]string{"path": "ledger", "result": "sold"}, 100, 30*time.Second)
	opened, ok := w.reached(breaker.Open)
	if !ok {
		t.Fatal("breaker never opened")
	}
	ledgerSold := counter(t, e.reg, "stockgate_purchases_total", map[string]string{"path": "ledger", "result": "sold"})
	gateBefore := counter(t, e.reg, "stockgate_purchases_total", map[string]string{"path": "gate", "result": "sold"})
	restart := time.Now()
	for _, n := range c.Nodes {
		if err := n.Restart(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitHealthy(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	s.waitSold(total, 60*time.Second)
	st := s.oracle()
	if st.Sold != total {
		t.Errorf("sold %d, want exactly %d", st.Sold, total)
	}
	gateAfter := counter(t, e.reg, "stockgate_purchases_total", map[string]string{"path": "gate", "result": "sold"})
	if gateAfter == gateBefore {
		t.Error("no sale went through Redis after it came back")
	}
	if n := counter(t, e.reg, "stockgate_reseeds_total", nil); n < 1 {
		t.Error("Redis served again without a re-seed")
	}
	// 32 clients against a fallback cap of 4: the excess was turned away
	// with 503 + Retry-After, not queued on the ledger.
	overloaded := counter(t, e.reg, "stockgate_purchases_total", map[string]string{"path": "ledger", "result": "overloaded"})
	if overloaded == 0 {
		t.Error("no purchase was turned away at the fallback cap")
	}
	redisConsistent(t, e, sku)
	t.Logf("breaker opened %v after the kill; %v sold through the ledger (%v turned away at the cap); Redis back (restart→healthy) %v after restart; "+
		"%v sold through Redis after; re-seeds %v",
		opened.Sub(fault), ledgerSold, overloaded, time.Since(restart), gateAfter-gateBefore, counter(t, e.reg, "stockgate_reseeds_total", nil))
}

// Scenario 4: SCRIPT FLUSH on every node, repeatedly, mid-sale: go-redis
// falls back from EVALSHA to EVAL, no buyer sees an error, nothing is taken
// twice.
func TestFaultScriptFlush(t *testing.T) {
	c := testenv.SharedCluster(t)
	e := startEnv(t, envOptions{driver: ledger.Postgres, cluster: c})
	sku := newSKU(t)
	const total = 800
	e.putSKU(t, sku, total, 1, 4)
	ctx := context.Background()
	s := startSale(t, []*env{e}, sku, total, 32)
	flushes := 0
	for {
		st, _ := e.ledger.SKU(ctx, sku)
		if st.Sold >= total {
			break
		}
		for _, n := range c.Nodes {
			cl := n.Client()
			if err := cl.ScriptFlush(ctx).Err(); err != nil {
				t.Error(err)
			}
			cl.Close()
		}
		flushes++
		time.Sleep(20 * time.Millisecond)
	}
	st := s.oracle()
	if st.Sold != total {
		t.Errorf("sold %d, want %d", st.Sold, total)
	}
	s.mu.Lock()
	for status, n := range s.counts {
		if status != http.StatusCreated && status != http.StatusConflict {
			t.Errorf("%d buyers got %d", n, status)
		}
	}
	s.mu.Unlock()
	redisConsistent(t, e, sku)
	t.Logf("%d rounds of SCRIPT FLUSH on all %d nodes", flushes, len(c.Nodes))
	s.linearizable(true)
}

func sinceOrNever(at, t0 time.Time) string {
	if at.IsZero() {
		return "never"
	}
	return at.Sub(t0).String()
}

// waitCounter waits until a metric reaches at least want, or fails.
func waitCounter(t *testing.T, e *env, name string, labels map[string]string, want float64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for counter(t, e.reg, name, labels) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v after %v, want >= %v", name, labels, counter(t, e.reg, name, labels), within, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Scenario 5: the reply of a deduct is lost after the script ran (the
// dialer throws the answer away and breaks the connection). go-redis re-sends
// it, or the gateway asks again, or the client retries; each time the
// request's deduction record answers, and the stock moves once.
func TestFaultLostDeductReply(t *testing.T) {
	var drop testenv.ReplyDropper
	// The drift check runs, as in production: a purchase whose replies
	// were all lost is sold around the gate, and a SKU that then sells out
	// takes no more requests that would rebuild its gate.
	e := startEnv(t, envOptions{driver: ledger.Postgres, dialer: drop.Dial, drift: true})
	sku := newSKU(t)
	const total = 400
	e.putSKU(t, sku, total, 1, 4)
	ctx := context.Background()

	// One purchase at a time, losing 1 reply (go-redis re-sends), 4 (go-redis
	// gives up, the gateway asks again), 50 (every attempt of this call: the
	// ledger decides).
	var bought int64
	for _, lost := range []int{1, 4, 50} {
		key := fmt.Sprintf("lost-%d", lost)
		before := drop.Dropped()
		drop.Arm(":"+sale.PurchaseGateID(sale.Ask{Buyer: keys.MustID("b"), Key: keys.MustID(key)}, sku, 2).String(), lost)
		r := e.buy(t, sku, key, "b", 2)
		if lost == 50 {
			// Every attempt's reply lost: the outcome in Redis is unknown,
			// and the ledger decides (the purchase commits around the
			// gate, whose rebuild drops whatever the lost calls took).
			drop.Arm("", 0)
			if r.status != http.StatusCreated {
				t.Errorf("purchase losing every reply = %d %s, want 201 decided by the ledger", r.status, r.body)
			}
			waitFor(t, 10*time.Second, "the gate rebuilt after the sale around it", func() bool {
				e.buy(t, sku, fmt.Sprintf("rebuild-%d", time.Now().UnixNano()), "c", 1)
				st, _ := e.ledger.SKU(ctx, sku)
				left, _, _ := e.gate.Remaining(ctx, sku, 1)
				bought = st.Sold
				return !st.GateStale() && left == total-st.Sold
			})
			continue
		}
		if r.status != http.StatusCreated {
			t.Fatalf("lost %d replies: %d %s, want 201", lost, r.status, r.body)
		}
		bought += 2
		st, _ := e.ledger.SKU(ctx, sku)
		left, _, _ := e.gate.Remaining(ctx, sku, 1)
		if st.Sold != bought || left != total-bought {
			t.Errorf("lost %d replies (%d dropped): ledger sold %d, redis remaining %d; want %d and %d",
				lost, drop.Dropped()-before, st.Sold, left, bought, total-bought)
		}
	}

	// Under load: 60 replies of deducts and restores lost at random while 32
	// clients buy the rest.
	drop.Arm(":ded:", 60)
	s := startSale(t, []*env{e}, sku, total-bought, 32)
	s.waitSold(total, 60*time.Second)
	st := s.oracle()
	if st.Sold != total {
		t.Errorf("sold %d, want %d", st.Sold, total)
	}
	redisConsistent(t, e, sku)
	t.Logf("%d replies lost in all", drop.Dropped())
	s.linearizable(true)
}

// Scenario 6: the ledger is unreachable. Purchases answer 503, the Redis
// stock they took goes back, nothing is confirmed, and the breaker (which
// guards Redis, not the ledger) stays closed.
func TestFaultLedgerUnreachable(t *testing.T) {
	dsn, proxy := testenv.ProxiedPostgresURL(t)
	e := startEnv(t, envOptions{driver: ledger.Postgres, dsn: dsn, tune: func(o *app.Options) {
		o.Sale.SettingsTTL = time.Minute // so every purchase reaches the commit
	}})
	sku := newSKU(t)
	const total = 500
	e.putSKU(t, sku, total, 2, 4)
	pre := e.buyAll(100, 20, func(i int) reply { return e.buy(t, sku, fmt.Sprintf("pre-%d", i), "b", 1) })
	if pre[http.StatusCreated] != 100 {
		t.Fatalf("before the cut: %v", pre)
	}
	proxy.Cut()
	var mu sync.Mutex
	noRetryAfter := 0
	retries := map[string]int{}
	cut := e.buyAll(200, 20, func(i int) reply {
		r := e.buy(t, sku, fmt.Sprintf("cut-%d", i), "b", 1)
		mu.Lock()
		defer mu.Unlock()
		if r.header.Get("Retry-After") == "" {
			noRetryAfter++
		}
		retries[r.header.Get("Retry-After")]++
		return r
	})
	// Spread, not lockstep: every 503 says 1 or 2 seconds, and 200 of them
	// say both (all alike by chance: 2 in 2^200).
	if len(retries) != 2 || retries["1"] == 0 || retries["2"] == 0 {
		t.Errorf("Retry-After values of 200 503s: %v, want 1 and 2, both", retries)
	}
	left, _, err := e.gate.Remaining(context.Background(), sku, 2)
	proxy.Restore()
	if cut[http.StatusServiceUnavailable] != 200 || noRetryAfter != 0 {
		t.Errorf("with the ledger cut off: answers %v, %d without Retry-After; want 200×503 with it", cut, noRetryAfter)
	}
	if err != nil || left != total-100 {
		t.Errorf("redis remaining %d (%v) after 200 refused commits, want %d: taken stock not given back", left, err, total-100)
	}
	ctx := context.Background()
	for i := range 200 {
		if _, err := orderOf(ctx, e.ledger, "b", fmt.Sprintf("cut-%d", i)); !errors.Is(err, ledger.ErrNotFound) {
			t.Fatalf("order for cut-%d: %v, want none", i, err)
		}
	}
	st, _ := e.ledger.SKU(ctx, sku)
	if st.Sold != 100 {
		t.Errorf("ledger sold %d, want 100", st.Sold)
	}
	if reached := counter(t, e.reg, "stockgate_purchases_total", map[string]string{"path": "gate", "result": "unavailable"}); reached != 200 {
		t.Errorf("%v purchases reached the commit and failed, want 200", reached)
	}
	if e.srv.BreakerState() != breaker.Closed {
		t.Errorf("breaker %v after ledger failures, want closed", e.srv.BreakerState())
	}
}

// countingLedger counts every call the gateway makes to the real ledger.
// It overrides every method of sale.Ledger, so none reaches the real
// ledger through the embedded interface unseen; a method added to the
// interface must be added here too.
type countingLedger struct {
	sale.Ledger
	calls   atomic.Int64
	mu      sync.Mutex
	methods map[string]int
}

func (l *countingLedger) note(m string) {
	l.calls.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.methods == nil {
		l.methods = map[string]int{}
	}
	l.methods[m]++
}

func (l *countingLedger) byMethod() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.methods)
}

func (l *countingLedger) PutSKU(ctx context.Context, c ledger.SKUConfig) (ledger.SKUState, error) {
	l.note("PutSKU")
	return l.Ledger.PutSKU(ctx, c)
}

func (l *countingLedger) SKU(ctx context.Context, sku stock.SKU) (ledger.SKUState, error) {
	l.note("SKU")
	return l.Ledger.SKU(ctx, sku)
}

func (l *countingLedger) OrderByKey(ctx context.Context, key keys.ID) (ledger.Order, error) {
	l.note("OrderByKey")
	return l.Ledger.OrderByKey(ctx, key)
}

func (l *countingLedger) MarkGateSeeded(ctx context.Context, sku stock.SKU, seq int64) error {
	l.note("MarkGateSeeded")
	return l.Ledger.MarkGateSeeded(ctx, sku, seq)
}

func (l *countingLedger) SKUs(ctx context.Context, after stock.SKU, limit int) ([]ledger.SKUState, error) {
	l.note("SKUs")
	return l.Ledger.SKUs(ctx, after, limit)
}

// countingEnv is a gateway whose every ledger call is counted, with SKU
// settings cached for a minute so their reloads do not count.
func countingEnv(t *testing.T) (*env, *countingLedger) {
	var counted *countingLedger
	e := startEnv(t, envOptions{driver: ledger.Postgres, tune: func(o *app.Options) {
		o.WrapLedger = func(l sale.Ledger) sale.Ledger {
			counted = &countingLedger{Ledger: l}
			return counted
		}
		o.Sale.SettingsTTL = time.Minute
	}})
	return e, counted
}

// Scenario 7: 10,000 purchases of a sold-out SKU: all 409, the breaker
// stays closed without a single transition, and the ledger sees no query
// per request: only the read of the SKU's committed requests, once per
// sold-out flag period (each new flag may follow a sale of returned stock).
func TestFaultSoldOutStorm(t *testing.T) {
	e, counted := countingEnv(t)
	sku := newSKU(t)
	e.putSKU(t, sku, 0, 4, 4)
	if r := e.buy(t, sku, "first", "b", 1); r.status != http.StatusConflict {
		t.Fatalf("first purchase at stock 0 = %d %s", r.status, r.body)
	}
	before := counted.byMethod()
	start := time.Now()
	storm := e.buyAll(10_000, 64, func(i int) reply { return e.buy(t, sku, fmt.Sprintf("storm-%d", i), "b", 1) })
	took := time.Since(start)
	if storm[http.StatusConflict] != 10_000 {
		t.Errorf("storm answers %v, want 10000×409", storm)
	}
	after := counted.byMethod()
	periods := int(took/(500*time.Millisecond)) + 2 // the cache's default sold-out TTL
	for m, n := range after {
		d := n - before[m]
		if d != 0 && (m != "CommittedSince" || d > periods) {
			t.Errorf("the ledger saw %d %s calls during a %v storm, want only CommittedSince, at most %d",
				d, m, took.Round(time.Millisecond), periods)
		}
	}
	t.Logf("storm of 10000 in %v: ledger calls %d (CommittedSince)", took.Round(time.Millisecond),
		after["CommittedSince"]-before["CommittedSince"])
	if e.srv.BreakerState() != breaker.Closed || counter(t, e.reg, "stockgate_breaker_transitions_total", nil) != 0 {
		t.Errorf("breaker %v with %v transitions, want closed and none", e.srv.BreakerState(),
			counter(t, e.reg, "stockgate_breaker_transitions_total", nil))
	}
}

// Scenario 8: 1,000 client cancellations, many while the breaker is
// half-open: they neither trip it nor hold it half-open. The test fails if
// cancelled calls count as Redis failures (checked by making both the
// breaker and shard.Failed count them: every run then opens the breaker
// with "read shard N: context canceled").
func TestFaultCancellationsDuringHalfOpen(t *testing.T) {
	c := testenv.NewCluster(t, testenv.ClusterOptions{ReplicasPerMaster: 1})
	// What opened the breaker, once the cancellations start: a cancelled
	// client never may; a probe that outran its own Redis timeout on a busy
	// machine may (Redis was too slow, which is what the breaker is for).
	var (
		mu       sync.Mutex
		watching bool
		openedBy []error
	)
	// Once half-open, every Redis call takes 20ms more and each node has two
	// connections: calls wait for the pool, and a client that gives up meanwhile
	// leaves the gateway a cancelled call (context.Canceled), not a finished one.
	var slow testenv.Latency
	e := startEnv(t, envOptions{driver: ledger.Postgres, cluster: c, dialer: slow.Dial, tune: func(o *app.Options) {
		o.Redis.PoolSize = 2
		o.Sale.Breaker = breaker.Options{OpenFor: 300 * time.Millisecond, Probes: 3, ConsecutiveFailures: 2,
			OnChange: func(_, to breaker.State, cause error) {
				mu.Lock()
				defer mu.Unlock()
				if watching && to == breaker.Open {
					openedBy = append(openedBy, cause)
				}
			}}
		o.Sale.RedisTimeout = 500 * time.Millisecond
		o.Sale.StockTTL = time.Microsecond // every stock read asks Redis
	}})
	sku := newSKU(t)
	e.putSKU(t, sku, 100_000, 4, 4)

	// Open the breaker: freeze every node (for less than the node timeout,
	// so no failover) and let purchases time out.
	for _, n := range c.Nodes {
		if err := n.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	tripBreakers(t, e, c.Masters)
	for _, n := range c.Nodes {
		if err := n.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	// Redis answers again before the breaker probes it: a probe that meets
	// a node still catching up is a real failure and re-opens it, which is
	// right but not what this test is about.
	if err := c.WaitHealthy(context.Background(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for e.srv.BreakerState() != breaker.HalfOpen {
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	watching = true
	mu.Unlock()
	slow.Set(20 * time.Millisecond)

	// 1,000 requests whose clients give up after 0–40ms: stock reads run their
	// Redis call under the client's context; purchases run detached.
	var cancelled, answered, duringHalfOpen atomic.Int64
	var wg sync.WaitGroup
	for g := range 50 {
		wg.Go(func() {
			for i := range 20 {
				if e.srv.BreakerState() == breaker.HalfOpen {
					duringHalfOpen.Add(1)
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(40_000))*time.Microsecond)
				path, body := "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/stock", ""
				method := http.MethodGet
				if i%4 == 3 {
					method, path, body = http.MethodPost, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/purchases", `{"buyer":"b","quantity":1}`
				}
				req, _ := http.NewRequestWithContext(ctx, method, e.url+path, strings.NewReader(body))
				req.Header.Set("Idempotency-Key", fmt.Sprintf("cancel-%d-%d", g, i))
				req.Header.Set("Content-Type", "application/json")
				resp, err := e.client.Do(req)
				if err != nil {
					cancelled.Add(1)
				} else {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					answered.Add(1)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	slow.Set(0)
	// Normal traffic closes them (the stock view reads every shard, so
	// every master's breaker gets its probes); none may be stuck
	// half-open or open.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; e.srv.BreakerState() != breaker.Closed; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("breakers %v 10s after the cancellations, want closed", e.srv.Breakers().States())
		}
		e.do(t, http.MethodGet, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/stock", nil, "")
		e.buy(t, sku, fmt.Sprintf("after-%d", i), "b", 1)
	}
	if r := e.buy(t, sku, "final", "b", 1); r.status != http.StatusCreated {
		t.Errorf("purchase after recovery = %d %s", r.status, r.body)
	}
	t.Logf("1000 requests: %d cancelled by their clients, %d answered, %d sent while half-open; transitions %v",
		cancelled.Load(), answered.Load(), duringHalfOpen.Load(), counter(t, e.reg, "stockgate_breaker_transitions_total", nil))
	if duringHalfOpen.Load() == 0 {
		t.Error("no request was sent while the breaker was half-open")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, cause := range openedBy {
		switch {
		case errors.Is(cause, context.DeadlineExceeded):
			t.Logf("a probe outran its %v Redis timeout and opened the breaker again: %v", 500*time.Millisecond, cause)
		default:
			t.Errorf("the breaker opened because of %v (%T), want never a cancellation nor any other failure", cause, cause)
		}
	}
}

// Scenario 9: two replicas asked to re-seed the same SKU at the same moment:
// one does it, the other says it is in progress. Then a holder killed
// mid-way (a real process, SIGKILL, with the gate fenced) leaves a lock that
// expires, and the next re-seed completes while buyers keep buying.
func TestFaultReseedOneAtATime(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	// A rebuild that reaches AdvanceGate waits there until the other
	// reconcile has answered, so the two overlap whatever the timing.
	gate := &gateHold{}
	t.Cleanup(gate.release)
	held := func(o *app.Options) {
		o.WrapLedger = func(l sale.Ledger) sale.Ledger { return heldLedger{Ledger: l, gate: gate} }
	}
	a := startEnv(t, envOptions{driver: ledger.Postgres, dsn: dsn, drift: true, tune: held})
	b := startEnv(t, envOptions{driver: ledger.Postgres, dsn: dsn, drift: true, tune: held})
	sku := newSKU(t)
	const total = 3000
	a.putSKU(t, sku, total, 4, 4)

	gate.hold()
	answers := make(chan reply, 2)
	for _, e := range []*env{a, b} {
		go func() {
			answers <- e.do(t, http.MethodPost, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/reconcile", nil, "")
		}()
	}
	first := <-answers
	gate.release()
	second := <-answers
	if first.status != 409 || second.status != 200 {
		t.Fatalf("two reconciles at once = %d %s, then %d %s; want 409 while the other runs, then 200",
			first.status, first.body, second.status, second.body)
	}

	// A holder in another process takes the lock, fences the gate, and dies.
	s := startSale(t, []*env{a, b}, sku, total, 16)
	s.waitSold(total/5, 30*time.Second)
	ctx := context.Background()
	killed := killHolderMidway(t, a, "reconcile", dsn, sku, 4)
	waitFor(t, 15*time.Second, "the gate to reopen", func() bool {
		shards, err := a.gate.Read(ctx, sku, 4)
		if err != nil {
			return false
		}
		for _, sh := range shards {
			if sh.Fenced || !sh.Seeded {
				return false
			}
		}
		return true
	})
	reopened := time.Since(killed)
	s.waitSold(total, 60*time.Second)
	st := s.oracle()
	if st.Sold != total {
		t.Errorf("sold %d, want %d", st.Sold, total)
	}
	redisConsistent(t, a, sku)
	t.Logf("holder killed with the gate fenced; reopened %v later (lock TTL 1s); re-seeds %v + %v; sold through the ledger meanwhile %v + %v",
		reopened, counter(t, a.reg, "stockgate_reseeds_total", nil), counter(t, b.reg, "stockgate_reseeds_total", nil),
		counter(t, a.reg, "stockgate_purchases_total", map[string]string{"path": "ledger", "result": "sold"}),
		counter(t, b.reg, "stockgate_purchases_total", map[string]string{"path": "ledger", "result": "sold"}))
}

// tripBreakers pings every Redis master through the gateway's client
// (each command goes through its master's breaker) until masters of them
// are open: with the nodes down or frozen, every master's breaker opens,
// as a sale's calls would open it.
func tripBreakers(t *testing.T, e *env, masters int) {
	t.Helper()
	waitFor(t, 60*time.Second, "every master's breaker open", func() bool {
		_ = e.guarded.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
			ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			return c.Ping(ctx).Err()
		})
		open := 0
		for _, st := range e.srv.Breakers().States() {
			if st == breaker.Open {
				open++
			}
		}
		return open >= masters
	})
}

func waitFor(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// reseedHolder is the helper process of TestFaultReseedOneAtATime: it
// starts a re-seed that fences the gate and then waits an hour to read the
// ledger, so the test can kill it mid-way.
// gateHold holds whoever waits on it between hold and release.
type gateHold struct {
	mu sync.Mutex
	ch chan struct{}
}

func (g *gateHold) hold() { g.mu.Lock(); g.ch = make(chan struct{}); g.mu.Unlock() }

func (g *gateHold) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
}

func (g *gateHold) wait(ctx context.Context) error {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// heldLedger holds AdvanceGate while its gate is held.
type heldLedger struct {
	sale.Ledger
	gate *gateHold
}

func (l heldLedger) AdvanceGate(ctx context.Context, sku stock.SKU) (ledger.SKUState, error) {
	if err := l.gate.wait(ctx); err != nil {
		return ledger.SKUState{}, err
	}
	return l.Ledger.AdvanceGate(ctx, sku)
}

// stuckLedger never finishes AdvanceGate: a rebuild that calls it stops
// there, fenced, holding its lock.
type stuckLedger struct{ sale.Ledger }

func (stuckLedger) AdvanceGate(ctx context.Context, _ stock.SKU) (ledger.SKUState, error) {
	<-ctx.Done()
	return ledger.SKUState{}, ctx.Err()
}

func reseedHolder() int {
	ctx := context.Background()
	// The holder stops inside the rebuild, with the gate fenced, until it
	// is killed: its ledger never returns from AdvanceGate.
	a, err := app.Open(ctx, app.Options{
		Redis:      cluster.Options{Addrs: strings.Split(os.Getenv("HELPER_REDIS"), ",")},
		Ledger:     ledger.Options{Driver: ledger.Postgres, DSN: os.Getenv("HELPER_DSN")},
		Lock:       lock.Options{TTL: time.Second, CallTimeout: 300 * time.Millisecond},
		Sale:       sale.Options{WorkTimeout: time.Hour},
		WrapLedger: func(l sale.Ledger) sale.Ledger { return stuckLedger{l} },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "reseed holder: open:", err)
		return 1
	}
	srv := a.Sale
	sku := stock.SKU{Program: keys.MustID(os.Getenv("HELPER_PROGRAM")), Ticket: keys.MustID(os.Getenv("HELPER_TICKET"))}
	// The replicas take the lock now and then for a moment (a drift check
	// that finds nothing to do): try until this one holds it.
	tries := 0
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); tries++ {
		if os.Getenv("HELPER_MODE") == "collapse" {
			_, err = srv.Collapse(ctx, sku)
		} else {
			_, err = srv.Reconcile(ctx, sku)
		}
		if !errors.Is(err, lock.ErrBusy) && !errors.Is(err, sale.ErrRebuildBusy) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "reseed holder: returned after %d busy tries (it should have been killed): %v\n", tries, err)
	return 1
}

func (l *countingLedger) LoadSeats(ctx context.Context, sku stock.SKU, seats []ledger.Seat) (int64, error) {
	l.note("LoadSeats")
	return l.Ledger.LoadSeats(ctx, sku, seats)
}

func (l *countingLedger) Seats(ctx context.Context, sku stock.SKU, section keys.ID) ([]ledger.Seat, error) {
	l.note("Seats")
	return l.Ledger.Seats(ctx, sku, section)
}

func (l *countingLedger) SeatFacts(ctx context.Context, sku stock.SKU) ([]ledger.SeatFact, error) {
	l.note("SeatFacts")
	return l.Ledger.SeatFacts(ctx, sku)
}

func (l *countingLedger) HoldByID(ctx context.Context, id keys.ID) (ledger.Hold, error) {
	l.note("HoldByID")
	return l.Ledger.HoldByID(ctx, id)
}

func (l *countingLedger) HoldByKey(ctx context.Context, key keys.ID) (ledger.Hold, error) {
	l.note("HoldByKey")
	return l.Ledger.HoldByKey(ctx, key)
}

func (l *countingLedger) Confirm(ctx context.Context, id, buyer keys.ID, req ledger.Request) (ledger.Order, error) {
	l.note("Confirm")
	return l.Ledger.Confirm(ctx, id, buyer, req)
}

func (l *countingLedger) Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult {
	l.note("Commit")
	return l.Ledger.Commit(ctx, takes, direct)
}

func (l *countingLedger) ConfirmBatch(ctx context.Context, cs []ledger.HoldRequest) ([]ledger.BatchResult, error) {
	l.note("ConfirmBatch")
	return l.Ledger.ConfirmBatch(ctx, cs)
}

func (l *countingLedger) CancelBatch(ctx context.Context, cs []ledger.HoldRequest) ([]ledger.HoldResult, error) {
	l.note("CancelBatch")
	return l.Ledger.CancelBatch(ctx, cs)
}

func (l *countingLedger) Cancel(ctx context.Context, id, buyer keys.ID, req ledger.Request) (ledger.Hold, bool, error) {
	l.note("Cancel")
	return l.Ledger.Cancel(ctx, id, buyer, req)
}

func (l *countingLedger) ExpireDue(ctx context.Context, limit int) ([]ledger.Hold, error) {
	l.note("ExpireDue")
	return l.Ledger.ExpireDue(ctx, limit)
}

func (l *countingLedger) Refund(ctx context.Context, id, buyer keys.ID, req ledger.Request) (ledger.Order, bool, error) {
	l.note("Refund")
	return l.Ledger.Refund(ctx, id, buyer, req)
}

func (l *countingLedger) CartByID(ctx context.Context, id keys.ID) (ledger.Cart, error) {
	l.note("CartByID")
	return l.Ledger.CartByID(ctx, id)
}

func (l *countingLedger) OrderByID(ctx context.Context, id keys.ID) (ledger.Order, error) {
	l.note("OrderByID")
	return l.Ledger.OrderByID(ctx, id)
}

func (l *countingLedger) PendingRestores(ctx context.Context, older time.Duration, limit int) ([]ledger.Restore, error) {
	l.note("PendingRestores")
	return l.Ledger.PendingRestores(ctx, older, limit)
}

func (l *countingLedger) RestoreDone(ctx context.Context, kind string, id keys.ID) error {
	l.note("RestoreDone")
	return l.Ledger.RestoreDone(ctx, kind, id)
}

func (l *countingLedger) EndSale(ctx context.Context, sku stock.SKU) (ledger.SKUState, error) {
	l.note("EndSale")
	return l.Ledger.EndSale(ctx, sku)
}

func (l *countingLedger) PutProgram(ctx context.Context, program keys.ID, perBuyer int64) error {
	l.note("PutProgram")
	return l.Ledger.PutProgram(ctx, program, perBuyer)
}

func (l *countingLedger) ProgramCap(ctx context.Context, program keys.ID) (int64, error) {
	l.note("ProgramCap")
	return l.Ledger.ProgramCap(ctx, program)
}

// killHolderMidway starts a gateway in another process that takes the
// SKU's re-seed lock, closes its gate for a rebuild (mode "reconcile") or a
// collapse onto one shard ("collapse"), and then waits; once the fence is
// visible it is killed with SIGKILL. It returns when it died.
func killHolderMidway(t *testing.T, e *env, mode, dsn string, sku stock.SKU, shards int) time.Time {
	t.Helper()
	holder := exec.Command(os.Args[0], "-test.run=^$")
	holder.Env = append(os.Environ(), "STOCKGATE_TEST_HELPER=reseed-holder", "HELPER_MODE="+mode,
		"HELPER_REDIS="+strings.Join(testenv.SharedCluster(t).Addrs(), ","), "HELPER_DSN="+dsn,
		"HELPER_PROGRAM="+sku.Program.String(), "HELPER_TICKET="+sku.Ticket.String())
	var stderr bytes.Buffer
	holder.Stderr = &stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- holder.Wait() }() // ends when the holder does; the kill below makes sure it does
	t.Cleanup(func() { holder.Process.Kill() })
	// A bound, not a pause: a race-built helper process opening its own
	// ledger and Redis client on a busy 2-core machine can take seconds. A
	// holder that stops before fencing fails the test at once, saying why.
	// Its stderr is read only once Wait has returned (exec copies into the
	// buffer until then).
	for deadline := time.Now().Add(60 * time.Second); ; {
		select {
		case err := <-exited:
			t.Fatalf("the reseed holder exited before fencing (%v): %s", err, stderr.String())
		default:
		}
		if st, err := e.gate.Read(context.Background(), sku, shards); err == nil && st[0].Fenced {
			break
		}
		if time.Now().After(deadline) {
			holder.Process.Kill()
			err := <-exited
			t.Fatalf("no fence from the reseed holder within 60s (%v): %s", err, stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	killed := time.Now()
	holder.Process.Kill()
	<-exited
	return killed
}

func (l *countingLedger) RequestByKey(ctx context.Context, scope, key keys.ID) (ledger.Recorded, error) {
	l.note("RequestByKey")
	return l.Ledger.RequestByKey(ctx, scope, key)
}

func (l *countingLedger) CommittedSince(ctx context.Context, sku stock.SKU, after int64) (ledger.Committed, error) {
	l.note("CommittedSince")
	return l.Ledger.CommittedSince(ctx, sku, after)
}

func (l *countingLedger) AdvanceGate(ctx context.Context, sku stock.SKU) (ledger.SKUState, error) {
	l.note("AdvanceGate")
	return l.Ledger.AdvanceGate(ctx, sku)
}

func (l *countingLedger) RestoreOwed(ctx context.Context, kind string, id keys.ID) (ledger.Restore, bool, error) {
	l.note("RestoreOwed")
	return l.Ledger.RestoreOwed(ctx, kind, id)
}

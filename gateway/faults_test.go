package gateway_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/gateway"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// faultEnv is a gateway on a 3-master + 3-replica cluster of the test's own
// (it will be damaged), a PostgreSQL ledger, and the drift check running.
func faultEnv(t *testing.T, tune func(*gateway.Options)) (*env, *testenv.Cluster) {
	c := testenv.NewCluster(t, testenv.ClusterOptions{ReplicasPerMaster: 1})
	e := startEnv(t, envOptions{driver: ledger.Postgres, cluster: c, drift: true, tune: tune})
	return e, c
}

// Scenario 1: kill -9 the master holding the SKU during a flash sale.
func TestFaultKillMaster(t *testing.T) {
	for _, shards := range []int{1, 4} {
		t.Run(map[int]string{1: "shards=1", 4: "shards=4"}[shards], func(t *testing.T) {
			e, c := faultEnv(t, nil)
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
			if gateAfter == gateBefore {
				t.Error("no sale went through Redis after the failover")
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
	e, c := faultEnv(t, func(o *gateway.Options) {
		o.Breaker = breaker.Options{OpenFor: 500 * time.Millisecond}
	})
	sku := newSKU(t)
	const total = 1200
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
	redisConsistent(t, e, sku)
	t.Logf("breaker opened %v after the kill; %v sold through the ledger; Redis back (restart→healthy) %v after restart; "+
		"%v sold through Redis after; re-seeds %v",
		opened.Sub(fault), ledgerSold, time.Since(restart), gateAfter-gateBefore, counter(t, e.reg, "stockgate_reseeds_total", nil))
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

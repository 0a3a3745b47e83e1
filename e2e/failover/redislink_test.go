package failover_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// TestFaultRedisMasterLinkBlackHole: the link between a replica and the
// Redis master of a SKU's shard goes silent for 10 s (toxiproxy: bytes
// dropped, nothing closed) while the cluster sees nothing wrong: the
// master answers its bus, so no replica of it is promoted and nothing
// ends the fault but the link. Every purchase meanwhile is answered
// within the work timeout (and a margin for a busy machine), 201 around
// the gate or 503 with Retry-After, never another status; afterwards
// the master's breaker closes and the gate sells again, each 503 sent
// again with its key is sold exactly once, the ledger, Redis and the
// answers agree, and no goroutine the fault started is left running.
func TestFaultRedisMasterLinkBlackHole(t *testing.T) {
	systest.FullTier(t)
	c, sku, victim, link, dial := linkedMaster(t)
	const work = 1500 * time.Millisecond
	e := systest.Start(t, systest.Options{Driver: ledger.SQLite, Cluster: c, Dialer: dial, Drift: true, Tune: func(o *app.Options) {
		o.Sale.WorkTimeout = work
	}})
	const total, before = 100000, 60
	e.PutSKU(t, sku, total, 1, 4)
	buy := func(key string) systest.Reply { return e.Buy(t, sku, key, "b", 1) }
	if got := systest.BuyAll(before, 12, func(i int) systest.Reply { return buy(fmt.Sprintf("before-%d", i)) }); got[http.StatusCreated] != before {
		t.Fatalf("before the cut: %v", got)
	}
	e.Client.CloseIdleConnections()
	base := runtime.NumGoroutine()
	gateSold := func() float64 {
		return systest.Counter(t, e.Registry, "stockgate_purchases_total", map[string]string{"path": "gate", "result": "sold"})
	}

	// 10 s of the fault, 16 buyers buying on; each answer timed.
	link.Cut(t)
	counts, refused, slowest, bad := buySpell(t, buy, "cut", 16, 10*time.Second)
	link.Heal(t)
	t.Logf("10 s of a silent link to the master %s: purchases %v, the slowest answered in %v", victim.Addr, counts, slowest.Round(time.Millisecond))
	if len(bad) > 0 {
		t.Errorf("%d answers neither 201 nor 503 with Retry-After: %v", len(bad), bad[:min(len(bad), 5)])
	}
	// The work timeout bounds every answer; 3 s more for a busy machine
	// (a silent link held answers 6-10 s past a 5 s timeout before).
	if slowest > work+3*time.Second {
		t.Errorf("an answer took %v with the work timeout at %v", slowest, work)
	}
	if opened := systest.Counter(t, e.Registry, "stockgate_breaker_transitions_total", map[string]string{"node": victim.Addr, "to": "open"}); opened == 0 {
		t.Errorf("the breaker of %s never opened: the fault did not land", victim.Addr)
	}

	// Healed: the breaker closes and the gate sells again.
	sold := gateSold()
	systest.WaitFor(t, 30*time.Second, "the gate selling again after the link healed", func() bool {
		buy(fmt.Sprintf("after-%d", time.Now().UnixNano()))
		return e.Sale.BreakerState() == breaker.Closed && gateSold() > sold
	})
	for _, key := range refused {
		if r, _ := e.Retried(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", key, `{"buyer":"b","quantity":1}`); r.Status != http.StatusCreated {
			t.Errorf("%s sent again after the link healed = %d %s", key, r.Status, r.Body)
		}
	}
	systest.WaitSettled(t, e, sku)
	got := e.State(t, sku)
	if got.Orders != got.Sold || got.OrderUnits != got.Sold || got.Sold < int64(before+counts[http.StatusCreated]+len(refused)) {
		t.Errorf("ledger %+v after %d + %d + %d purchases answered 201", got, before, counts[http.StatusCreated], len(refused))
	}
	systest.RedisConsistent(t, e, sku)

	goroutinesBackTo(t, e, base)
}

// linkedMaster is a cluster of the test's own, a SKU, the master of its
// first shard, a Link in front of that master, and the dialer that takes
// a replica to the master through it (the cluster's bus goes direct, so
// nothing the link does ends in a failover).
func linkedMaster(t *testing.T) (*testenv.Cluster, stock.SKU, *testenv.Node, *systest.Link, func(context.Context, string, string) (net.Conn, error)) {
	t.Helper()
	c := testenv.NewCluster(t, testenv.ClusterOptions{})
	sku := systest.NewSKU(t)
	victim, err := c.MasterOf(context.Background(), keys.Shard(sku.Program, sku.Ticket, 0, 1).Slot())
	if err != nil {
		t.Fatal(err)
	}
	link := systest.NewLink(t, victim.Addr)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == victim.Addr {
			addr = link.Addr
		}
		return (&net.Dialer{Timeout: time.Second}).DialContext(ctx, network, addr)
	}
	return c, sku, victim, link, dial
}

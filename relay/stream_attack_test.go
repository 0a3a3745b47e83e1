package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/cluster"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/relay"
)

// TestAttackStreamNoFailoverMasters: masters without replicas that run with
// cluster-replica-no-failover yes (one config file for every node is
// common) show as "master,nofailover" in CLUSTER NODES. The sink must still
// see that they have no replica and add without WAIT: every event is
// delivered through the gateway's client, as on any master without replicas.
func TestAttackStreamNoFailoverMasters(t *testing.T) {
	ctx := context.Background()
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.SQLite, DSN: testenv.SQLitePath(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	program := keys.MustID("show-stream-nofailover")
	skus := makeSKUs(t, l, program.String(), 2)
	for i := range 4 {
		buy(t, l, skus[i%len(skus)])
	}
	events := allEvents(t, l, program)

	c := testenv.NewCluster(t, testenv.ClusterOptions{})
	for _, n := range c.Nodes {
		nc := n.Client()
		if err := nc.ConfigSet(ctx, "cluster-replica-no-failover", "yes").Err(); err != nil {
			t.Fatal(err)
		}
		nc.Close()
	}
	o := cluster.DefaultOptions()
	o.Addrs = c.Addrs()
	rdb, err := cluster.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	// Every node's view shows the flag before the sink reads the layout.
	waitFor(t, 20*time.Second, "every master flagged nofailover", func() bool {
		for _, n := range c.Nodes {
			nc := n.Client()
			nodes, err := nc.ClusterNodes(ctx).Result()
			nc.Close()
			if err != nil || strings.Count(nodes, "master,nofailover") < c.Masters {
				return false
			}
		}
		return true
	})
	sink, err := relay.NewStream(relay.StreamOptions{Redis: rdb, Prefix: testenv.ID(t, "ev") + ":"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if err := sink.Deliver(ctx, e); err != nil {
			t.Fatalf("Deliver(%s) on a master without replicas = %v", e.ID, err)
		}
	}
}

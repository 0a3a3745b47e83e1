package relay_test

import (
	"context"
	"testing"

	"github.com/stockgate/stockgate/cluster"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/relay"
)

// The stream sink through the gateway's own Redis client (cluster.New with
// its defaults: a 500 ms read timeout) and the sink's default ReplicaWait
// of 1 s. A pipeline's answers are read under the client's read timeout,
// so a WAIT of 1 s failed every add as an i/o timeout: on masters with no
// replica (WAIT blocks for its whole timeout there) always, on masters
// whose replicas are slow whenever they were. Every event must be
// delivered on both layouts.
func TestStreamThroughTheGatewaysClient(t *testing.T) {
	ctx := context.Background()
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.SQLite, DSN: testenv.SQLitePath(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	program := keys.MustID("show-stream-client")
	skus := makeSKUs(t, l, program.String(), 2)
	for i := range 8 {
		buy(t, l, skus[i%len(skus)])
	}
	events := allEvents(t, l, program)
	for _, layout := range []struct {
		name string
		c    *testenv.Cluster
	}{
		{"masters without replicas", testenv.NewCluster(t, testenv.ClusterOptions{})},
		{"masters with replicas", testenv.SharedCluster(t)},
	} {
		t.Run(layout.name, func(t *testing.T) {
			o := cluster.DefaultOptions()
			o.Addrs = layout.c.Addrs()
			rdb, err := cluster.New(o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rdb.Close() })
			sink, err := relay.NewStream(relay.StreamOptions{Redis: rdb, Prefix: testenv.ID(t, "ev") + ":"})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range events {
				if err := sink.Deliver(ctx, e); err != nil {
					t.Fatalf("Deliver(%s) = %v", e.ID, err)
				}
				if n := rdb.XLen(ctx, sink.Key(e.Partition)).Val(); n < 1 {
					t.Fatalf("stream of partition %d has %d entries after its delivery", e.Partition, n)
				}
			}
		})
	}
}

package cluster_test

import (
	"testing"
	"time"

	"github.com/stockgate/stockgate/cluster"
)

func TestNewValidates(t *testing.T) {
	for _, o := range []cluster.Options{{}, {Addrs: []string{"localhost"}}, {Addrs: []string{"a:1"}, ReadTimeout: -1}} {
		if c, err := cluster.New(o); err == nil {
			c.Close()
			t.Errorf("New(%+v) succeeded", o)
		}
	}
}

// The failover settings are what the package documents, not go-redis's
// defaults (5s dial timeout, 5 dial retries, 60s slot-map reload).
func TestFailoverDefaults(t *testing.T) {
	c, err := cluster.New(cluster.Options{Addrs: []string{"127.0.0.1:7000"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	o := c.Options()
	if o.DialTimeout != time.Second || o.DialerRetries != 1 || o.ReadTimeout != 500*time.Millisecond ||
		o.WriteTimeout != 500*time.Millisecond || o.ClusterStateReloadInterval != time.Second ||
		!o.ContextTimeoutEnabled || o.ReadOnly || o.PoolSize != 64 {
		t.Errorf("options = dial %v retries %d read %v write %v reload %v ctx %v readonly %v pool %d",
			o.DialTimeout, o.DialerRetries, o.ReadTimeout, o.WriteTimeout, o.ClusterStateReloadInterval,
			o.ContextTimeoutEnabled, o.ReadOnly, o.PoolSize)
	}
}

package testenv

import (
	"context"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A master announced at a proxy's port is reached through the proxy by a
// cluster client that learns the nodes from the cluster (as a gateway in
// another process does): cut, the master's keys fail for that client
// while the cluster stays healthy (its bus goes direct), and restored,
// they work again. MasterOf still names the master.
func TestAnnouncedMasterIsReachedThroughItsProxy(t *testing.T) {
	ctx := context.Background()
	c := NewCluster(t, ClusterOptions{})
	m := c.Nodes[0]
	p, err := StartProxy(m.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, port, _ := net.SplitHostPort(p.Addr)
	n, _ := strconv.Atoi(port)
	if err := c.Announce(ctx, m, n); err != nil {
		t.Fatal(err)
	}
	mc := m.Client()
	defer mc.Close()
	key := ""
	for i := 0; key == ""; i++ {
		k := "k" + strconv.Itoa(i)
		slot, err := mc.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got, err := c.MasterOf(ctx, int(slot)); err != nil {
			t.Fatal(err)
		} else if got == m {
			key = k
		}
	}
	seeds := slices.DeleteFunc(c.Addrs(), func(a string) bool { return a == m.Addr })
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: seeds, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond,
		DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer cl.Close()
	if err := cl.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatalf("SET through the proxy: %v", err)
	}
	p.Cut()
	if err := cl.Set(ctx, key, "v2", 0).Err(); err == nil {
		t.Fatal("SET of the announced master's key succeeded with its proxy cut: the client went around it")
	}
	if err := c.WaitHealthy(ctx, 5*time.Second); err != nil {
		t.Errorf("the cluster with the master's proxy cut: %v", err)
	}
	p.Restore()
	if err := retry(ctx, 10*time.Second, func() error { return cl.Set(ctx, key, "v3", 0).Err() }); err != nil {
		t.Errorf("SET after the proxy was restored: %v", err)
	}
}

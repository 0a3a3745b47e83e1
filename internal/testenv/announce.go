package testenv

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"
)

// Announce makes master n tell clients to reach it at port on loopback
// (CONFIG SET cluster-announce-port) and waits until every live node's
// slot map says so. A fault proxy listening there then stands between
// every client and n, including one in another process that learns the
// cluster's addresses from the cluster, while the cluster's bus goes
// direct (its port is announced apart), so nothing done to the proxy
// ends in a failover.
func (c *Cluster) Announce(ctx context.Context, n *Node, port int) error {
	cl := n.client()
	err := cl.ConfigSet(ctx, "cluster-announce-port", strconv.Itoa(port)).Err()
	cl.Close()
	if err != nil {
		return fmt.Errorf("testenv: announce %s at %d: %w", n.Addr, port, err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	err = retry(ctx, 30*time.Second, func() error {
		for _, m := range c.Nodes {
			if !m.Alive() {
				continue
			}
			mc := m.client()
			slots, err := mc.ClusterSlots(ctx).Result()
			mc.Close()
			if err != nil {
				return err
			}
			seen := false
			for _, s := range slots {
				seen = seen || (len(s.Nodes) > 0 && s.Nodes[0].ID == n.ID && s.Nodes[0].Addr == addr)
			}
			if !seen {
				return fmt.Errorf("%s does not list %s at %s yet", m.Addr, n.ID, addr)
			}
		}
		return nil
	})
	if err == nil {
		n.announced = addr
	}
	return err
}

// reachedAt reports whether addr, as the cluster names a node, is n.
func (n *Node) reachedAt(addr string) bool { return addr == n.Addr || addr == n.announced }

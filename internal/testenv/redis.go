// Package testenv starts the real servers the tests run against: a Redis
// Cluster made of redis-server processes on free loopback ports, a throwaway
// PostgreSQL server (or the one STOCKGATE_TEST_DATABASE_URL names), and
// temp-file SQLite ledgers. Nothing here mocks a server.
//
// A missing binary is an error, never a skip: `make test` installs the
// servers, and a test run that silently skipped them would prove nothing.
package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterOptions shapes a test cluster.
type ClusterOptions struct {
	Masters int // default 3
	// ReplicasPerMaster is 0 (default) or more; failover tests ask for 1.
	ReplicasPerMaster int
	// NodeTimeout is cluster-node-timeout: how long a silent master may be
	// unreachable before its replica is promoted. Default 2s, far below the
	// server's 15s so failover tests finish quickly.
	NodeTimeout time.Duration
	// TLS makes every node TLS-only (clients, cluster bus, replication),
	// with a throwaway CA (Cluster.TLS).
	TLS bool
	// Users are ACL users set on every node once the cluster is up: name →
	// rules, as ACL SETUSER takes them ("on >password ~* +get").
	Users map[string][]string
}

// Node is one redis-server process.
type Node struct {
	Addr string
	Port int
	ID   string // cluster node id
	// announced is the address the cluster names n by when not Addr
	// (Announce): a proxy in front of it.
	announced string
	dir       string
	bin       string
	args      []string
	tls       *TLSFiles
	cmd       *exec.Cmd
	done      chan struct{} // closed when the process has exited
}

// Cluster is a running Redis Cluster on loopback.
type Cluster struct {
	Nodes   []*Node // masters first, then replicas in master order
	Masters int
	TLS     *TLSFiles // with ClusterOptions.TLS: the CA and node certificate
	opts    ClusterOptions
	dir     string
}

// Addrs lists every node's address, for a cluster client's seed list.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// Client returns a new cluster client for the cluster; the caller closes it.
func (c *Cluster) Client() *redis.ClusterClient {
	o := &redis.ClusterOptions{Addrs: c.Addrs()}
	if c.TLS != nil {
		o.TLSConfig = c.TLS.Config()
	}
	return redis.NewClusterClient(o)
}

// MasterRanges is the standard even split of the slots over n masters, the
// one `redis-cli --cluster create` makes: master j serves [r[j], r[j+1]).
func MasterRanges(n int) []int {
	r := []int{0}
	per := 16384.0 / float64(n)
	for j := 1; j < n; j++ {
		r = append(r, int(math.Round(per*float64(j)-1))+1)
	}
	return append(r, 16384)
}

// RedisServer returns the path of redis-server or an error that says how to
// get it.
func RedisServer() (string, error) {
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errors.New("redis-server not found: run `make test` (it installs redis-server with apt-get) or install it yourself")
	}
	return p, nil
}

// StartCluster starts and joins a Redis Cluster and waits until every node
// reports cluster_state:ok with the same view of the slots. On error it
// stops whatever it started.
func StartCluster(ctx context.Context, opts ClusterOptions) (*Cluster, error) {
	if opts.Masters == 0 {
		opts.Masters = 3
	}
	if opts.NodeTimeout == 0 {
		opts.NodeTimeout = 2 * time.Second
	}
	bin, err := RedisServer()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "stockgate-redis-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Masters: opts.Masters, opts: opts, dir: dir}
	if opts.TLS {
		if c.TLS, err = newTLSFiles(dir); err != nil {
			c.Stop()
			return nil, err
		}
	}
	total := opts.Masters * (1 + opts.ReplicasPerMaster)
	for i := range total {
		n, err := startNode(ctx, bin, filepath.Join(dir, strconv.Itoa(i)), opts.NodeTimeout, c.TLS)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	if err := c.join(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	if err := c.setUsers(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// setUsers sets the ACL users on every node (ACLs are per node).
func (c *Cluster) setUsers(ctx context.Context) error {
	for _, n := range c.Nodes {
		cl := n.client()
		for name, rules := range c.opts.Users {
			args := []any{"ACL", "SETUSER", name, "reset"}
			for _, r := range rules {
				args = append(args, r)
			}
			if err := cl.Do(ctx, args...).Err(); err != nil {
				cl.Close()
				return fmt.Errorf("acl setuser %s on %s: %w", name, n.Addr, err)
			}
		}
		cl.Close()
	}
	return nil
}

// startNode starts one cluster-mode redis-server on a free port, retrying
// with another port when a parallel test package took it first.
func startNode(ctx context.Context, bin, dir string, nodeTimeout time.Duration, tlsFiles *TLSFiles) (*Node, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var lastErr error
	for range 20 {
		port, err := freeClusterPort()
		if err != nil {
			return nil, err
		}
		args := []string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10),
			// Any replica may be promoted, however long since it heard
			// from its master: a test that pauses a replica while its
			// master takes writes (then kills the master) waits for the
			// promotion, and on a busy machine the pause can outlast the
			// default's bound (10 × node timeout + 10s), after which the
			// replica never stands (CI saw "no failover" for 60s).
			"--cluster-replica-validity-factor", "0",
			"--dir", dir, "--save", "", "--appendonly", "no",
			// Replicas get their first copy at once, not after the default
			// 5s wait: a replica that never synced cannot be promoted.
			"--repl-diskless-sync-delay", "0",
			"--logfile", filepath.Join(dir, "redis.log"),
			"--protected-mode", "no", "--daemonize", "no"}
		if tlsFiles != nil {
			// TLS only: the plain port is off, and the cluster bus and
			// replication go over TLS too. Clients need no certificate;
			// nodes present theirs to each other.
			args[0], args[1] = "--port", "0"
			args = append(args, "--tls-port", strconv.Itoa(port), "--tls-cluster", "yes", "--tls-replication", "yes",
				"--tls-cert-file", tlsFiles.Cert, "--tls-key-file", tlsFiles.Key, "--tls-ca-cert-file", tlsFiles.CA,
				"--tls-auth-clients", "optional")
		}
		n := &Node{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, dir: dir, bin: bin, args: args, tls: tlsFiles}
		if err := n.start(); err != nil {
			return nil, err
		}
		if err := n.waitUp(ctx); err != nil {
			n.kill()
			lastErr = err
			_ = os.Remove(filepath.Join(dir, "nodes.conf"))
			continue
		}
		return n, nil
	}
	return nil, fmt.Errorf("start redis-server: %w", lastErr)
}

func (n *Node) start() error {
	cmd := exec.Command(n.bin, n.args...)
	// Pdeathsig: if the test binary dies (a -timeout panic, a kill), the
	// node dies with it instead of outliving the run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	n.cmd, n.done = cmd, make(chan struct{})
	done := n.done
	go func() { _ = cmd.Wait(); close(done) }() // owned by the node; ends with the process
	return nil
}

func (n *Node) waitUp(ctx context.Context) error {
	cl := n.client()
	defer cl.Close()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-n.done:
			return fmt.Errorf("redis-server on %s exited: %s", n.Addr, tail(filepath.Join(n.dir, "redis.log")))
		default:
		}
		if err := cl.Ping(ctx).Err(); err == nil {
			id, err := cl.ClusterMyID(ctx).Result()
			if err != nil {
				return err
			}
			n.ID = id
			return nil
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	return fmt.Errorf("redis-server on %s did not answer", n.Addr)
}

func (n *Node) client() *redis.Client {
	o := &redis.Options{Addr: n.Addr, MaxRetries: -1, DialTimeout: time.Second}
	if n.tls != nil {
		o.TLSConfig = n.tls.Config()
	}
	return redis.NewClient(o)
}

// Client returns a single-node client for this node; the caller closes it.
func (n *Node) Client() *redis.Client { return n.client() }

func (n *Node) kill() {
	if n.cmd.Process != nil {
		_ = n.cmd.Process.Kill()
		<-n.done
	}
}

func (c *Cluster) join(ctx context.Context) error {
	first := c.Nodes[0].client()
	defer first.Close()
	for _, n := range c.Nodes[1:] {
		if err := first.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(n.Port)).Err(); err != nil {
			return fmt.Errorf("cluster meet: %w", err)
		}
	}
	ranges := MasterRanges(c.Masters)
	for j := range c.Masters {
		cl := c.Nodes[j].client()
		err := cl.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", ranges[j], ranges[j+1]-1).Err()
		cl.Close()
		if err != nil {
			return fmt.Errorf("cluster addslotsrange: %w", err)
		}
	}
	// A replica can only follow a master it already knows.
	for k, n := range c.Nodes[c.Masters:] {
		master := c.Nodes[k%c.Masters]
		cl := n.client()
		err := retry(ctx, 10*time.Second, func() error {
			return cl.ClusterReplicate(ctx, master.ID).Err()
		})
		cl.Close()
		if err != nil {
			return fmt.Errorf("cluster replicate: %w", err)
		}
	}
	if err := c.WaitHealthy(ctx, 30*time.Second); err != nil {
		return err
	}
	return c.waitReplicasSynced(ctx)
}

// waitReplicasSynced waits until every live replica has a working link to
// its master, so a failover test can rely on it being promotable, and until
// every node's view of the cluster shows all the replicas as replicas (the
// roles spread by gossip, a little after REPLICATE).
func (c *Cluster) waitReplicasSynced(ctx context.Context) error {
	want := len(c.Nodes) - c.Masters
	return retry(ctx, 30*time.Second, func() error {
		for _, n := range c.Nodes {
			if !n.Alive() {
				continue
			}
			cl := n.client()
			nodes, err := cl.ClusterNodes(ctx).Result()
			cl.Close()
			if err != nil {
				return err
			}
			got := 0
			for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
				if f := strings.Fields(line); len(f) > 2 && strings.Contains(f[2], "slave") {
					got++
				}
			}
			if got != want {
				return fmt.Errorf("%s sees %d replicas, want %d", n.Addr, got, want)
			}
		}
		for _, n := range c.Nodes[c.Masters:] {
			if !n.Alive() {
				continue
			}
			cl := n.client()
			info, err := cl.Info(ctx, "replication").Result()
			cl.Close()
			if err != nil {
				return err
			}
			if strings.Contains(info, "role:slave") && !strings.Contains(info, "master_link_status:up") {
				return fmt.Errorf("replica %s not in sync yet", n.Addr)
			}
		}
		return nil
	})
}

// WaitHealthy waits until every live node says cluster_state:ok, knows every
// slot, and agrees with the others on which node serves which slot.
func (c *Cluster) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	return retry(ctx, timeout, func() error {
		var view string
		for _, n := range c.Nodes {
			if !n.Alive() {
				continue
			}
			cl := n.client()
			info, err := cl.ClusterInfo(ctx).Result()
			if err == nil && !strings.Contains(info, "cluster_state:ok") {
				err = fmt.Errorf("%s: cluster state not ok", n.Addr)
			}
			var slots []redis.ClusterSlot
			if err == nil {
				slots, err = cl.ClusterSlots(ctx).Result()
			}
			cl.Close()
			if err != nil {
				return err
			}
			v := slotView(slots)
			if view == "" {
				view = v
			} else if v != view {
				return fmt.Errorf("%s: slot view differs", n.Addr)
			}
		}
		return nil
	})
}

func slotView(slots []redis.ClusterSlot) string {
	var b strings.Builder
	covered := 0
	for _, s := range slots {
		covered += s.End - s.Start + 1
		fmt.Fprintf(&b, "%d-%d:%s,%d;", s.Start, s.End, s.Nodes[0].Addr, len(s.Nodes))
	}
	if covered != 16384 {
		return fmt.Sprintf("partial %d", covered)
	}
	return b.String()
}

// MasterOf returns the node serving slot, as the cluster itself says.
func (c *Cluster) MasterOf(ctx context.Context, slot int) (*Node, error) {
	for _, n := range c.Nodes {
		if !n.Alive() {
			continue
		}
		cl := n.client()
		slots, err := cl.ClusterSlots(ctx).Result()
		cl.Close()
		if err != nil {
			continue
		}
		for _, s := range slots {
			if slot >= s.Start && slot <= s.End {
				for _, m := range c.Nodes {
					if m.reachedAt(s.Nodes[0].Addr) {
						return m, nil
					}
				}
			}
		}
	}
	return nil, fmt.Errorf("no node serves slot %d", slot)
}

// WaitFailover waits until every live node agrees that slot is served by
// a live master other than old (its replica was promoted), then until the
// cluster is healthy.
func (c *Cluster) WaitFailover(ctx context.Context, slot int, old *Node, timeout time.Duration) error {
	start := time.Now()
	err := retry(ctx, timeout, func() error {
		for _, n := range c.Nodes {
			if !n.Alive() || n == old {
				continue
			}
			cl := n.client()
			slots, err := cl.ClusterSlots(ctx).Result()
			cl.Close()
			if err != nil {
				return err
			}
			for _, s := range slots {
				if slot >= s.Start && slot <= s.End && s.Nodes[0].Addr == old.Addr {
					return fmt.Errorf("%s still routes slot %d to %s", n.Addr, slot, old.Addr)
				}
			}
		}
		return nil
	})
	if err != nil {
		// What the nodes said of the failover, for the test's failure.
		var said []string
		for _, n := range c.Nodes {
			if n != old {
				said = append(said, n.Addr+": "+tail(filepath.Join(n.dir, "redis.log")))
			}
		}
		return fmt.Errorf("%w; the nodes' logs end: %s", err, strings.Join(said, " || "))
	}
	return c.WaitHealthy(ctx, timeout-time.Since(start))
}

// Alive reports whether the node's process is still running.
func (n *Node) Alive() bool {
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL to the node's process and waits for it to exit.
func (n *Node) Kill() { n.kill() }

// Pause stops the node's process with SIGSTOP: it holds its sockets open
// and answers nothing, like a node cut off by the network. Resume undoes it.
func (n *Node) Pause() error { return n.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume continues a paused node with SIGCONT.
func (n *Node) Resume() error { return n.cmd.Process.Signal(syscall.SIGCONT) }

// Restart starts a killed node again on its port with its cluster config
// file, so it rejoins the cluster in its old role, but with no data: the
// test nodes keep none on disk, as a node replaced after a crash.
func (n *Node) Restart(ctx context.Context) error {
	if n.Alive() {
		return fmt.Errorf("restart %s: still running", n.Addr)
	}
	if err := n.start(); err != nil {
		return err
	}
	if err := n.waitUp(ctx); err != nil {
		n.kill()
		return fmt.Errorf("restart %s: %w", n.Addr, err)
	}
	return nil
}

// Stop kills every node (by the pid it started) and removes the files.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		n.kill()
	}
	_ = os.RemoveAll(c.dir)
}

// freeClusterPort finds a port that is free together with its cluster bus
// port (port + 10000), both below the kernel's ephemeral range: a node
// killed and restarted on its port (the fault tests) found it taken by
// an outgoing connection's local port, any process's, bind: address
// already in use (make test, TestAdminPutWhileRedisIsDownAnswersWhatStands,
// port 42797). Ports the kernel hands out for :0 are in that range.
// Node ports are 12000-19999 (buses 22000-29999), clear of deploy's
// TestLocalClusterRestarts, whose nodes start at 21000 (buses 31000):
// a node of another cluster started on the port of one it had killed
// was greeted by the killed node's cluster, and the two clusters'
// gossip mixed (no replica took over within 2 minutes).
func freeClusterPort() (int, error) {
	const first, last = 12000, 20000
	top := min(last, ephemeralLow()-10000)
	if top <= first+100 {
		return 0, fmt.Errorf("no room for a port pair below the ephemeral range (from %d)", top+10000)
	}
	for range 200 {
		port := first + rand.IntN(top-first)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		l.Close()
		if err != nil {
			continue
		}
		bus.Close()
		return port, nil
	}
	return 0, errors.New("no free port pair on loopback")
}

// ephemeralLow is the first port of the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), 32768 when it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return low
}

func retry(ctx context.Context, timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tail returns the last lines of a log file, for error messages.
func tail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		lines = append(lines, s.Text())
		if len(lines) > 5 {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, " | ")
}

// AddMaster starts a node and joins it to the cluster as a master with no
// slots yet, as an operator adds capacity (redis-cli --cluster add-node).
func (c *Cluster) AddMaster(ctx context.Context) (*Node, error) {
	if c.TLS != nil {
		return nil, errors.New("add master: not on a TLS cluster")
	}
	bin, err := RedisServer()
	if err != nil {
		return nil, err
	}
	n, err := startNode(ctx, bin, filepath.Join(c.dir, strconv.Itoa(len(c.Nodes))), c.opts.NodeTimeout, nil)
	if err != nil {
		return nil, err
	}
	c.Nodes = append(c.Nodes, n)
	out, err := exec.CommandContext(ctx, "redis-cli", "--cluster", "add-node", n.Addr, c.Nodes[0].Addr).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("add-node %s: %w: %s", n.Addr, err, out)
	}
	// Every node must know the new one before slots move to it: a reshard
	// that starts while gossip still spreads it fails with "I don't know
	// about node" (a make test failure).
	known := retry(ctx, 30*time.Second, func() error {
		for _, m := range c.Nodes {
			if !m.Alive() {
				continue
			}
			cl := m.client()
			nodes, err := cl.ClusterNodes(ctx).Result()
			cl.Close()
			if err == nil && !strings.Contains(nodes, n.ID) {
				err = fmt.Errorf("%s does not know %s yet", m.Addr, n.Addr)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if known != nil {
		return n, known
	}
	return n, c.WaitHealthy(ctx, 30*time.Second)
}

// Reshard moves slots from the other masters to to, key by key, as an
// operator does (redis-cli --cluster reshard --cluster-from all), and
// returns once every slot is served again.
func (c *Cluster) Reshard(ctx context.Context, to *Node, slots int) error {
	out, err := exec.CommandContext(ctx, "redis-cli", "--cluster", "reshard", c.Nodes[0].Addr,
		"--cluster-from", "all", "--cluster-to", to.ID, "--cluster-slots", strconv.Itoa(slots),
		"--cluster-yes", "--cluster-pipeline", "100").CombinedOutput()
	if err != nil {
		if len(out) > 2000 {
			out = out[len(out)-2000:]
		}
		return fmt.Errorf("reshard %d slots to %s: %w: %s", slots, to.Addr, err, out)
	}
	return c.WaitHealthy(ctx, 30*time.Second)
}

package testenv

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// AutoFailover is a highly available PostgreSQL made of real processes:
// pg_auto_failover's monitor and data nodes, a primary and its standbys,
// each run by its own pg_autoctl on free loopback ports, as production runs
// them. Failures are the real ones: a planned failover through the
// monitor, a postmaster killed with -9, a whole node gone.
type AutoFailover struct {
	dir, bin, pgctl string
	db              string // the test database, replicated to the standby
	env             []string
	cred            *syscall.Credential
	monitorURI      string
	mon             *sql.DB // the monitor's own database, for its view
	monitor         *afNode
	nodes           []*afNode
	sync            bool // AutoFailoverOptions.Sync
}

// AutoFailoverOptions configure StartAutoFailover.
type AutoFailoverOptions struct {
	// Sync keeps the standby synchronous (replication-quorum true, the
	// default of pg_auto_failover): a commit returns once the standby has
	// it, so a failover loses no committed row. Without it the standby
	// is asynchronous (created with --replication-quorum false).
	Sync bool
	// Standbys is how many standbys the primary has (default 1). With Sync
	// and two, pg_auto_failover sets number_sync_standbys to 1: a commit
	// waits for one of them, and with neither the primary blocks writes
	// rather than commit alone. With one, it trades the other way: while
	// its standby is away the primary drops to wait_primary, empties
	// synchronous_standby_names and acknowledges commits only it holds
	// (docs/architecture-multi-standby.rst of pg_auto_failover).
	Standbys int
	// DBName is the database the test writes to, created on the primary
	// by pg_autoctl (--dbname) and so on the standby. Default "stockgate".
	DBName string
}

// afNode is one pg_autoctl process (the monitor or a data node) with the
// postgres it supervises. The postmaster is in pg_autoctl's process group;
// its own children (backends, walsenders) start sessions of their own and
// exit when they see it gone.
type afNode struct {
	name, pgdata, log string
	port              int
	cmd               *exec.Cmd
	done              chan struct{}
	paused            []int // WAL senders stopped by PauseReplication
}

// killPaused kills the processes PauseReplication stopped: stopped, they
// would never see their postmaster gone.
func (n *afNode) killPaused() {
	for _, pid := range n.paused {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	n.paused = nil
}

// Failure detection, shortened from pg_auto_failover's defaults (made for
// networks and busy hosts) to what two nodes on loopback need, keeping its
// safety argument intact. The monitor promotes the standby only once the
// primary has both missed its reports (node_considered_unhealthy_timeout)
// and failed the monitor's health checks, and then only after waiting
// primary_demote_timeout for the old primary to step down; a primary cut
// off from both monitor and standby stops its postgres after the keeper's
// network_partition_timeout. So a partitioned old primary is down before
// the standby takes writes as long as network_partition_timeout (+1s of
// keeper loop and a fast shutdown) < node_considered_unhealthy_timeout +
// primary_demote_timeout: here 3s+2s < 3s+5s, as 20s < 20s+30s by default.
var (
	// Monitor settings (ALTER SYSTEM on the monitor, reloaded).
	afMonitorSettings = [][2]string{
		// Check each node every second (default 5s); a connection on
		// loopback takes milliseconds, so 1s to connect (default 5s) is
		// ample; 2 retries (the default) 500ms apart (default 2s): a dead
		// node is marked bad within about 2s.
		{"pgautofailover.health_check_period", "1000"},
		{"pgautofailover.health_check_timeout", "1000"},
		{"pgautofailover.health_check_retry_delay", "500"},
		// Keepers report every second; 3 missed reports (default 20s).
		// Not less: on 2 shared cores a keeper can stall for a second.
		{"pgautofailover.node_considered_unhealthy_timeout", "3000"},
		// See above: must stay above network_partition_timeout + ~2s -
		// node_considered_unhealthy_timeout (default 30s).
		{"pgautofailover.primary_demote_timeout", "5000"},
		// No failover in the first seconds after the monitor starts, while
		// its health checks have not run yet (default 10s); with checks
		// every second 3s is enough.
		{"pgautofailover.startup_grace_period", "3000"},
	}
	// Keeper settings (pg_autoctl config set on each data node). The
	// restart settings stay at their defaults (3 tries within 20s): a
	// postmaster that dies is restarted in place before the monitor hears
	// of it, as in production.
	afKeeperSettings = [][2]string{
		{"timeout.network_partition_timeout", "3"}, // default 20
	}
	// PostgreSQL settings of the data nodes (ALTER SYSTEM on the first).
	afNodeSettings = [][2]string{
		// pg_autoctl's pg_basebackup asks for a spread checkpoint, paced
		// over 90% of checkpoint_timeout: with the new database to write
		// out, the standby took minutes to clone. 0 writes at once.
		{"checkpoint_completion_target", "0"},
		// A standby whose primary restarted (kill -9) reconnects after
		// this (default 5s), and until then a synchronous primary's
		// commits wait for it.
		{"wal_retrieve_retry_interval", "'500ms'"},
	}
)

// The states in which a node takes writes (pg_auto_failover's FSM).
var afWritableStates = map[string]bool{"single": true, "wait_primary": true, "primary": true, "join_primary": true, "apply_settings": true}

// StartAutoFailover starts a monitor, a primary and a standby, and returns
// once the monitor sees them as primary and secondary (with Sync, once
// replication is synchronous). pg_autoctl refuses root, so as root every
// process runs as the postgres user. On error it stops what it started.
func StartAutoFailover(ctx context.Context, o AutoFailoverOptions) (*AutoFailover, error) {
	if o.DBName == "" {
		o.DBName = "stockgate"
	}
	if o.Standbys == 0 {
		o.Standbys = 1
	}
	if o.Standbys < 1 || o.Standbys > 3 {
		return nil, fmt.Errorf("auto failover: %d standbys: want 1 to 3", o.Standbys)
	}
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	autoctl, err := pgAutoctl(bin)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "stockgate-af-")
	if err != nil {
		return nil, err
	}
	a := &AutoFailover{dir: dir, bin: autoctl, pgctl: filepath.Join(bin, "pg_ctl"), db: o.DBName, sync: o.Sync}
	if a.cred, err = pgCredential(dir); err != nil {
		a.Stop()
		return nil, err
	}
	// pg_autoctl keeps its configuration and state under the XDG
	// directories (~/.config, ~/.local/share, a runtime dir for pid
	// files): all of them in dir, removed with it. PG_REGRESS_SOCK_DIR
	// (pg_auto_failover's own test hook) puts the unix sockets there too,
	// and PGHOST makes pg_autoctl find them.
	a.env = []string{"PATH=" + bin + ":/usr/bin:/bin", "HOME=" + dir, "PGHOST=" + dir, "PG_REGRESS_SOCK_DIR=" + dir}
	for _, x := range [][2]string{{"XDG_CONFIG_HOME", "config"}, {"XDG_DATA_HOME", "share"}, {"XDG_RUNTIME_DIR", "run"}} {
		p := filepath.Join(dir, x[1])
		if err := os.Mkdir(p, 0o700); err != nil {
			a.Stop()
			return nil, err
		}
		if a.cred != nil {
			_ = os.Chown(p, int(a.cred.Uid), int(a.cred.Gid))
		}
		a.env = append(a.env, x[0]+"="+p)
	}
	if err := a.start(ctx, o); err != nil {
		a.Stop()
		return nil, err
	}
	return a, nil
}

func (a *AutoFailover) start(ctx context.Context, o AutoFailoverOptions) error {
	common := []string{"--pgctl", a.pgctl, "--hostname", "127.0.0.1", "--listen", "127.0.0.1", "--auth", "trust", "--no-ssl", "--run"}
	m, err := a.startNode("monitor", append([]string{"create", "monitor"}, common...))
	if err != nil {
		return err
	}
	a.monitor = m
	a.monitorURI = fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", m.port)
	if a.mon, err = sql.Open("pgx", fmt.Sprintf("postgres://postgres@127.0.0.1:%d/pg_auto_failover?sslmode=disable", m.port)); err != nil {
		return err
	}
	// The monitor is up once its extension answers.
	if err := a.waitNode(ctx, m, "monitor", func() error { _, err := a.State(ctx); return err }); err != nil {
		return err
	}
	for _, s := range afMonitorSettings {
		if err := alterSystem(ctx, m.port, s[0], s[1]); err != nil {
			return fmt.Errorf("monitor: %w", err)
		}
	}
	for i := range 1 + o.Standbys {
		want := "secondary"
		if i == 0 {
			want = "single"
		}
		name := fmt.Sprintf("node%d", i+1)
		args := append([]string{"create", "postgres", "--monitor", a.monitorURI, "--name", name, "--dbname", a.db}, common...)
		if i > 0 && !o.Sync {
			args = append(args, "--replication-quorum", "false")
		}
		n, err := a.startNode(name, args)
		if err != nil {
			return err
		}
		a.nodes = append(a.nodes, n)
		// The first node becomes a primary of its own (single); each
		// other is a standby once pg_basebackup is done and it caught up.
		if err := a.waitNode(ctx, n, "reach "+want, func() error { return a.inState(ctx, n.port, want) }); err != nil {
			return err
		}
		if i == 0 {
			// In postgresql.auto.conf, so the standby's copy has them too.
			for _, s := range afNodeSettings {
				if err := alterSystem(ctx, n.port, s[0], s[1]); err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
			}
		}
		// pg_autoctl rewrites its config file on its own at state
		// changes: read half-written, "config set" fails (seen under
		// load), so each setting is set until "config get" reads it back.
		for _, s := range afKeeperSettings {
			err := waitFor(ctx, func() error {
				if out, err := a.autoctl(ctx, "config", "set", "--pgdata", n.pgdata, s[0], s[1]); err != nil {
					return fmt.Errorf("%w: %s", err, out)
				}
				out, err := a.autoctl(ctx, "config", "get", "--pgdata", n.pgdata, s[0])
				if err != nil {
					return fmt.Errorf("%w: %s", err, out)
				}
				if got := strings.TrimSpace(string(out)); got != s[1] {
					return fmt.Errorf("config get reads %q", got)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("%s: config set %s: %w", name, s[0], err)
			}
		}
	}
	return a.WaitSecondary(ctx)
}

// startNode starts one long-lived pg_autoctl (create ... --run) with its
// output in <name>.log. It runs in a process group of its own with the
// postgres it starts, so that a whole node can be killed at once.
func (a *AutoFailover) startNode(name string, args []string) (*afNode, error) {
	port, err := freeClusterPort()
	if err != nil {
		return nil, err
	}
	n := &afNode{name: name, pgdata: filepath.Join(a.dir, name), log: filepath.Join(a.dir, name+".log"), port: port, done: make(chan struct{})}
	args = append(args, "--pgdata", n.pgdata, "--pgport", strconv.Itoa(port))
	log, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(a.bin, args...)
	cmd.Env, cmd.Dir = a.env, a.dir
	cmd.Stdout, cmd.Stderr = log, log
	// SIGINT when the test binary dies: pg_autoctl then stops its postgres
	// (fast shutdown) instead of leaving it behind, as SIGKILL would.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: a.cred, Setpgid: true, Pdeathsig: syscall.SIGINT}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start pg_autoctl %s: %w", name, err)
	}
	go func() { _ = cmd.Wait(); log.Close(); close(n.done) }() // ends with the process
	n.cmd = cmd
	return n, nil
}

// waitNode waits for ok, failing early if n's pg_autoctl exits; the error
// names the step and ends with the tail of n's log.
func (a *AutoFailover) waitNode(ctx context.Context, n *afNode, step string, ok func() error) error {
	err := waitFor(ctx, func() error {
		select {
		case <-n.done:
			return errors.New("pg_autoctl exited")
		default:
		}
		return ok()
	})
	if err != nil {
		err = fmt.Errorf("pg_autoctl %s: %s: %w: %s", n.name, step, err, tail(n.log))
		if n != a.monitor {
			err = fmt.Errorf("%w; monitor: %s", err, tail(a.monitor.log))
		}
		return err
	}
	return nil
}

// alterSystem sets a server setting with ALTER SYSTEM and reloads.
func alterSystem(ctx context.Context, port int, name, value string) error {
	c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, fmt.Sprintf("ALTER SYSTEM SET %s = %s", name, value)); err != nil {
		return fmt.Errorf("set %s: %w", name, err)
	}
	_, err = c.Exec(ctx, "SELECT pg_reload_conf()")
	return err
}

// autoctl runs a short pg_autoctl command (as the postgres user when root).
func (a *AutoFailover) autoctl(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, a.bin, args...)
	cmd.Env, cmd.Dir = a.env, a.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: a.cred}
	return cmd.CombinedOutput()
}

// DSN is a multi-host URL of the test database naming both data nodes:
// libpq and pgx connect to whichever takes writes, so a client that
// reconnects follows a failover.
func (a *AutoFailover) DSN() string {
	hosts := make([]string, len(a.nodes))
	for i, n := range a.nodes {
		hosts[i] = "127.0.0.1:" + strconv.Itoa(n.port)
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?target_session_attrs=read-write&sslmode=disable", strings.Join(hosts, ","), a.db)
}

// URL is the URL of the test database on one data node (by its port), for
// checking what that node holds.
func (a *AutoFailover) URL(port int) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", port, a.db)
}

// Ports are the data nodes' ports.
func (a *AutoFailover) Ports() []int {
	ports := make([]int, len(a.nodes))
	for i, n := range a.nodes {
		ports[i] = n.port
	}
	return ports
}

// AutoFailoverNode is one node as the monitor sees it: a row of
// `pg_autoctl show state --json`.
type AutoFailoverNode struct {
	ID       int64  `json:"node_id"`
	Name     string `json:"nodename"`
	Port     int    `json:"nodeport"`
	Current  string `json:"current_group_state"`
	Assigned string `json:"assigned_group_state"`
	Health   int    `json:"health"` // 1 good, 0 bad, -1 unknown
	LSN      string `json:"reported_lsn"`
	Quorum   bool   `json:"replication_quorum"`
}

func (n AutoFailoverNode) String() string {
	return fmt.Sprintf("%s :%d %s->%s health=%d lsn=%s", n.Name, n.Port, n.Current, n.Assigned, n.Health, n.LSN)
}

// State is the monitor's view of the formation. It runs the query of
// `pg_autoctl show state --json` on the monitor itself: the waits poll it
// every 50ms, which would otherwise be a process each.
func (a *AutoFailover) State(ctx context.Context) ([]AutoFailoverNode, error) {
	var js []byte
	err := a.mon.QueryRowContext(ctx, `SELECT coalesce(jsonb_agg(row_to_json(s)), '[]')
		FROM pgautofailover.current_state('default') s`).Scan(&js)
	if err != nil {
		return nil, fmt.Errorf("monitor state: %w", err)
	}
	var st []AutoFailoverNode
	if err := json.Unmarshal(js, &st); err != nil {
		return nil, fmt.Errorf("monitor state: %w", err)
	}
	return st, nil
}

// inState is nil once the monitor sees the node on port in state want,
// reported and assigned alike (no transition under way).
func (a *AutoFailover) inState(ctx context.Context, port int, want string) error {
	st, err := a.State(ctx)
	if err != nil {
		return err
	}
	for _, n := range st {
		if n.Port == port && n.Current == want && n.Assigned == want {
			return nil
		}
	}
	return fmt.Errorf("node :%d not %s: %v", port, want, st)
}

// WaitPrimary waits until exactly one data node takes writes and returns
// its port: it is out of recovery, commits (so a synchronous standby, if
// any, acknowledges), and the monitor agrees it is a primary. Without the
// monitor's word an old primary still draining could pass for a new one.
func (a *AutoFailover) WaitPrimary(ctx context.Context) (int, error) {
	var port int
	err := waitFor(ctx, func() error {
		var writable []int
		var why []string
		for _, n := range a.nodes {
			if err := acceptsWrites(ctx, n.port); err != nil {
				why = append(why, fmt.Sprintf(":%d %v", n.port, err))
				continue
			}
			writable = append(writable, n.port)
		}
		if len(writable) != 1 {
			return fmt.Errorf("%d nodes take writes (%s)", len(writable), strings.Join(why, "; "))
		}
		st, err := a.State(ctx)
		if err != nil {
			return err
		}
		for _, n := range st {
			if n.Port == writable[0] && n.Current == n.Assigned && afWritableStates[n.Current] {
				port = n.Port
				return nil
			}
		}
		return fmt.Errorf(":%d takes writes but the monitor says %v", writable[0], st)
	})
	if err != nil {
		return 0, fmt.Errorf("wait primary: %w", err)
	}
	return port, nil
}

// acceptsWrites is nil when the server on port is out of recovery and a
// transaction that writes WAL commits within 2s, so a synchronous standby,
// if there is one, acknowledged it. Not txid_current(): a transaction that
// wrote no WAL before its commit does not wait for the standby. A
// transactional logical message writes WAL and needs no table. (ctx ends
// the wait by a cancel request; statement_timeout would not: it is off
// before the commit.)
func acceptsWrites(ctx context.Context, port int) error {
	return onNode(ctx, port, func(ctx context.Context, c *pgx.Conn) error {
		var primary bool
		if err := c.QueryRow(ctx, "SELECT NOT pg_is_in_recovery()").Scan(&primary); err != nil {
			return err
		}
		if !primary {
			return errors.New("in recovery")
		}
		_, err := c.Exec(ctx, "SELECT pg_logical_emit_message(true, 'stockgate-testenv', 'probe')")
		return err
	})
}

// onNode runs f on a connection of its own to the data node on port, all
// of it within 2s.
func onNode(ctx context.Context, port int, f func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", port))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	return f(ctx, c)
}

// syncInForce is nil when the primary on port waits for its standby at
// every commit now: synchronous_standby_names is set and a standby streams
// as a synchronous (or quorum) one.
func syncInForce(ctx context.Context, port int) error {
	return onNode(ctx, port, func(ctx context.Context, c *pgx.Conn) error {
		var names string
		var streaming int
		if err := c.QueryRow(ctx, `SELECT current_setting('synchronous_standby_names'),
			(SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum'))`).
			Scan(&names, &streaming); err != nil {
			return err
		}
		if names == "" || streaming == 0 {
			return fmt.Errorf(":%d commits without its standby (synchronous_standby_names %q, %d synchronous standbys streaming)", port, names, streaming)
		}
		return nil
	})
}

// WaitSecondary waits until the monitor sees one primary and every other
// live node a secondary, all settled: the standbys stream again (with
// Sync, as synchronous standbys the primary's commits wait for: the
// monitor's word alone can be stale) and can be promoted. A node
// StopPrimaryNode killed is left out.
func (a *AutoFailover) WaitSecondary(ctx context.Context) error {
	err := waitFor(ctx, func() error {
		st, err := a.State(ctx)
		if err != nil {
			return err
		}
		seen, live := map[string]int{}, 0
		for _, n := range st {
			if an := a.node(n.Port); an == nil || an.dead() {
				continue
			}
			live++
			if n.Current == n.Assigned {
				seen[n.Current]++
			}
		}
		if live < 2 || seen["primary"] != 1 || seen["secondary"] != live-1 {
			return fmt.Errorf("monitor says %v", st)
		}
		if !a.sync {
			return nil
		}
		for _, n := range st {
			if n.Current == "primary" {
				return syncInForce(ctx, n.Port)
			}
		}
		return fmt.Errorf("monitor says %v", st)
	})
	if err != nil {
		return fmt.Errorf("wait secondary: %w", err)
	}
	return nil
}

// Failover is a planned failover (`pg_autoctl perform failover`), which
// returns once the monitor has a new node in the primary state (the old
// primary has rejoined as its standby). It returns the new primary's port.
func (a *AutoFailover) Failover(ctx context.Context) (int, error) {
	old, err := a.WaitPrimary(ctx)
	if err != nil {
		return 0, err
	}
	if err := a.waitSync(ctx, old); err != nil {
		return 0, fmt.Errorf("perform failover: %w", err)
	}
	// --wait 0: no timeout of its own; ctx bounds it.
	if out, err := a.autoctl(ctx, "perform", "failover", "--monitor", a.monitorURI, "--wait", "0"); err != nil {
		return 0, fmt.Errorf("perform failover: %w: %s", err, out)
	}
	port, err := a.WaitPrimary(ctx)
	if err != nil {
		return 0, err
	}
	if port == old {
		return 0, fmt.Errorf("perform failover: :%d is still the primary", port)
	}
	return port, nil
}

// KillPrimary kills the current primary's postmaster with SIGKILL (its pid
// from postmaster.pid) and leaves the node's pg_autoctl running: it
// restarts postgres as it would in production, so the same node usually
// comes back as the primary (crash recovery) before the monitor would
// fail over. It returns the primary's port and the killed pid; WaitPrimary
// tells when writes are taken again.
func (a *AutoFailover) KillPrimary(ctx context.Context) (port, pid int, err error) {
	port, err = a.WaitPrimary(ctx)
	if err != nil {
		return 0, 0, err
	}
	if err := a.waitSync(ctx, port); err != nil {
		return 0, 0, fmt.Errorf("kill primary: %w", err)
	}
	n := a.node(port)
	b, err := os.ReadFile(filepath.Join(n.pgdata, "postmaster.pid"))
	if err != nil {
		return 0, 0, fmt.Errorf("kill primary: %w", err)
	}
	pid, err = strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return 0, 0, fmt.Errorf("kill primary: postmaster.pid: %w", err)
	}
	// Only a process of the node's group is ours: a stale pid file may
	// name a process that is not.
	if g, err := syscall.Getpgid(pid); err != nil || g != n.cmd.Process.Pid {
		return 0, 0, fmt.Errorf("kill primary: pid %d is not of pg_autoctl %s (group %d)", pid, n.name, g)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return 0, 0, fmt.Errorf("kill primary: %w", err)
	}
	return port, pid, nil
}

// waitSync waits, with Sync, until the primary on port waits for a standby
// at every commit, so that a fault now loses nothing it acknowledged.
// With one standby that can end a moment later (see Standbys): the
// monitor's states lag the keepers', and a primary it still calls
// "primary" may have dropped to wait_primary. Killed then, one lost 142
// acknowledged sales in a run of five, and another 28 in CI: a fault test
// that promises no loss runs two standbys.
func (a *AutoFailover) waitSync(ctx context.Context, port int) error {
	if !a.sync {
		return nil
	}
	return waitFor(ctx, func() error { return syncInForce(ctx, port) })
}

// StopPrimaryNode kills the current primary's whole node, pg_autoctl and
// postgres together (SIGKILL to its process group; the backends follow
// their postmaster within milliseconds): a machine lost. The
// monitor then promotes the standby once the failure is detected (see
// the settings above). It returns the dead node's port; WaitPrimary gives
// the new primary. The node stays down until Stop.
func (a *AutoFailover) StopPrimaryNode(ctx context.Context) (int, error) {
	port, err := a.WaitPrimary(ctx)
	if err != nil {
		return 0, err
	}
	if err := a.waitSync(ctx, port); err != nil {
		return 0, fmt.Errorf("stop primary node: %w", err)
	}
	n := a.node(port)
	if err := syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("stop primary node: %w", err)
	}
	n.killPaused()
	<-n.done
	return port, nil
}

// dead: the node's pg_autoctl has exited (StopPrimaryNode).
func (n *afNode) dead() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

func (a *AutoFailover) node(port int) *afNode {
	for _, n := range a.nodes {
		if n.port == port {
			return n
		}
	}
	return nil
}

// Stop stops every pg_autoctl this package started (by pid; each stops its
// postgres) and removes the files.
func (a *AutoFailover) Stop() {
	if a.mon != nil {
		a.mon.Close()
	}
	all := append([]*afNode{a.monitor}, a.nodes...)
	for _, n := range all {
		if n != nil {
			n.killPaused()
			_ = n.cmd.Process.Signal(syscall.SIGINT) // fast shutdown of its postgres
		}
	}
	for _, n := range all {
		if n == nil {
			continue
		}
		select {
		case <-n.done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL) // the group: pg_autoctl and its postgres
			<-n.done
		}
	}
	_ = os.RemoveAll(a.dir)
}

// waitFor calls f every 50ms until it returns nil. When ctx ends first, the
// error is f's last one: what was still wrong.
func waitFor(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// pgAutoctl returns the path of pg_autoctl, and fails when it or the
// monitor's extension for the server in bin is missing (Debian's
// pg-auto-failover-cli and postgresql-<major>-auto-failover, which the
// Makefile's deps-autofailover installs).
func pgAutoctl(bin string) (string, error) {
	ext := filepath.Join(filepath.Dir(bin), "lib", "pgautofailover.so")
	p, err := exec.LookPath("pg_autoctl")
	if err == nil {
		_, err = os.Stat(ext)
	}
	if err != nil {
		return "", fmt.Errorf("pg_auto_failover not found (%w): run `make test` (it installs pg-auto-failover-cli and postgresql-%d-auto-failover with apt-get)", err, version(bin))
	}
	return p, nil
}

// PauseReplication stops the primary's WAL sender (SIGSTOP): from then on
// the standby hears nothing, as when replication lags behind, and an
// asynchronous primary's commits are on it alone. Follow it with
// StopPrimaryNode: the paused sender is killed with its node (never
// resumed, which would send what it holds), so those commits are lost
// with the node. Only a child of the primary's postmaster is signalled.
func (a *AutoFailover) PauseReplication(ctx context.Context) error {
	port, err := a.WaitPrimary(ctx)
	if err != nil {
		return err
	}
	n := a.node(port)
	c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", port))
	if err != nil {
		return fmt.Errorf("pause replication: %w", err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	var pid int
	if err := c.QueryRow(ctx, `SELECT pid FROM pg_stat_replication LIMIT 1`).Scan(&pid); err != nil {
		return fmt.Errorf("pause replication: no WAL sender on :%d: %w", port, err)
	}
	b, err := os.ReadFile(filepath.Join(n.pgdata, "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("pause replication: %w", err)
	}
	postmaster, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if ppid, err := parentOf(pid); err != nil || ppid != postmaster {
		return fmt.Errorf("pause replication: pid %d is not the primary postmaster's (%d) child (%d, %v)", pid, postmaster, ppid, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pause replication: %w", err)
	}
	n.paused = append(n.paused, pid)
	return nil
}

// parentOf reads a process's parent pid from /proc.
func parentOf(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid ...: comm may hold spaces, so read after ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	return strconv.Atoi(f[1])
}

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/stockgate/stockgate/cluster"
	"github.com/stockgate/stockgate/e2e/loadgen"
	"github.com/stockgate/stockgate/e2e/netfault"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// faultsHeading opens the section faultsCmd writes into the benchmark
// document (replacing it when present, so a suite run keeps it).
const faultsHeading = "## Redis and ledger faults during a sale"

// faultsCmd runs the four Redis faults, a Redis master's link cut, the
// three ledger-link faults, a
// full disk under the SQLite ledger and the four failovers of the
// ledger's primary during a sale against a stockgate process (PostgreSQL
// through a fault proxy or a formation, or SQLite on a tmpfs; a 3+3
// cluster of its own per fault) through the load tool, and writes their
// section of the benchmark document.
func faultsCmd(args []string) error {
	fs := flag.NewFlagSet("faults", flag.ExitOnError)
	out := fs.String("out", "docs/BENCHMARKS.md", "benchmark document whose faults section to write")
	dir := fs.String("dir", ".run/bench", "working directory (the stockgate binary)")
	only := fs.String("only", "", "run only the faults whose name contains this (the section then lists only them)")
	fs.IntVar(&faultStandbys, "standbys", faultStandbys, "synchronous standbys of the formation the primary's faults run on")
	fs.StringVar(&faultDump, "goroutines", "", "write the gateway's goroutines (pprof, debug=1) into this file, suffixed .1 to .8, each second of a fault's first eight")
	_ = fs.Parse(args)
	ctx := context.Background()
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	bin := filepath.Join(*dir, "stockgate")
	fmt.Fprintln(os.Stderr, "building stockgate")
	if b, err := exec.Command("go", "build", "-o", bin, "./cmd/stockgate").CombinedOutput(); err != nil {
		return fmt.Errorf("build: %v: %s", err, b)
	}
	pg, err := testenv.StartDurablePostgres(ctx)
	if err != nil {
		return err
	}
	defer pg.Stop()
	var rows []faultRow
	for _, f := range faults {
		if !strings.Contains(f.name, *only) {
			continue
		}
		row, err := runFault(ctx, bin, pg, f)
		if err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
		fmt.Fprintf(os.Stderr, "%s: %+v\n", f.name, row)
		rows = append(rows, row)
	}
	return writeSection(*out, faultsDoc(rows))
}

// fault is one scenario: do starts it at the fault window's start; it
// returns when the fault (and its repair, if the scenario has one) is
// done, and the moment from which the gates are timed back. A fault of
// the ledger's primary (formation) runs on a pg_auto_failover formation of
// its own, a primary and two synchronous standbys reached by a multi-host
// DSN as OPERATIONS.md advises, instead of the proxied PostgreSQL, and
// watches for window (default 15 s): a failover outlasts a link's fault.
type fault struct {
	name      string
	formation bool
	async     bool // the formation's standbys asynchronous: a failover may lose acknowledged commits
	sqlite    bool // the SQLite ledger, its file on a tmpfs of its own (the disk's faults)
	redisLink bool // the gateway reaches the victim master through a fault proxy (rlink)
	window    time.Duration
	do        func(ctx context.Context, e faultEnv) (from time.Time, err error)
}

// faultEnv is what a fault acts on: the cluster, the first SKU's master,
// the ledger's link (the proxied PostgreSQL), its formation, or the file
// system the SQLite ledger is on.
type faultEnv struct {
	c      *testenv.Cluster
	victim *testenv.Node
	link   *netfault.Link
	rlink  *netfault.Link // between the gateway and victim (redisLink)
	ha     *testenv.AutoFailover
	disk   string // the SQLite ledger's tmpfs
}

var faults = []fault{
	{name: "kill -9 of one master of three", do: func(ctx context.Context, e faultEnv) (time.Time, error) {
		e.victim.Kill()
		return time.Now(), nil
	}},
	{name: "all of Redis down 10 s, restarted empty", do: func(ctx context.Context, e faultEnv) (time.Time, error) {
		for _, n := range e.c.Nodes {
			n.Kill()
		}
		time.Sleep(10 * time.Second) // the scenario's outage
		for _, n := range e.c.Nodes {
			if err := n.Restart(ctx); err != nil {
				return time.Time{}, err
			}
		}
		return time.Now(), nil
	}},
	{name: "a quarter of the slots resharded to a new master", do: func(ctx context.Context, e faultEnv) (time.Time, error) {
		start := time.Now()
		n, err := e.c.AddMaster(ctx)
		if err != nil {
			return start, err
		}
		return start, e.c.Reshard(ctx, n, 16384/4)
	}},
	{name: "zombie master: SIGSTOP 5 s (node timeout 2 s), then SIGCONT", do: func(ctx context.Context, e faultEnv) (time.Time, error) {
		if err := e.victim.Pause(); err != nil {
			return time.Time{}, err
		}
		time.Sleep(5 * time.Second) // frozen past the node timeout
		return time.Now(), e.victim.Resume()
	}},
	// The master answers its bus, so the cluster promotes no replica:
	// nothing ends the fault but the link (issue 40: "then one Redis
	// master").
	{name: "link to one Redis master black-holed for 10 s", redisLink: true, do: func(ctx context.Context, e faultEnv) (time.Time, error) {
		if err := e.rlink.Cut(); err != nil {
			return time.Time{}, err
		}
		time.Sleep(10 * time.Second) // the scenario's outage
		e.rlink.Heal(ctx)
		return time.Now(), nil
	}},
	// Issue 40's slow ledger: 30 s of it, so a queue that grows without
	// bound would show in the window's tail.
	{name: "PostgreSQL 500 ms slower per round trip for 30 s", window: 33 * time.Second, do: func(ctx context.Context, e faultEnv) (time.Time, error) {
		if err := e.link.Latency(250 * time.Millisecond); err != nil {
			return time.Time{}, err
		}
		time.Sleep(30 * time.Second) // the scenario's slow spell
		e.link.Heal(ctx)
		return time.Now(), nil
	}},
	{name: "link to PostgreSQL black-holed for 10 s", do: func(ctx context.Context, e faultEnv) (time.Time, error) {
		if err := e.link.Cut(); err != nil {
			return time.Time{}, err
		}
		time.Sleep(10 * time.Second) // the scenario's outage
		e.link.Heal(ctx)
		return time.Now(), nil
	}},
	// A COMMIT's reply lost on the way back (its connection closed): the
	// commit stands and the request's outcome is unknown to the replica.
	{name: "one PostgreSQL COMMIT reply in 50 lost for 10 s", do: func(ctx context.Context, e faultEnv) (time.Time, error) {
		lost, err := e.link.LoseEveryCommitReply(50)
		if err != nil {
			return time.Time{}, err
		}
		time.Sleep(10 * time.Second) // the scenario's spell
		e.link.Heal(ctx)
		fmt.Fprintf(os.Stderr, "COMMIT replies lost: %d\n", lost())
		return time.Now(), nil
	}},
	{name: "SQLite ledger's disk full for 10 s", sqlite: true, do: func(ctx context.Context, e faultEnv) (time.Time, error) {
		free, err := fillDisk(e.disk)
		if err != nil {
			return time.Time{}, err
		}
		time.Sleep(10 * time.Second) // the scenario's full spell
		return time.Now(), free()
	}},
	// The ledger's primary fails over: the gateway finds the new one by
	// its DSN (target_session_attrs=read-write). Timed from the fault.
	{name: "PostgreSQL planned failover (pg_autoctl perform failover)", formation: true, window: 40 * time.Second,
		do: func(ctx context.Context, e faultEnv) (time.Time, error) {
			from := time.Now()
			_, err := e.ha.Failover(ctx)
			return from, err
		}},
	{name: "PostgreSQL primary's postmaster killed -9", formation: true, window: 40 * time.Second,
		do: func(ctx context.Context, e faultEnv) (time.Time, error) {
			from := time.Now()
			if _, _, err := e.ha.KillPrimary(ctx); err != nil {
				return from, err
			}
			_, err := e.ha.WaitPrimary(ctx)
			return from, err
		}},
	{name: "PostgreSQL primary's node lost (pg_autoctl and postgres killed)", formation: true, window: 60 * time.Second,
		do: nodeLost},
	// The same with the standby asynchronous: the commits the primary
	// acknowledged and had not shipped are lost (OPERATIONS.md).
	{name: "PostgreSQL primary's node lost, standby asynchronous", formation: true, async: true, window: 60 * time.Second,
		do: nodeLost},
}

func nodeLost(ctx context.Context, e faultEnv) (time.Time, error) {
	from := time.Now()
	if _, err := e.ha.StopPrimaryNode(ctx); err != nil {
		return from, err
	}
	_, err := e.ha.WaitPrimary(ctx)
	return from, err
}

// faultRow is what one fault run measured.
type faultRow struct {
	name           string
	rate           int
	requests, n503 uint64
	other          string // answers other than 201 and 503
	p99            time.Duration
	p99ok, p99shed time.Duration // the window's 201s and its 503s apart: a sale waits on the ledger, a shed answer should not
	slowest        time.Duration // the window's slowest answer
	past           float64       // purchases the gateway itself took longer than its work timeout to answer (its histogram)
	shedAfter      int64         // a failover's 503s after the second writes were taken again in (-1: not a failover)
	back           time.Duration // from the fault (or Redis's return) until every SKU's gate agreed with the ledger
	ok             uint64
	sold           int64
	lost           int // 201s whose order the ledger does not have (audited by id)
}

const faultSKUs = 100

// faultStandbys is how many standbys the formation runs (-standbys).
var faultStandbys = 2

// faultDump is where -goroutines writes a dump of the gateway's
// goroutines during a fault (a file per fault, its name suffixed), to see
// where requests wait; "" writes none.
var faultDump string

func runFault(ctx context.Context, bin string, pg *testenv.Postgres, f fault) (faultRow, error) {
	row := faultRow{name: f.name}
	c, err := testenv.StartCluster(ctx, testenv.ClusterOptions{ReplicasPerMaster: 1})
	if err != nil {
		return row, err
	}
	defer c.Stop()
	env := faultEnv{c: c}
	dsn, stopLedger, err := env.startLedger(ctx, pg, f)
	if err != nil {
		return row, err
	}
	defer stopLedger()
	g, stopGateway, err := env.startGateway(ctx, bin, dsn, f)
	if err != nil {
		return row, err
	}
	defer stopGateway()
	paths, skus, err := putFaultSKUs(&g)
	if err != nil {
		return row, err
	}
	capRun, err := loadgen.Attack(loadgen.Run{Name: "capacity", BaseURL: g.base, Workers: 64, Duration: 3 * time.Second,
		Scenario: loadgen.Purchases(paths, "cap-", 0)})
	if err != nil {
		return row, err
	}
	row.rate = max(int(float64(capRun.Count(http.StatusCreated))/capRun.Elapsed.Seconds()/2), 10)
	if err := env.pickVictim(ctx, skus[0]); err != nil {
		return row, err
	}
	driver := ledger.Postgres
	if f.sqlite {
		driver = ledger.SQLite
	}
	led, err := ledger.Open(ctx, ledger.Options{Driver: driver, DSN: dsn, NoMigrate: true})
	if err != nil {
		return row, err
	}
	defer led.Close()
	probe, err := cluster.New(cluster.Options{Addrs: c.Addrs()})
	if err != nil {
		return row, err
	}
	defer probe.Close()
	gate, err := shard.New(shard.Options{Redis: probe})
	if err != nil {
		return row, err
	}

	// Workers × 16 requests in flight cover the rate for the gateway's
	// 5 s work timeout and a second more: in a fault each request may
	// take that long, and one the tool could not send on time would be
	// its own wait, not the server's (counted Late if it still happens).
	workers := uint64(max(64, row.rate*6/16+1))
	why := &causes{n: map[string]int{}}
	answered := &sales{ids: map[string]struct{}{}}
	collect := func(code int, body []byte) {
		why.collect(code, body)
		answered.collect(code, body)
	}
	phase := func(name string, d time.Duration) (loadgen.Result, error) {
		return loadgen.Attack(loadgen.Run{Name: name, BaseURL: g.base, Rate: row.rate, Duration: d, Workers: workers,
			Scenario: loadgen.Purchases(paths, name+"-", 0), Collect: collect})
	}
	var results []loadgen.Result
	h0, landed, shed0 := purchaseBuckets(g.base), readLanded(g.base), shedAt(g.base)
	before, err := phase("before", 3*time.Second)
	if err != nil {
		return row, err
	}
	results = append(results, before)
	type done struct {
		back   time.Duration
		writes time.Time // when the formation took writes again (zero: not a formation's fault)
		err    error
	}
	over := make(chan done, 1)
	duringFrom := time.Now() // about when phase "during" starts sending, below
	go func() {              // the fault, owned by this run; it ends by itself
		from, err := f.do(ctx, env)
		var writes time.Time
		if f.formation {
			writes = time.Now()
			fmt.Fprintf(os.Stderr, "%s: writes taken %v after the fault\n", f.name, writes.Sub(from).Round(100*time.Millisecond))
		}
		if err == nil {
			err = c.WaitHealthy(ctx, 60*time.Second)
		}
		if err != nil {
			over <- done{err: err}
			return
		}
		// Buyers keep coming meanwhile: the gates come back under load.
		over <- done{back: gatesBack(ctx, led, gate, skus, from), writes: writes}
	}()
	window := f.window
	if window == 0 {
		window = 15 * time.Second
	}
	if faultDump != "" {
		go dumpDuring(f.name, g.pprof) // owned by this run: one fetch, bounded by its timeout
	}
	traceCtx, stopTrace := context.WithCancel(ctx)
	traced := make(chan struct{})
	if f.formation {
		go func() { // owned by this run: stopped after the last phase
			defer close(traced)
			traceFormation(traceCtx, env.ha, duringFrom)
		}()
	} else {
		close(traced)
	}
	defer func() { stopTrace(); <-traced }()
	during, err := phase("during", window)
	if err != nil {
		return row, err
	}
	results = append(results, during)
	fmt.Fprintf(os.Stderr, "%s: 503s by second of the window: %v; sent late by the tool %d (most %v), errors %v\n",
		f.name, during.Seconds[http.StatusServiceUnavailable], during.Late, during.MaxLag.Round(time.Millisecond), during.Errors)
	fmt.Fprintf(os.Stderr, "%s: 201s by second of the window: %v\n", f.name, during.Seconds[http.StatusCreated])
	fmt.Fprintf(os.Stderr, "%s: 503s so far by cause: %v\n", f.name, why.String())
	row.p99 = during.Quantile(99)
	row.p99ok, row.p99shed = during.QuantileOf(http.StatusCreated, 99), during.QuantileOf(http.StatusServiceUnavailable, 99)
	row.slowest = during.Quantile(100)
	after, err := phase("after", 10*time.Second)
	if err != nil {
		return row, err
	}
	results = append(results, after)
	d := <-over
	if d.err != nil {
		return row, d.err
	}
	row.back = d.back
	row.count(results)
	if err := f.landed(g.base, landed); err != nil {
		return row, err
	}
	// The load tool times an answer from when it was due, on the same
	// two cores; the gateway's own histogram says whether the server or
	// the machine was late (its last bound is the 5 s work timeout).
	h1 := purchaseBuckets(g.base)
	row.past = (h1[math.Inf(1)] - h0[math.Inf(1)]) - (h1[5] - h0[5])
	fmt.Fprintf(os.Stderr, "%s: purchases the gateway answered past 5 s by its own clock: %.0f\n", f.name, row.past)
	fmt.Fprintf(os.Stderr, "%s: takes the gateway refused 503 overloaded, by where: %v\n", f.name, shedAt(g.base).since(shed0))
	row.shedAfter = -1
	if !d.writes.IsZero() {
		n := shedAfter(during, d.writes.Sub(duringFrom)) + uint64(after.Count(http.StatusServiceUnavailable))
		row.shedAfter = int64(n)
		fmt.Fprintf(os.Stderr, "%s: 503s sent in the seconds after the one writes were taken again in: %d (%.2f %% of %d)\n",
			f.name, n, 100*float64(n)/float64(max(row.requests, 1)), row.requests)
	}
	for _, sku := range skus {
		st, err := led.SKU(ctx, sku)
		if err != nil {
			return row, err
		}
		row.sold += st.Sold
	}
	row.sold -= int64(capRun.Count(http.StatusCreated))
	return row, row.audit(ctx, led, answered)
}

// shedAfter counts the 503s of r sent in the whole seconds of its run
// after the one that at falls in: what a fault cost once the failover
// manager had promoted a primary (issue 40: "beyond the seconds the
// manager needs").
func shedAfter(r loadgen.Result, at time.Duration) uint64 {
	var n uint64
	for sec, c := range r.Seconds[http.StatusServiceUnavailable] {
		if sec > int(at/time.Second) {
			n += c
		}
	}
	return n
}

// startLedger starts the fault's ledger: a pg_auto_failover formation of
// its own, or a fresh database on pg behind a fault proxy. It returns the
// gateway's DSN and what stops it.
func (env *faultEnv) startLedger(ctx context.Context, pg *testenv.Postgres, f fault) (string, func(), error) {
	if f.sqlite {
		dir, err := os.MkdirTemp("", "stockbench-disk")
		if err != nil {
			return "", nil, err
		}
		// Room for the run's orders; the fault fills the rest.
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", dir).CombinedOutput(); err != nil {
			os.Remove(dir)
			return "", nil, fmt.Errorf("mount a tmpfs for the SQLite ledger (as root): %v %s", err, out)
		}
		env.disk = dir
		return filepath.Join(dir, "ledger.db"), func() {
			if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "umount %s: %v %s\n", dir, err, out)
				return
			}
			os.Remove(dir)
		}, nil
	}
	if f.formation {
		ha, err := testenv.StartAutoFailover(ctx, testenv.AutoFailoverOptions{Sync: !f.async, Standbys: faultStandbys})
		if err != nil {
			return "", nil, err
		}
		env.ha = ha
		return ha.DSN(), ha.Stop, nil
	}
	url, drop, err := pg.NewDatabase(ctx)
	if err != nil {
		return "", nil, err
	}
	link, through, err := netfault.Postgres(url)
	if err != nil {
		drop()
		return "", nil, err
	}
	env.link = link
	return through, func() { link.Stop(); drop() }, nil
}

// putFaultSKUs creates the run's faultSKUs SKUs of one shard each.
func putFaultSKUs(g *gateway) (paths []string, skus []stock.SKU, err error) {
	prog := fmt.Sprintf("faults%d", time.Now().UnixNano()%1_000_000)
	for i := range faultSKUs {
		sku := stock.SKU{Program: keys.MustID(prog), Ticket: keys.MustID(fmt.Sprintf("t%d", i))}
		if err := g.admin.putSKU(prog+"/"+sku.Ticket.String(), 1_000_000, 1); err != nil {
			return nil, nil, err
		}
		paths, skus = append(paths, prog+"/"+sku.Ticket.String()), append(skus, sku)
	}
	return paths, skus, nil
}

// count adds the phases' answers to the row.
func (row *faultRow) count(results []loadgen.Result) {
	for _, r := range results {
		row.requests += r.Requests
		row.n503 += r.Count(http.StatusServiceUnavailable)
		row.ok += r.Count(http.StatusCreated)
		for code, n := range r.Codes {
			if code != http.StatusCreated && code != http.StatusServiceUnavailable && n > 0 {
				row.other += fmt.Sprintf(" %d:%d", code, n)
			}
		}
	}
}

// dumpDuring writes the gateway's goroutines each second of a fault's
// first eight to files named for faultDump and the second: where the
// requests wait moves as the fault goes on (a failover's gap without a
// primary comes seconds after pg_autoctl is asked for it).
func dumpDuring(fault, pprof string) {
	for sec := 1; sec <= 8; sec++ {
		time.Sleep(time.Second) // the moments to look at: one a second
		name := fmt.Sprintf("%s.%d", faultDump, sec)
		if err := dumpGoroutines(pprof, name); err != nil {
			fmt.Fprintf(os.Stderr, "%s: goroutines: %v\n", fault, err)
			return
		}
	}
	fmt.Fprintf(os.Stderr, "%s: goroutines each second of the fault's first 8 in %s.1 to .8\n", fault, faultDump)
}

// gatesBack waits (at most a minute) until every SKU's gate serves again
// (seeded, and not stale: rebuilt after every sale around it), polling,
// and says how long after from that was; -1 when it never was.
func gatesBack(ctx context.Context, led *ledger.Ledger, gate *shard.Store, skus []stock.SKU, from time.Time) time.Duration {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		all := true
		for _, sku := range skus {
			st, err := led.SKU(ctx, sku)
			if err != nil {
				all = false
				break
			}
			// Serving, not equal: under load, units a gate admitted and the
			// ledger has not committed yet keep the two apart by a few.
			_, seeded, err := gate.Remaining(ctx, sku, st.Shards)
			if err != nil || !seeded || st.GateStale() {
				all = false
				break
			}
		}
		if all {
			return time.Since(from)
		}
		time.Sleep(100 * time.Millisecond) // a poll of state another process moves
	}
	return -1
}

func faultsDoc(rows []faultRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", faultsHeading)
	fmt.Fprintf(&b, "`go run ./cmd/stockbench faults` (%s UTC): each fault on a 3-master + 3-replica cluster of its own "+
		"(node timeout 2 s), a stockgate process on a fresh PostgreSQL ledger reached through a TCP fault proxy (toxiproxy, "+
		"for the three ledger-link faults; wait budget 250 ms), for a fault of the ledger's primary on a pg_auto_failover "+
		"formation of its own (a primary and "+standbysText(faultStandbys)+", asynchronous in the row that says so, the gateway on a multi-host DSN with "+
		"target_session_attrs=read-write), or, for the disk's fault, on a SQLite ledger whose file is on a 512 MiB tmpfs of its own "+
		"(filled but for 128 KiB, then freed); 100 SKUs of one shard each. Purchases are "+
		"sent open loop at half the rate measured closed loop first: 3 s before the fault, 15 s from its start (the fault "+
		"window; 33 s for the slow ledger, 40 s for a failover, 60 s for a node lost), 10 s more. The p99 is given for all answers in the window, "+
		"then for its 201s and its 503s apart, the slowest answer of the window as the load tool timed it (from when it was due), "+
		"and how many purchases the gateway's own histogram saw take longer than 5 s (its work timeout); for a failover, the 503s "+
		"sent after the second the formation took writes again in (issue 40's \"beyond the seconds the manager needs to promote\"). \"Back on its gate\" is from the fault (the restart, for all of Redis) until the cluster is "+
		"healthy and every SKU's gate serves again (seeded, and rebuilt after every sale around it; for a ledger fault, from the "+
		"link's repair), polled every "+
		"100 ms under the load; the ledger's sales are counted against the 201s: more sold than 201s are commits whose answer was lost "+
		"(503, settled by the request's key when sent again), fewer are acknowledged sales a failover lost; and each 201's order is "+
		"looked up in the ledger by its id (\"not in the ledger\": 201s whose order it does not have).\n\n",
		time.Now().UTC().Format("2006-01-02 15:04"))
	b.WriteString("| fault | req/s | requests | 503 | 503 after writes resumed | other answers | p99 in the fault window: all / 201s / 503s | slowest / past 5 s by the gateway's clock | every SKU back on its gate | 201s / ledger sold / not in the ledger |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		share := 0.0
		if r.requests > 0 {
			share = 100 * float64(r.n503) / float64(r.requests)
		}
		back := r.back.Round(100 * time.Millisecond).String()
		if r.back < 0 {
			back = "not within a minute"
		}
		other := strings.TrimSpace(r.other)
		if other == "" {
			other = "none"
		}
		after := "—"
		if r.shedAfter >= 0 {
			after = fmt.Sprintf("%d (%.2f %%)", r.shedAfter, 100*float64(r.shedAfter)/float64(max(r.requests, 1)))
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d (%.2f %%) | %s | %s | %v / %v / %v | %v / %.0f | %s | %d / %d / %d |\n",
			r.name, r.rate, r.requests, r.n503, share, after, other, r.p99.Round(time.Millisecond), r.p99ok.Round(time.Millisecond),
			r.p99shed.Round(time.Millisecond), r.slowest.Round(time.Millisecond), r.past, back, r.ok, r.sold, r.lost)
	}
	return b.String()
}

// writeSection puts section into the document at path in place of the
// one with the same heading (up to the next "## "), or at its end.
func writeSection(path, section string) error {
	doc, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	return os.WriteFile(path, []byte(replaceSection(string(doc), section)), 0o644)
}

// sectionOf is doc's section under heading, up to the next "## ", or "".
func sectionOf(doc, heading string) string {
	i := strings.Index(doc, heading)
	if i < 0 {
		return ""
	}
	rest := doc[i:]
	if j := strings.Index(rest[len(heading):], "\n## "); j >= 0 {
		rest = rest[:len(heading)+j]
	}
	return strings.TrimRight(rest, "\n") + "\n"
}

// replaceSection is doc with section in place of its heading's section.
func replaceSection(doc, section string) string {
	heading := strings.SplitN(section, "\n", 2)[0]
	i := strings.Index(doc, heading)
	if i < 0 {
		return strings.TrimRight(doc, "\n") + "\n\n" + section
	}
	rest := doc[i+len(heading):]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		return doc[:i] + section + rest[j:]
	}
	return doc[:i] + section
}

// dumpGoroutines writes the goroutines of the gateway whose pprof
// listener is at addr into file, grouped by stack with counts.
func dumpGoroutines(addr, file string) error {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o644)
}

// traceFormation writes each change of the formation's nodes' states to
// stderr, with its time from the start of the fault window, until ctx
// ends: a spell of 503s long after a failover (a standby rejoining as the
// synchronous one, commits then waiting for it) shows against it.
func traceFormation(ctx context.Context, ha *testenv.AutoFailover, from time.Time) {
	said := map[string]string{}
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		if st, err := ha.State(ctx); err == nil {
			for _, n := range st {
				now := n.Current + "->" + n.Assigned
				if said[n.Name] != now {
					fmt.Fprintf(os.Stderr, "formation at %5.1fs: %s :%d %s\n", time.Since(from).Seconds(), n.Name, n.Port, now)
					said[n.Name] = now
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// standbysText says how many synchronous standbys the formation ran.
func standbysText(n int) string {
	if n == 1 {
		return "one synchronous standby"
	}
	return fmt.Sprintf("%d synchronous standbys (number_sync_standbys 1)", n)
}

// sheds counts the gateway's 503 overloaded refusals of takes by where
// they were refused (stockgate_ledger_shed_total's at label): which
// check turned a request away, not inferred from the code.
type sheds map[string]float64

func shedAt(base string) sheds {
	out := sheds{}
	for _, at := range []string{"door", "door_patient", "full", "withdrawn", "flush", "behind"} {
		out[at] = metricSum(base, "stockgate_ledger_shed_total", `work="takes"`, `at="`+at+`"`)
	}
	out["in_flight"] = metricSum(base, "stockgate_ledger_shed_total", `work="in_flight"`)
	return out
}

func (s sheds) since(before sheds) sheds {
	out := sheds{}
	for k, v := range s {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

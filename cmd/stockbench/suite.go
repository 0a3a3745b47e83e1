package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/cluster"
	"github.com/stockgate/stockgate/e2e/loadgen"
	"github.com/stockgate/stockgate/internal/comparators"
	"github.com/stockgate/stockgate/internal/onsale"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// suite runs everything side by side and writes the benchmark document.
type suite struct {
	ctx     context.Context
	n       uint64
	workers uint64
	plots   string
	log     io.Writer
	cl      *testenv.Cluster
	rdb     *redis.ClusterClient
	gw      gateway
	fb      gateway // a second gateway whose Redis is unreachable: the fallback
	sq      gateway // a third on the SQLite ledger, as `make run` runs it
	two     gateway // a fourth whose ledger is split over pg and pg2
	pg      *testenv.Postgres
	pg2     *testenv.Postgres // the second primary of two
	bin     string            // the stockgate binary the gateways run
	// redisAddrs are the cluster's seed nodes, for the gateways.
	redisAddrs string
	// ledgerDB is gw's ledger, for pg_stat_statements.
	ledgerDB *sql.DB
	idle     idle
	rounds   int
	label    string // the round, appended to every run's name
	doc      strings.Builder
	results  []loadgen.Result
	// The waiting room's sizes: the standing line, and the on-sale.
	queueJoins                  uint64
	onsaleBuyers, onsaleTickets int
	room                        room
}

type gateway struct {
	base  string
	pprof string
	cmd   *exec.Cmd
	admin adminClient
}

func suiteCmd(args []string) error {
	fs := flag.NewFlagSet("suite", flag.ExitOnError)
	out := fs.String("out", "docs/BENCHMARKS.md", "benchmark document to write")
	n := fs.Uint64("n", 50_000, "requests of each throughput run, each round")
	rounds := fs.Int("rounds", 3, "rounds: every pair a target compares runs once per round; targets report the median and range")
	workers := fs.Uint64("workers", 64, "concurrent connections of each throughput run")
	plots := fs.String("plots", ".run/bench", "directory for the latency-over-time charts")
	queueJoins := fs.Uint64("queue-joins", 1_000_000, "buyers joined to the waiting room whose places the rounds check")
	onsaleBuyers := fs.Int("onsale-buyers", 100_000, "buyers of the on-sale through the waiting room (0: none)")
	onsaleTickets := fs.Int("onsale-tickets", 1000, "tickets of the on-sale")
	only := fs.String("only", "", `"room": only the waiting room's measurements; "buy": only the purchase-with-commit latency; "crowd": only the winners at 64 and 1,024 connections against their floor, with takes per batch; "admit": only the admission latency, after the purchase runs the suite runs before it; "primaries": only one primary against two; "shards": only self-sized shards against fixed ones; "calls": only the Redis calls of the sold-out storm and read floods at three paces; printed (no document written)`)
	_ = fs.Parse(args)
	if *rounds < 1 {
		return fmt.Errorf("-rounds %d: at least 1", *rounds)
	}
	s := &suite{ctx: context.Background(), n: *n, workers: *workers, rounds: *rounds, plots: *plots, log: os.Stderr,
		queueJoins: max(*queueJoins, 1), onsaleBuyers: *onsaleBuyers, onsaleTickets: max(*onsaleTickets, 1)}
	// A part alone, checked before any server starts.
	onlyRun, ok := map[string]func(*suite) error{"": nil, "room": (*suite).runRoom, "buy": (*suite).runBuy,
		"crowd": (*suite).runCrowd, "admit": (*suite).runAdmit, "primaries": (*suite).runPrimaries, "shards": (*suite).runShards, "calls": (*suite).runCalls}[*only]
	if !ok {
		return fmt.Errorf("-only %q: want room, buy, crowd, admit, primaries, shards or calls", *only)
	}
	if err := os.MkdirAll(s.plots, 0o755); err != nil {
		return err
	}
	defer s.stop()
	if err := s.start(); err != nil {
		return err
	}
	if *only != "" {
		if err := onlyRun(s); err != nil {
			return err
		}
		fmt.Print(s.doc.String())
		return nil
	}
	if err := s.runAll(); err != nil {
		return err
	}
	// The Redis faults section is written by `stockbench faults`: keep it.
	doc := s.doc.String()
	if old, err := os.ReadFile(*out); err == nil {
		if sec := sectionOf(string(old), faultsHeading); sec != "" {
			doc = replaceSection(doc, sec)
		}
	}
	return os.WriteFile(*out, []byte(doc), 0o644)
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (s *suite) start() error {
	fmt.Fprintln(s.log, "starting a 3+3 Redis Cluster and PostgreSQL")
	var err error
	if s.cl, err = testenv.StartCluster(s.ctx, testenv.ClusterOptions{ReplicasPerMaster: 1}); err != nil {
		return err
	}
	if s.rdb, err = cluster.New(cluster.Options{Addrs: s.cl.Addrs(), PoolSize: 128}); err != nil {
		return err
	}
	pg, err := testenv.StartDurablePostgres(s.ctx)
	if err != nil {
		return err
	}
	pgStop, s.pg = pg.Stop, pg
	ledgerURL, _, err := pg.NewDatabase(s.ctx)
	if err != nil {
		return err
	}
	if s.ledgerDB, err = ledgerDBOf(s.ctx, ledgerURL); err != nil {
		return err
	}
	compURL, _, err := pg.NewDatabase(s.ctx)
	if err != nil {
		return err
	}
	compDB, err = sql.Open("pgx", compURL)
	if err != nil {
		return err
	}
	compDB.SetMaxOpenConns(64)
	bin := filepath.Join(s.plots, "stockgate")
	fmt.Fprintln(s.log, "building stockgate")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/stockgate").CombinedOutput(); err != nil {
		return fmt.Errorf("build: %v: %s", err, out)
	}
	s.bin, s.redisAddrs = bin, strings.Join(s.cl.Addrs(), ",")
	s.gw, err = startGateway(s.ctx, bin, s.redisAddrs, ledgerURL, "")
	if err != nil {
		return err
	}
	fbURL, _, err := pg.NewDatabase(s.ctx)
	if err != nil {
		return err
	}
	if s.fb, err = startGateway(s.ctx, bin, "127.0.0.1:1", fbURL, "STOCKGATE_FALLBACK_CONCURRENCY=32"); err != nil {
		return err
	}
	// The SQLite ledger `make run` runs, in a file of its own.
	sqDir, err := os.MkdirTemp("", "stockgate-bench-sqlite-")
	if err != nil {
		return err
	}
	s.sq, err = startGateway(s.ctx, bin, s.redisAddrs, filepath.Join(sqDir, "ledger.db"))
	return err
}

var (
	pgStop func()
	compDB *sql.DB
)

func startGateway(ctx context.Context, bin, redisAddrs, dsn string, extra ...string) (gateway, error) {
	g := gateway{base: "http://" + freeAddr(), pprof: freeAddr()}
	// One attempt: the fallback gateway's admin calls answer 503 by design.
	g.admin = newAdmin(g.base, "", nil, 1)
	g.cmd = exec.Command(bin, "serve")
	driver := ledger.Postgres
	if !strings.HasPrefix(dsn, "postgres") {
		driver = ledger.SQLite // a file
	}
	g.cmd.Env = append(os.Environ(), "STOCKGATE_ADDR="+strings.TrimPrefix(g.base, "http://"),
		"STOCKGATE_REDIS_ADDRS="+redisAddrs, "STOCKGATE_LEDGER_DRIVER="+driver, "STOCKGATE_LEDGER_DSN="+dsn,
		"STOCKGATE_PPROF_ADDR="+g.pprof, "STOCKGATE_LOG_LEVEL=error", "STOCKGATE_LEDGER_MAX_CONNS=64",
		// The drift check reads every SKU's shards; it would blur the
		// count of Redis calls the storm and read runs make.
		"STOCKGATE_DRIFT_EVERY=1h")
	for _, e := range extra {
		if e != "" {
			g.cmd.Env = append(g.cmd.Env, e)
		}
	}
	g.cmd.Stderr = os.Stderr
	if err := g.cmd.Start(); err != nil {
		return g, err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return g, waitReady(wctx, g.base)
}

func (s *suite) stop() {
	if s.ledgerDB != nil {
		s.ledgerDB.Close()
	}
	for _, g := range []gateway{s.gw, s.fb, s.sq, s.two} {
		if g.cmd != nil && g.cmd.Process != nil {
			g.cmd.Process.Kill()
			_ = g.cmd.Wait()
		}
	}
	if s.rdb != nil {
		s.rdb.Close()
	}
	if s.cl != nil {
		s.cl.Stop()
	}
	if pgStop != nil {
		pgStop()
	}
	if s.pg2 != nil {
		s.pg2.Stop()
	}
}

// serve runs a comparator on its own loopback listener.
func serve(h http.Handler) (string, func()) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }() // owned by the returned stop
	return "http://" + l.Addr().String(), func() { srv.Close() }
}

func (s *suite) attack(name, base string, sc loadgen.Scenario, rate int, workers uint64, d time.Duration) loadgen.Result {
	name += s.label
	res, err := loadgen.Attack(loadgen.Run{Name: name, BaseURL: base, Scenario: sc, Rate: rate, Workers: workers,
		Duration: d, Progress: s.log, Plot: filepath.Join(s.plots, slug(name)+".html")})
	if err != nil {
		fmt.Fprintln(s.log, "attack:", err)
	}
	s.results = append(s.results, res)
	return res
}

func slug(s string) string {
	return strings.Trim(regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(s), "-"), "-")
}

func (s *suite) runAll() error {
	var rounds []docInputs
	for r := range s.rounds {
		fmt.Fprintf(s.log, "round %d of %d\n", r+1, s.rounds)
		in, err := s.round(r)
		if err != nil {
			return err
		}
		rounds = append(rounds, in)
	}
	// The waiting room after the other measurements: its pacer steps the
	// standing line five times a second, Redis calls the others would
	// count as theirs.
	if err := s.roomRounds(rounds); err != nil {
		return err
	}
	fmt.Fprintln(s.log, "an idle replica: 1,000 programs, 200 idle waiting rooms")
	var err error
	if s.idle, err = s.idleReplica(40*time.Second, 60*time.Second); err != nil {
		return err
	}
	var sale onsale.Report
	saleErr := errors.New("not run (-onsale-buyers 0)")
	var pacers []pacerRun
	if s.onsaleBuyers > 0 {
		sale, saleErr = s.onSale()
		pacers = s.pacerRuns()
	}
	pow := s.powRuns()
	prim, err := s.primaries()
	if err != nil {
		return err
	}
	shards, err := s.shardRuns()
	if err != nil {
		return err
	}
	s.write(rounds, microBenchmarks(), hotSKU())
	s.writePrimaries(prim)
	s.writeRoom(rounds, s.room, sale, saleErr)
	s.writePacers(pacers)
	s.writePow(pow)
	s.writeShards(shards)
	return nil
}

// round runs every measurement once, each pair that a target compares
// back to back, on SKUs, keys and buyers of its own (a key reused with
// another body would be refused). The last round also takes the CPU
// profile.
func (s *suite) round(r int) (in docInputs, err error) {
	s.label = fmt.Sprintf(" · r%d", r+1)
	n, w := s.n, s.workers
	stamp := strconv.FormatInt(time.Now().Unix(), 10) + "r" + strconv.Itoa(r+1)
	p := func(name string) string { return name + stamp }
	k := func(prefix string) string { return prefix + "r" + strconv.Itoa(r+1) + "-" }
	// 0. The ledger floors, with the machine to themselves.
	if in.floors, err = s.floors(); err != nil {
		return in, err
	}
	flashSKU := p("flash") + "/ga"
	if err := s.gw.admin.putSKU(flashSKU, int64(n/10), 12); err != nil {
		return in, err
	}
	if r == 0 { // warm the connections and caches; not counted
		_, _ = loadgen.Attack(loadgen.Run{Name: "warm", BaseURL: s.gw.base, Scenario: loadgen.Reads(flashSKU, 2000), Workers: w})
	}

	// 1. Flash sale through stockgate, with the memory (and a CPU profile).
	stop := make(chan struct{})
	peak := rssPeak(s.gw.cmd.Process.Pid, stop)
	var prof <-chan string = closedString
	if r == s.rounds-1 {
		prof = s.profile(5 * time.Second)
	}
	scripts0, usec0 := s.commandStats("evalsha")
	flash := s.attack("stockgate flash sale", s.gw.base, loadgen.Purchases([]string{flashSKU}, k("flash"), n), 0, w, 0)
	scripts1, usec1 := s.commandStats("evalsha")
	close(stop)
	rssKB := <-peak
	cpuTop := <-prof
	flashAudit := s.audit(s.gw, []string{flashSKU}, flash)

	// Requests decided in Redis alone: one buyer over a per-buyer cap of 1.
	capSKU := p("cap") + "/ga"
	if err := s.gw.admin.putCapped(capSKU, int64(n), 12, 1); err != nil {
		return in, err
	}
	oneBuyer := func(i uint64) (loadgen.Request, bool) {
		r, ok := loadgen.Purchases([]string{capSKU}, k("cap"), n)(i)
		r.Body = `{"buyer":"` + k("one") + `b","quantity":1}`
		return r, ok
	}
	capRun := s.attack("stockgate decided in Redis (per-buyer cap)", s.gw.base, oneBuyer, 0, w, 0)

	// 2. The comparators, same load.
	comps := []*comparators.Comparator{comparators.Floor(s.rdb), comparators.Bare(), comparators.DecrIncr(s.rdb), comparators.Lock(s.rdb)}
	opt, err := comparators.Optimistic(compDB)
	if err != nil {
		return in, err
	}
	comps = append(comps, opt)
	compRes := map[string]loadgen.Result{}
	compOversell := map[string]int64{}
	for _, c := range comps {
		reqs := n
		if c == opt {
			reqs = n / 10 // it is an order of magnitude slower
		}
		units := int64(reqs / 10)
		prog := p("cmp" + slug(c.Name)[:4])
		if err := c.Seed(s.ctx, stock.MustSKU(prog, "ga"), units); err != nil {
			return in, err
		}
		var base string
		var closeFn func()
		if c.Name == comparators.BareName { // the ceiling runs in a process of its own (bare.go)
			if base, closeFn, err = serveBare("purchases"); err != nil {
				return in, err
			}
		} else {
			base, closeFn = serve(c.Handler)
		}
		r := s.attack(c.Name+" flash sale", base, loadgen.Purchases([]string{prog + "/ga"}, k("c"), reqs), 0, w, 0)
		closeFn()
		compRes[c.Name] = r
		if c.Name != comparators.BareName {
			compOversell[c.Name] = max(0, c.Sold.Load()-units)
		}
	}
	floor, bare := compRes[comps[0].Name], compRes[comps[1].Name]

	// 3. Sold-out storm and stock reads, answered from memory.
	soldSKU := p("soldout") + "/ga"
	if err := s.gw.admin.putSKU(soldSKU, 0, 4); err != nil {
		return in, err
	}
	s.attack("warm sold-out", s.gw.base, loadgen.Purchases([]string{soldSKU}, k("warm"), 10), 0, 1, 0)
	before := s.redisCalls()
	storm := s.attack("stockgate sold-out storm", s.gw.base, loadgen.Purchases([]string{soldSKU}, k("storm"), n), 0, w, 0)
	stormCalls := s.redisCalls() - before
	before = s.redisCalls()
	reads := s.attack("stockgate stock reads", s.gw.base, loadgen.Reads(flashSKU, n), 0, w, 0)
	readCalls := s.redisCalls() - before
	bareBase, bareStop, err := serveBare("purchases")
	if err != nil {
		return in, err
	}
	bareReads := s.attack("bare gin stock reads", bareBase, loadgen.Reads("x/y", n), 0, w, 0)
	bareStop()

	// 4. Steady purchases over 100 SKUs: every request a committed order.
	var steadySKUs []string
	for i := range 100 {
		sku := fmt.Sprintf("%s/t%d", p("steady"), i)
		steadySKUs = append(steadySKUs, sku)
		if err := s.gw.admin.putSKU(sku, int64(n), 1); err != nil {
			return in, err
		}
	}
	var steady loadgen.Result
	var steadyCPU cpuShare
	shape := s.batchesDuring(func() {
		steadyCPU = cpuDuring(s.gw.cmd.Process.Pid, func() {
			steady = s.attack("stockgate steady purchases (100 SKUs)", s.gw.base, loadgen.Purchases(steadySKUs, k("steady"), n/2), 0, w, 0)
		})
	})
	steadyAudit := s.audit(s.gw, steadySKUs, steady)
	// 4b. Latency at half that maximum, open loop, right after it: before
	// the overload run below, whose backlog PostgreSQL is still writing
	// out (checkpoints) for a while after it ends.
	halfBuy := int(steady.Throughput() / 2)
	var buyLat loadgen.Result
	buyCheckpoints := s.checkpointsDuring(func() {
		buyLat = s.attack(fmt.Sprintf("purchase with commit at %d/s (open loop)", halfBuy), s.gw.base,
			loadgen.Purchases(steadySKUs, k("lat"), 0), halfBuy, w, 10*time.Second)
	})
	// 4c. The same SKUs at crowd size: 1,024 buyers waiting at once.
	crowd := s.crowd(steadySKUs, k("crowd"), n/2)
	overPG := s.overload("stockgate steady purchases (100 SKUs)", s.gw, steadySKUs, k("over"), steady.Throughput())
	overAudit := s.audit(s.gw, steadySKUs, overPG.res)

	// 4a. The same on the SQLite ledger, as `make run` runs it.
	var sqSKUs []string
	for i := range 100 {
		sku := fmt.Sprintf("%s/t%d", p("sq"), i)
		sqSKUs = append(sqSKUs, sku)
		if err := s.sq.admin.putSKU(sku, int64(n), 1); err != nil {
			return in, err
		}
	}
	var sqSteady loadgen.Result
	sqCPU := cpuDuring(s.sq.cmd.Process.Pid, func() {
		sqSteady = s.attack("stockgate on SQLite: steady purchases (100 SKUs)", s.sq.base, loadgen.Purchases(sqSKUs, k("sq"), n/2), 0, w, 0)
	})
	sqAudit := s.audit(s.sq, sqSKUs, sqSteady)
	overSQ := s.overload("stockgate on SQLite: steady purchases (100 SKUs)", s.sq, sqSKUs, k("sqover"), sqSteady.Throughput())
	sqOverAudit := s.audit(s.sq, sqSKUs, overSQ.res)

	// 4b. Carts of 3 lines against single purchases of the same shape.
	carts, cartSingles, cartAudit, err := s.carts(r, p("cart"), p("single"), k("cart"), k("single"))
	if err != nil {
		return in, err
	}

	// 5. Holds, then 70 % confirmed, the rest abandoned.
	holdSKU := p("holds") + "/ga"
	if err := s.gw.admin.putSKU(holdSKU, int64(n), 4); err != nil {
		return in, err
	}
	var holds loadgen.Result
	var refs []loadgen.HoldRef
	holdsCPU := cpuDuring(s.gw.cmd.Process.Pid, func() { holds, refs = s.holds(holdSKU, k("hold"), n/5) })
	confirm := refs[:len(refs)*7/10]
	var confirms loadgen.Result
	confirmsCPU := cpuDuring(s.gw.cmd.Process.Pid, func() {
		confirms = s.attack("stockgate confirm 70 % of holds", s.gw.base, loadgen.Confirms(confirm, k("hold")), 0, w, 0)
	})

	// 6. The ledger fallback: Redis unreachable, 32 buyers on one SKU.
	fbSKU := p("fallback") + "/ga"
	if err := s.fb.admin.putSKU(fbSKU, 1_000_000, 1); err != nil && !strings.Contains(err.Error(), "503") {
		return in, err
	}
	var fallback loadgen.Result
	fallbackCPU := cpuDuring(s.fb.cmd.Process.Pid, func() {
		fallback = s.attack("fallback: ledger only, 32 buyers", s.fb.base, loadgen.Purchases([]string{fbSKU}, k("fb"), 0), 0, 32, 10*time.Second)
	})
	fbAudit := s.audit(s.fb, []string{fbSKU}, fallback)

	// 7. Latency at half the measured maximum, open loop.
	halfAdmit := int(capRun.Throughput() / 2)
	capSKU2 := p("cap2") + "/ga"
	if err := s.gw.admin.putCapped(capSKU2, int64(n), 12, 1); err != nil {
		return in, err
	}
	oneBuyer2 := func(i uint64) (loadgen.Request, bool) {
		r, ok := loadgen.Purchases([]string{capSKU2}, k("cap2"), 0)(i)
		r.Body = `{"buyer":"` + k("two") + `b","quantity":1}`
		return r, ok
	}
	admitLat := s.attack(fmt.Sprintf("admission at %d/s (open loop)", halfAdmit), s.gw.base, oneBuyer2, halfAdmit, w, 10*time.Second)

	// 8. Redis memory per shard and per idempotency record.
	shardMem, recMem := s.redisMemory(flashSKU, k("flash"))

	return docInputs{flash: flash, flashAudit: flashAudit, capRun: capRun, floor: floor, bare: bare, compRes: compRes,
		compOversell: compOversell, comps: comps, storm: storm, stormCalls: stormCalls, reads: reads, readCalls: readCalls,
		bareReads: bareReads, steady: steady, steadyAudit: steadyAudit, carts: carts, cartSingles: cartSingles,
		cartAudit: cartAudit, holds: holds, confirms: confirms, fallback: fallback,
		fbAudit: fbAudit, admitLat: admitLat, buyLat: buyLat, buyCheckpoints: buyCheckpoints, rssKB: rssKB, cpuTop: cpuTop, shardMem: shardMem,
		crowd: crowd, floors: in.floors, steadyCPU: steadyCPU, holdsCPU: holdsCPU, confirmsCPU: confirmsCPU, sqCPU: sqCPU, fallbackCPU: fallbackCPU, shape: shape,
		sqSteady: sqSteady, sqAudit: sqAudit, overPG: overPG, overSQ: overSQ, overAudit: overAudit, sqOverAudit: sqOverAudit,
		flashScripts: scripts1 - scripts0, flashScriptUsec: usec1 - usec0,
		recMem: recMem}, nil
}

// carts runs n/10 carts of 3 lines (one ticket of each of 3 SKUs of
// program cartProg) and as many single purchases over 3 SKUs of program
// singleProg, from the same connections, back to back (which goes first
// alternates by round), every request granted: each SKU has stock for
// every request and 4 shards. It returns both runs and the carts' ledger
// audit.
func (s *suite) carts(r int, cartProg, singleProg, cartKey, singleKey string) (carts, singles loadgen.Result, a audit, err error) {
	n := s.cartRequests()
	var cartSKUs, singleSKUs []string
	for _, t := range cartTickets {
		cartSKUs, singleSKUs = append(cartSKUs, cartProg+"/"+t), append(singleSKUs, singleProg+"/"+t)
	}
	for _, sku := range append(slices.Clone(cartSKUs), singleSKUs...) {
		if err := s.gw.admin.putSKU(sku, int64(n), cartShards); err != nil {
			return carts, singles, a, err
		}
	}
	runCarts := func() {
		carts = s.attack(fmt.Sprintf("stockgate carts (%d lines, all granted)", len(cartTickets)), s.gw.base,
			loadgen.Carts(cartProg, cartTickets, cartKey, n), 0, s.workers, 0)
	}
	runSingles := func() {
		singles = s.attack(fmt.Sprintf("stockgate single purchases (%d SKUs, all granted)", len(cartTickets)), s.gw.base,
			loadgen.Purchases(singleSKUs, singleKey, n), 0, s.workers, 0)
	}
	if r%2 == 0 {
		runSingles()
		runCarts()
	} else {
		runCarts()
		runSingles()
	}
	return carts, singles, s.audit(s.gw, cartSKUs, carts), nil
}

// cartShards is the shards of each SKU of the carts measurement.
const cartShards = 4

// cartRequests is how many carts, and single purchases, a round sends: a
// tenth of the other throughput runs', as the holds run's.
func (s *suite) cartRequests() uint64 { return max(s.n/10, 1) }

// closedString answers "" at once: no profile.
var closedString = func() chan string { c := make(chan string); close(c); return c }()

// holds takes n holds and returns the run and the holds it got.
func (s *suite) holds(sku, prefix string, n uint64) (loadgen.Result, []loadgen.HoldRef) {
	var mu sync.Mutex
	var refs []loadgen.HoldRef
	var got atomic.Int64
	res, err := loadgen.Attack(loadgen.Run{Name: "stockgate holds" + s.label, BaseURL: s.gw.base, Scenario: loadgen.Holds(sku, prefix, n),
		Workers: s.workers, Progress: s.log, Collect: func(code int, body []byte) {
			if code != http.StatusCreated {
				return
			}
			var h struct {
				HoldID string `json:"hold_id"`
				Buyer  string `json:"buyer"`
			}
			if json.Unmarshal(body, &h) == nil {
				got.Add(1)
				mu.Lock()
				refs = append(refs, loadgen.HoldRef{ID: h.HoldID, Buyer: h.Buyer})
				mu.Unlock()
			}
		}})
	if err != nil {
		fmt.Fprintln(s.log, "holds:", err)
	}
	s.results = append(s.results, res)
	return res, refs
}

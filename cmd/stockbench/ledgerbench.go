package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stockgate/stockgate/client"
	"github.com/stockgate/stockgate/e2e/loadgen"
	"github.com/stockgate/stockgate/ledger"
)

// The ledger's side of the suite: the floors every ledger target is a
// ratio to, the CPU each process spends per winner, the statements and
// round trips per batch, overload, and an idle replica.

// floors are one round's ledger floors (floor.go), each on a fresh
// database, with the machine to itself.
type floors struct {
	purchases, holds, confirms, sqlite floorResult
}

// floorConfigs are the floors' settings: the best batching found for
// each (larger batches than the gateway's, several transactions at once
// over 100 SKUs, one at a time on one SKU, whose row serializes them).
var floorConfigs = struct{ purchases, holds, confirms, sqlite floorConfig }{
	purchases: floorConfig{driver: ledger.Postgres, kind: "purchase", skus: 100, batch: 256, clients: 2, n: 50_000},
	holds:     floorConfig{driver: ledger.Postgres, kind: "hold", skus: 1, batch: 256, clients: 1, n: 30_000},
	confirms:  floorConfig{driver: ledger.Postgres, kind: "confirm", skus: 1, batch: 256, clients: 1, n: 30_000},
	sqlite:    floorConfig{driver: ledger.SQLite, kind: "purchase", skus: 100, batch: 256, clients: 1, n: 20_000},
}

func (s *suite) floors() (f floors, err error) {
	for _, run := range []struct {
		c   floorConfig
		out *floorResult
	}{{floorConfigs.purchases, &f.purchases}, {floorConfigs.holds, &f.holds}, {floorConfigs.confirms, &f.confirms},
		{floorConfigs.sqlite, &f.sqlite}} {
		c := run.c
		if c.driver == ledger.Postgres {
			if c.dsn, _, err = s.pg.NewDatabase(s.ctx); err != nil {
				return f, err
			}
		} else {
			dir, err := os.MkdirTemp("", "stockgate-floor-")
			if err != nil {
				return f, err
			}
			defer os.RemoveAll(dir)
			c.dsn = filepath.Join(dir, "floor.db")
		}
		db := func() float64 {
			if c.driver == ledger.Postgres {
				return procCPU(0, "postgres")
			}
			return procCPU(os.Getpid(), "")
		}
		before := db()
		if *run.out, err = runFloor(s.ctx, c); err != nil {
			return f, fmt.Errorf("%s: %w", c, err)
		}
		run.out.ledgerCPU = db() - before
		fmt.Fprintf(s.log, "%s: %.0f/s\n", c, run.out.perSecond())
	}
	return f, nil
}

// procCPU is the CPU seconds the processes named comm (or the pid, when
// comm is "") have used, from /proc.
func procCPU(pid int, comm string) float64 {
	ticks := func(stat string) float64 {
		secs, _ := statCPU(stat)
		return secs
	}
	if comm == "" {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return ticks(string(b))
	}
	var sum float64
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		c, _ := os.ReadFile("/proc/" + d.Name() + "/comm")
		if strings.TrimSpace(string(c)) != comm {
			continue
		}
		b, _ := os.ReadFile("/proc/" + d.Name() + "/stat")
		sum += ticks(string(b))
	}
	return sum
}

// cpuShare is what each process spent over one run.
type cpuShare struct {
	gateway, postgres, redis, tool float64 // CPU seconds
}

// cpuDuring runs f and measures the CPU each process spent meanwhile: the
// gateway (pid), PostgreSQL, Redis and this process (the load generator).
func cpuDuring(gwPid int, f func()) cpuShare {
	snap := func() cpuShare {
		return cpuShare{procCPU(gwPid, ""), procCPU(0, "postgres"), procCPU(0, "redis-server"), procCPU(os.Getpid(), "")}
	}
	a := snap()
	f()
	b := snap()
	return cpuShare{b.gateway - a.gateway, b.postgres - a.postgres, b.redis - a.redis, b.tool - a.tool}
}

// perWinner is the µs of CPU per winner of each process.
func (c cpuShare) perWinner(winners uint64) cpuShare {
	n := float64(max(winners, 1)) / 1e6
	return cpuShare{c.gateway / n, c.postgres / n, c.redis / n, c.tool / n}
}

func (c cpuShare) total() float64 { return c.gateway + c.postgres + c.redis + c.tool }

// metric reads one sample (name, exactly as exposed with its labels) from
// a gateway's /metrics; 0 when missing.
func metric(base, name string) float64 {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+" ") {
			v, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, name)), 64)
			return v
		}
	}
	return 0
}

// batchShape is what the ledger did per batch over one run: takes per
// batch, statements per batch (pg_stat_statements of the ledger's
// database), round trips per batch (the gateway's own count).
type batchShape struct {
	takes, statements, trips float64
}

// batchesDuring runs f and measures the gateway's batches meanwhile.
func (s *suite) batchesDuring(f func()) batchShape {
	calls := func() float64 {
		var n float64
		if err := s.ledgerDB.QueryRowContext(s.ctx, `SELECT COALESCE(SUM(calls), 0) FROM pg_stat_statements
			WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil {
			fmt.Fprintln(s.log, "pg_stat_statements:", err)
		}
		return n
	}
	m := func() (float64, float64, float64) {
		return metric(s.gw.base, "stockgate_ledger_batch_size_count"), metric(s.gw.base, "stockgate_ledger_batch_size_sum"),
			metric(s.gw.base, "stockgate_ledger_batch_round_trips_total")
	}
	b0, t0, r0 := m()
	c0 := calls()
	f()
	c1 := calls()
	b1, t1, r1 := m()
	batches := max(b1-b0, 1)
	return batchShape{takes: (t1 - t0) / batches, statements: (c1 - c0) / batches, trips: (r1 - r0) / batches}
}

// idle is a replica at rest: 1,000 programs, 200 of them with a waiting
// room that is sold out or ended, nothing sold.
type idle struct {
	programs, rooms int
	cpu             float64 // share of a core
	redisCalls      float64 // a second
	seconds         float64
}

// idleReplica starts a gateway of its own on a fresh ledger, sets the
// programs up, lets it settle for settle and measures it over window.
func (s *suite) idleReplica(settle, window time.Duration) (idle, error) {
	out := idle{programs: 1000, rooms: 200}
	dsn, _, err := s.pg.NewDatabase(s.ctx)
	if err != nil {
		return out, err
	}
	// The drift check at its default period: an idle replica runs it.
	g, err := startGateway(s.ctx, s.bin, s.redisAddrs, dsn, "STOCKGATE_DRIFT_EVERY=30s")
	if err != nil {
		return out, err
	}
	defer func() { g.cmd.Process.Kill(); _ = g.cmd.Wait() }()
	ctx := context.Background()
	for i := range out.programs {
		sku := fmt.Sprintf("idle%d/ga", i)
		total := int64(10)
		if i < out.rooms/2 {
			total = 0
		}
		if err := g.admin.putSKU(sku, total, 2); err != nil {
			return out, err
		}
		if i >= out.rooms {
			continue
		}
		if i >= out.rooms/2 {
			if _, err := g.admin.c.EndSale(ctx, skuOf(sku)); err != nil {
				return out, err
			}
		}
		if _, err := g.admin.c.PutQueue(ctx, fmt.Sprintf("idle%d", i), client.QueueConfig{OpensInSeconds: ptr[int64](0),
			RatePerSecond: 500, WindowSeconds: 300, PerRemaining: 1.5}); err != nil {
			return out, err
		}
	}
	time.Sleep(settle) // the benchmark waits out the setup's own work; no test asserts on it
	pid := g.cmd.Process.Pid
	c0, r0, t0 := procCPU(pid, ""), metric(g.base, "stockgate_redis_calls_total"), time.Now()
	time.Sleep(window)
	c1, r1 := procCPU(pid, ""), metric(g.base, "stockgate_redis_calls_total")
	out.seconds = time.Since(t0).Seconds()
	out.cpu, out.redisCalls = (c1-c0)/out.seconds, (r1-r0)/out.seconds
	return out, nil
}

// ledgerDBOf opens the gateway's PostgreSQL ledger for the suite's own
// reads (pg_stat_statements), with the extension made.
func ledgerDBOf(ctx context.Context, dsn string) (*sql.DB, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// overloadRun is an open-loop run at twice a gateway's closed-loop rate,
// with the gateway's own view of it: its p99 of purchases (from its
// latency histogram) and what it shed.
type overloadRun struct {
	res       loadgen.Result
	serverP99 time.Duration
	shed      float64
}

// overload is an open-loop run at twice what a gateway committed closed
// loop, with room in the tool for 4,096 requests in flight.
func (s *suite) overload(name string, g gateway, skus []string, prefix string, capacity float64) overloadRun {
	rate := int(2 * capacity)
	shed := func() float64 {
		var n float64
		for _, w := range []string{"takes", "in_flight"} {
			n += metricSum(g.base, "stockgate_ledger_shed_total", `work="`+w+`"`)
		}
		return n
	}
	h0, s0 := purchaseBuckets(g.base), shed()
	res := s.attack(fmt.Sprintf("%s at 2× (%d/s, open loop)", name, rate), g.base, loadgen.Purchases(skus, prefix, 0), rate, 256, 10*time.Second)
	h1, s1 := purchaseBuckets(g.base), shed()
	return overloadRun{res: res, serverP99: bucketQuantile(h0, h1, 0.99), shed: s1 - s0}
}

// purchaseBuckets reads the gateway's latency histogram of purchases:
// cumulative counts by upper bound (seconds).
func purchaseBuckets(base string) map[float64]float64 {
	out := map[float64]float64{}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	prefix := `stockgate_http_request_duration_seconds_bucket{method="POST",route="/v1/skus/:program/:ticket/purchases",le="`
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			continue
		}
		le, count, _ := strings.Cut(rest, `"} `)
		bound := math.Inf(1)
		if le != "+Inf" {
			bound, _ = strconv.ParseFloat(le, 64)
		}
		out[bound], _ = strconv.ParseFloat(count, 64)
	}
	return out
}

// bucketQuantile is the q quantile of what a histogram counted between
// two reads: the upper bound of the first bucket that holds it.
func bucketQuantile(before, after map[float64]float64, q float64) time.Duration {
	bounds := slices.Sorted(maps.Keys(after))
	if len(bounds) == 0 {
		return 0
	}
	total := after[math.Inf(1)] - before[math.Inf(1)]
	for _, b := range bounds {
		if after[b]-before[b] >= q*total {
			if math.IsInf(b, 1) {
				return -1 // beyond the last bound
			}
			return time.Duration(b * float64(time.Second))
		}
	}
	return -1
}

// checkpointsDuring runs f and returns how many checkpoints PostgreSQL
// began meanwhile (timed and requested): each writes out the dirty pages
// of what came before, beside the commits being measured.
func (s *suite) checkpointsDuring(f func()) int64 {
	read := func() int64 {
		var n int64
		if err := s.ledgerDB.QueryRowContext(s.ctx, "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter").Scan(&n); err != nil {
			fmt.Fprintln(s.log, "pg_stat_bgwriter:", err)
			return -1
		}
		return n
	}
	before := read()
	f()
	after := read()
	if before < 0 || after < 0 {
		return -1
	}
	return after - before
}

// statCPU reads a /proc/<pid>/stat line: the CPU seconds the process
// spent (user + system) and its parent's pid; 0s when unreadable.
func statCPU(stat string) (secs float64, parent int) {
	// The fields after the command's ")" start at state (field 3).
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	k, _ := strconv.ParseFloat(f[12], 64)
	parent, _ = strconv.Atoi(f[1])
	return (u + k) / 100, parent // USER_HZ
}

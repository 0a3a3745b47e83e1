package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stockgate/stockgate/e2e/loadgen"
	"github.com/stockgate/stockgate/internal/testenv"
)

// One primary and two: winners over 100 SKUs of 10 programs committed by
// a gateway whose ledger is one PostgreSQL primary (the suite's own
// gateway) and by one whose ledger is split over two (package fleet: five
// programs on each), side by side. On this machine both servers share the
// cores with everything else, so the run reports what each process spent
// as well as the ratio.

// primariesRun is one round's pair.
type primariesRun struct {
	one, two       loadgen.Result
	oneCPU, twoCPU primaryCPU
	oneAudit       audit
	twoAudit       audit
}

// primaryCPU is the CPU seconds each process spent over one run.
type primaryCPU struct {
	gateway, first, second, redis, tool float64
}

func (c primaryCPU) String() string {
	return fmt.Sprintf("gateway %.1f s, primary 1 %.1f s, primary 2 %.1f s, Redis %.1f s, load %.1f s",
		c.gateway, c.first, c.second, c.redis, c.tool)
}

// startPrimaries starts a second durable PostgreSQL server and a gateway
// whose ledger is split over the suite's server and it.
func (s *suite) startPrimaries() error {
	pg2, err := testenv.StartDurablePostgres(s.ctx)
	if err != nil {
		return err
	}
	s.pg2 = pg2
	first, _, err := s.pg.NewDatabase(s.ctx)
	if err != nil {
		return err
	}
	second, _, err := pg2.NewDatabase(s.ctx)
	if err != nil {
		return err
	}
	s.two, err = startGateway(s.ctx, s.bin, s.redisAddrs, first, "STOCKGATE_LEDGER_PRIMARIES=p1="+second)
	return err
}

// serverCPU is the CPU seconds of a PostgreSQL server: the postmaster
// (pid) and its children, the backends and workers (each its own process
// group: PostgreSQL calls setsid in every child).
func serverCPU(pid int) float64 {
	var sum float64
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		self, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + d.Name() + "/stat")
		if secs, parent := statCPU(string(b)); self == pid || parent == pid {
			sum += secs
		}
	}
	return sum
}

func (s *suite) primaryCPUDuring(gwPid int, f func()) primaryCPU {
	snap := func() primaryCPU {
		return primaryCPU{procCPU(gwPid, ""), serverCPU(s.pg.Pid()), serverCPU(s.pg2.Pid()), procCPU(0, "redis-server"), procCPU(os.Getpid(), "")}
	}
	a := snap()
	f()
	b := snap()
	return primaryCPU{b.gateway - a.gateway, b.first - a.first, b.second - a.second, b.redis - a.redis, b.tool - a.tool}
}

// primariesRound runs the pair once, the side that goes first alternating
// by round.
func (s *suite) primariesRound(r int) (primariesRun, error) {
	stamp := strconv.FormatInt(time.Now().Unix(), 10) + "r" + strconv.Itoa(r+1)
	var run primariesRun
	sides := []struct {
		name string
		g    gateway
		res  *loadgen.Result
		cpu  *primaryCPU
		a    *audit
	}{
		{"one primary", s.gw, &run.one, &run.oneCPU, &run.oneAudit},
		{"two primaries", s.two, &run.two, &run.twoCPU, &run.twoAudit},
	}
	if r%2 == 1 {
		slices.Reverse(sides)
	}
	for _, side := range sides {
		tag := strings.ReplaceAll(side.name, " ", "")
		var skus []string
		for p := range 10 {
			for t := range 10 {
				sku := fmt.Sprintf("%s%sp%d/t%d", tag, stamp, p, t)
				skus = append(skus, sku)
				if err := side.g.admin.putSKU(sku, int64(s.n), 1); err != nil {
					return run, err
				}
			}
		}
		*side.cpu = s.primaryCPUDuring(side.g.cmd.Process.Pid, func() {
			*side.res = s.attack("winners over 100 SKUs of 10 programs, "+side.name, side.g.base,
				loadgen.Purchases(skus, tag+stamp+"-", s.n/2), 0, s.workers, 0)
		})
		*side.a = s.audit(side.g, skus, *side.res)
	}
	return run, nil
}

// writePrimaries writes the section.
func (s *suite) writePrimaries(runs []primariesRun) {
	d := &s.doc
	fmt.Fprintf(d, "## One primary and two\n\n"+
		"Winners (every request a committed order) over 100 SKUs of 10 programs: a gateway whose ledger is one PostgreSQL\n"+
		"primary, and one whose ledger is split over two servers (`STOCKGATE_LEDGER_PRIMARIES`; five programs on each),\n"+
		"back to back in each round, the first side alternating. Both servers run on this machine with the gateway, six\n"+
		"Redis processes and the load generator, on %d cores: a second primary adds disks to flush to in parallel and\n"+
		"takes CPU from the rest, so the ratio here is a floor for servers of their own. CPU seconds per run, by process.\n\n"+
		"| round | one primary | two primaries | ratio | CPU, one primary | CPU, two primaries | audit |\n|---|---|---|---|---|---|---|\n",
		numCPU())
	var ratios []float64
	for i, r := range runs {
		ratio := r.two.Throughput() / max(r.one.Throughput(), 1)
		ratios = append(ratios, ratio)
		fmt.Fprintf(d, "| %d | %.0f /s | %.0f /s | %.2f | %s | %s | %s; %s |\n", i+1, r.one.Throughput(), r.two.Throughput(), ratio,
			r.oneCPU, r.twoCPU, r.oneAudit, r.twoAudit)
	}
	v := spreadOf(ratios)
	fmt.Fprintf(d, "\nTwo primaries ÷ one: median **%.2f** (%.2f – %.2f).\n\n", v.med, v.lo, v.hi)
}

// primaries runs the rounds of one primary against two.
func (s *suite) primaries() ([]primariesRun, error) {
	if err := s.startPrimaries(); err != nil {
		return nil, err
	}
	var runs []primariesRun
	for r := range s.rounds {
		fmt.Fprintf(s.log, "one primary and two: round %d of %d\n", r+1, s.rounds)
		run, err := s.primariesRound(r)
		if err != nil {
			return nil, err
		}
		runs = append(runs, run)
	}
	return runs, nil
}

// runPrimaries is `stockbench suite -only primaries`.
func (s *suite) runPrimaries() error {
	runs, err := s.primaries()
	if err != nil {
		return err
	}
	s.writePrimaries(runs)
	return nil
}

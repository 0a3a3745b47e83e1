package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stockgate/stockgate/e2e/loadgen"
	"github.com/stockgate/stockgate/internal/comparators"
)

type docInputs struct {
	flash, capRun, floor, bare, storm, reads, bareReads, steady, holds, confirms, fallback, admitLat, buyLat loadgen.Result
	carts, cartSingles                                                                                       loadgen.Result
	flashAudit, steadyAudit, fbAudit, cartAudit                                                              audit
	compRes                                                                                                  map[string]loadgen.Result
	compOversell                                                                                             map[string]int64
	comps                                                                                                    []*comparators.Comparator
	stormCalls, readCalls                                                                                    int64
	flashScripts, flashScriptUsec                                                                            int64
	rssKB                                                                                                    int64
	cpuTop                                                                                                   string
	shardMem, recMem                                                                                         int64
	room                                                                                                     roomRound
	floors                                                                                                   floors
	steadyCPU, holdsCPU, confirmsCPU, sqCPU, fallbackCPU                                                     cpuShare
	buyCheckpoints                                                                                           int64
	shape                                                                                                    batchShape
	crowd                                                                                                    crowdRun
	sqSteady                                                                                                 loadgen.Result
	overPG, overSQ                                                                                           overloadRun
	sqAudit, overAudit, sqOverAudit                                                                          audit
}

func cmdOut(name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

// spread is a measure over the rounds: its median and range.
type spread struct{ med, lo, hi float64 }

func spreadOf(vals []float64) spread {
	v := slices.Clone(vals)
	slices.Sort(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return spread{med: m, lo: v[0], hi: v[len(v)-1]}
}

// per reads one value from every round.
func per(rounds []docInputs, f func(in docInputs) float64) spread {
	var vals []float64
	for _, in := range rounds {
		vals = append(vals, f(in))
	}
	return spreadOf(vals)
}

// okRate is successful answers (200, 201) per second of the run.
func okRate(r loadgen.Result) float64 {
	return float64(r.Count(http.StatusOK)+r.Count(http.StatusCreated)) / r.Elapsed.Seconds()
}

func ratio(a, b loadgen.Result) float64 { return a.Throughput() / b.Throughput() }

func (s *suite) write(rounds []docInputs, micro, hot string) {
	d := &s.doc
	last := rounds[len(rounds)-1]
	mem, _ := os.ReadFile("/proc/meminfo")
	fmt.Fprintf(d, "# Benchmarks\n\nWritten by `make bench` (`go run ./cmd/stockbench suite -out docs/BENCHMARKS.md`) on %s.\n"+
		"Every figure below comes from that one run on this machine; rerun the command to check it. Everything runs on the\n"+
		"same machine at once: the load generator, the gateway, six Redis processes and PostgreSQL share the cores, so the\n"+
		"ratios (measured side by side, same cluster, same ledger, same load) matter more than the absolute numbers.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(d, "## Machine\n\n- %d cores, %s\n- %s\n- %s\n- %s\n\n", numCPU(), strings.TrimSpace(strings.SplitN(string(mem), "\n", 2)[0]),
		goVersion(), cmdOut("redis-server", "--version"), pgVersion())
	fmt.Fprintf(d, "## How\n\nThe suite runs %d rounds. Each round runs every measurement once, and the two sides of every\n"+
		"comparison back to back, so a ratio is taken from runs seconds apart; the machine varies by about ±20 %% from\n"+
		"one minute to the next. Targets report the median over the rounds and the range (lowest – highest); the verdict\n"+
		"is the median's. Throughput runs send %d requests from %d connections as fast as they are answered (closed\n"+
		"loop); latency runs send at a fixed rate (half the round's measured maximum) for 10s (open loop: a late answer\n"+
		"counts from when it was due, no coordinated omission). Latencies are from an HDR histogram. A flash sale has\n"+
		"stock = 10 %% of its requests, one ticket each, unique Idempotency-Keys and buyers per round. stockgate runs as\n"+
		"its own process (PostgreSQL ledger with its default durable settings: fsync and synchronous commit on; 12 shards\n"+
		"for the hot SKU); the comparators are gin handlers in the benchmark process using the same Redis Cluster\n"+
		"client and the same PostgreSQL, except the bare gin ceilings (no Redis), which run in a process of their own, as\n"+
		"stockgate does, with its HTTP server settings: next to the load generator in one process, the same bare handler\n"+
		"answered 15–64 %% more requests than in a process of its own (`stockbench bare where`), which is where it runs,\n"+
		"not what it does.\n"+
		"Charts of latency over time: `.run/bench/*.html` after a run.\n\n",
		len(rounds), s.n, s.workers)

	compName := func(i int) string { return last.comps[i].Name }
	byName := func(in docInputs, i int) loadgen.Result { return in.compRes[compName(i)] }
	pct := func(v spread) string { return fmt.Sprintf("%.0f %%", 100*v.med) }
	pctRange := func(v spread) string { return fmt.Sprintf("%.0f – %.0f %%", 100*v.lo, 100*v.hi) }
	times := func(v spread) string { return fmt.Sprintf("%.2f×", v.med) }
	timesRange := func(v spread) string { return fmt.Sprintf("%.2f – %.2f×", v.lo, v.hi) }
	rate := func(unit string) (func(spread) string, func(spread) string) {
		return func(v spread) string { return fmt.Sprintf("%.0f %s", v.med, unit) },
			func(v spread) string { return fmt.Sprintf("%.0f – %.0f", v.lo, v.hi) }
	}
	ms := func(v spread) string { return fmt.Sprintf("%.1f ms", v.med) }
	msRange := func(v spread) string { return fmt.Sprintf("%.1f – %.1f ms", v.lo, v.hi) }
	perK := func(v spread) string { return fmt.Sprintf("%.2f per 1,000", v.med) }
	perKRange := func(v spread) string { return fmt.Sprintf("%.2f – %.2f", v.lo, v.hi) }
	msOf := func(r loadgen.Result, q float64) float64 { return float64(r.Quantile(q).Microseconds()) / 1000 }

	fmt.Fprintf(d, "## Targets\n\n| run | median of %d | range | goal | |\n|---|---|---|---|---|\n", len(rounds))
	row := func(name, goal string, v spread, med, rng func(spread) string, ok bool) {
		fmt.Fprintf(d, "| %s | %s | %s | %s | %s |\n", name, med(v), rng(v), goal, verdict(ok))
	}
	perS, perSRange := rate("/s")
	orders, ordersRange := rate("orders/s")
	tickets, ticketsRange := rate("tickets/s")
	us, usRange := rate("µs")
	// A ledger target: its absolute goal and its ratio to the floor
	// measured in the same round, each a row.
	ledgerRows := func(name string, goal float64, unit string, got func(in docInputs) float64, floor func(in docInputs) floorResult) {
		v := per(rounds, got)
		r := per(rounds, func(in docInputs) float64 { return got(in) / floor(in).perSecond() })
		f := per(rounds, func(in docInputs) float64 { return floor(in).perSecond() })
		med, rng := rate(unit)
		row(name, fmt.Sprintf("≥ %s %s", thousands(goal), unit), v, med, rng, v.med >= goal)
		row(fmt.Sprintf("%s, as a share of its floor (%s, median %.0f/s)", name, floorShort(floor(rounds[0])), f.med), "≥ 50 %", r, pct, pctRange, r.med >= 0.5)
	}
	ledgerRows("winners committed, 100 SKUs", 10_000, "orders/s", func(in docInputs) float64 { return okRate(in.steady) },
		func(in docInputs) floorResult { return in.floors.purchases })
	crowdShare := per(rounds, func(in docInputs) float64 { return okRate(in.crowd.res) / in.floors.purchases.perSecond() })
	row(fmt.Sprintf("winners committed, 100 SKUs, %d connections, as a share of the same floor", crowdWorkers), "≥ 50 %",
		crowdShare, pct, pctRange, crowdShare.med >= 0.5)
	takes := func(v spread) string { return fmt.Sprintf("%.1f", v.med) }
	takesRange := func(v spread) string { return fmt.Sprintf("%.1f – %.1f", v.lo, v.hi) }
	t64 := per(rounds, func(in docInputs) float64 { return in.shape.takes })
	row(fmt.Sprintf("takes per ledger batch, winners at %d connections", s.workers), "≥ 40", t64, takes, takesRange, t64.med >= 40)
	tCrowd := per(rounds, func(in docInputs) float64 { return in.crowd.shape.takes })
	row(fmt.Sprintf("takes per ledger batch, winners at %d connections", crowdWorkers), "≥ 200", tCrowd, takes, takesRange, tCrowd.med >= 200)
	ledgerRows("holds, one SKU", 5_000, "/s", func(in docInputs) float64 { return okRate(in.holds) },
		func(in docInputs) floorResult { return in.floors.holds })
	ledgerRows("confirms, one SKU", 5_000, "/s", func(in docInputs) float64 { return okRate(in.confirms) },
		func(in docInputs) floorResult { return in.floors.confirms })
	ledgerRows("`make run` (SQLite ledger), winners committed, 100 SKUs", 3_800, "orders/s",
		func(in docInputs) float64 { return okRate(in.sqSteady) }, func(in docInputs) floorResult { return in.floors.sqlite })
	v := per(rounds, func(in docInputs) float64 {
		return float64(len(cartTickets)) * okRate(in.carts) / okRate(in.cartSingles)
	})
	cart503 := 0
	for _, in := range rounds {
		cart503 += int(in.carts.Count(http.StatusServiceUnavailable))
	}
	row(fmt.Sprintf("carts of %d lines vs single purchases, in tickets (%d answers 503)", len(cartTickets), cart503), "≥ 0.8×, no 503",
		v, times, timesRange, v.med >= 0.8 && cart503 == 0)
	v = per(rounds, func(in docInputs) float64 { return float64(in.fallback.Count(201)) / in.fallback.Elapsed.Seconds() })
	row("breaker-open fallback, one SKU, 32 buyers", "≥ 5,000 tickets/s", v, tickets, ticketsRange, v.med >= 5000)
	v = per(rounds, func(in docInputs) float64 { return in.steadyCPU.perWinner(in.steady.Count(201)).gateway })
	row("gateway CPU per committed purchase (steady run)", "≤ 150 µs", v, us, usRange, v.med <= 150)
	v = per(rounds, func(in docInputs) float64 { return in.holdsCPU.perWinner(in.holds.Count(201)).gateway })
	row("gateway CPU per hold (holds run)", "≤ 150 µs", v, us, usRange, v.med <= 150)
	idle := s.idle
	fmt.Fprintf(d, "| an idle replica: %d programs, %d with sold-out or ended waiting rooms (%.0f s) | %.2f %% of a core, %.1f Redis calls/s | | ≤ 1 %% of a core, ≤ 10 Redis calls/s | %s |\n",
		idle.programs, idle.rooms, idle.seconds, 100*idle.cpu, idle.redisCalls, verdict(idle.cpu <= 0.01 && idle.redisCalls <= 10))
	_ = orders
	_ = ordersRange
	_ = perS
	_ = perSRange
	v = per(rounds, func(in docInputs) float64 { return ratio(in.flash, in.floor) })
	row("flash sale vs the floor (one EVALSHA per request behind gin)", "≥ 80 %", v, pct, pctRange, v.med >= 0.8)
	v = per(rounds, func(in docInputs) float64 { return ratio(in.capRun, in.floor) })
	row("decided in Redis alone vs the floor", "≥ 90 %", v, pct, pctRange, v.med >= 0.9)
	v = per(rounds, func(in docInputs) float64 { return ratio(in.flash, byName(in, 2)) })
	row("flash sale vs DECR + INCR-on-negative", "≥ 1.2×", v, times, timesRange, v.med >= 1.2)
	v = per(rounds, func(in docInputs) float64 { return ratio(in.storm, in.bare) })
	row("sold-out storm vs bare gin", "≥ 90 %", v, pct, pctRange, v.med >= 0.9)
	v = per(rounds, func(in docInputs) float64 { return 1000 * float64(in.stormCalls) / float64(in.storm.Requests) })
	row("sold-out storm: Redis calls", "0 per request (≤ 1 per 1,000)", v, perK, perKRange, v.med <= 1)
	v = per(rounds, func(in docInputs) float64 { return ratio(in.reads, in.bareReads) })
	row("stock reads vs bare gin", "≥ 90 %", v, pct, pctRange, v.med >= 0.9)
	v = per(rounds, func(in docInputs) float64 { return 1000 * float64(in.readCalls) / float64(in.reads.Requests) })
	row("stock reads: Redis calls", "0 per request (≤ 1 per 1,000)", v, perK, perKRange, v.med <= 1)
	v = per(rounds, func(in docInputs) float64 { return ratio(in.room.polls, in.room.bare) })
	row(fmt.Sprintf("waiting-room checks (a line of %d) vs bare gin", s.room.joined), "≥ 90 %", v, pct, pctRange, v.med >= 0.9)
	v = per(rounds, func(in docInputs) float64 {
		return 1000 * float64(in.room.calls) / float64(max(in.room.polls.Requests, 1))
	})
	row("waiting-room checks: line reads from Redis", "0 per request (≤ 1 per 1,000)", v, perK, perKRange, v.med <= 1)
	v = per(rounds, func(in docInputs) float64 { return msOf(in.admitLat, 99) })
	row("admission p99 at half its maximum rate (open loop)", "≤ 5 ms", v, ms, msRange, v.med <= 5)
	v = per(rounds, func(in docInputs) float64 { return msOf(in.buyLat, 99) })
	row("purchase with commit p99 at half its maximum (open loop)", "≤ 25 ms", v, ms, msRange, v.med <= 25)
	v = per(rounds, func(in docInputs) float64 { return ratio(in.flash, byName(in, 3)) })
	row("flash sale vs SET NX lock + GET/SET", "≥ 2×", v, times, timesRange, v.med >= 2)
	v = per(rounds, func(in docInputs) float64 { return ratio(in.flash, byName(in, 4)) })
	row("flash sale vs ledger-only optimistic", "≥ 20×", v, times, timesRange, v.med >= 20)
	v = per(rounds, func(in docInputs) float64 { return float64(in.rssKB) / 1024 })
	mib, mibRange := rate("MiB")
	row("gateway resident memory in the flash sale (peak)", "≤ 150 MiB", v, mib, mibRange, v.hi <= 150)
	oversold := false
	for _, in := range rounds {
		for _, a := range []audit{in.flashAudit, in.steadyAudit, in.cartAudit, in.fbAudit} {
			oversold = oversold || a.sold > a.total
		}
	}
	fmt.Fprintf(d, "| oversold in any round (flash, steady, carts, fallback; ledger audit) | %v | | none | %s |\n", oversold, verdict(!oversold))

	d.WriteString("\n## Against the floor and the approaches stockgate replaces\n\n" +
		"Flash sale, same load; requests per second, median and range over the rounds; \"vs stockgate\" is the median of\n" +
		"each round's ratio.\n\n| approach | req/s | range | vs stockgate | oversold (sum of rounds) |\n|---|---|---|---|---|\n")
	v = per(rounds, func(in docInputs) float64 { return in.flash.Throughput() })
	fmt.Fprintf(d, "| stockgate | %.0f | %.0f – %.0f | 1.00 | %v |\n", v.med, v.lo, v.hi, oversold)
	for i := range last.comps {
		v := per(rounds, func(in docInputs) float64 { return byName(in, i).Throughput() })
		rel := per(rounds, func(in docInputs) float64 { return ratio(byName(in, i), in.flash) })
		over := "n/a"
		if _, ok := last.compOversell[compName(i)]; ok {
			var sum int64
			for _, in := range rounds {
				sum += in.compOversell[compName(i)]
			}
			over = fmt.Sprint(sum)
		}
		fmt.Fprintf(d, "| %s | %.0f | %.0f – %.0f | %.2f | %s |\n", compName(i), v.med, v.lo, v.hi, rel.med, over)
	}
	s.writeLedger(rounds)
	s.writeCarts(rounds)
	d.WriteString("\n## Per-request costs\n\nWhat docs/CAPACITY.md sizes a deployment from. Redis figures are INFO commandstats deltas over\n" +
		"each round's flash sale (scripts run on masters only; `usec` is Redis's own time in the script, not its network I/O);\n" +
		"the gateway's CPU is the last round's 5-second profile, which spans its whole flash sale, over that sale's requests.\n\n" +
		"| cost | median | range |\n|---|---|---|\n")
	v = per(rounds, func(in docInputs) float64 { return float64(in.flashScripts) / float64(in.flash.Requests) })
	fmt.Fprintf(d, "| Redis scripts per flash-sale request | %.2f | %.2f – %.2f |\n", v.med, v.lo, v.hi)
	v = per(rounds, func(in docInputs) float64 { return float64(in.flashScriptUsec) / float64(max(in.flashScripts, 1)) })
	fmt.Fprintf(d, "| Redis time per stock script (µs) | %.1f | %.1f – %.1f |\n", v.med, v.lo, v.hi)
	if sec := cpuSeconds(last.cpuTop); sec > 0 {
		fmt.Fprintf(d, "| gateway CPU per flash-sale request (µs, last round) | %.0f | |\n", 1e6*sec/float64(last.flash.Requests))
	}
	d.WriteString("\n## Every run of every round\n\n")
	d.WriteString(loadgen.Table(s.results))
	fmt.Fprintf(d, "\nRedis memory (`MEMORY USAGE`, last round): one stock shard hash %d bytes; one idempotency (deduction) record %d bytes.\n", last.shardMem, last.recMem)
	fmt.Fprintf(d, "\nHolds (last round): %s; then confirmed 70 %% of them: %s.\n", last.holds.CodesString(), last.confirms.CodesString())
	d.WriteString("\n## Where the time goes: CPU profile of the gateway during the last round's flash sale\n\n```\n" + trimTop(last.cpuTop) + "\n```\n")
	d.WriteString("\n## Hot SKUs: per-master share and probes per purchase\n\n" +
		"One SKU's flash sale straight through package shard (stock 10 % of 20,000 purchases): the share of its scripts each\n" +
		"master ran, from INFO commandstats deltas, with 1 and with 12 shards; then probes per purchase over a 1,000-unit,\n" +
		"16-shard sale with quantities 1 to 4.\n\n```\n" + hot + "```\n")
	d.WriteString("\n## Micro-benchmarks of the hot path\n\n`go test -run '^$' -bench Micro -benchmem -benchtime 200000x ./keys ./shard ./cache ./gateway ./waitroom`\n\n```\n" + micro + "\n```\n")
}

func trimTop(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > 32 {
		lines = lines[:32]
	}
	return strings.Join(lines, "\n")
}

func pgVersion() string {
	for _, v := range []string{"17", "16", "15", "14"} {
		if out := cmdOut("/usr/lib/postgresql/"+v+"/bin/postgres", "--version"); out != "unknown" {
			return out
		}
	}
	return cmdOut("postgres", "--version")
}

func numCPU() int { return runtimeNumCPU() }

// writeCarts is the carts section: 3-line carts against single purchases
// of the same shape, each round's pair run back to back.
func (s *suite) writeCarts(rounds []docInputs) {
	d := &s.doc
	lines := float64(len(cartTickets))
	fmt.Fprintf(d, "\n## Carts of %d lines against single purchases\n\n"+
		"Each round runs %d carts, each one ticket of each of %d SKUs of one program, and %d single purchases of one ticket\n"+
		"each, round-robin over %d SKUs of another program, both from %d connections as fast as they are answered, back to\n"+
		"back (which goes first alternates by round). Every SKU has stock for every request and %d shards, so every request\n"+
		"is granted and both runs measure the winners' path: the gate takes, the ledger commits. The ratio is each round's\n"+
		"carts per second over that round's single purchases per second; in tickets it is %.0f times that.\n\n"+
		"| measure | median of %d | range |\n|---|---|---|\n",
		len(cartTickets), s.cartRequests(), len(cartTickets), s.cartRequests(), len(cartTickets), s.workers, cartShards, lines, len(rounds))
	row := func(name, unit string, f func(in docInputs) float64, format string) {
		v := per(rounds, f)
		fmt.Fprintf(d, "| %s | "+format+" %s | "+format+" – "+format+" |\n", name, v.med, unit, v.lo, v.hi)
	}
	row("carts", "carts/s", func(in docInputs) float64 { return okRate(in.carts) }, "%.0f")
	row("tickets in carts", "tickets/s", func(in docInputs) float64 { return lines * okRate(in.carts) }, "%.0f")
	row("single purchases", "purchases/s", func(in docInputs) float64 { return okRate(in.cartSingles) }, "%.0f")
	row("carts / single purchases (requests)", "×", func(in docInputs) float64 { return okRate(in.carts) / okRate(in.cartSingles) }, "%.2f")
	row("cart tickets / single-purchase tickets", "×", func(in docInputs) float64 {
		return lines * okRate(in.carts) / okRate(in.cartSingles)
	}, "%.2f")
	row("cart p99", "ms", func(in docInputs) float64 { return float64(in.carts.Quantile(99).Microseconds()) / 1000 }, "%.1f")
	row("single purchase p99", "ms", func(in docInputs) float64 { return float64(in.cartSingles.Quantile(99).Microseconds()) / 1000 }, "%.1f")
	d.WriteString("\nAnswers and the carts' ledger audit (sold + held over the carts' 3 SKUs; every granted cart is that many tickets):\n\n")
	for i, in := range rounds {
		a := in.cartAudit
		fmt.Fprintf(d, "- round %d: carts %s; single purchases %s; %s; every granted cart's tickets in the ledger: %v\n",
			i+1, in.carts.CodesString(), in.cartSingles.CodesString(), a, a.sold >= int64(lines)*a.created)
	}
}

// thousands writes 10000 as "10,000".
func thousands(v float64) string {
	s := strconv.FormatFloat(v, 'f', 0, 64)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// floorShort names a floor's setting in a few words.
func floorShort(f floorResult) string { return f.config.short() }

func (c floorConfig) short() string {
	return fmt.Sprintf("%s, %d per transaction, %d at once", c.driver, c.batch, c.clients)
}

// writeLedger is the ledger's sections: the floors, where each winner's
// CPU goes, the batches' shape, overload, and what limits the targets.
func (s *suite) writeLedger(rounds []docInputs) {
	d := &s.doc
	fmt.Fprintf(d, "\n## The ledger floors\n\n"+
		"`stockbench floor` (cmd/stockbench/floor.go) writes the rows stockgate's ledger writes for each winner (the request\n"+
		"with its stored answer, the order or hold, the event; per SKU and batch, its row; a confirm changes its hold; the\n"+
		"buyers' count rows only under a cap, which these SKUs have none of), against the same schema on the same database, with the\n"+
		"best batching found: every table one set-based statement, a batch's statements in one pipeline as one implicit\n"+
		"transaction (one round trip, one fsync), on PostgreSQL with its default durable settings; on SQLite one transaction\n"+
		"with the ledger's PRAGMAs (WAL, synchronous FULL). No HTTP, no Redis, no decisions: what this machine's database\n"+
		"does for stockgate's schema with the machine to itself, measured at the start of each round.\n\n"+
		"| floor | median of %d | range |\n|---|---|---|\n", len(rounds))
	for _, f := range []struct {
		get func(in docInputs) floorResult
	}{{func(in docInputs) floorResult { return in.floors.purchases }}, {func(in docInputs) floorResult { return in.floors.holds }},
		{func(in docInputs) floorResult { return in.floors.confirms }}, {func(in docInputs) floorResult { return in.floors.sqlite }}} {
		v := per(rounds, func(in docInputs) float64 { return f.get(in).perSecond() })
		fmt.Fprintf(d, "| %s | %.0f /s | %.0f – %.0f |\n", f.get(rounds[0]).config, v.med, v.lo, v.hi)
	}

	fmt.Fprintf(d, "\n## Where each winner's CPU goes\n\n"+
		"CPU seconds each process used during the run (from /proc), over the run's winners: the gateway, every PostgreSQL\n"+
		"process, every Redis process, and the benchmark process itself, which during these runs is only the load generator.\n"+
		"Their sum over the run's length is how much of the machine's %d cores the run used.\n\n"+
		"| run | winners/s | gateway µs | PostgreSQL µs | Redis µs | load generator µs | sum µs | cores busy |\n|---|---|---|---|---|---|---|---|\n", numCPU())
	cpuRow := func(name string, res func(in docInputs) loadgen.Result, cpu func(in docInputs) cpuShare) {
		get := func(f func(c cpuShare) float64) spread {
			return per(rounds, func(in docInputs) float64 { return f(cpu(in).perWinner(res(in).Count(201))) })
		}
		busy := per(rounds, func(in docInputs) float64 { return cpu(in).total() / res(in).Elapsed.Seconds() })
		rate := per(rounds, func(in docInputs) float64 { return okRate(res(in)) })
		fmt.Fprintf(d, "| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f |\n", name, rate.med,
			get(func(c cpuShare) float64 { return c.gateway }).med, get(func(c cpuShare) float64 { return c.postgres }).med,
			get(func(c cpuShare) float64 { return c.redis }).med, get(func(c cpuShare) float64 { return c.tool }).med,
			get(cpuShare.total).med, busy.med)
	}
	cpuRow("winners committed, 100 SKUs (PostgreSQL)", func(in docInputs) loadgen.Result { return in.steady }, func(in docInputs) cpuShare { return in.steadyCPU })
	cpuRow("holds, one SKU", func(in docInputs) loadgen.Result { return in.holds }, func(in docInputs) cpuShare { return in.holdsCPU })
	cpuRow("confirms, one SKU", func(in docInputs) loadgen.Result { return in.confirms }, func(in docInputs) cpuShare { return in.confirmsCPU })
	cpuRow("winners committed, 100 SKUs (SQLite, in the gateway)", func(in docInputs) loadgen.Result { return in.sqSteady }, func(in docInputs) cpuShare { return in.sqCPU })
	cpuRow("breaker-open fallback, one SKU, 32 buyers (PostgreSQL)", func(in docInputs) loadgen.Result { return in.fallback }, func(in docInputs) cpuShare { return in.fallbackCPU })

	fmt.Fprintf(d, "\n## The batches of the steady run\n\n"+
		"Per ledger transaction of takes during the steady run over 100 SKUs, at %d connections and at %d (the same SKUs,\n"+
		"closed loop, right after): takes committed (the gateway's stockgate_ledger_batch_size), statements PostgreSQL ran\n"+
		"(pg_stat_statements of the ledger's database, everything the gateway ran there meanwhile over the batches), and\n"+
		"round trips (the gateway's stockgate_ledger_batch_round_trips_total: each pipeline, each COMMIT). A batch holds\n"+
		"the takes that came while the one before it committed: the connections not waiting on the ledger (in HTTP, Redis,\n"+
		"the load generator's turn for the cores) are not in it. So two batches in a row never share a connection, and\n"+
		"over a closed loop of N connections carry N takes at most: whatever the ledger's pace, a lane that starts its\n"+
		"next batch as soon as one commits averages N/2 takes a batch at most (32 at 64 connections). Only a lane that\n"+
		"holds a batch back for the takes on their way, each waiting the longer, would pass that (TestBatchesGrowWithTheCrowd\n"+
		"shows the alternation: 200 buyers behind a slowed ledger in batches of 3 and 197).\n\n"+
		"| per batch | %d connections, median of %d | range | %d connections, median | range |\n|---|---|---|---|---|\n",
		s.workers, crowdWorkers, s.workers, len(rounds), crowdWorkers)
	for _, m := range []struct {
		name string
		f    func(b batchShape) float64
	}{{"takes", func(b batchShape) float64 { return b.takes }}, {"statements", func(b batchShape) float64 { return b.statements }},
		{"round trips", func(b batchShape) float64 { return b.trips }}} {
		a := per(rounds, func(in docInputs) float64 { return m.f(in.shape) })
		c := per(rounds, func(in docInputs) float64 { return m.f(in.crowd.shape) })
		fmt.Fprintf(d, "| %s | %.2f | %.2f – %.2f | %.2f | %.2f – %.2f |\n", m.name, a.med, a.lo, a.hi, c.med, c.lo, c.hi)
	}

	fmt.Fprintf(d, "\n## Overload: twice the capacity, open loop\n\n"+
		"Each round, right after the closed-loop steady run, purchases are sent at twice the rate that run committed, for 10 s,\n"+
		"with room in the load generator for 4,096 requests in flight; a latency counts from when its request was due. A\n"+
		"take waits for its ledger batch at most the wait budget (250 ms) when the ledger is behind: beyond what the ledger\n"+
		"commits in that time it is refused at once, 503 overloaded with Retry-After, its units given back (TestOverloadShedsAtTheLedger\n"+
		"shows it with a ledger slowed down). The ledger audit counts sold against 201s after each run.\n\n"+
		"| run | answers | req/s sent | p50 | p99 | the load tool limited it | gateway's own p99 | shed | oversold |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, in := range rounds {
		for _, o := range []struct {
			r overloadRun
			a audit
		}{{in.overPG, in.overAudit}, {in.overSQ, in.sqOverAudit}} {
			own := "> 5 s"
			if o.r.serverP99 >= 0 {
				own = "≤ " + o.r.serverP99.String()
			}
			fmt.Fprintf(d, "| %s | %s | %.0f | %v | %v | %v | %s | %.0f | %v |\n", o.r.res.Name, o.r.res.CodesString(), o.r.res.Throughput(),
				o.r.res.Quantile(50), o.r.res.Quantile(99), o.r.res.ToolLimited(), own, o.r.shed, o.a.sold > o.a.total)
		}
	}
	d.WriteString("\nThe gateway's own p99 is the upper bound of the bucket of its latency histogram of purchases that holds it: the time\n" +
		"from the request's arrival to its answer. Where the load tool limited the run, the rest of the p50 and p99 is the\n" +
		"tool's own queue (its requests going out late on the same two cores), counted from when each was due.\n")

	steadyCPU := per(rounds, func(in docInputs) float64 { return in.steadyCPU.perWinner(in.steady.Count(201)).total() })
	busy := per(rounds, func(in docInputs) float64 { return in.steadyCPU.total() / in.steady.Elapsed.Seconds() })
	floorCPU := per(rounds, func(in docInputs) float64 { return 1e6 * float64(numCPU()) / in.floors.purchases.perSecond() })
	d.WriteString("\n### What limits the missed targets\n\n")
	fmt.Fprintf(d, "- **The machine's two cores, for every ledger target.** A committed purchase costs the whole machine\n"+
		"  %.0f µs of CPU (median; the table above: gateway, PostgreSQL, Redis and the load generator), and the steady run keeps\n"+
		"  %.2f of the %d cores busy: at that cost the machine cannot commit more than about %.0f purchases a second whatever\n"+
		"  the ledger does, so 10,000 orders/s is out of reach here. The floor's winner costs the machine %.0f µs (both cores,\n"+
		"  no HTTP, no Redis, no load generator): the ratio to the floor is the ratio of those costs more than anything the\n"+
		"  ledger waits on. On a machine where the gateway, Redis and PostgreSQL each have cores of their own, the limit is\n"+
		"  PostgreSQL's own column above.\n",
		steadyCPU.med, busy.med, numCPU(), float64(numCPU())*1e6/steadyCPU.med, floorCPU.med)
	// What the parts besides the ledger cost each winner bounds every
	// ledger target on these two cores, whatever the ledger does.
	d.WriteString("- **What the rest of each winner costs, against half the floor.** The gateway's, Redis's and the load\n" +
		"  generator's CPU per winner (the table above; for SQLite the gateway's without its ledger is not separable, so\n" +
		"  the PostgreSQL run's gateway figure stands in) alone let the machine commit at most the rate below, however\n" +
		"  cheap the ledger's own work; with the database's CPU per winner in its floor (the same rows at the best batching:\n" +
		"  less than the ledger can spend on them) added, at most the second rate. Where that is under half the floor, the\n" +
		"  target is out of reach on this machine:\n\n" +
		"  | target | µs besides the ledger | cap with a free ledger | + the floor's database µs | cap | half the floor | out of reach here |\n" +
		"  |---|---|---|---|---|---|---|\n")
	capRow := func(name string, rest func(in docInputs) float64, floor func(in docInputs) floorResult) {
		r := per(rounds, rest)
		half := per(rounds, func(in docInputs) float64 { return floor(in).perSecond() / 2 })
		db := per(rounds, func(in docInputs) float64 { return floor(in).ledgerMicros() })
		free := float64(numCPU()) * 1e6 / r.med
		cap := float64(numCPU()) * 1e6 / (r.med + db.med)
		fmt.Fprintf(d, "  | %s | %.0f | %.0f /s | %.0f | %.0f /s | %.0f /s | %v |\n", name, r.med, free, db.med, cap, half.med, cap < half.med)
	}
	rest := func(c cpuShare, winners uint64) float64 {
		w := c.perWinner(winners)
		return w.gateway + w.redis + w.tool
	}
	capRow("winners committed, 100 SKUs", func(in docInputs) float64 { return rest(in.steadyCPU, in.steady.Count(201)) },
		func(in docInputs) floorResult { return in.floors.purchases })
	capRow("holds, one SKU", func(in docInputs) float64 { return rest(in.holdsCPU, in.holds.Count(201)) },
		func(in docInputs) floorResult { return in.floors.holds })
	capRow("confirms, one SKU", func(in docInputs) float64 { return rest(in.confirmsCPU, in.confirms.Count(201)) },
		func(in docInputs) floorResult { return in.floors.confirms })
	capRow("`make run` (SQLite), 100 SKUs", func(in docInputs) float64 {
		s, q := in.steadyCPU.perWinner(in.steady.Count(201)), in.sqCPU.perWinner(in.sqSteady.Count(201))
		return s.gateway + q.redis + q.tool
	}, func(in docInputs) floorResult { return in.floors.sqlite })
	d.WriteString("\n")
	var cps []string
	for _, in := range rounds {
		cps = append(cps, strconv.FormatInt(in.buyCheckpoints, 10))
	}
	fmt.Fprintf(d, "- **Open-loop p99s** at half the closed-loop maximum queue behind the load generator and the other servers on the\n"+
		"  same two cores; a purchase with commit waits for its batch's fsync. The purchase run follows the steady run whose\n"+
		"  maximum it halves, before the overload run (whose backlog PostgreSQL writes out for a while after it); checkpoints\n"+
		"  PostgreSQL began during it, per round: %s (each writes out what the runs before it dirtied, beside the commits).\n",
		strings.Join(cps, ", "))
	d.WriteString(`- **Holds and confirms of one SKU** commit in one lane, one batch at a time: a SKU's row has one writer per
  replica, and each batch holds the row until its commit's fsync, so the pace is batch size over a batch's time; the
  batches are at most the requests in flight (64 connections). The floor of one SKU writes batches of 256.
- **Redis calls in the sold-out storm and the read flood** are per change of the SKU, not per unit of time, while
  the replica hears its notices: the sold-out flag stands until a restock notice, and the stock view until a change
  notice (each up to the notice max age, 10 s). What the count still holds is the replica's own calls per second
  (the waiting rooms' pacer lock, the drift check), whatever the SKUs do; ` + "`stockbench suite -only calls`" + ` takes them
  out and runs each flood at a half and a tenth of its pace too.
`)
}

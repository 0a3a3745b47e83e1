package main

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"time"

	"github.com/stockgate/stockgate/client"
	"github.com/stockgate/stockgate/e2e/powpage"
)

// The waiting room page's proof of work, solved in headless Chromium's
// web worker (package powpage) on this machine's core and on a browser
// slowed powpage.PhoneSlowdown times, at two difficulties: what a buyer
// pays for a place. A puzzle's tries vary by nature, so each cell is the
// median of powSolves solves.
const powSolves = 5

var powBitsRun = []int{16, 18}

type powRun struct {
	bits     int
	slowdown float64
	solves   []powpage.Solve
	err      error
}

// powRuns solves powSolves puzzles per difficulty and browser through the
// suite's gateway.
func (s *suite) powRuns() []powRun {
	chrome, err := exec.LookPath("chromium")
	if err != nil {
		return []powRun{{err: fmt.Errorf("chromium not found (make deps-chromium): %w", err)}}
	}
	var out []powRun
	for _, slowdown := range []float64{1, powpage.PhoneSlowdown} {
		bctx, stop, err := powpage.Browser(s.ctx, chrome, slowdown)
		if err != nil {
			out = append(out, powRun{slowdown: slowdown, err: err})
			continue
		}
		for _, bits := range powBitsRun {
			out = append(out, s.powRun(bctx, bits, slowdown))
		}
		stop()
	}
	return out
}

func (s *suite) powRun(bctx context.Context, bits int, slowdown float64) powRun {
	run := powRun{bits: bits, slowdown: slowdown}
	program := fmt.Sprintf("pow%d", time.Now().UnixNano())
	if _, err := s.gw.admin.c.PutQueue(s.ctx, program, client.QueueConfig{OpensInSeconds: ptr[int64](0),
		RatePerSecond: 1, WindowSeconds: 60, PerRemaining: 1, ProofOfWorkBits: int64(bits)}); err != nil {
		run.err = err
		return run
	}
	fmt.Fprintf(s.log, "proof of work: %d bits, CPU slowed %vx, %d solves in the page\n", bits, slowdown, powSolves)
	for i := range powSolves {
		ctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
		sv, err := powpage.Join(ctx, s.gw.base, program, fmt.Sprintf("b%d", i))
		cancel()
		if err != nil {
			run.err = err
			return run
		}
		run.solves = append(run.solves, sv)
	}
	return run
}

// writePow is the proof-of-work table, beside the gateway's cost of a
// check (the micro-benchmarks above).
func (s *suite) writePow(runs []powRun) {
	d := &s.doc
	fmt.Fprintf(d, "\n**Proof of work in the buyer's browser.** The waiting room's page (`/queue/{program}`) in headless Chromium, its\n"+
		"web worker solving a room's puzzle, %d buyers per row, each in a new page: on this machine's core, and in a\n"+
		"browser run in a CPU cgroup allowed 1/%d of one core, standing for a mid-range phone (DevTools' CPU throttling\n"+
		"does not reach a worker; package powpage). A solve's tries vary by nature (2^bits on average), so the rate is\n"+
		"the steadier figure; \"expected\" is 2^bits tries at the median rate. The gateway checks a proof in about 0.5 µs\n"+
		"(BenchmarkMicroPowVerify above); a bot pays one try of a Go solver (BenchmarkMicroPowHash) 2^bits times per place.\n\n",
		powSolves, powpage.PhoneSlowdown)
	fmt.Fprintf(d, "| bits | CPU | solve, median (range) | hashes a second, median | expected at that rate |\n|---|---|---|---|---|\n")
	for _, r := range runs {
		cpu := "this machine's core"
		if r.slowdown > 1 {
			cpu = fmt.Sprintf("1/%v of a core", r.slowdown)
		}
		if r.err != nil || len(r.solves) == 0 {
			fmt.Fprintf(d, "| %d | %s | failed: %v | | |\n", r.bits, cpu, r.err)
			continue
		}
		took := make([]time.Duration, len(r.solves))
		rates := make([]float64, len(r.solves))
		for i, sv := range r.solves {
			took[i], rates[i] = sv.Took, sv.Rate()
		}
		slices.Sort(took)
		slices.Sort(rates)
		rate := rates[len(rates)/2]
		expected := time.Duration(float64(uint64(1)<<r.bits) / rate * float64(time.Second))
		fmt.Fprintf(d, "| %d | %s | %v (%v – %v) | %.0f | %v |\n", r.bits, cpu, took[len(took)/2].Round(time.Millisecond),
			took[0].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), rate, expected.Round(time.Millisecond))
	}
}

package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/stockgate/stockgate/e2e/loadgen"
)

// runCalls measures what a sold-out storm and read floods cost Redis, per
// 1,000 requests: closed loop at full pace, then open loop at a half and
// a tenth of it (issue 43: calls per change, not per unit of time, so a
// slower flood must not cost more per request). The reads are of the
// sold-out SKU and of a SKU in stock that nobody buys.
func (s *suite) runCalls() error {
	stamp := strconv.FormatInt(time.Now().Unix(), 10)
	sold, still := "soldout"+stamp+"/ga", "still"+stamp+"/ga"
	if err := s.gw.admin.putSKU(sold, 0, 4); err != nil {
		return err
	}
	if err := s.gw.admin.putSKU(still, int64(s.n), 4); err != nil {
		return err
	}
	s.attack("warm sold-out", s.gw.base, loadgen.Purchases([]string{sold}, "warm"+stamp, 10), 0, 1, 0)
	// The replica's own calls per second with no request at all (the
	// waiting rooms' pacer lock, the drift check): they come per unit of
	// time whatever the SKUs do, and are taken out of each run's count.
	idle0, start := s.redisCalls(), time.Now()
	time.Sleep(5 * time.Second) // the idle period measured
	idle := float64(s.redisCalls()-idle0) / time.Since(start).Seconds()
	fmt.Fprintf(&s.doc, "With no request at all the replica made %.1f Redis calls a second; each run's count less that is the requests' own.\n\n", idle)
	fmt.Fprintf(&s.doc, "| run | pace | requests | Redis calls | the requests' own | per 1,000 |\n|---|---|---|---|---|---|\n")
	measure := func(what string, sc func(n uint64, key string) loadgen.Scenario, r int) loadgen.Result {
		before, began := s.redisCalls(), time.Now()
		var res loadgen.Result
		pace := "closed loop"
		if r == 0 {
			res = s.attack(what, s.gw.base, sc(uint64(s.n), what+stamp), 0, s.workers, 0)
		} else {
			pace = fmt.Sprintf("%d/s open loop", r)
			res = s.attack(fmt.Sprintf("%s at %d/s", what, r), s.gw.base, sc(0, what+strconv.Itoa(r)+stamp), r, s.workers, 5*time.Second)
		}
		calls := s.redisCalls() - before
		own := max(float64(calls)-idle*time.Since(began).Seconds(), 0)
		fmt.Fprintf(&s.doc, "| %s | %s | %d | %d | %.0f | %.2f |\n", what, pace, res.Requests, calls, own, 1000*own/float64(max(res.Requests, 1)))
		return res
	}
	runs := []struct {
		what string
		sc   func(n uint64, key string) loadgen.Scenario
	}{
		{"sold-out storm", func(n uint64, key string) loadgen.Scenario { return loadgen.Purchases([]string{sold}, key, n) }},
		{"reads, sold out", func(n uint64, _ string) loadgen.Scenario { return loadgen.Reads(sold, n) }},
		{"reads, in stock, unchanged", func(n uint64, _ string) loadgen.Scenario { return loadgen.Reads(still, n) }},
	}
	for _, run := range runs {
		full := measure(run.what, run.sc, 0)
		for _, div := range []float64{2, 10} {
			measure(run.what, run.sc, max(int(full.Throughput()/div), 1))
		}
	}
	return nil
}

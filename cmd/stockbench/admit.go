package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/stockgate/stockgate/e2e/loadgen"
)

// runAdmit is `suite -only admit`: the admission latency, each round a
// closed loop of one buyer at the per-buyer cap to find the maximum, the
// steady, crowd and overload purchase runs the suite runs before the
// latency, then an open loop at half the maximum for 10 s, printed as a
// table (no document written). The runs before are there because what
// they leave behind (sockets in TIME_WAIT, the ledger's backlog) is what
// the latency run meets in the suite.
func (s *suite) runAdmit() error {
	stamp := strconv.FormatInt(time.Now().Unix(), 10)
	fmt.Fprintf(&s.doc, "| round | max | open-loop rate | p50 | p90 | p99 | p99.9 |\n|---|---|---|---|---|---|---|\n")
	for r := range s.rounds {
		k := func(prefix string) string { return prefix + "r" + strconv.Itoa(r+1) + "-" + stamp + "-" }
		capped := func(name string) (loadgen.Scenario, error) {
			sku := fmt.Sprintf("admit%sr%d/%s", stamp, r+1, name)
			if err := s.gw.admin.putCapped(sku, int64(s.n), 12, 1); err != nil {
				return nil, err
			}
			return func(i uint64) (loadgen.Request, bool) {
				req, ok := loadgen.Purchases([]string{sku}, k(name), s.n)(i)
				req.Body = `{"buyer":"` + k(name) + `b","quantity":1}`
				return req, ok
			}, nil
		}
		one, err := capped("one")
		if err != nil {
			return err
		}
		most := s.attack("stockgate decided in Redis (per-buyer cap)", s.gw.base, one, 0, s.workers, 0)
		var skus []string
		for i := range 100 {
			sku := fmt.Sprintf("admit%sr%d/t%d", stamp, r+1, i)
			skus = append(skus, sku)
			if err := s.gw.admin.putSKU(sku, int64(s.n), 1); err != nil {
				return err
			}
		}
		steady := s.attack("stockgate steady purchases (100 SKUs)", s.gw.base, loadgen.Purchases(skus, k("steady"), s.n/2), 0, s.workers, 0)
		s.crowd(skus, k("crowd"), s.n/2)
		s.overload("stockgate steady purchases (100 SKUs)", s.gw, skus, k("over"), steady.Throughput())
		two, err := capped("two")
		if err != nil {
			return err
		}
		half := int(most.Throughput() / 2)
		lat := s.attack(fmt.Sprintf("admission at %d/s (open loop)", half), s.gw.base, two, half, s.workers, 10*time.Second)
		fmt.Fprintf(&s.doc, "| %d | %.0f | %d | %v | %v | %v | %v |\n", r+1, most.Throughput(), half,
			lat.Quantile(50), lat.Quantile(90), lat.Quantile(99), lat.Quantile(99.9))
	}
	return nil
}

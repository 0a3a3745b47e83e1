package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/stockgate/stockgate/e2e/loadgen"
)

// runBuy is `suite -only buy`: the purchase-with-commit latency alone,
// each round a closed-loop steady run over 100 SKUs to find the maximum,
// then an open loop at half of it for 10 s, printed as a table (no
// document written). It is the suite's own measurement, for working on
// the latency without the rest of the suite's half hour.
func (s *suite) runBuy() error {
	stamp := strconv.FormatInt(time.Now().Unix(), 10)
	fmt.Fprintf(&s.doc, "| round | steady max | open-loop rate | p50 | p90 | p99 | p99.9 |\n|---|---|---|---|---|---|---|\n")
	for r := range s.rounds {
		k := func(prefix string) string { return prefix + "r" + strconv.Itoa(r+1) + "-" + stamp + "-" }
		var skus []string
		for i := range 100 {
			sku := fmt.Sprintf("buy%sr%d/t%d", stamp, r+1, i)
			skus = append(skus, sku)
			if err := s.gw.admin.putSKU(sku, int64(s.n), 1); err != nil {
				return err
			}
		}
		steady := s.attack("steady purchases (100 SKUs)", s.gw.base, loadgen.Purchases(skus, k("steady"), s.n/2), 0, s.workers, 0)
		half := int(steady.Throughput() / 2)
		lat := s.attack(fmt.Sprintf("purchase with commit at %d/s (open loop)", half), s.gw.base,
			loadgen.Purchases(skus, k("lat"), 0), half, s.workers, 10*time.Second)
		fmt.Fprintf(&s.doc, "| %d | %.0f | %d | %v | %v | %v | %v |\n", r+1, steady.Throughput(), half,
			lat.Quantile(50), lat.Quantile(90), lat.Quantile(99), lat.Quantile(99.9))
	}
	return nil
}

package main

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/stockgate/stockgate/e2e/loadgen"
)

// crowdWorkers is the crowd-sized run's buyers in flight at once: an
// on-sale's crowd, where the 64-connection steady run is a busy day.
const crowdWorkers = 1024

// crowdRun is the winners' run at crowd size and the ledger's batches
// meanwhile.
type crowdRun struct {
	res   loadgen.Result
	shape batchShape
}

// crowd sends n purchases over skus from crowdWorkers connections, closed
// loop: every connection waits for its answer, so up to crowdWorkers takes
// wait for the ledger at once and a batch can hold that many. (An open
// loop keeps that many in flight only above capacity, which is the
// overload run; here nothing is sent faster than it is answered.)
func (s *suite) crowd(skus []string, key string, n uint64) crowdRun {
	var out crowdRun
	out.shape = s.batchesDuring(func() {
		out.res = s.attack(fmt.Sprintf("stockgate steady purchases (100 SKUs), %d connections", crowdWorkers), s.gw.base,
			loadgen.Purchases(skus, key, n), 0, crowdWorkers, 0)
	})
	return out
}

// runCrowd is `suite -only crowd`: the winners over 100 SKUs at 64
// connections and at crowdWorkers, each round, with takes per batch and
// each as a share of the purchases floor measured in the same round,
// printed as a table (no document written).
func (s *suite) runCrowd() error {
	stamp := strconv.FormatInt(time.Now().Unix(), 10)
	fmt.Fprintf(&s.doc, "| round | floor | connections | winners/s | share of floor | takes per batch | statements per batch | 503 |\n"+
		"|---|---|---|---|---|---|---|---|\n")
	for r := range s.rounds {
		k := func(prefix string) string { return prefix + "r" + strconv.Itoa(r+1) + "-" + stamp + "-" }
		c := floorConfigs.purchases
		var err error
		if c.dsn, _, err = s.pg.NewDatabase(s.ctx); err != nil {
			return err
		}
		floor, err := runFloor(s.ctx, c)
		if err != nil {
			return fmt.Errorf("%s: %w", c, err)
		}
		var skus []string
		for i := range 100 {
			sku := fmt.Sprintf("crowd%sr%d/t%d", stamp, r+1, i)
			skus = append(skus, sku)
			if err := s.gw.admin.putSKU(sku, int64(s.n), 1); err != nil {
				return err
			}
		}
		var steady crowdRun
		steady.shape = s.batchesDuring(func() {
			steady.res = s.attack("stockgate steady purchases (100 SKUs)", s.gw.base, loadgen.Purchases(skus, k("steady"), s.n/2), 0, s.workers, 0)
		})
		crowd := s.crowd(skus, k("crowd"), s.n/2)
		for _, run := range []struct {
			workers uint64
			crowdRun
		}{{s.workers, steady}, {crowdWorkers, crowd}} {
			fmt.Fprintf(&s.doc, "| %d | %.0f/s | %d | %.0f | %.0f %% | %.1f | %.1f | %d |\n", r+1, floor.perSecond(), run.workers,
				okRate(run.res), 100*okRate(run.res)/floor.perSecond(), run.shape.takes, run.shape.statements,
				run.res.Count(http.StatusServiceUnavailable))
		}
	}
	return nil
}

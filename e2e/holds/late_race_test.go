package holds_test

// Found by TestModelConcurrent (e2e/model/concurrent_test.go): Redis
// lower than the ledger after two late payments of one hold raced.

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
)

// Two late payments of one expired hold, sent at once to two replicas
// under their own keys, one for all of the hold's units and one for
// fewer: one order is made (the other answers it, or 409 hold-confirmed
// for its other quantity), and the units at the gate are exactly the
// ledger's remaining afterwards. Both payments share the request derived
// from the hold, so one may meet the other's deduction at the gate; the
// one that commits must stand on as many units as its order has, and the
// other must give back what the order does not stand on.
func TestLatePaymentsOfOtherQuantitiesRace(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		late := func(o *app.Options) { o.Sale.LatePayment = time.Minute }
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: late})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: late})
		for _, shards := range []int{1, 2} {
			sku := systest.NewSKU(t)
			a.PutSKU(t, sku, 400, shards, 4)
			const n = 24
			ids := make([]string, n)
			var until time.Time
			for i := range ids {
				_, h := a.Hold(t, sku, fmt.Sprintf("h%d-%d", shards, i), fmt.Sprintf("b%d", i), 4, 1)
				if h.HoldID == "" {
					t.Fatalf("hold %d not made", i)
				}
				ids[i], until = h.HoldID, h.ExpiresAt
			}
			systest.WaitFor(t, 10*time.Second, "the holds' expiry to pass", func() bool { return time.Now().After(until) })
			var wg sync.WaitGroup
			for i, id := range ids {
				buyer := fmt.Sprintf("b%d", i)
				for j, e := range []*systest.Env{a, b} {
					q := []int{4, 1}[(i+j)%2]
					wg.Go(func() {
						// A 503 (48 payments at once on one SQLite writer can
						// outlast the work timeout on a busy machine) is sent
						// again with its key, as a platform would.
						r, _ := e.Retried(t, http.MethodPost, "/v1/holds/"+id+"/confirm", fmt.Sprintf("pay-%d-%d-%d", shards, i, j),
							fmt.Sprintf(`{"buyer":%q,"quantity":%d}`, buyer, q))
						switch {
						case r.Status == http.StatusCreated:
						case r.Status == http.StatusConflict && systest.ProblemKind(r) == "hold-confirmed":
						default:
							t.Errorf("late payment of %d of hold %d = %d %s", q, i, r.Status, r.Body)
						}
					})
				}
			}
			wg.Wait()
			if st := a.State(t, sku); st.Orders != n {
				t.Errorf("%d shards: %d orders of %d late-paid holds: %+v", shards, st.Orders, n, st)
			}
			systest.WaitSettled(t, a, sku)
		}
	})
}

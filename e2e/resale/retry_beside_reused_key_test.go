package resale_test

// Found by TestModelConcurrent (e2e/model/concurrent_test.go).

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stockgate/stockgate/e2e/systest"
)

// A retry of a committed request gets its answer, whatever else is sent
// under its key meanwhile: Ann's withdrawal under "w1" committed (200).
// While a hold she (wrongly) sends under "w1" is in flight on a replica,
// her withdrawal sent again under "w1" to that replica must still answer
// 200 with the listing, replayed; only the hold, the request that differs
// from what the key committed, is 422 idempotency-key-reused.
func TestRetryBesideAReusedKeyInFlight(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 10, 1, 4)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 2))
		x := mustList(t, a, ann, "l1", "ann", 2)
		if w := b.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w1", "ann"); w.Status != http.StatusOK {
			t.Fatalf("withdraw = %d %s", w.Status, w.Body)
		}
		var refused, held atomic.Int64
		for range 30 {
			var wg sync.WaitGroup
			wg.Go(func() {
				if r, _ := a.Hold(t, sku, "w1", "ann", 2, 77); r.Status == http.StatusCreated {
					held.Add(1)
				}
			})
			wg.Go(func() {
				r := a.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w1", "ann")
				if r.Status != http.StatusOK || r.Header.Get("Idempotent-Replayed") != "true" {
					if refused.Add(1) == 1 {
						t.Logf("the withdrawal again under its key = %d %s", r.Status, r.Body)
					}
				}
			})
			wg.Wait()
		}
		if n := refused.Load(); n > 0 {
			t.Errorf("%d of 30 retries of a committed withdrawal were not its answer while a hold under its key was in flight", n)
		}
		if n := held.Load(); n > 0 {
			t.Errorf("%d holds under the withdrawal's key were made", n)
		}
	})
}

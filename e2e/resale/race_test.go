package resale_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/e2e/systest"
)

// A listing of 3 raced by 50 buyers over two replicas, with its seller
// withdrawing in the middle, sells each listed ticket once: the buyers
// who got one plus the units withdrawn are the 3 listed, the seller's
// order gives up exactly the units sold (one refund's worth of
// listing.sold events), and the gate agrees with the ledger.
func TestResaleRacedByFiftyBuyers(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 5, 2, 5)
		order := systest.OrderID(a.MustBuy(t, sku, "p0", "seller", 5))
		x := mustList(t, a, order, "l1", "seller", 3)
		systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, sku).RedisRemaining == 3 })
		var bought atomic.Int64
		var withdrawn int64
		var wg sync.WaitGroup
		wg.Go(func() {
			// Once the first buyer is served: mid-race.
			for deadline := time.Now().Add(10 * time.Second); bought.Load() == 0 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond) // poll interval
			}
			w := b.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w1", "seller")
			switch {
			case w.Status == http.StatusOK:
				withdrawn = listingOf(t, w).Withdrawn
			case w.Status != http.StatusConflict:
				t.Errorf("withdraw = %d %s", w.Status, w.Body)
			}
			t.Logf("the withdrawal mid-race: %d %s", w.Status, w.Body)
		})
		systest.BuyAll(50, 16, func(i int) systest.Reply {
			e := a
			if i%2 == 1 {
				e = b
			}
			r := e.Buy(t, sku, fmt.Sprintf("k%d", i), fmt.Sprintf("b%d", i), 1)
			switch r.Status {
			case http.StatusCreated:
				bought.Add(1)
			case http.StatusConflict:
			default:
				t.Errorf("purchase %d = %d %s", i, r.Status, r.Body)
			}
			return r
		})
		wg.Wait()
		n := bought.Load()
		if n+withdrawn > 3 || (withdrawn == 0 && n != 3) {
			t.Fatalf("%d bought and %d withdrawn of 3 listed", n, withdrawn)
		}
		systest.WaitFor(t, 15*time.Second, "the sales to settle", func() bool {
			got := getListing(t, a, x.ListingID)
			return got.Sold == n && got.State != "listed"
		})
		if q := orderQuantity(t, a, order); q != 5-n {
			t.Errorf("the seller's order has %d after %d resold, want %d", q, n, 5-n)
		}
		if _, units := soldEvents(t, a, sku); units != n {
			t.Errorf("listing.sold events for %d units, want %d", units, n)
		}
		st, err := a.Ledger.SKU(context.Background(), sku)
		if err != nil {
			t.Fatal(err)
		}
		if st.Total-st.Listed != 5 || st.Sold != 5 || st.Listed != 0 || st.Held != 0 {
			t.Errorf("SKU row total %d listed %d sold %d held %d, want the organizer's 5, all sold, nothing listed", st.Total, st.Listed, st.Sold, st.Held)
		}
		systest.WaitSettled(t, a, sku)
	})
}

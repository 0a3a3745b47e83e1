package resale_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/e2e/systest"
)

// The admin's views add up while tickets are listed: total = sold + held
// + remaining, and the public pool's allotment is the ticket's, as the
// report's sold + held + open = total. Listed tickets are on sale again
// (in remaining, or in held once a hold has them), not in sold. Counted
// in sold (their sellers' orders still have them), the SKU read "total 4,
// sold 4, held 2" once a hold took the 2 listed tickets, and the public
// pool's allotment was 6 of a ticket of 4 (helper-110).
func TestAdminViewsAddUpWhileListed(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, _ := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 4, 1, 4)
		order := systest.OrderID(a.MustBuy(t, sku, "p1", "sam", 4))
		mustList(t, a, order, "l1", "sam", 2)
		type counts struct{ Total, Sold, Held, Remaining, Listed int64 }
		read := func() (row, pool counts) {
			t.Helper()
			r := a.Do(t, http.MethodGet, systest.AdminPath(sku), nil, "")
			var v struct {
				Total, Sold, Held, Remaining, Listed int64
			}
			if r.Status != http.StatusOK || json.Unmarshal(r.Body, &v) != nil {
				t.Fatalf("GET SKU = %d %s", r.Status, r.Body)
			}
			p := a.Do(t, http.MethodGet, systest.AdminPath(sku)+"/pools", nil, "")
			var pools struct {
				Pools []struct {
					Pool                             string
					Allotment, Sold, Held, Remaining int64
				}
			}
			if p.Status != http.StatusOK || json.Unmarshal(p.Body, &pools) != nil || len(pools.Pools) != 1 {
				t.Fatalf("GET pools = %d %s", p.Status, p.Body)
			}
			q := pools.Pools[0]
			return counts{v.Total, v.Sold, v.Held, v.Remaining, v.Listed}, counts{q.Allotment, q.Sold, q.Held, q.Remaining, 0}
		}
		check := func(when string, want counts) {
			t.Helper()
			s, p := read()
			if s != want {
				t.Errorf("%s: the SKU reads %+v, want %+v", when, s, want)
			}
			if want.Listed = 0; p != want {
				t.Errorf("%s: the public pool reads %+v, want %+v", when, p, want)
			}
		}
		check("listed", counts{Total: 4, Sold: 2, Remaining: 2, Listed: 2})
		systest.WaitFor(t, 10*time.Second, "the listed tickets at the gate", func() bool { return a.State(t, sku).RedisRemaining == 2 })
		if r, _ := a.Hold(t, sku, "h1", "tom", 2, 0); r.Status != http.StatusCreated {
			t.Fatalf("a hold of the listed tickets = %d %s", r.Status, r.Body)
		}
		check("a hold of the listed tickets", counts{Total: 4, Sold: 2, Held: 2, Listed: 2})
	})
}

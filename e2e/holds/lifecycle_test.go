package holds_test

// Where two transitions of one hold meet (issue 39): a confirm that lost
// a race to another confirm, a late payment that names a quantity, a
// buyer's key that looks like one the service derives.

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// Break 2 of issue 39: 20 confirms of one hold at once, each under its
// own key, asking 1..4 of its 4 units, on two replicas. On PostgreSQL the
// losers' conditional update waited for the winner's row and then saw it
// confirmed, which was answered "expired, nothing was sold" (410) while
// the hold had an order. Every answer now is the hold's one order (201,
// when it asked that quantity) or 409 hold-confirmed naming it; never
// 410, and one order per hold.
func TestConcurrentConfirmsOfOneHold(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		ctx := context.Background()
		sku := systest.NewSKU(t)
		const holds = 8
		a.PutSKU(t, sku, 4*holds, 2, 4)
		for i := range holds {
			_, h := a.Hold(t, sku, fmt.Sprintf("h%d", i), "bob", 4, 120)
			if h.HoldID == "" {
				t.Fatalf("hold %d not made", i)
			}
			type got struct {
				status  int
				kind    string
				order   string
				q, want int64
			}
			out := make([]got, 20)
			var wg sync.WaitGroup
			for j := range out {
				wg.Go(func() {
					e := []*systest.Env{a, b}[j%2]
					want := int64(j%4 + 1)
					r, q := confirmPart(t, e, h.HoldID, fmt.Sprintf("c%d-%d", i, j), "bob", want)
					out[j] = got{r.Status, systest.ProblemKind(r), systest.OrderID(r), q, want}
				})
			}
			wg.Wait()
			cur, err := a.Ledger.HoldByID(ctx, keys.MustID(h.HoldID))
			if err != nil || cur.State != ledger.Confirmed {
				t.Fatalf("hold %d after the race: %+v, %v", i, cur, err)
			}
			o, err := a.Ledger.OrderByID(ctx, cur.OrderID)
			if err != nil {
				t.Fatal(err)
			}
			for j, g := range out {
				switch {
				case g.status == http.StatusCreated && g.order == o.ID.String() && g.q == g.want && g.want == o.Quantity:
				case g.status == http.StatusConflict && g.kind == "hold-confirmed" && g.want != o.Quantity:
				default:
					t.Errorf("hold %d confirm %d asking %d: %d %s (order %s of %d), want the hold's order %s of %d or 409 hold-confirmed",
						i, j, g.want, g.status, g.kind, g.order, g.q, o.ID, o.Quantity)
				}
			}
		}
		st := a.State(t, sku)
		if st.Orders != holds || st.Held != 0 || st.Sold > 4*holds {
			t.Errorf("after the races: %+v, want %d orders and nothing held", st, holds)
		}
		systest.RedisConsistent(t, a, sku)
	})
}

// Breaks 3 and 4 of issue 39: a late payment that names a quantity buys
// that many inside the window (201), once per hold: another under a new
// key asking another quantity is 409 hold-confirmed, one naming none gets
// the order. A buyer's own purchase under the key "late-<hold id>" (the
// key the service used to derive) takes nothing from the late payment.
func TestLatePaymentOfAQuantity(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		late := func(o *app.Options) { o.Sale.LatePayment = time.Minute }
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: late})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: late})
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 10, 2, 4)
		_, h := a.Hold(t, sku, "h1", "cat", 3, 1)
		_, h2 := a.Hold(t, sku, "h2", "cat", 2, 1)
		// Break 4: the buyer's own key, spelt as the service's old one.
		if r := b.Buy(t, sku, "late-"+h2.HoldID, "cat", 1); r.Status != http.StatusCreated {
			t.Fatalf("a purchase under the key late-<hold> = %d %s", r.Status, r.Body)
		}
		systest.WaitFor(t, 10*time.Second, "the holds' expiry to pass", func() bool {
			return time.Now().After(h.ExpiresAt) && time.Now().After(h2.ExpiresAt)
		})
		r, q := confirmPart(t, b, h.HoldID, "c1", "cat", 1)
		if r.Status != http.StatusCreated || q != 1 {
			t.Fatalf("a late payment of 1 of 3 = %d %s", r.Status, r.Body)
		}
		order := systest.OrderID(r)
		if r, q := confirmPart(t, a, h.HoldID, "c1", "cat", 1); r.Status != http.StatusCreated || systest.OrderID(r) != order || q != 1 {
			t.Errorf("its retry on the other replica = %d %s, want order %s", r.Status, r.Body, order)
		}
		if r, _ := confirmPart(t, a, h.HoldID, "c2", "cat", 3); r.Status != http.StatusConflict || systest.ProblemKind(r) != "hold-confirmed" {
			t.Errorf("a late payment of 3 under another key after one of 1 = %d %s, want 409 hold-confirmed", r.Status, r.Body)
		}
		if r := b.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c3", "cat"); r.Status != http.StatusCreated || systest.OrderID(r) != order {
			t.Errorf("a late payment naming no quantity after one of 1 = %d %s, want order %s", r.Status, r.Body, order)
		}
		if r, _ := confirmPart(t, b, h.HoldID, "c4", "cat", 4); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("a late payment of more than the hold had = %d %s, want 422", r.Status, r.Body)
		}
		r2 := a.Act(t, "/v1/holds/"+h2.HoldID+"/confirm", "c5", "cat")
		if r2.Status != http.StatusCreated {
			t.Errorf("a late payment of the hold whose old derived key the buyer used = %d %s", r2.Status, r2.Body)
		}
		// cat: 1 bought, 1 paid late of h, 2 paid late of h2.
		if st := a.State(t, sku); st.Sold != 4 || st.Held != 0 || st.Orders != 3 {
			t.Errorf("after the late payments: %+v, want 4 sold in 3 orders", st)
		}
		systest.WaitFor(t, 10*time.Second, "Redis equal to the ledger", func() bool { return a.State(t, sku).RedisRemaining == 6 })
	})
}

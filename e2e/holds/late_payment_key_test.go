package holds_test

// Found by TestModelConcurrent (e2e/model/concurrent_test.go).

import (
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
)

// The client's Idempotency-Key of a late payment is a request like any
// other: Cat pays late for her expired hold under key "pay-1" (201, an
// order); a purchase she then sends under "pay-1" is another request
// under a used key: 422 idempotency-key-reused, and nothing moves; and
// her late payment sent again under "pay-1" still answers its order,
// replayed, on either replica, also once the late-payment window has
// closed (a platform's retry must never read "expired, nothing was sold"
// for an order that stands).
func TestLatePaymentKeyIsRemembered(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		late := func(o *app.Options) { o.Sale.LatePayment = 3 * time.Second }
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: late})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: late})
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 10, 1, 4)
		_, h := a.Hold(t, sku, "h1", "cat", 2, 1)
		systest.WaitFor(t, 10*time.Second, "the hold's expiry to pass", func() bool { return time.Now().After(h.ExpiresAt) })
		r := a.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "pay-1", "cat")
		if r.Status != http.StatusCreated {
			t.Fatalf("a late payment = %d %s", r.Status, r.Body)
		}
		order := systest.OrderID(r)
		before := a.State(t, sku)
		if r := b.Buy(t, sku, "pay-1", "cat", 1); r.Status != http.StatusUnprocessableEntity || systest.ProblemKind(r) != "idempotency-key-reused" {
			t.Errorf("a purchase under the late payment's key = %d %s, want 422 idempotency-key-reused", r.Status, r.Body)
		}
		if after := a.State(t, sku); after.Sold != before.Sold || after.Orders != before.Orders {
			t.Errorf("the reused key moved stock: before %+v, after %+v", before, after)
		}
		for _, e := range []*systest.Env{a, b} {
			if r := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "pay-1", "cat"); r.Status != http.StatusCreated || systest.OrderID(r) != order ||
				r.Header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("the late payment again under its key = %d %s (replayed %q), want 201 with order %s, replayed",
					r.Status, r.Body, r.Header.Get("Idempotent-Replayed"), order)
			}
		}
		// A second hold, paid late under its own key, retried once the
		// window has closed.
		_, h2 := a.Hold(t, sku, "h2", "dan", 1, 1)
		systest.WaitFor(t, 10*time.Second, "the second hold's expiry to pass", func() bool { return time.Now().After(h2.ExpiresAt) })
		r2 := b.Act(t, "/v1/holds/"+h2.HoldID+"/confirm", "pay-2", "dan")
		if r2.Status != http.StatusCreated {
			t.Fatalf("the second late payment = %d %s", r2.Status, r2.Body)
		}
		systest.WaitFor(t, 10*time.Second, "the late-payment window to close", func() bool { return time.Now().After(h2.ExpiresAt.Add(3*time.Second + 100*time.Millisecond)) })
		if r := a.Act(t, "/v1/holds/"+h2.HoldID+"/confirm", "pay-2", "dan"); r.Status != http.StatusCreated || systest.OrderID(r) != systest.OrderID(r2) {
			t.Errorf("the late payment again under its key after the window = %d %s, want 201 with order %s", r.Status, r.Body, systest.OrderID(r2))
		}
	})
}

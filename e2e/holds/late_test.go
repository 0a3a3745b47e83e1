package holds_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// A confirm that comes after the hold expired, within the late-payment
// window, buys the hold's units again if they are there, once (a retry on
// the other replica answers the same order), whether the sweeper had
// expired the hold or not; if another buyer took them meanwhile it is
// refused with late-payment-refused and nothing moves; past the window,
// or with late payments off, it is hold-expired.
func TestLatePayment(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		late := func(o *app.Options) { o.Sale.LatePayment = time.Minute; o.Sale.SweepEvery = 20 * time.Millisecond }
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: late})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: func(o *app.Options) { o.Sale.LatePayment = time.Minute }})
		off := systest.Start(t, systest.Options{Driver: driver, DSN: dsn})
		ctx := context.Background()
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 4, 2, 4)
		expired := func(id string) bool {
			h, err := a.Ledger.HoldByID(ctx, keys.MustID(id))
			return err == nil && h.State == ledger.Expired
		}
		// Swept, then paid late: bought again, once.
		_, h := a.Hold(t, sku, "h1", "ann", 2, 1)
		systest.WaitFor(t, 10*time.Second, "the sweeper to expire the hold", func() bool { return expired(h.HoldID) })
		if r := off.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c1", "ann"); r.Status != http.StatusGone || systest.ProblemKind(r) != "hold-expired" {
			t.Fatalf("a late confirm with late payments off = %d %s", r.Status, r.Body)
		}
		r := b.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c2", "ann")
		if r.Status != http.StatusCreated || systest.OrderID(r) == "" {
			t.Fatalf("a late confirm = %d %s", r.Status, r.Body)
		}
		order := systest.OrderID(r)
		for _, e := range []*systest.Env{a, b} {
			if r := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c2", "ann"); r.Status != http.StatusCreated || systest.OrderID(r) != order {
				t.Errorf("its retry = %d %s, want order %s", r.Status, r.Body, order)
			}
		}
		if r := a.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c3", "ann"); r.Status != http.StatusCreated || systest.OrderID(r) != order {
			t.Errorf("another late confirm of the hold = %d %s, want the same order %s", r.Status, r.Body, order)
		}
		if st := a.State(t, sku); st.Sold != 2 || st.Held != 0 || st.Orders != 1 || st.RedisRemaining != 2 {
			t.Fatalf("after the late payment: %+v, want 2 sold once", st)
		}
		// Not swept yet (b runs no sweeper; a's is fast, so hold on b and
		// confirm at once after the expiry): expired first, then bought.
		_, h2 := b.Hold(t, sku, "h2", "bob", 1, 1)
		systest.WaitFor(t, 10*time.Second, "the expiry to pass", func() bool { return time.Now().After(h2.ExpiresAt) })
		if r := b.Act(t, "/v1/holds/"+h2.HoldID+"/confirm", "c4", "bob"); r.Status != http.StatusCreated {
			t.Fatalf("a late confirm of a hold maybe not swept = %d %s", r.Status, r.Body)
		}
		if st := a.State(t, sku); st.Sold != 3 || st.Held != 0 || st.RedisRemaining != 1 {
			t.Fatalf("after the second late payment: %+v, want 3 sold, 1 left", st)
		}
		// Gone meanwhile: refused, nothing moves.
		_, h3 := a.Hold(t, sku, "h3", "cat", 1, 1)
		systest.WaitFor(t, 10*time.Second, "the third hold to expire", func() bool { return expired(h3.HoldID) })
		// The sweeper gives the unit back to the gate after the ledger
		// marks the hold expired: buy it once the gate has it.
		systest.WaitFor(t, 10*time.Second, "the expired unit back at the gate", func() bool { return a.State(t, sku).RedisRemaining == 1 })
		dan := a.MustBuy(t, sku, "p1", "dan", 1)
		if r := b.Act(t, "/v1/holds/"+h3.HoldID+"/confirm", "c5", "cat"); r.Status != http.StatusConflict || systest.ProblemKind(r) != "late-payment-refused" {
			t.Fatalf("a late confirm of units sold meanwhile = %d %s", r.Status, r.Body)
		}
		if st := a.State(t, sku); st.Sold != 4 || st.Held != 0 || st.RedisRemaining != 0 {
			t.Fatalf("after the refusal: %+v, want 4 sold, none left", st)
		}
		// The refusal is final: the platform refunded on it. The unit
		// coming back (dan's refund) is for sale, not for a retry of the
		// late payment, nor for one under another key.
		if r := a.Act(t, "/v1/orders/"+systest.OrderID(dan)+"/refund", "r1", "dan"); r.Status != http.StatusOK {
			t.Fatalf("dan's refund = %d %s", r.Status, r.Body)
		}
		systest.WaitFor(t, 10*time.Second, "the refunded unit back at the gate", func() bool { return a.State(t, sku).RedisRemaining == 1 })
		for _, e := range []*systest.Env{a, b} {
			for _, key := range []string{"c5", "c6"} {
				if r := e.Act(t, "/v1/holds/"+h3.HoldID+"/confirm", key, "cat"); r.Status != http.StatusConflict || systest.ProblemKind(r) != "late-payment-refused" {
					t.Fatalf("a late confirm (key %s) after the refusal, its units back = %d %s, want the refusal again", key, r.Status, r.Body)
				}
			}
		}
		if st := a.State(t, sku); st.Sold != 3 || st.Orders != 2 || st.RedisRemaining != 1 {
			t.Fatalf("after the refused late payment's retries: %+v, want 3 sold, the refunded unit left", st)
		}
	})
}

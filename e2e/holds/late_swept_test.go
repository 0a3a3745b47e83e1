package holds_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
)

// failRestoreOwed is a ledger whose next RestoreOwed fails, as a sweeper
// that expired a hold and has not given its units to Redis yet leaves it
// (a batch of 200 restored one by one, a ledger error at that moment).
type failRestoreOwed struct {
	sale.Ledger
	fail atomic.Bool
}

func (l *failRestoreOwed) RestoreOwed(ctx context.Context, kind string, id keys.ID) (ledger.Restore, bool, error) {
	if l.fail.CompareAndSwap(true, false) {
		return ledger.Restore{}, false, errors.New("injected: the sweeper's restore did not run")
	}
	return l.Ledger.RestoreOwed(ctx, kind, id)
}

// A late payment for a hold the sweeper expired in the ledger but whose
// units are not back in Redis yet buys them: they are the buyer's own,
// and the ledger has them. Refused there (the gate empty), the platform
// was told to refund for units that were for sale.
func TestLatePaymentBeforeTheSweepersRestore(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		wrapped := &failRestoreOwed{}
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: func(o *app.Options) {
			o.Sale.LatePayment = time.Minute
			o.Sale.SweepEvery = 20 * time.Millisecond
			o.Sale.RestoreGrace = time.Hour // the sweeper does not come back to it in the test's time
			o.WrapLedger = func(l sale.Ledger) sale.Ledger { wrapped.Ledger = l; return wrapped }
		}})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: func(o *app.Options) { o.Sale.LatePayment = time.Minute }})
		ctx := context.Background()
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 2, 1, 2)
		wrapped.fail.Store(true)
		_, h := a.Hold(t, sku, "h1", "ann", 2, 1)
		// The ledger's expiry commits before the sweeper asks for the
		// restore it owes: both are waited for.
		systest.WaitFor(t, 10*time.Second, "the sweeper to expire the hold and miss its restore", func() bool {
			got, err := a.Ledger.HoldByID(ctx, keys.MustID(h.HoldID))
			return err == nil && got.State == ledger.Expired && !wrapped.fail.Load()
		})
		if st := b.State(t, sku); st.RedisRemaining != 0 {
			t.Fatalf("before the late payment: %+v, want the units still out of Redis", st)
		}
		r := b.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c1", "ann")
		if r.Status != http.StatusCreated || systest.OrderID(r) == "" {
			t.Fatalf("a late confirm of a swept hold whose units were not back in Redis = %d %s, want 201", r.Status, r.Body)
		}
		if st := b.State(t, sku); st.Sold != 2 || st.Held != 0 || st.Orders != 1 || st.RedisRemaining != 0 {
			t.Fatalf("after the late payment: %+v, want 2 sold once and Redis at 0", st)
		}
	})
}

// A late payment refused at the buyer's cap is final, as one refused for
// units sold is: once the buyer's count comes back (a refund of another
// order), neither its retry nor a payment under another key sells.
func TestLatePaymentRefusedAtTheCapStaysRefused(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		late := func(o *app.Options) { o.Sale.LatePayment = time.Minute; o.Sale.SweepEvery = 20 * time.Millisecond }
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: late})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: late})
		sku := systest.NewSKU(t)
		a.PutCapped(t, sku, 1, 2)
		_, h := a.Hold(t, sku, "h1", "ann", 2, 1)
		systest.WaitFor(t, 10*time.Second, "the hold's expiry to pass", func() bool { return time.Now().After(h.ExpiresAt) })
		// The buyer buys 2 more once the expired hold's count is back:
		// at the cap of 2, the late payment of the hold's 2 is over it.
		systest.WaitFor(t, 10*time.Second, "the expired hold's count given back", func() bool {
			return a.Buy(t, sku, "own", "ann", 2).Status == http.StatusCreated
		})
		own := a.Buy(t, sku, "own", "ann", 2)
		if r := b.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c1", "ann"); r.Status != http.StatusConflict || systest.ProblemKind(r) != "late-payment-refused" {
			t.Fatalf("a late payment over the buyer's cap = %d %s, want 409 late-payment-refused", r.Status, r.Body)
		}
		if r := a.Act(t, "/v1/orders/"+systest.OrderID(own)+"/refund", "r1", "ann"); r.Status != http.StatusOK {
			t.Fatalf("the refund of the other order = %d %s", r.Status, r.Body)
		}
		for _, e := range []*systest.Env{a, b} {
			for _, key := range []string{"c1", "c2"} {
				if r := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", key, "ann"); r.Status != http.StatusConflict || systest.ProblemKind(r) != "late-payment-refused" {
					t.Fatalf("a late payment (key %s) after the refusal, the cap free again = %d %s, want the refusal again", key, r.Status, r.Body)
				}
			}
		}
		if st := a.State(t, sku); st.Sold != 0 || st.Held != 0 {
			t.Fatalf("after the refused late payment's retries: %+v, want nothing sold or held", st)
		}
	})
}

package holds_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
)

// failAnswerWith is a ledger whose next AnswerWith fails once, as a
// ledger error at that moment would.
type failAnswerWith struct {
	sale.Ledger
	fail atomic.Bool
}

func (l *failAnswerWith) AnswerWith(ctx context.Context, req ledger.Request, o ledger.Order) (ledger.Order, error) {
	if l.fail.CompareAndSwap(true, false) {
		return ledger.Order{}, errors.New("injected: the ledger failed recording the client's key")
	}
	return l.Ledger.AnswerWith(ctx, req, o)
}

// A late payment whose order committed but whose client key could not be
// recorded is not answered 201: the key would then answer 410 once the
// window closed, and take another request. It answers 503 (outcome
// unknown), and its retry under the same key gets the order, replayed,
// with the key recorded: past the window the key still answers the order,
// and another request under it is 422. A first retry that comes only
// after the window closed gets the order too (it was answered 410,
// "nothing was sold", while the order stood).
func TestLatePaymentKeyUnrecordedIsNotAnswered201(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		wrapped := &failAnswerWith{}
		e := systest.Start(t, systest.Options{Driver: driver, Tune: func(o *app.Options) {
			o.Sale.LatePayment = 3 * time.Second
			o.WrapLedger = func(l sale.Ledger) sale.Ledger { wrapped.Ledger = l; return wrapped }
		}})
		for i, retry := range []string{"in the window", "after the window"} {
			t.Run(retry, func(t *testing.T) {
				pay1, pay2 := fmt.Sprintf("pay-%d-1", i), fmt.Sprintf("pay-%d-2", i)
				sku := systest.NewSKU(t)
				e.PutSKU(t, sku, 10, 1, 4)
				_, h := e.Hold(t, sku, fmt.Sprintf("h%d", i), "cat", 2, 1)
				systest.WaitFor(t, 10*time.Second, "the hold's expiry to pass", func() bool { return time.Now().After(h.ExpiresAt) })
				wrapped.fail.Store(true)
				if r := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", pay1, "cat"); r.Status != http.StatusServiceUnavailable ||
					!bytes.Contains(r.Body, []byte(`"outcome":"unknown"`)) {
					t.Fatalf("a late payment whose key was not recorded = %d %s, want 503 with outcome unknown", r.Status, r.Body)
				}
				windowClosed := func() bool { return time.Now().After(h.ExpiresAt.Add(3*time.Second + 100*time.Millisecond)) }
				if retry == "after the window" {
					systest.WaitFor(t, 10*time.Second, "the late-payment window to close", windowClosed)
				}
				r := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", pay1, "cat")
				if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("its retry %s = %d %s (replayed %q), want 201 replayed", retry, r.Status, r.Body, r.Header.Get("Idempotent-Replayed"))
				}
				order := systest.OrderID(r)
				systest.WaitFor(t, 10*time.Second, "the late-payment window to close", windowClosed)
				if r := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", pay1, "cat"); r.Status != http.StatusCreated || systest.OrderID(r) != order {
					t.Errorf("the retry after the window = %d %s, want 201 with order %s", r.Status, r.Body, order)
				}
				if r := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", pay2, "cat"); r.Status != http.StatusCreated || systest.OrderID(r) != order {
					t.Errorf("a confirm under another key after the window = %d %s, want 201 with order %s", r.Status, r.Body, order)
				}
				if r := e.Buy(t, sku, pay1, "cat", 1); r.Status != http.StatusUnprocessableEntity {
					t.Errorf("a purchase under the late payment's key = %d %s, want 422", r.Status, r.Body)
				}
				if st := e.State(t, sku); st.Orders != 1 || st.Sold != 2 {
					t.Errorf("after the late payment and its retries: %+v, want one order of 2", st)
				}
			})
		}
	})
}

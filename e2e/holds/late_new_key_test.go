package holds_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
)

// A late payment sent again under a new key, after its order moved on,
// answers the order as it is now, not as the first payment answered it
// (helper-34: the row under the hold's derived key was replayed, and the
// new key recorded it: ann's order of 2 as hers and standing, after she
// had transferred it to bob). A confirm of a confirmed hold answers so.
func TestLatePaymentUnderANewKeyAnswersTheOrderNow(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.Start(t, systest.Options{Driver: driver, Tune: func(o *app.Options) { o.Sale.LatePayment = time.Minute }})
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 10, 1, 4)
		_, h := e.Hold(t, sku, "h1", "ann", 2, 1)
		systest.WaitFor(t, 10*time.Second, "the hold's expiry to pass", func() bool { return time.Now().After(h.ExpiresAt) })
		r := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "k1", "ann")
		if r.Status != http.StatusCreated {
			t.Fatalf("the late payment = %d %s", r.Status, r.Body)
		}
		order := systest.OrderID(r)
		if r := e.Do(t, http.MethodPost, "/v1/orders/"+order+"/transfer", map[string]string{"Idempotency-Key": "x1"},
			`{"buyer":"ann","to":"bob"}`); r.Status != http.StatusOK {
			t.Fatalf("transfer = %d %s", r.Status, r.Body)
		}
		for _, key := range []string{"k2", "k2"} { // the new key, then its replay
			r := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", key, "ann")
			var o struct {
				OrderID string `json:"order_id"`
				Buyer   string `json:"buyer"`
			}
			if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &o) != nil || o.OrderID != order || o.Buyer != "bob" {
				t.Errorf("the late payment under %s after the transfer = %d %s, want 201 with order %s as bob's now", key, r.Status, r.Body, order)
			}
		}
	})
}

package holds_test

// Found by TestModelConcurrent (e2e/model/concurrent_test.go).

import (
	"net/http"
	"testing"

	"github.com/stockgate/stockgate/e2e/systest"
)

// A confirm under a new key of a hold already confirmed is answered by
// what the hold was confirmed as, not by what its order holds now: Bob's
// hold of 4 is confirmed whole (an order of 4), then he transfers 1 of
// them to Cat (the order now stands with 3). A platform confirming again
// under a new key "quantity 4" (a retry with a fresh key) must get the
// hold's order (201), and one asking "quantity 3" must get 409
// hold-confirmed: the hold was paid as 4, never as 3. The answers must not
// move when the order's tickets later move (a transfer, a resale).
func TestConfirmAgainAfterItsOrderMoved(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 10, 1, 4)
		_, h := a.Hold(t, sku, "h1", "bob", 4, 300)
		r, q := confirmPart(t, a, h.HoldID, "c1", "bob", 4)
		if r.Status != http.StatusCreated || q != 4 {
			t.Fatalf("confirm of 4 = %d %s", r.Status, r.Body)
		}
		order := systest.OrderID(r)
		if r := b.Do(t, http.MethodPost, "/v1/orders/"+order+"/transfer", map[string]string{"Idempotency-Key": "x1"},
			`{"buyer":"bob","to":"cat","quantity":1}`); r.Status != http.StatusOK {
			t.Fatalf("transfer of 1 = %d %s", r.Status, r.Body)
		}
		if r, _ := confirmPart(t, b, h.HoldID, "c2", "bob", 4); r.Status != http.StatusCreated || systest.OrderID(r) != order {
			t.Errorf("a confirm of 4 under a new key of the hold confirmed as 4 = %d %s, want 201 with order %s", r.Status, r.Body, order)
		}
		if r, _ := confirmPart(t, a, h.HoldID, "c3", "bob", 3); r.Status != http.StatusConflict || systest.ProblemKind(r) != "hold-confirmed" {
			t.Errorf("a confirm of 3 under a new key of the hold confirmed as 4 = %d %s, want 409 hold-confirmed", r.Status, r.Body)
		}
	})
}

package security_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
)

// What a hostile probe of a running gateway found answered wrongly behind
// the door (helper-35): an unknown SKU's seat map and seat check were an
// empty 200 where its stock is 404; a hold TTL past its bound was told as
// "-1ns"; a cart line's order refused a transfer with a hold's words.
func TestAnswersNameWhatWasSent(t *testing.T) {
	e := systest.New(t, ledger.SQLite)
	sku := systest.NewSKU(t)
	if r := e.Do(t, http.MethodGet, "/v1/skus/"+sku.Program.String()+"/nope/seats", nil, ""); r.Status != http.StatusNotFound ||
		systest.ProblemKind(r) != "unknown-sku" {
		t.Errorf("seats of an unknown SKU = %d %s, want 404 unknown-sku", r.Status, r.Body)
	}
	if r := e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/seats/check", nil, ""); r.Status != http.StatusNotFound ||
		systest.ProblemKind(r) != "unknown-sku" {
		t.Errorf("seat check of an unknown SKU = %d %s, want 404 unknown-sku", r.Status, r.Body)
	}
	r := e.Do(t, http.MethodPut, systest.AdminPath(sku), nil, `{"total":10,"shards":1,"max_per_order":4,"hold_ttl_max_seconds":86401}`)
	if r.Status != http.StatusUnprocessableEntity || !strings.Contains(string(r.Body), "hold_ttl_max_seconds") || !strings.Contains(string(r.Body), "86401") {
		t.Errorf("hold_ttl_max_seconds 86401 = %d %s, want 422 naming the field and the value", r.Status, r.Body)
	}
	e.PutSKU(t, sku, 10, 1, 4)
	// A seated SKU's known empty section is still a 200.
	if r := e.Do(t, http.MethodGet, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/seats", nil, ""); r.Status != http.StatusOK {
		t.Errorf("seats of a known SKU without a map = %d %s, want 200", r.Status, r.Body)
	}
	cart := e.Do(t, http.MethodPost, "/v1/programs/"+sku.Program.String()+"/carts", map[string]string{"Idempotency-Key": "c1"},
		`{"buyer":"ann","lines":[{"ticket":"`+sku.Ticket.String()+`","quantity":2}]}`)
	if cart.Status != http.StatusCreated {
		t.Fatalf("cart = %d %s", cart.Status, cart.Body)
	}
	var c struct {
		Orders []struct {
			OrderID string `json:"order_id"`
		} `json:"orders"`
	}
	if err := json.Unmarshal(cart.Body, &c); err != nil || len(c.Orders) != 1 {
		t.Fatalf("cart orders: %s", cart.Body)
	}
	r = e.Do(t, http.MethodPost, "/v1/orders/"+c.Orders[0].OrderID+"/transfer", map[string]string{"Idempotency-Key": "x1"}, `{"buyer":"ann","to":"bob"}`)
	if r.Status != http.StatusConflict || systest.ProblemKind(r) != "in-cart" || !strings.Contains(string(r.Body), "order is a line of a cart") {
		t.Errorf("transfer of a cart line = %d %s, want 409 in-cart about the order", r.Status, r.Body)
	}
}

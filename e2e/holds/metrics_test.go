package holds_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stockgate/stockgate/e2e/systest"
)

// What moves after the first click is counted: units released by a
// partial confirm, holds extended, units transferred, units listed for
// resale; a retry counts nothing more.
func TestAfterSaleMetrics(t *testing.T) {
	e := systest.New(t, "sqlite")
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 20, 1, 10)
	count := func(name string, labels map[string]string) float64 {
		return systest.Counter(t, e.Registry, name, labels)
	}
	_, h := e.Hold(t, sku, "h1", "ann", 3, 0)
	partial := func() systest.Reply {
		return e.Do(t, http.MethodPost, "/v1/holds/"+h.HoldID+"/confirm", map[string]string{"Idempotency-Key": "c1"}, `{"buyer":"ann","quantity":1}`)
	}
	if r := partial(); r.Status != http.StatusCreated {
		t.Fatalf("partial confirm = %d %s", r.Status, r.Body)
	}
	partial()
	_, h2 := e.Hold(t, sku, "h2", "bob", 1, 0)
	if r := e.Act(t, "/v1/holds/"+h2.HoldID+"/extend", "x1", "bob"); r.Status != http.StatusOK {
		t.Fatalf("extend = %d %s", r.Status, r.Body)
	}
	order := systest.OrderID(e.MustBuy(t, sku, "p1", "cat", 4))
	move := func(key string) systest.Reply {
		return e.Do(t, http.MethodPost, "/v1/orders/"+order+"/transfer", map[string]string{"Idempotency-Key": key}, `{"buyer":"cat","to":"dan","quantity":1}`)
	}
	if r := move("t1"); r.Status != http.StatusOK {
		t.Fatalf("transfer = %d %s", r.Status, r.Body)
	}
	move("t1")
	if r := e.Do(t, http.MethodPost, "/v1/orders/"+order+"/resale", map[string]string{"Idempotency-Key": "l1"}, `{"buyer":"cat","quantity":2}`); r.Status != http.StatusCreated {
		t.Fatalf("list = %d %s", r.Status, r.Body)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"stockgate_after_sale_units_total", map[string]string{"what": "released"}, 2},
		{"stockgate_after_sale_units_total", map[string]string{"what": "transferred"}, 1},
		{"stockgate_holds_extended_total", nil, 1},
		{"stockgate_resale_units_total", map[string]string{"what": "listed"}, 2},
	} {
		if got := count(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, fmt.Sprint(c.labels), got, c.want)
		}
	}
}

package holds_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stockgate/stockgate/e2e/systest"
)

// The organizer's comps and box-office sales are orders of the SKU's
// stock, once per key on any replica, refused like a purchase when the
// stock is not there, and counted apart in the report (standing ones:
// a refunded comp leaves the column); bad channels are 422 and move
// nothing.
func TestOrganizerOrders(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 10, 2, 10)
		path := systest.AdminPath(sku) + "/orders"
		give := func(e *systest.Env, key, body string) systest.Reply {
			return e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": key}, body)
		}
		comp := give(a, "c1", `{"buyer":"press","quantity":2,"channel":"comp"}`)
		if comp.Status != http.StatusCreated {
			t.Fatalf("comp = %d %s", comp.Status, comp.Body)
		}
		if r := give(b, "c1", `{"buyer":"press","quantity":2,"channel":"comp"}`); r.Status != http.StatusCreated || systest.OrderID(r) != systest.OrderID(comp) {
			t.Errorf("the comp's retry on the other replica = %d %s", r.Status, r.Body)
		}
		if r := give(b, "c1", `{"buyer":"press","quantity":2,"channel":"box_office"}`); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("the comp's key for a box-office order = %d %s, want 422", r.Status, r.Body)
		}
		if r := give(a, "bo1", `{"buyer":"walkin","quantity":3,"channel":"box_office"}`); r.Status != http.StatusCreated {
			t.Fatalf("box office = %d %s", r.Status, r.Body)
		}
		comp2 := give(b, "c2", `{"buyer":"crew","quantity":1,"channel":"comp"}`)
		if comp2.Status != http.StatusCreated {
			t.Fatalf("second comp = %d %s", comp2.Status, comp2.Body)
		}
		a.MustBuy(t, sku, "p1", "ann", 4)
		if r := give(a, "bo2", `{"buyer":"walkin","quantity":1,"channel":"box_office"}`); r.Status != http.StatusConflict || systest.ProblemKind(r) != "sold-out" {
			t.Errorf("a box-office sale of a sold-out SKU = %d %s, want 409 sold-out", r.Status, r.Body)
		}
		for _, body := range []string{`{"buyer":"x","quantity":1}`, `{"buyer":"x","quantity":1,"channel":"online"}`, `{"buyer":"x","quantity":0,"channel":"comp"}`} {
			if r := give(a, "bad", body); r.Status != http.StatusUnprocessableEntity {
				t.Errorf("%s = %d %s, want 422", body, r.Status, r.Body)
			}
		}
		if r := a.Act(t, "/v1/orders/"+systest.OrderID(comp2)+"/refund", "rc2", "crew"); r.Status != http.StatusOK {
			t.Fatalf("refund of a comp = %d %s", r.Status, r.Body)
		}
		r := b.Do(t, http.MethodGet, "/v1/admin/programs/"+sku.Program.String()+"/report", nil, "")
		var rep struct {
			Balanced bool `json:"balanced"`
			SKUs     []struct {
				Sold      int64 `json:"sold"`
				Purchased int64 `json:"purchased_units"`
				Comps     int64 `json:"comp_units"`
				BoxOffice int64 `json:"box_office_units"`
			} `json:"skus"`
		}
		if err := json.Unmarshal(r.Body, &rep); err != nil || len(rep.SKUs) != 1 {
			t.Fatalf("report %s: %v", r.Body, err)
		}
		if l := rep.SKUs[0]; !rep.Balanced || l.Sold != 9 || l.Purchased != 9 || l.Comps != 2 || l.BoxOffice != 3 {
			t.Errorf("report %s: want balanced, 9 sold and purchased, of them 2 comps and 3 box office", r.Body)
		}
	})
}

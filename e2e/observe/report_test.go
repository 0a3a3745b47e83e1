package observe_test

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// reportLine is what the test reads of a report's line.
type reportLine struct {
	Ticket                          string
	Total, Sold, Held, Open, Orders int64
	OrderUnits                      int64 `json:"order_units"`
	PurchasedUnits                  int64 `json:"purchased_units"`
	ConfirmedUnits                  int64 `json:"confirmed_units"`
	CartUnits                       int64 `json:"cart_units"`
	Refunds                         int64
	RefundedUnits                   int64  `json:"refunded_units"`
	HeldUnits                       int64  `json:"held_units"`
	CancelledUnits                  int64  `json:"cancelled_units"`
	Balanced                        bool   `json:"balanced"`
	GateRemaining                   *int64 `json:"gate_remaining"`
	GateDifference                  int64  `json:"gate_difference"`
}

// A program's reconciliation report, on either replica and either ledger,
// adds every sale up by how it was made (purchases, confirmed holds, cart
// lines), beside refunds, live and cancelled holds, and Redis's count; as
// JSON and as the same CSV. Reading it moves nothing; a bad format is
// refused.
func TestReconciliationReport(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		ga := systest.NewSKU(t)
		vip := stock.SKU{Program: ga.Program, Ticket: keys.MustID("vip")}
		a.PutSKU(t, ga, 20, 2, 4)
		a.PutSKU(t, vip, 5, 1, 4)
		a.MustBuy(t, ga, "p1", "ann", 2)
		r := b.MustBuy(t, ga, "p2", "bob", 1)
		if r := a.Act(t, "/v1/orders/"+systest.OrderID(r)+"/refund", "r1", "bob"); r.Status != http.StatusOK {
			t.Fatalf("refund = %d %s", r.Status, r.Body)
		}
		_, h := a.Hold(t, ga, "h1", "cat", 3, 0)
		if r := b.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c1", "cat"); r.Status != http.StatusCreated {
			t.Fatalf("confirm = %d %s", r.Status, r.Body)
		}
		_, h = a.Hold(t, ga, "h2", "dan", 1, 0)
		if r := a.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "k1", "dan"); r.Status != http.StatusOK {
			t.Fatalf("cancel = %d %s", r.Status, r.Body)
		}
		a.Hold(t, ga, "h3", "eve", 4, 0)
		if r := b.Do(t, http.MethodPost, "/v1/programs/"+ga.Program.String()+"/carts", map[string]string{"Idempotency-Key": "cart1"},
			fmt.Sprintf(`{"buyer":"fay","lines":[{"ticket":%q,"quantity":1},{"ticket":"vip","quantity":2}]}`, ga.Ticket)); r.Status != http.StatusCreated {
			t.Fatalf("cart = %d %s", r.Status, r.Body)
		}
		want := map[string]reportLine{
			ga.Ticket.String(): {Total: 20, Sold: 6, Held: 4, Open: 10, Orders: 3, OrderUnits: 6, PurchasedUnits: 2, ConfirmedUnits: 3,
				CartUnits: 1, Refunds: 1, RefundedUnits: 1, HeldUnits: 4, CancelledUnits: 1, Balanced: true},
			"vip": {Total: 5, Sold: 2, Open: 3, Orders: 1, OrderUnits: 2, CartUnits: 2, Balanced: true},
		}
		for _, e := range []*systest.Env{a, b} {
			r := e.Do(t, http.MethodGet, "/v1/admin/programs/"+ga.Program.String()+"/report", nil, "")
			var got struct {
				Balanced bool
				SKUs     []reportLine
			}
			if err := json.Unmarshal(r.Body, &got); r.Status != http.StatusOK || err != nil || !got.Balanced || len(got.SKUs) != 2 {
				t.Fatalf("report = %d %s (%v)", r.Status, r.Body, err)
			}
			for _, l := range got.SKUs {
				w := want[l.Ticket]
				w.Ticket, w.GateRemaining = l.Ticket, l.GateRemaining
				if l != w || l.GateRemaining == nil || *l.GateRemaining != l.Open || l.GateDifference != 0 {
					t.Errorf("line %+v, want %+v with the gate's count equal to open", l, w)
				}
			}
			// The CSV: a header of the JSON's names, the same numbers.
			for _, how := range []map[string]string{nil, {"Accept": "text/csv"}} {
				path := "/v1/admin/programs/" + ga.Program.String() + "/report"
				if how == nil {
					path += "?format=csv"
				}
				r = e.Do(t, http.MethodGet, path, how, "")
				rows, err := csv.NewReader(strings.NewReader(string(r.Body))).ReadAll()
				if r.Status != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/csv") || err != nil || len(rows) != 3 {
					t.Fatalf("CSV report = %d %q %s (%v)", r.Status, r.Header.Get("Content-Type"), r.Body, err)
				}
				col := map[string]int{}
				for i, name := range rows[0] {
					col[name] = i
				}
				for _, row := range rows[1:] {
					w := want[row[col["ticket"]]]
					if row[col["sold"]] != fmt.Sprint(w.Sold) || row[col["open"]] != fmt.Sprint(w.Open) ||
						row[col["cart_units"]] != fmt.Sprint(w.CartUnits) || row[col["balanced"]] != "true" ||
						row[col["gate_remaining"]] != fmt.Sprint(w.Open) {
						t.Errorf("CSV row %v (columns %v), want %+v", row, rows[0], w)
					}
				}
			}
		}
		for _, q := range []string{"format=xml", "format=csv&format=xml", "format="} {
			if r := a.Do(t, http.MethodGet, "/v1/admin/programs/"+ga.Program.String()+"/report?"+q, nil, ""); r.Status != http.StatusUnprocessableEntity {
				t.Errorf("%s = %d %s, want 422", q, r.Status, r.Body)
			}
		}
		if r := a.Do(t, http.MethodGet, "/v1/admin/programs/no-such-program/report", nil, ""); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"skus":[]`) {
			t.Errorf("a program without SKUs = %d %s, want an empty report", r.Status, r.Body)
		}
		if st := a.State(t, ga); st.Sold != 6 || st.Held != 4 || st.RedisRemaining != 10 {
			t.Errorf("after the reports: %+v", st)
		}
	})
}

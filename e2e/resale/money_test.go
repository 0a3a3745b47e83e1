package resale_test

// Each unit's money told once (issue 39): a resold unit is never also a
// refund, an order's answer says where its units went, and the report
// adds up per SKU while listings live.

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// orderBody is GET /v1/orders/{id} as a platform reads it.
type orderBody struct {
	Quantity   int64      `json:"quantity"`
	State      string     `json:"state"`
	RefundedAt *time.Time `json:"refunded_at"`
	ResoldAt   *time.Time `json:"resold_at"`
	Units      struct {
		Began, Standing, Listed, Resold, Refunded, Transferred int64
	} `json:"units"`
}

func getOrder(t *testing.T, e *systest.Env, id string) orderBody {
	t.Helper()
	r := e.Do(t, http.MethodGet, "/v1/orders/"+id, nil, "")
	if r.Status != http.StatusOK {
		t.Fatalf("get order = %d %s", r.Status, r.Body)
	}
	var o orderBody
	if err := json.Unmarshal(r.Body, &o); err != nil {
		t.Fatal(err)
	}
	u := o.Units
	if u.Began != u.Standing+u.Resold+u.Refunded+u.Transferred || u.Listed > u.Standing {
		t.Errorf("order %s: units do not add up: %s", id, r.Body)
	}
	return o
}

// skuLine is one SKU's line of the program report.
type skuLine struct {
	Total, Sold, Held, Open int64
	Refunds                 int64 `json:"refunds"`
	RefundedUnits           int64 `json:"refunded_units"`
	ListedUnits             int64 `json:"listed_units"`
	ResoldUnits             int64 `json:"resold_units"`
	OrderUnits              int64 `json:"order_units"`
	Balanced                bool
}

func reportLine(t *testing.T, e *systest.Env, sku stock.SKU) skuLine {
	t.Helper()
	r := e.Do(t, http.MethodGet, "/v1/admin/programs/"+sku.Program.String()+"/report", nil, "")
	var rep struct {
		Balanced bool
		SKUs     []skuLine `json:"skus"`
	}
	if err := json.Unmarshal(r.Body, &rep); err != nil || len(rep.SKUs) != 1 {
		t.Fatalf("report %d %s: %v", r.Status, r.Body, err)
	}
	l := rep.SKUs[0]
	if l.Sold+l.Held+l.Open != l.Total || !l.Balanced || !rep.Balanced {
		t.Errorf("report does not add up (sold + held + open = total): %s", r.Body)
	}
	return l
}

// Break 1 of issue 39: Ann buys 4 and lists all 4; four buyers take
// them. Her order is resold (no refunded_at), the report counts no refund,
// a refund or a transfer is 409 order-resold, and the events tell her
// money once: 4 units of listing.sold, no order.refunded.
// Break 5: while 2 of 5 are listed, the report's sold is 3 and open 2.
func TestMoneyToldOnceWholeResale(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 5, 1, 5)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 4))
		a.MustBuy(t, sku, "p0", "zed", 1)
		// Break 5: 5 sold, 2 of them listed.
		x := mustList(t, a, ann, "l1", "ann", 2)
		if l := reportLine(t, b, sku); l.Total != 5 || l.Sold != 3 || l.Open != 2 || l.ListedUnits != 2 || l.OrderUnits != 5 {
			t.Errorf("report with 2 listed: %+v, want total 5, sold 3, open 2, listed 2, order units 5", l)
		}
		if o := getOrder(t, b, ann); o.State != "standing" || o.Units.Standing != 4 || o.Units.Listed != 2 {
			t.Errorf("the listed order: %+v", o)
		}
		y := mustList(t, b, ann, "l2", "ann", 2)
		systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, sku).RedisRemaining == 4 })
		for i, buyer := range []string{"bob", "cat", "dan", "eve"} {
			e := []*systest.Env{a, b}[i%2]
			e.MustBuy(t, sku, "r"+buyer, buyer, 1)
		}
		systest.WaitFor(t, 15*time.Second, "both listings settled", func() bool {
			return getListing(t, a, x.ListingID).State == "sold" && getListing(t, a, y.ListingID).State == "sold"
		})
		o := getOrder(t, b, ann)
		if o.State != "resold" || o.RefundedAt != nil || o.ResoldAt == nil || o.Units.Began != 4 || o.Units.Resold != 4 || o.Units.Refunded != 0 {
			t.Errorf("ann's order, resold whole: %+v", o)
		}
		for i, e := range []*systest.Env{a, b} {
			key := []string{"rf1", "rf2"}[i]
			if r := e.Act(t, "/v1/orders/"+ann+"/refund", key, "ann"); r.Status != http.StatusConflict || systest.ProblemKind(r) != "order-resold" {
				t.Errorf("refund of the resold order = %d %s, want 409 order-resold", r.Status, r.Body)
			}
		}
		if r := b.Do(t, http.MethodPost, "/v1/orders/"+ann+"/transfer", map[string]string{"Idempotency-Key": "t1"},
			`{"buyer":"ann","to":"fay"}`); r.Status != http.StatusConflict || systest.ProblemKind(r) != "order-resold" {
			t.Errorf("transfer of the resold order = %d %s, want 409 order-resold", r.Status, r.Body)
		}
		if l := reportLine(t, a, sku); l.Refunds != 0 || l.RefundedUnits != 0 || l.ResoldUnits != 4 || l.Total != 5 || l.Sold != 5 || l.Open != 0 {
			t.Errorf("report after the resale: %+v, want no refund, 4 resold, 5 sold of 5", l)
		}
		// The events: per order, the refunds told (listing.sold and
		// order.refunded) never pass what was sold.
		checkMoney(t, a, sku)
	})
}

// checkMoney applies docs/API.md's reconciliation rule to the events of
// sku: each order's units refunded to its payer (listing.sold of its
// listings, order.refunded of it or of orders split from it by transfers)
// never pass what it was sold, and an order given up by resale has no
// order.refunded.
func checkMoney(t *testing.T, e *systest.Env, sku stock.SKU) {
	t.Helper()
	evs, err := e.Ledger.Events(context.Background(), sku.Program, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	sold, back := map[string]int64{}, map[string]int64{}
	root := map[string]string{} // an order split off by a transfer: the order it came from
	rootOf := func(id string) string {
		for root[id] != "" {
			id = root[id]
		}
		return id
	}
	for _, ev := range evs {
		if ev.SKU != sku {
			continue
		}
		switch ev.Type {
		case ledger.EventOrderCreated:
			sold[ev.Subject.String()] += ev.Quantity
		case ledger.EventHoldConfirmed:
			sold[ev.Order.String()] += ev.Quantity
		case ledger.EventOrderTransferred:
			if ev.Order != ev.Subject {
				root[ev.Order.String()] = ev.Subject.String()
			}
		case ledger.EventListingSold:
			back[rootOf(ev.Order.String())] += ev.Quantity
		case ledger.EventOrderRefunded:
			back[rootOf(ev.Subject.String())] += ev.Quantity
		}
	}
	for id, n := range back {
		if n > sold[id] {
			t.Errorf("order %s: %d units refunded by the events, %d sold", id, n, sold[id])
		}
	}
}

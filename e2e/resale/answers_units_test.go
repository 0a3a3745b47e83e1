package resale_test

// Answers that tell where an order's units went, where resale, transfers,
// confirms and comps meet (helper-34). Each was shown failing first.

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/e2e/systest"
)

// A confirm under a new key of a hold whose order was resold whole since
// answers the order resold, not refunded (its answer was built from the
// bare order row: refunded_at set, units began 4 = refunded 4); and a
// listing's request sent again answers what it answered first (listed,
// nothing sold), not the listing as it is now.
func TestConfirmAgainAfterResaleAndListingReplay(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 4, 1, 4)
		_, h := a.Hold(t, sku, "h1", "ann", 4, 120)
		r := a.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c1", "ann")
		if r.Status != http.StatusCreated {
			t.Fatalf("confirm = %d %s", r.Status, r.Body)
		}
		ann := systest.OrderID(r)
		x := mustList(t, a, ann, "l1", "ann", 4)
		systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, sku).RedisRemaining == 4 })
		for i, buyer := range []string{"bob", "cat", "dan", "eve"} {
			[]*systest.Env{a, b}[i%2].MustBuy(t, sku, "r"+buyer, buyer, 1)
		}
		systest.WaitFor(t, 15*time.Second, "the listing settled", func() bool { return getListing(t, a, x.ListingID).State == "sold" })

		r = b.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c2", "ann")
		var o orderBody
		if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &o) != nil || o.State != "resold" || o.RefundedAt != nil ||
			o.Units.Resold != 4 || o.Units.Refunded != 0 || o.Units.Began != 4 {
			t.Errorf("confirm under a new key of the resold order's hold = %d %s, want 201 with the order resold, no refund", r.Status, r.Body)
		}
		// Sent again (its client timed out), on either replica: the same
		// answer, not "refunded" from a snapshot without the units
		// (helper-38).
		for _, e := range []*systest.Env{a, b} {
			again := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c2", "ann")
			var o2 orderBody
			if again.Status != http.StatusCreated || json.Unmarshal(again.Body, &o2) != nil || o2.State != o.State || o2.Units != o.Units ||
				o2.RefundedAt != nil {
				t.Errorf("the confirm under c2 again = %d %s, want its first answer %s", again.Status, again.Body, r.Body)
			}
		}
		for _, e := range []*systest.Env{a, b} {
			r := list(t, e, ann, "l1", "ann", 4)
			if y := listingOf(t, r); r.Status != http.StatusCreated || y.ListingID != x.ListingID || y.State != "listed" || y.Sold != 0 {
				t.Errorf("the listing's request again = %d %s, want its first answer (listed, sold 0)", r.Status, r.Body)
			}
		}
	})
}

// An order with 2 of its 4 tickets resold: a transfer or a listing of 4
// is 409 order-resold naming the 2 (it was 422 "more than the order has",
// which names no state), and a whole transfer answers the order's units
// with the 2 resold in began.
func TestPartlyResoldOrderTellsItsResoldUnits(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 4, 1, 4)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 4))
		x := mustList(t, a, ann, "l1", "ann", 2)
		systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, sku).RedisRemaining == 2 })
		a.MustBuy(t, sku, "rbob", "bob", 1)
		b.MustBuy(t, sku, "rcat", "cat", 1)
		systest.WaitFor(t, 15*time.Second, "the listing settled", func() bool { return getListing(t, a, x.ListingID).State == "sold" })
		if r := b.Do(t, http.MethodPost, "/v1/orders/"+ann+"/transfer", map[string]string{"Idempotency-Key": "t4"},
			`{"buyer":"ann","to":"fay","quantity":4}`); r.Status != http.StatusConflict || systest.ProblemKind(r) != "order-resold" {
			t.Errorf("transfer of 4 with 2 resold = %d %s, want 409 order-resold", r.Status, r.Body)
		}
		if r := list(t, a, ann, "l4", "ann", 4); r.Status != http.StatusConflict || systest.ProblemKind(r) != "order-resold" {
			t.Errorf("listing of 4 with 2 resold = %d %s, want 409 order-resold", r.Status, r.Body)
		}
		if r := list(t, a, ann, "l5", "ann", 5); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("listing of 5 of an order of 4 = %d %s, want 422", r.Status, r.Body)
		}
		r := b.Do(t, http.MethodPost, "/v1/orders/"+ann+"/transfer", map[string]string{"Idempotency-Key": "t1"}, `{"buyer":"ann","to":"fay"}`)
		var o orderBody
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &o) != nil || o.Units.Began != 4 || o.Units.Resold != 2 || o.Units.Standing != 2 {
			t.Errorf("whole transfer = %d %s, want the units: began 4, resold 2, standing 2", r.Status, r.Body)
		}
		// Sent again: the same units (the replay said began 2, resold 0).
		again := a.Do(t, http.MethodPost, "/v1/orders/"+ann+"/transfer", map[string]string{"Idempotency-Key": "t1"}, `{"buyer":"ann","to":"fay"}`)
		var o2 orderBody
		if again.Status != http.StatusOK || json.Unmarshal(again.Body, &o2) != nil || o2.Units != o.Units {
			t.Errorf("the whole transfer again = %d %s, want its first answer %s", again.Status, again.Body, r.Body)
		}
		getOrder(t, a, ann) // adds up
	})
}

// A comp order split by a transfer stays comp in the report (the split
// was counted as a purchase), and the feed tells a comp's events by their
// channel, so a platform applying API.md's rule pays nothing back for
// tickets nobody paid for.
func TestCompSplitStaysCompAndSaysSo(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 10, 1, 4)
		r := e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/orders", map[string]string{"Idempotency-Key": "c1"},
			`{"buyer":"press","quantity":2,"channel":"comp"}`)
		if r.Status != http.StatusCreated {
			t.Fatalf("comp order = %d %s", r.Status, r.Body)
		}
		comp := systest.OrderID(r)
		e.MustBuy(t, sku, "p1", "ann", 1)
		if r := e.Do(t, http.MethodPost, "/v1/orders/"+comp+"/transfer", map[string]string{"Idempotency-Key": "x1"},
			`{"buyer":"press","to":"crew","quantity":1}`); r.Status != http.StatusOK {
			t.Fatalf("transfer of 1 = %d %s", r.Status, r.Body)
		}
		r = e.Do(t, http.MethodGet, "/v1/admin/programs/"+sku.Program.String()+"/report", nil, "")
		var rep struct {
			SKUs []struct {
				CompUnits      int64 `json:"comp_units"`
				PurchasedUnits int64 `json:"purchased_units"`
			} `json:"skus"`
		}
		if err := json.Unmarshal(r.Body, &rep); err != nil || len(rep.SKUs) != 1 || rep.SKUs[0].CompUnits != 2 || rep.SKUs[0].PurchasedUnits != 3 {
			t.Errorf("report after a comp's split = %s, want comp 2 (of 3 ordered without a hold)", r.Body)
		}
		r = e.Do(t, http.MethodGet, "/v1/admin/events?program="+sku.Program.String()+"&limit=100", nil, "")
		var feed struct {
			Events []struct {
				Type, Subject, Channel string
				OrderID                string `json:"order_id"`
			} `json:"events"`
		}
		if err := json.Unmarshal(r.Body, &feed); err != nil {
			t.Fatalf("events %d %s: %v", r.Status, r.Body, err)
		}
		seen := map[string]string{}
		for _, ev := range feed.Events {
			seen[ev.Type+" "+ev.Subject] = ev.Channel
		}
		for _, k := range []string{"order.created " + comp, "order.transferred " + comp} {
			if c, ok := seen[k]; !ok || c != "comp" {
				t.Errorf("event %s: channel %q (seen %v), want comp", k, c, ok)
			}
		}
		for k, c := range seen {
			if strings.HasPrefix(k, "order.created ") && k != "order.created "+comp && c != "" {
				t.Errorf("event %s: channel %q, want none for a purchase", k, c)
			}
		}
	})
}

package resale_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

type listing struct {
	ListingID string `json:"listing_id"`
	OrderID   string `json:"order_id"`
	Seller    string `json:"seller"`
	Quantity  int64  `json:"quantity"`
	Sold      int64  `json:"sold"`
	Withdrawn int64  `json:"withdrawn"`
	State     string `json:"state"`
}

func listingOf(t *testing.T, r systest.Reply) listing {
	t.Helper()
	var x listing
	if err := json.Unmarshal(r.Body, &x); err != nil {
		t.Fatalf("listing %s: %v", r.Body, err)
	}
	return x
}

func list(t *testing.T, e *systest.Env, order, key, buyer string, q int64) systest.Reply {
	return e.Do(t, http.MethodPost, "/v1/orders/"+order+"/resale", map[string]string{"Idempotency-Key": key},
		fmt.Sprintf(`{"buyer":%q,"quantity":%d}`, buyer, q))
}

// mustList lists q of order's tickets and returns the listing; any answer
// but 201 fails the test.
func mustList(t *testing.T, e *systest.Env, order, key, buyer string, q int64) listing {
	t.Helper()
	r := list(t, e, order, key, buyer, q)
	if r.Status != http.StatusCreated {
		t.Fatalf("list = %d %s", r.Status, r.Body)
	}
	return listingOf(t, r)
}

func getListing(t *testing.T, e *systest.Env, id string) listing {
	t.Helper()
	r := e.Do(t, http.MethodGet, "/v1/listings/"+id, nil, "")
	if r.Status != http.StatusOK {
		t.Fatalf("get listing = %d %s", r.Status, r.Body)
	}
	return listingOf(t, r)
}

func orderQuantity(t *testing.T, e *systest.Env, id string) int64 {
	t.Helper()
	o, err := e.Ledger.OrderByID(context.Background(), keysID(t, id))
	if err != nil {
		t.Fatal(err)
	}
	return o.Quantity
}

// start opens two replicas on one ledger; the first sweeps (and so
// settles resales) every 20 ms.
func start(t *testing.T, driver string) (a, b *systest.Env) {
	dsn := systest.LedgerDSN(t, driver)
	a = systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: func(o *app.Options) { o.Sale.SweepEvery = 20 * time.Millisecond }})
	b = systest.Start(t, systest.Options{Driver: driver, DSN: dsn})
	return a, b
}

// soldEvents adds up the listing.sold events of sku's program: what the
// platform refunds sellers by.
func soldEvents(t *testing.T, e *systest.Env, sku stock.SKU) (n int, units int64) {
	t.Helper()
	got, err := e.Ledger.Events(context.Background(), sku.Program, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range got {
		if ev.Type == ledger.EventListingSold && ev.SKU == sku {
			n++
			units += ev.Quantity
		}
	}
	return n, units
}

// A sold-out SKU sells a listed ticket to the next buyer: the listing is
// for sale at the gate at once, a retry on the other replica answers the
// same listing, the seller's listed tickets can be neither refunded nor
// moved, the sale settles (the seller's order gives the ticket up, one
// listing.sold event), a withdrawal takes the rest off sale once, and the
// report adds up with the resale and the transfer in it.
func TestResaleLifecycle(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 10, 2, 10)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 4))
		a.MustBuy(t, sku, "p2", "bob", 6)
		if r := a.Buy(t, sku, "p3", "cat", 1); r.Status != http.StatusConflict {
			t.Fatalf("a purchase of a sold-out SKU = %d %s", r.Status, r.Body)
		}
		x := mustList(t, a, ann, "l1", "ann", 2)
		if x.Quantity != 2 || x.State != "listed" || x.OrderID != ann || x.Seller != "ann" {
			t.Fatalf("listing %+v", x)
		}
		if r := list(t, b, ann, "l1", "ann", 2); r.Status != http.StatusCreated || listingOf(t, r).ListingID != x.ListingID {
			t.Errorf("the listing's retry on the other replica = %d %s, want the same listing", r.Status, r.Body)
		}
		systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, sku).RedisRemaining == 2 })
		// Listed tickets stay the seller's, but cannot be refunded or moved.
		if r := a.Act(t, "/v1/orders/"+ann+"/refund", "rf1", "ann"); r.Status != http.StatusConflict || systest.ProblemKind(r) != "order-listed" {
			t.Errorf("a refund of a listed order = %d %s, want 409 order-listed", r.Status, r.Body)
		}
		xfer := func(key string, q int64) systest.Reply {
			return b.Do(t, http.MethodPost, "/v1/orders/"+ann+"/transfer", map[string]string{"Idempotency-Key": key},
				fmt.Sprintf(`{"buyer":"ann","to":"dan","quantity":%d}`, q))
		}
		if r := xfer("x1", 3); r.Status != http.StatusConflict || systest.ProblemKind(r) != "order-listed" {
			t.Errorf("a transfer of listed tickets = %d %s, want 409 order-listed", r.Status, r.Body)
		}
		if r := xfer("x2", 1); r.Status != http.StatusOK {
			t.Fatalf("a transfer of an unlisted ticket = %d %s", r.Status, r.Body)
		}
		// The next buyer gets a listed ticket; the sale settles.
		a.MustBuy(t, sku, "p4", "cat", 1)
		systest.WaitFor(t, 15*time.Second, "the sale to settle", func() bool { return getListing(t, b, x.ListingID).Sold == 1 })
		if q := orderQuantity(t, a, ann); q != 2 {
			t.Errorf("the seller's order has %d after 1 of its 3 resold, want 2", q)
		}
		if n, units := soldEvents(t, a, sku); n != 1 || units != 1 {
			t.Errorf("%d listing.sold events of %d units, want 1 of 1", n, units)
		}
		// Withdrawn: the unsold ticket goes off sale, once.
		r := b.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w1", "ann")
		if r.Status != http.StatusOK || listingOf(t, r).State != "withdrawn" || listingOf(t, r).Withdrawn != 1 {
			t.Fatalf("withdraw = %d %s", r.Status, r.Body)
		}
		if r := a.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w1", "ann"); r.Status != http.StatusOK || listingOf(t, r).State != "withdrawn" {
			t.Errorf("the withdrawal's retry = %d %s", r.Status, r.Body)
		}
		if r := a.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w2", "ann"); r.Status != http.StatusConflict || systest.ProblemKind(r) != "listing-ended" {
			t.Errorf("a second withdrawal = %d %s, want 409 listing-ended", r.Status, r.Body)
		}
		systest.WaitFor(t, 10*time.Second, "the withdrawn unit off the gate", func() bool { return a.State(t, sku).RedisRemaining == 0 })
		if r := a.Buy(t, sku, "p5", "eve", 1); r.Status != http.StatusConflict {
			t.Errorf("a purchase after the withdrawal = %d %s, want sold out", r.Status, r.Body)
		}
		if r := a.Act(t, "/v1/orders/"+ann+"/refund", "rf2", "ann"); r.Status != http.StatusOK {
			t.Errorf("a refund after the withdrawal = %d %s", r.Status, r.Body)
		}
		rep := a.Do(t, http.MethodGet, "/v1/admin/programs/"+sku.Program.String()+"/report", nil, "")
		var report struct {
			Balanced bool `json:"balanced"`
			SKUs     []struct {
				Total, Sold, Open           int64
				Listed, Resold, Transferred int64 `json:"-"`
				ListedUnits                 int64 `json:"listed_units"`
				ResoldUnits                 int64 `json:"resold_units"`
				TransferredUnits            int64 `json:"transferred_units"`
			} `json:"skus"`
		}
		if err := json.Unmarshal(rep.Body, &report); err != nil || len(report.SKUs) != 1 {
			t.Fatalf("report %s: %v", rep.Body, err)
		}
		l := report.SKUs[0]
		if !report.Balanced || l.Total != 10 || l.Sold != 8 || l.Open != 2 || l.ListedUnits != 0 || l.ResoldUnits != 1 || l.TransferredUnits != 1 {
			t.Errorf("report %s: want balanced, total 10, sold 8 (bob 6, cat 1, dan 1), open 2 (ann's refund), 1 resold, 1 transferred", rep.Body)
		}
	})
}

func keysID(t *testing.T, s string) keys.ID {
	t.Helper()
	id, err := keys.ParseID(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// Bad resale requests get a clear 4xx and change nothing: no quantity,
// more than the order has unlisted, another buyer's order or listing, a
// refunded order, unknown ids, a bad resale mode.
func TestResaleBadInput(t *testing.T) {
	a, _ := start(t, "sqlite")
	sku := systest.NewSKU(t)
	a.PutSKU(t, sku, 10, 1, 10)
	order := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 3))
	refunded := systest.OrderID(a.MustBuy(t, sku, "p2", "ann", 1))
	if r := a.Act(t, "/v1/orders/"+refunded+"/refund", "rf", "ann"); r.Status != http.StatusOK {
		t.Fatalf("refund = %d %s", r.Status, r.Body)
	}
	for _, c := range []struct {
		path, body string
		status     int
		kind       string
	}{
		{"/v1/orders/" + order + "/resale", `{"buyer":"ann"}`, 422, "invalid-field"},
		{"/v1/orders/" + order + "/resale", `{"buyer":"ann","quantity":0}`, 422, "invalid-field"},
		{"/v1/orders/" + order + "/resale", `{"buyer":"ann","quantity":4}`, 422, "invalid-field"},
		{"/v1/orders/" + order + "/resale", `{"buyer":"ann","quantity":"1"}`, 422, ""},
		{"/v1/orders/" + order + "/resale", `{"buyer":"bob","quantity":1}`, 403, "not-owner"},
		{"/v1/orders/" + refunded + "/resale", `{"buyer":"ann","quantity":1}`, 409, "order-refunded"},
		{"/v1/orders/nope/resale", `{"buyer":"ann","quantity":1}`, 404, "unknown-order"},
		{"/v1/orders/bad!id/resale", `{"buyer":"ann","quantity":1}`, 400, "invalid-id"},
		{"/v1/listings/nope/withdraw", `{"buyer":"ann"}`, 404, "unknown-listing"},
	} {
		r := a.Do(t, http.MethodPost, c.path, map[string]string{"Idempotency-Key": "bad-" + fmt.Sprint(c.status)}, c.body)
		if r.Status != c.status || (c.kind != "" && systest.ProblemKind(r) != c.kind) {
			t.Errorf("POST %s %s = %d %s, want %d %s", c.path, c.body, r.Status, r.Body, c.status, c.kind)
		}
	}
	x := mustList(t, a, order, "l1", "ann", 3)
	if r := a.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w-bob", "bob"); r.Status != http.StatusForbidden {
		t.Errorf("another buyer's withdrawal = %d %s, want 403", r.Status, r.Body)
	}
	if r := list(t, a, order, "l2", "ann", 1); r.Status != http.StatusUnprocessableEntity {
		t.Errorf("listing more than is left unlisted = %d %s, want 422", r.Status, r.Body)
	}
	if r := list(t, a, order, "l1", "ann", 2); r.Status != http.StatusUnprocessableEntity || systest.ProblemKind(r) != "idempotency-key-reused" {
		t.Errorf("the listing's key for another quantity = %d %s, want 422 idempotency-key-reused", r.Status, r.Body)
	}
	if r := a.Do(t, http.MethodGet, "/v1/listings/nope", nil, ""); r.Status != http.StatusNotFound {
		t.Errorf("an unknown listing = %d %s", r.Status, r.Body)
	}
	if r := a.Do(t, http.MethodPut, systest.AdminPath(sku), nil, `{"total":10,"resale":"sometimes"}`); r.Status != http.StatusUnprocessableEntity {
		t.Errorf("a bad resale mode = %d %s, want 422", r.Status, r.Body)
	}
	if got := getListing(t, a, x.ListingID); got.Quantity != 3 || got.State != "listed" || got.Sold != 0 {
		t.Errorf("after the refusals the listing is %+v", got)
	}
	st, err := a.Ledger.SKU(context.Background(), sku)
	if err != nil || st.Total != 10+3 || st.Listed != 3 || st.Sold != 3 {
		t.Errorf("SKU row %+v (%v): want total 13 (10 and 3 listed), sold 3", st, err)
	}
}

// putAlongside makes sku (total, max per order) with resale "alongside".
func putAlongside(t *testing.T, e *systest.Env, sku stock.SKU, total, most int) {
	t.Helper()
	body := fmt.Sprintf(`{"total":%d,"max_per_order":%d,"resale":"alongside"}`, total, most)
	if r := e.Do(t, http.MethodPut, systest.AdminPath(sku), nil, body); r.Status != http.StatusOK {
		t.Fatalf("put sku = %d %s", r.Status, r.Body)
	}
}

// alongside: listed tickets sell by their share of what is for sale.
func TestResaleAlongside(t *testing.T) {
	a, _ := start(t, "postgres")
	sku := systest.NewSKU(t)
	putAlongside(t, a, sku, 10, 10)
	order := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 5))
	x := mustList(t, a, order, "l1", "ann", 5)
	systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, sku).RedisRemaining == 10 })
	a.MustBuy(t, sku, "p2", "bob", 4)
	// 5 listed of 10 for sale: half of the 4 sold are resales.
	systest.WaitFor(t, 15*time.Second, "the sale to settle", func() bool { return getListing(t, a, x.ListingID).Sold == 2 })
	if q := orderQuantity(t, a, order); q != 3 {
		t.Errorf("the seller's order has %d, want 3", q)
	}
}

// A seller whose listed tickets resold may buy again up to the cap: the
// settle a withdrawal makes gives the seller's counts at the gate back,
// as the sweeper's does (this replica runs no sweeper).
func TestResaleSellerBuysAgainAfterWithdrawalSettles(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutCapped(t, sku, 1, 4)
		order := systest.OrderID(e.MustBuy(t, sku, "p1", "sam", 4))
		x := mustList(t, e, order, "l1", "sam", 2)
		e.MustBuy(t, sku, "p2", "bob", 2)
		// A sale settles once it is older than the horizon (before, a
		// withdrawal would count it as the public stock's).
		sold := time.Now()
		systest.WaitFor(t, 15*time.Second, "the sale to come of age", func() bool { return time.Since(sold) > ledger.ResaleHorizon })
		if w := e.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w1", "sam"); w.Status != http.StatusConflict || systest.ProblemKind(w) != "listing-ended" {
			t.Fatalf("withdraw after the sale = %d %s, want 409 listing-ended", w.Status, w.Body)
		}
		if got := getListing(t, e, x.ListingID); got.Sold != 2 {
			t.Fatalf("listing %+v, want 2 sold", got)
		}
		if r := e.Buy(t, sku, "p3", "sam", 2); r.Status != http.StatusCreated {
			t.Errorf("the seller buying again under its cap = %d %s, want 201", r.Status, r.Body)
		}
	})
}

// alongside beside a hold taken before the listing: the one free unit is
// the listed one, so the buyer who takes it takes a resale, and the
// settle tells it while the hold still counts in what was for sale (its
// confirm is never a resale). Before, the share left it unsettled (1 of 2
// for sale) and, once the hold was confirmed, for good: three orders
// stood on two tickets, the seller was never told, and the listing could
// be neither withdrawn (409 listing-selling) nor its order refunded
// (helper-65).
func TestResaleAlongsideBesideAnEarlierHold(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		putAlongside(t, a, sku, 2, 4)
		order := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 1))
		r, h := b.Hold(t, sku, "h1", "hal", 1, 0)
		if r.Status != http.StatusCreated {
			t.Fatalf("hold = %d %s", r.Status, r.Body)
		}
		x := mustList(t, b, order, "l1", "ann", 1)
		systest.WaitFor(t, 10*time.Second, "the listed unit at the gate", func() bool { return a.State(t, sku).RedisRemaining == 1 })
		b.MustBuy(t, sku, "p2", "bob", 1)
		systest.WaitFor(t, 15*time.Second, "bob's sale settled to the listing while hal's hold is held",
			func() bool { return getListing(t, a, x.ListingID).Sold == 1 })
		if r := b.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c1", "hal"); r.Status != http.StatusCreated {
			t.Fatalf("confirm of hal's hold = %d %s", r.Status, r.Body)
		}
		// A later settle changes nothing: one listing.sold of 1, ann's
		// order resold out, two orders on two tickets.
		systest.WaitFor(t, 15*time.Second, "a settle after the confirm", func() bool {
			st, err := a.Ledger.SKU(context.Background(), sku)
			return err == nil && st.Sold == 2 && st.Held == 0
		})
		if got := getListing(t, a, x.ListingID); got.State != "sold" || got.Sold != 1 {
			t.Errorf("listing %+v, want sold, 1", got)
		}
		if n, units := soldEvents(t, a, sku); n != 1 || units != 1 {
			t.Errorf("%d listing.sold events of %d units, want 1 of 1", n, units)
		}
		if st, err := a.Ledger.SKU(context.Background(), sku); err != nil || st.Total != 2 || st.Listed != 0 {
			t.Errorf("SKU row %+v (%v): want total 2 (ann's ticket resold to bob), nothing listed", st, err)
		}
		if r := a.Act(t, "/v1/orders/"+order+"/refund", "rf1", "ann"); r.Status != http.StatusConflict || systest.ProblemKind(r) != "order-resold" {
			t.Errorf("ann's refund of her resold order = %d %s, want 409 order-resold", r.Status, r.Body)
		}
	})
}

// Behind a waiting room a listing is not withdrawn: the room admitted a
// buyer for each listed ticket, and a withdrawal took the tickets from
// under those buyers, who met sold out (helper-109). Refused with nothing
// moved (409 listing-selling); once the room is removed it withdraws.
func TestAListingBehindAWaitingRoomStaysListed(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, _ := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 4, 1, 4)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 4))
		x := mustList(t, a, ann, "l1", "ann", 2)
		systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, sku).RedisRemaining == 2 })
		queue := "/v1/admin/programs/" + sku.Program.String() + "/queue"
		if r := a.Do(t, http.MethodPut, queue, nil, `{"opens_in_seconds":0,"rate_per_second":100,"window_seconds":60,"per_remaining":1}`); r.Status != http.StatusOK {
			t.Fatalf("PUT queue = %d %s", r.Status, r.Body)
		}
		if r := a.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w1", "ann"); r.Status != http.StatusConflict || systest.ProblemKind(r) != "listing-selling" {
			t.Errorf("a withdrawal behind a waiting room = %d %s, want 409 listing-selling", r.Status, r.Body)
		}
		if got := getListing(t, a, x.ListingID); got.State != "listed" || a.State(t, sku).RedisRemaining != 2 {
			t.Errorf("after the refusal: listing %+v, %+v; want it listed, its 2 for sale", got, a.State(t, sku))
		}
		if r := a.Do(t, http.MethodDelete, queue, nil, ""); r.Status != http.StatusNoContent {
			t.Fatalf("DELETE queue = %d %s", r.Status, r.Body)
		}
		if r := a.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w2", "ann"); r.Status != http.StatusOK || listingOf(t, r).Withdrawn != 2 {
			t.Errorf("the withdrawal once the room is gone = %d %s, want 200, 2 withdrawn", r.Status, r.Body)
		}
	})
}

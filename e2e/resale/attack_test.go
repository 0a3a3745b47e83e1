package resale_test

// Attacks on resale (issue 33): each test says what it tries and what
// must hold. The ones that broke were fixed and stay as regression tests;
// the others are attacks that held.

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// skuRow is the SKU row as the resale arithmetic sees it.
func skuRow(t *testing.T, e *systest.Env, sku stock.SKU) (organizer, sold, held, listed int64) {
	t.Helper()
	st, err := e.Ledger.SKU(context.Background(), sku)
	if err != nil {
		t.Fatal(err)
	}
	return st.Total - st.Listed, st.Sold, st.Held, st.Listed
}

// A listing of every ticket of an order that all sell gives the whole
// order up: the seller's order cannot go to 0 tickets (orders.quantity >
// 0), so it is the seller's refund, and the settle that gives it up must
// not fail (nor hold up the settles of every other SKU behind it).
func TestAttackWholeOrderResold(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 2, 1, 4)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 2))
		x := mustList(t, a, ann, "l1", "ann", 2)
		// Another SKU of the program, listed after: its settle comes after
		// the first one's.
		other := stock.SKU{Program: sku.Program, Ticket: keys.MustID("vip")}
		a.PutSKU(t, other, 3, 1, 4)
		dan := systest.OrderID(a.MustBuy(t, other, "p2", "dan", 3))
		y := mustList(t, a, dan, "l2", "dan", 1)
		systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool {
			return a.State(t, sku).RedisRemaining == 2 && a.State(t, other).RedisRemaining == 1
		})
		b.MustBuy(t, sku, "p3", "bob", 2)
		b.MustBuy(t, other, "p4", "eve", 1)
		systest.WaitFor(t, 15*time.Second, "both listings settled", func() bool {
			return getListing(t, a, x.ListingID).State == "sold" && getListing(t, a, y.ListingID).State == "sold"
		})
		o, err := a.Ledger.OrderByID(context.Background(), keysID(t, ann))
		if err != nil {
			t.Fatal(err)
		}
		if o.RefundedAt.IsZero() {
			t.Errorf("the seller's order after all of it resold: %+v, want it given up (refunded)", o)
		}
		if _, units := soldEvents(t, a, sku); units != 2 {
			t.Errorf("listing.sold events for %d units, want 2", units)
		}
		if org, sold, held, listed := skuRow(t, a, sku); org != 2 || sold != 2 || held != 0 || listed != 0 {
			t.Errorf("SKU row: organizer's %d sold %d held %d listed %d, want 2 2 0 0 (bob's)", org, sold, held, listed)
		}
		// Nothing is left to give back: a refund is refused (its money
		// went back by listing.sold: a 200 would tell it twice), a
		// withdrawal finds the listing ended, another listing is refused.
		if r := a.Act(t, "/v1/orders/"+ann+"/refund", "rf1", "ann"); r.Status != http.StatusConflict || systest.ProblemKind(r) != "order-resold" {
			t.Errorf("refund of the resold order = %d %s, want 409 order-resold", r.Status, r.Body)
		}
		if r := b.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w1", "ann"); r.Status != http.StatusConflict ||
			systest.ProblemKind(r) != "listing-ended" {
			t.Errorf("withdrawal of the sold listing = %d %s, want 409 listing-ended", r.Status, r.Body)
		}
		if r := list(t, b, ann, "l3", "ann", 1); r.Status != http.StatusConflict {
			t.Errorf("listing the resold order again = %d %s, want 409", r.Status, r.Body)
		}
		if org, sold, _, _ := skuRow(t, a, sku); org != 2 || sold != 2 {
			t.Errorf("after the refund: organizer's %d sold %d, want 2 2", org, sold)
		}
		systest.WaitSettled(t, a, sku)
		systest.WaitSettled(t, a, other)
	})
}

// A sale ended with tickets listed: they can no longer sell, so the
// seller must be able to take them back (and then refund the order);
// the gate of an ended sale has nothing to take them out of.
func TestAttackWithdrawAfterSaleEnded(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 3, 1, 4)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 3))
		x := mustList(t, a, ann, "l1", "ann", 2)
		systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, sku).RedisRemaining == 2 })
		if r := a.Do(t, http.MethodPost, systest.AdminPath(sku)+"/end", nil, ""); r.Status != http.StatusOK {
			t.Fatalf("end = %d %s", r.Status, r.Body)
		}
		if r := a.Buy(t, sku, "p2", "bob", 1); r.Status == http.StatusCreated {
			t.Fatalf("a purchase after the end = %d %s", r.Status, r.Body)
		}
		r := b.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w1", "ann")
		if r.Status != http.StatusOK || listingOf(t, r).Withdrawn != 2 {
			t.Fatalf("withdrawal after the end = %d %s, want 200 with 2 withdrawn", r.Status, r.Body)
		}
		if r := a.Act(t, "/v1/orders/"+ann+"/refund", "rf1", "ann"); r.Status != http.StatusOK {
			t.Errorf("refund after the withdrawal = %d %s", r.Status, r.Body)
		}
		if org, sold, held, listed := skuRow(t, a, sku); org != 3 || sold != 0 || held != 0 || listed != 0 {
			t.Errorf("SKU row: organizer's %d sold %d held %d listed %d, want 3 0 0 0", org, sold, held, listed)
		}
		if n, _ := soldEvents(t, a, sku); n != 0 {
			t.Errorf("%d listing.sold events, want none", n)
		}
	})
}

// The organizer's total may not shrink below what the organizer sold
// because some of it is listed: the listed units are the seller's,
// counted in total only while they are for sale again.
func TestAttackShrinkTotalWhileListed(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 5, 1, 5)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 5))
		x := mustList(t, a, ann, "l1", "ann", 2)
		systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, sku).RedisRemaining == 2 })
		if r := a.Do(t, http.MethodPut, systest.AdminPath(sku), nil, `{"total":3,"shards":1,"max_per_order":5}`); r.Status != http.StatusConflict {
			t.Errorf("PUT total 3 below the 5 sold, 2 of them listed = %d %s, want 409", r.Status, r.Body)
		}
		// The same total again is fine, and keeps the listed units on sale.
		a.PutSKU(t, sku, 5, 1, 5)
		if org, sold, _, listed := skuRow(t, a, sku); org != 5 || sold != 5 || listed != 2 {
			t.Errorf("SKU row: organizer's %d sold %d listed %d, want 5 5 2", org, sold, listed)
		}
		b.MustBuy(t, sku, "p2", "bob", 1)
		systest.WaitFor(t, 15*time.Second, "the sale to settle", func() bool { return getListing(t, a, x.ListingID).Sold == 1 })
		if r := b.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w1", "ann"); r.Status != http.StatusOK || listingOf(t, r).Withdrawn != 1 {
			t.Errorf("withdraw = %d %s, want 1 withdrawn", r.Status, r.Body)
		}
		if org, sold, _, listed := skuRow(t, a, sku); org != 5 || sold != 5 || listed != 0 {
			t.Errorf("SKU row: organizer's %d sold %d listed %d, want 5 5 0", org, sold, listed)
		}
		systest.WaitSettled(t, a, sku)
	})
}

// A pool's allotment comes from the public stock's free units; listed
// units are free too, but the seller's: a pool may not take them (they
// would sell twice: to the pool's buyers and, still the seller's, never
// given up). A pool's own orders are not listed: a pool's total moves at
// every PUT and at its close.
func TestAttackPoolTakesListedUnits(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, _ := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 6, 1, 5)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 5))
		x := mustList(t, a, ann, "l1", "ann", 2)
		// 1 public unit left and 2 listed: a pool of 2 must be refused.
		if r := a.Do(t, http.MethodPut, systest.AdminPath(sku)+"/pools/fans", nil, `{"allotment":2,"shards":1}`); r.Status/100 != 4 {
			t.Errorf("PUT pool of 2 with 1 public unit and 2 listed = %d %s, want 4xx", r.Status, r.Body)
		}
		if org, sold, _, listed := skuRow(t, a, sku); org != 6 || sold != 5 || listed != 2 {
			t.Errorf("SKU row: organizer's %d sold %d listed %d, want 6 5 2", org, sold, listed)
		}
		// A pool of 1 is fine; its buyer's order cannot be listed.
		a.PutPool(t, sku, "club", `{"allotment":1,"shards":1}`)
		r := a.Do(t, http.MethodPost, systest.SKUPath(sku)+"/purchases?pool=club", map[string]string{"Idempotency-Key": "p2"}, `{"buyer":"cat","quantity":1}`)
		if r.Status != http.StatusCreated {
			t.Fatalf("pool purchase = %d %s", r.Status, r.Body)
		}
		if r := list(t, a, systest.OrderID(r), "l2", "cat", 1); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("listing a pool's order = %d %s, want 422", r.Status, r.Body)
		}
		if r := a.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w1", "ann"); r.Status != http.StatusOK || listingOf(t, r).Withdrawn != 2 {
			t.Errorf("withdraw = %d %s, want 2 withdrawn", r.Status, r.Body)
		}
		systest.WaitSettled(t, a, sku)
	})
}

// A hold made before a listing took public stock: confirmed after it, it
// is no resale (the seller would be refunded for tickets nobody bought,
// and they would stay on sale). A purchase after the listing is one.
func TestAttackHoldBeforeListing(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 5, 1, 5)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 3))
		hr, h := a.Hold(t, sku, "h1", "bob", 2, 0)
		if hr.Status != http.StatusCreated {
			t.Fatalf("hold = %d %s", hr.Status, hr.Body)
		}
		x := mustList(t, a, ann, "l1", "ann", 2)
		systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, sku).RedisRemaining == 2 })
		if r := b.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c1", "bob"); r.Status != http.StatusCreated {
			t.Fatalf("confirm = %d %s", r.Status, r.Body)
		}
		b.MustBuy(t, sku, "p2", "cat", 1)
		systest.WaitFor(t, 15*time.Second, "the sales to settle", func() bool { return getListing(t, a, x.ListingID).Sold > 0 })
		if got := getListing(t, a, x.ListingID); got.Sold != 1 || got.State != "listed" {
			t.Errorf("listing %+v: want 1 sold (cat's), bob's hold took public stock before the listing", got)
		}
		if q := orderQuantity(t, a, ann); q != 2 {
			t.Errorf("the seller's order has %d, want 2", q)
		}
		r := a.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w1", "ann")
		if r.Status != http.StatusOK || listingOf(t, r).Withdrawn != 1 {
			t.Errorf("withdraw = %d %s, want 1 withdrawn", r.Status, r.Body)
		}
		if org, sold, held, listed := skuRow(t, a, sku); org != 5 || sold != 5 || held != 0 || listed != 0 {
			t.Errorf("SKU row: organizer's %d sold %d held %d listed %d, want 5 5 0 0", org, sold, held, listed)
		}
		systest.WaitSettled(t, a, sku)
	})
}

// A withdrawal under a key the buyer used for something else (here the
// listing itself) is refused with 422 and leaves the listed units on sale
// at the gate.
func TestAttackWithdrawKeyReused(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 3, 1, 4)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 3))
		x := mustList(t, a, ann, "k1", "ann", 2)
		systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, sku).RedisRemaining == 2 })
		for _, key := range []string{"k1", "p1"} {
			if r := b.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", key, "ann"); r.Status != http.StatusUnprocessableEntity ||
				systest.ProblemKind(r) != "idempotency-key-reused" {
				t.Errorf("withdraw under key %s = %d %s, want 422 idempotency-key-reused", key, r.Status, r.Body)
			}
			if got := a.State(t, sku).RedisRemaining; got != 2 {
				t.Errorf("the gate after the refused withdrawal under %s has %d, want the 2 listed", key, got)
			}
		}
		a.MustBuy(t, sku, "p2", "bob", 1)
		systest.WaitFor(t, 15*time.Second, "the sale to settle", func() bool { return getListing(t, a, x.ListingID).Sold == 1 })
		systest.WaitSettled(t, a, sku)
	})
}

// Attacks that held: a listing raced by a refund and a transfer of the
// same order on two replicas, two listings of one order at once, a
// reconcile and a retried withdrawal on the other replica, a partial
// transfer listed by its new owner, a refund of a resale's buyer.
func TestAttackResaleRaces(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 10, 2, 5)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 4))
		a.MustBuy(t, sku, "p2", "bob", 5)

		// Two listings of 3 of ann's 4 at once, a refund and a transfer of
		// all of it beside them: one listing, or the refund, or the move.
		type res struct {
			what string
			r    systest.Reply
		}
		out := make(chan res, 4)
		go func() { out <- res{"list a", list(t, a, ann, "la", "ann", 3)} }()
		go func() { out <- res{"list b", list(t, b, ann, "lb", "ann", 3)} }()
		go func() { out <- res{"refund", a.Act(t, "/v1/orders/"+ann+"/refund", "rf", "ann")} }()
		go func() {
			out <- res{"transfer", b.Do(t, http.MethodPost, "/v1/orders/"+ann+"/transfer", map[string]string{"Idempotency-Key": "xf"},
				`{"buyer":"ann","to":"zed"}`)}
		}()
		won := map[string]systest.Reply{}
		for range 4 {
			x := <-out
			switch x.r.Status {
			case http.StatusOK, http.StatusCreated:
				won[x.what] = x.r
			case http.StatusConflict, http.StatusUnprocessableEntity, http.StatusForbidden:
			default:
				t.Errorf("%s = %d %s", x.what, x.r.Status, x.r.Body)
			}
		}
		t.Logf("won: %v", func() (w []string) {
			for k := range won {
				w = append(w, k)
			}
			return w
		}())
		_, hasA := won["list a"]
		_, hasB := won["list b"]
		_, hasR := won["refund"]
		_, hasX := won["transfer"]
		n := 0
		for _, ok := range []bool{hasA, hasB, hasR, hasX} {
			if ok {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d of two listings of 3 of 4, a refund and a move of it all went through, want 1", n)
		}
		_, _, _, listed := skuRow(t, a, sku)
		if want := map[bool]int64{true: 3, false: 0}[hasA || hasB]; listed != want {
			t.Errorf("listed %d, want %d", listed, want)
		}
		if r := a.Do(t, http.MethodPost, systest.AdminPath(sku)+"/reconcile", nil, ""); r.Status != http.StatusOK {
			t.Errorf("reconcile = %d %s", r.Status, r.Body)
		}
		systest.WaitSettled(t, a, sku)

		// A partial transfer listed by its new owner; a buyer of it
		// refunds; the new owner's withdrawal retried on the other replica.
		other := stock.SKU{Program: sku.Program, Ticket: keys.MustID("b")}
		a.PutSKU(t, other, 4, 1, 4)
		dan := systest.OrderID(a.MustBuy(t, other, "q1", "dan", 4))
		r := b.Do(t, http.MethodPost, "/v1/orders/"+dan+"/transfer", map[string]string{"Idempotency-Key": "xf2"}, `{"buyer":"dan","to":"eve","quantity":2}`)
		if r.Status != http.StatusOK {
			t.Fatalf("transfer 2 = %d %s", r.Status, r.Body)
		}
		eve := systest.OrderID(r)
		r = list(t, a, eve, "le", "eve", 2)
		if r.Status != http.StatusCreated {
			t.Fatalf("the new owner's listing = %d %s", r.Status, r.Body)
		}
		x := listingOf(t, r)
		systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, other).RedisRemaining == 2 })
		fay := systest.OrderID(b.MustBuy(t, other, "q2", "fay", 1))
		if r := a.Act(t, "/v1/orders/"+fay+"/refund", "rf2", "fay"); r.Status != http.StatusOK {
			t.Fatalf("the resale buyer's refund = %d %s", r.Status, r.Body)
		}
		systest.WaitFor(t, 15*time.Second, "the resale to settle", func() bool { return getListing(t, a, x.ListingID).Sold == 1 })
		w1 := a.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w", "eve")
		w2 := b.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w", "eve")
		if w1.Status != http.StatusOK || w2.Status != http.StatusOK || listingOf(t, w2).Withdrawn != 1 {
			t.Errorf("withdraw and its retry = %d %s / %d %s", w1.Status, w1.Body, w2.Status, w2.Body)
		}
		if q := orderQuantity(t, a, eve); q != 1 {
			t.Errorf("the new owner's order has %d, want 1", q)
		}
		// 4 of the organizer's: dan 2, eve 1, fay's refunded 1 free.
		if org, sold, held, listed := skuRow(t, a, other); org != 4 || sold != 3 || held != 0 || listed != 0 {
			t.Errorf("SKU row: organizer's %d sold %d held %d listed %d, want 4 3 0 0", org, sold, held, listed)
		}
		systest.WaitSettled(t, a, other)
		if n, units := soldEvents(t, a, other); n != 1 || units != 1 {
			t.Errorf("%d listing.sold of %d units, want 1 of 1", n, units)
		}
	})
}

// A withdrawal sent twice at once, to both replicas, under one key (a
// client's retry) or two (two devices): the listing is withdrawn once and
// the gate keeps exactly what the ledger has for sale; neither copy gives
// the gate back units the other took out for the withdrawal that stood.
func TestAttackWithdrawRacedOnTwoReplicas(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 40, 1, 20)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 20))
		for i := range 8 {
			x := mustList(t, a, ann, fmt.Sprintf("l%d", i), "ann", 2)
			systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, sku).RedisRemaining == 22 })
			k1, k2 := fmt.Sprintf("w%d", i), fmt.Sprintf("w%d", i)
			if i%2 == 1 {
				k2 += "-other"
			}
			got := make(chan systest.Reply, 2)
			go func() { got <- a.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", k1, "ann") }()
			go func() { got <- b.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", k2, "ann") }()
			ok := 0
			for range 2 {
				r := <-got
				switch {
				case r.Status == http.StatusOK:
					ok++
				case r.Status == http.StatusConflict:
				default:
					t.Errorf("withdraw %d = %d %s", i, r.Status, r.Body)
				}
			}
			if ok == 0 {
				t.Fatalf("round %d: neither withdrawal went through", i)
			}
			if got := getListing(t, a, x.ListingID); got.State != "withdrawn" || got.Withdrawn != 2 {
				t.Fatalf("round %d: listing %+v", i, got)
			}
			st, err := a.Ledger.SKU(context.Background(), sku)
			if err != nil {
				t.Fatal(err)
			}
			if left := a.State(t, sku).RedisRemaining; left != st.Remaining() || left != 20 {
				t.Fatalf("round %d (keys %s, %s): the gate has %d, the ledger %d for sale, want 20", i, k1, k2, left, st.Remaining())
			}
		}
	})
}

// Two resales on two replicas whose clocks are 1.5 s apart: the later
// sale (the higher seq) carries the older time. A settle between the two
// horizons may count the later one alone, but must not move its mark past
// the earlier one: each sale is settled, so the listing sells out and
// its seller's order gives both up.
func TestAttackSettleSkewedClocks(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: func(o *app.Options) { o.Sale.SweepEvery = 20 * time.Millisecond }})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: func(o *app.Options) {
			o.Ledger.Now = func() time.Time { return time.Now().Add(-1500 * time.Millisecond) }
		}})
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 4, 1, 4)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 4))
		x := mustList(t, a, ann, "l1", "ann", 2)
		systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, sku).RedisRemaining == 2 })
		a.MustBuy(t, sku, "p2", "bob", 1)
		b.MustBuy(t, sku, "p3", "cat", 1)
		systest.WaitFor(t, 15*time.Second, "both resales settled", func() bool { return getListing(t, a, x.ListingID).Sold == 2 })
		if q := orderQuantity(t, a, ann); q != 2 {
			t.Errorf("the seller's order has %d, want 2", q)
		}
		if org, sold, held, listed := skuRow(t, a, sku); org != 4 || sold != 4 || held != 0 || listed != 0 {
			t.Errorf("SKU row: organizer's %d sold %d held %d listed %d, want 4 4 0 0", org, sold, held, listed)
		}
	})
}

// A withdrawal raced by a reconcile of its SKU: the gate rebuilt from the
// ledger between the withdrawal's deduction and its commit counts the
// listed units (the ledger still has them); the withdrawal then commits
// against a gate that has them again. The gate must keep what the ledger
// has for sale whichever comes first.
func TestAttackWithdrawRacedByReconcile(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 40, 1, 20)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 20))
		for i := range 12 {
			x := mustList(t, a, ann, fmt.Sprintf("l%d", i), "ann", 2)
			systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, sku).RedisRemaining == 22 })
			done := make(chan systest.Reply, 2)
			go func() { done <- b.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", fmt.Sprintf("w%d", i), "ann") }()
			go func() {
				time.Sleep(time.Duration(i%4) * time.Millisecond) // time under test: the reconcile 0-3 ms behind the withdrawal
				done <- a.Do(t, http.MethodPost, systest.AdminPath(sku)+"/reconcile", nil, "")
			}()
			for range 2 {
				if r := <-done; r.Status != http.StatusOK && r.Status != http.StatusConflict {
					t.Errorf("round %d: %d %s", i, r.Status, r.Body)
				}
			}
			if got := getListing(t, a, x.ListingID); got.State == "listed" {
				// Refused while the gate was closed: withdraw again.
				if r := b.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", fmt.Sprintf("w%d-again", i), "ann"); r.Status != http.StatusOK {
					t.Fatalf("round %d: withdraw again = %d %s", i, r.Status, r.Body)
				}
			}
			st, err := a.Ledger.SKU(context.Background(), sku)
			if err != nil {
				t.Fatal(err)
			}
			if left := a.State(t, sku).RedisRemaining; left != st.Remaining() || left != 20 {
				t.Fatalf("round %d: the gate has %d, the ledger %d for sale, want 20", i, left, st.Remaining())
			}
		}
	})
}

// alongside: listed tickets sell by their share of what is for sale,
// whichever way the sales fall into settles. 2 listed of 100 for sale:
// two single sales, settled one at a time, are public stock's (a share
// of 0.02 each), not the listing's (each settle rounded its share up to
// a whole unit).
func TestAttackAlongsideOneSaleAtATime(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		putAlongside(t, a, sku, 100, 10)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 2))
		x := mustList(t, a, ann, "l1", "ann", 2)
		version := func() int64 {
			st, err := a.Ledger.SKU(context.Background(), sku)
			if err != nil {
				t.Fatal(err)
			}
			return st.Version
		}
		for i, buyer := range []string{"bob", "cat"} {
			b.MustBuy(t, sku, fmt.Sprintf("p%d", i+2), buyer, 1)
			v := version()
			systest.WaitFor(t, 15*time.Second, "the sale's settle", func() bool { return version() > v })
		}
		if got := getListing(t, a, x.ListingID); got.Sold != 0 {
			t.Errorf("listing %+v after 2 single sales with 2 of 100 listed: want none sold", got)
		}
		if q := orderQuantity(t, a, ann); q != 2 {
			t.Errorf("the seller's order has %d, want 2", q)
		}
		if r := a.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w1", "ann"); r.Status != http.StatusOK || listingOf(t, r).Withdrawn != 2 {
			t.Errorf("withdraw = %d %s, want 2 withdrawn", r.Status, r.Body)
		}
		systest.WaitSettled(t, a, sku)
	})
}

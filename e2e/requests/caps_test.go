package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
)

// A committed purchase is refunded (its quota count given back), the buyer
// then buys up to the cap with another key, and the client's late retry of
// the first purchase arrives. The retry is the same request: it gets the
// replay of its 201, though the gate's quota count refuses it as new.
func TestAttack2RetryAtCapAfterRefund(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver)
		sku := newSKU(t)
		e.putCapped(t, sku, 2, 2)
		b := e.mustBuy(t, sku, "k1", "ann", 2)
		if f := e.act(t, "/v1/orders/"+orderID(b)+"/refund", "f1", "ann"); f.status != 200 {
			t.Fatalf("refund = %d %s", f.status, f.body)
		}
		e.mustBuy(t, sku, "k2", "ann", 2)
		again := e.buy(t, sku, "k1", "ann", 2)
		if again.status != 201 || orderID(again) != orderID(b) {
			t.Errorf("retry of the refunded purchase k1 = %d %s, want the replay of order %s", again.status, again.body, orderID(b))
		}
		used, _ := e.rdb.HGet(context.Background(), keys.Quota(sku.Program, sku.Ticket, keys.MustID("ann")), "used").Int64()
		if used != 2 {
			t.Errorf("redis quota used = %d, want 2", used)
		}
	})
}

// The same with a cancelled hold and a program cap.
func TestAttack2HoldRetryAtProgramCapAfterCancel(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver)
		sku := newSKU(t)
		e.putSKU(t, sku, 100, 1, 4)
		if r := e.do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String(), nil, `{"per_buyer":1}`); r.status != 200 {
			t.Fatalf("PUT program = %d %s", r.status, r.body)
		}
		r, h := e.hold(t, sku, "h1", "ann", 1, 0)
		if r.status != 201 {
			t.Fatalf("hold = %d %s", r.status, r.body)
		}
		if c := e.act(t, "/v1/holds/"+h.HoldID+"/cancel", "c1", "ann"); c.status != 200 {
			t.Fatalf("cancel = %d %s", c.status, c.body)
		}
		e.mustBuy(t, sku, "k2", "ann", 1)
		again, h2 := e.hold(t, sku, "h1", "ann", 1, 0)
		if again.status != 201 || h2.HoldID != h.HoldID {
			t.Errorf("retry of the cancelled hold h1 = %d %s, want the replay of hold %s", again.status, again.body, h.HoldID)
		}
	})
}

// The buyer owns its cap through key k1; the same key with another body
// gets 422 (idempotency-key-reused), not the 409 limit-reached the quota
// count gives the new fingerprint.
func TestAttack2ReusedKeyAtCap(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver)
		sku := newSKU(t)
		e.putCapped(t, sku, 1, 2)
		e.mustBuy(t, sku, "k1", "ann", 2)
		if r := e.buy(t, sku, "k1", "ann", 1); r.status != 422 {
			t.Errorf("key k1 reused with quantity 1 by a buyer at the cap = %d %s, want 422", r.status, r.body)
		}
	})
}

// The retry of a committed purchase is counted again per scope: the SKU's
// scope finds its count ("already"), the program's (a cap lowered since)
// refuses. The retry gets its replay, and the refusal gives back only the
// counts this attempt made: the SKU count the committed order stands on
// stays.
func TestAttack2LoweredProgramCapReleasesSKUCount(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver)
		sku := newSKU(t)
		vip := sku
		vip.Ticket = keys.MustID("vip")
		e.putCapped(t, sku, 1, 4)
		e.putSKU(t, vip, 100, 1, 4)
		b := e.mustBuy(t, sku, "k1", "ann", 2)
		if r := e.do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String(), nil, `{"per_buyer":3}`); r.status != 200 {
			t.Fatalf("PUT program = %d %s", r.status, r.body)
		}
		e.mustBuy(t, vip, "k2", "ann", 1)
		if r := e.do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String(), nil, `{"per_buyer":2}`); r.status != 200 {
			t.Fatalf("PUT program = %d %s", r.status, r.body)
		}
		again := e.buy(t, sku, "k1", "ann", 2)
		if again.status != 201 || orderID(again) != orderID(b) {
			t.Errorf("retry of k1 = %d %s, want the replay", again.status, again.body)
		}
		ctx := context.Background()
		used, _ := e.rdb.HGet(ctx, keys.Quota(sku.Program, sku.Ticket, keys.MustID("ann")), "used").Int64()
		units, _ := e.ledger.BuyerUnits(ctx, sku, keys.MustID("ann"))
		if used != units {
			t.Errorf("redis quota used = %d for %s, ledger holds+owns %d", used, sku.Ticket, units)
		}
	})
}

// A seat hold taken around the gate (replica A's Redis is down) is written
// into replica B's gate by the seat consistency check (the ledger wins: the
// seat is held by the hold's owner id). When the hold is cancelled its
// seats are released in that gate too: another buyer gets the free seat
// and the check finds nothing to repair.
func TestAttack2DirectSeatHoldRepairedThenCancelled(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	b := startEnv(t, envOptions{driver: ledger.Postgres, dsn: dsn})
	c := testenv.NewCluster(t, testenv.ClusterOptions{})
	a := startEnv(t, envOptions{driver: ledger.Postgres, dsn: dsn, cluster: c,
		tune: func(o *app.Options) { o.Sale.Breaker.OpenFor = time.Minute }})
	sku := newSKU(t)
	b.putSKU(t, sku, 0, 1, 4)
	b.loadSeats(t, sku, map[string]int{"A": 4})
	for _, n := range c.Nodes {
		n.Kill()
	}
	tripBreakers(t, a, c.Masters)
	r, h := a.seatHold(t, sku, "d1", "ann", "A-01")
	if r.status != 201 {
		t.Fatalf("seat hold around the gate = %d %s", r.status, r.body)
	}
	check := func(step string) []string {
		var res sale.SeatCheck
		cr := b.do(t, http.MethodPost, adminPath(sku)+"/seats/check", nil, "")
		if err := json.Unmarshal(cr.body, &res); err != nil || cr.status != 200 {
			t.Fatalf("%s: check = %d %s", step, cr.status, cr.body)
		}
		return res.Differed
	}
	check("after the direct hold") // repairs B's gate: A-01 held by the hold
	if x := b.act(t, "/v1/holds/"+h.HoldID+"/cancel", "c1", "ann"); x.status != 200 {
		t.Fatalf("cancel = %d %s", x.status, x.body)
	}
	if r, _ := b.seatHold(t, sku, "b1", "bob", "A-01"); r.status != 201 {
		t.Errorf("bob's hold of A-01, free in the ledger = %d %s, want 201", r.status, r.body)
	}
	if d := check("after the cancel"); len(d) != 0 {
		t.Errorf("seat check after the cancel differed %v, want []", d)
	}
}

// A purchase committed before the SKU had a per-buyer cap was never
// counted at the gate. Refunded, with the buyer at the new cap through
// another key, its retry still gets its replay (found among the SKU's
// committed keys), not 409 limit-reached.
func TestAttack2RetryOfUncountedPurchaseAtCap(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver)
		sku := newSKU(t)
		e.putSKU(t, sku, 100, 1, 4)
		b := e.mustBuy(t, sku, "k1", "ann", 2)
		e.putCapped(t, sku, 1, 2)
		if f := e.act(t, "/v1/orders/"+orderID(b)+"/refund", "f1", "ann"); f.status != 200 {
			t.Fatalf("refund = %d %s", f.status, f.body)
		}
		e.mustBuy(t, sku, "k2", "ann", 2)
		again := e.buy(t, sku, "k1", "ann", 2)
		if again.status != 201 || orderID(again) != orderID(b) {
			t.Errorf("retry of k1 = %d %s, want the replay of order %s", again.status, again.body, orderID(b))
		}
		if r := e.buy(t, sku, "k1", "ann", 1); r.status != 422 {
			t.Errorf("k1 reused = %d %s, want 422", r.status, r.body)
		}
	})
}

// A reused key under the cap (refused by the ledger, 422) must not take or
// drop the mark its committed request left at the gate: after a refund and
// the buyer at the cap again, the first request's retry is still replayed.
func TestAttack2ReusedKeyKeepsTheMark(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver)
		sku := newSKU(t)
		e.putCapped(t, sku, 1, 4)
		b := e.mustBuy(t, sku, "k1", "ann", 2)
		if r := e.buy(t, sku, "k1", "ann", 1); r.status != 422 {
			t.Fatalf("k1 reused under the cap = %d %s, want 422", r.status, r.body)
		}
		if f := e.act(t, "/v1/orders/"+orderID(b)+"/refund", "f1", "ann"); f.status != 200 {
			t.Fatalf("refund = %d %s", f.status, f.body)
		}
		e.mustBuy(t, sku, "k2", "ann", 4)
		again := e.buy(t, sku, "k1", "ann", 2)
		if again.status != 201 || orderID(again) != orderID(b) {
			t.Errorf("retry of k1 = %d %s, want the replay of order %s", again.status, again.body, orderID(b))
		}
		used, _ := e.rdb.HGet(context.Background(), keys.Quota(sku.Program, sku.Ticket, keys.MustID("ann")), "used").Int64()
		if used != 4 {
			t.Errorf("redis quota used = %d, want 4", used)
		}
	})
}

// A best-available seat hold the ticket's settings refuse (over the
// per-order maximum, a lifetime over the ticket's, an ended sale) moves
// nothing: before, Redis picked and held the seats first and nothing gave
// them back, so anyone could block a section with refused requests.
func TestAttack2RefusedBestSeatsHoldNothing(t *testing.T) {
	e := newEnv(t, ledger.SQLite)
	sku := newSKU(t)
	e.putSKU(t, sku, 0, 1, 4)
	e.loadSeats(t, sku, map[string]int{"A": 8})
	path := "/v1/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/seat-holds"
	for i, body := range []string{
		`{"buyer":"mal","quantity":4,"ttl_seconds":5000}`,
		`{"buyer":"mal","quantity":4,"section":"A","ttl_seconds":86400}`,
		`{"buyer":"mal","quantity":6,"section":"A"}`,
	} {
		r := e.do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": fmt.Sprintf("bad-%d", i)}, body)
		if r.status != http.StatusUnprocessableEntity {
			t.Errorf("%s = %d %s, want 422", body, r.status, r.body)
		}
	}
	if r := e.do(t, http.MethodPost, adminPath(sku)+"/end", nil, ""); r.status != http.StatusOK {
		t.Fatalf("end = %d %s", r.status, r.body)
	}
	if r := e.do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "after-end"}, `{"buyer":"mal","quantity":4}`); r.status != http.StatusConflict {
		t.Errorf("best seats after the end = %d %s, want 409", r.status, r.body)
	}
	var check sale.SeatCheck
	cr := e.do(t, http.MethodPost, adminPath(sku)+"/seats/check", nil, "")
	if err := json.Unmarshal(cr.body, &check); err != nil || cr.status != http.StatusOK {
		t.Fatalf("check = %d %s", cr.status, cr.body)
	}
	if len(check.Differed) != 0 {
		t.Errorf("refused seat holds left seats held in Redis: %v", check.Differed)
	}
}

// A ticket's maximum hold lifetime below the default lifetime is refused
// (holds without a lifetime of their own would outlive the maximum), and
// changes nothing.
func TestAttack2HoldMaxBelowDefaultRefused(t *testing.T) {
	e := newEnv(t, ledger.SQLite)
	sku := newSKU(t)
	if r := e.do(t, http.MethodPut, adminPath(sku), nil, `{"total":20,"hold_ttl_max_seconds":60}`); r.status != http.StatusUnprocessableEntity {
		t.Errorf("max 60s with the 900s default = %d %s, want 422", r.status, r.body)
	}
	if r := e.do(t, http.MethodGet, adminPath(sku), nil, ""); r.status != http.StatusNotFound {
		t.Errorf("the refused PUT created the SKU: %d %s", r.status, r.body)
	}
	if r := e.do(t, http.MethodPut, adminPath(sku), nil, `{"total":20,"hold_ttl_seconds":30,"hold_ttl_max_seconds":60}`); r.status != http.StatusOK {
		t.Errorf("max 60s with a 30s default = %d %s, want 200", r.status, r.body)
	}
}

// A seat map upload that moves a seat the map has (another section) is
// refused whole and changes nothing, in the ledger or in Redis.
func TestAttack2SeatMapCannotMoveASeat(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver)
		sku := newSKU(t)
		e.putSKU(t, sku, 0, 1, 4)
		e.loadSeats(t, sku, map[string]int{"A": 2})
		r := e.do(t, http.MethodPut, adminPath(sku)+"/seats", nil,
			`{"seats":[{"id":"B-01","section":"B","row":"1","number":1},{"id":"A-01","section":"B","row":"1","number":2}]}`)
		if r.status != http.StatusConflict || !strings.Contains(string(r.body), "A-01") {
			t.Errorf("moving A-01 to section B = %d %s, want 409 naming A-01", r.status, r.body)
		}
		if r := e.do(t, http.MethodGet, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/seats", nil, ""); !strings.Contains(string(r.body), `"free":2`) || strings.Contains(string(r.body), "B-01") {
			t.Errorf("seats after the refused upload = %s, want the 2 seats of A only", r.body)
		}
		if r, _ := e.seatHold(t, sku, "h", "ann", "A-01", "A-02"); r.status != http.StatusCreated {
			t.Errorf("hold of A-01, A-02 = %d %s", r.status, r.body)
		}
	})
}

// Media types compare case-insensitively and whole (RFC 9110): any case of
// application/json is JSON, application/jsonfoo is not; a JSON body that is
// not an object is malformed (400), and the problem names no Go type.
func TestAttack2MediaTypesAndNonObjectBodies(t *testing.T) {
	e := newEnv(t, ledger.SQLite)
	sku := newSKU(t)
	e.putSKU(t, sku, 10, 1, 4)
	path := "/v1/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/purchases"
	body := `{"buyer":"ann","quantity":1}`
	if r := e.do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "m1", "Content-Type": "Application/JSON; charset=UTF-8"}, body); r.status != http.StatusCreated {
		t.Errorf("Application/JSON = %d %s, want 201", r.status, r.body)
	}
	if r := e.do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "m2", "Content-Type": "application/jsonfoo"}, body); r.status != http.StatusUnsupportedMediaType {
		t.Errorf("application/jsonfoo = %d %s, want 415", r.status, r.body)
	}
	r := e.do(t, http.MethodPut, adminPath(sku), nil, `[]`)
	if r.status != http.StatusBadRequest || strings.Contains(string(r.body), "gateway.") {
		t.Errorf("PUT [] = %d %s, want 400 naming no Go type", r.status, r.body)
	}
	if st := e.state(t, sku); st.Sold != 1 {
		t.Errorf("sold %d, want 1", st.Sold)
	}
}

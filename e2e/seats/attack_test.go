package seats_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
)

// A seat hold taken around the gate (replica A's Redis is down) is written
// into replica B's gate by the seat consistency check (the ledger wins: the
// seat is held by the hold's owner id). When the hold is cancelled its
// seats are released in that gate too: another buyer gets the free seat
// and the check finds nothing to repair.
func TestAttackDirectSeatHoldRepairedThenCancelled(t *testing.T) {
	systest.FullTier(t)
	dsn := testenv.PostgresURL(t)
	b := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn})
	c := testenv.NewCluster(t, testenv.ClusterOptions{})
	a := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Cluster: c,
		Tune: func(o *app.Options) { o.Sale.Breaker.OpenFor = time.Minute }})
	sku := systest.NewSKU(t)
	b.PutSKU(t, sku, 0, 1, 4)
	b.LoadSeats(t, sku, map[string]int{"A": 4})
	for _, n := range c.Nodes {
		n.Kill()
	}
	systest.TripBreakers(t, a, c.Masters)
	r, h := a.SeatHold(t, sku, "d1", "ann", "A-01")
	if r.Status != 201 {
		t.Fatalf("seat hold around the gate = %d %s", r.Status, r.Body)
	}
	check := func(step string) []string {
		var res sale.SeatCheck
		cr := b.Do(t, http.MethodPost, systest.AdminPath(sku)+"/seats/check", nil, "")
		if err := json.Unmarshal(cr.Body, &res); err != nil || cr.Status != 200 {
			t.Fatalf("%s: check = %d %s", step, cr.Status, cr.Body)
		}
		return res.Differed
	}
	check("after the direct hold") // repairs B's gate: A-01 held by the hold
	if x := b.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c1", "ann"); x.Status != 200 {
		t.Fatalf("cancel = %d %s", x.Status, x.Body)
	}
	if r, _ := b.SeatHold(t, sku, "b1", "bob", "A-01"); r.Status != 201 {
		t.Errorf("bob's hold of A-01, free in the ledger = %d %s, want 201", r.Status, r.Body)
	}
	if d := check("after the cancel"); len(d) != 0 {
		t.Errorf("seat check after the cancel differed %v, want []", d)
	}
}

// A best-available seat hold the ticket's settings refuse (over the
// per-order maximum, a lifetime over the ticket's, an ended sale) moves
// nothing: before, Redis picked and held the seats first and nothing gave
// them back, so anyone could block a section with refused requests.
func TestAttackRefusedBestSeatsHoldNothing(t *testing.T) {
	systest.FullTier(t)
	e := systest.New(t, ledger.SQLite)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 0, 1, 4)
	e.LoadSeats(t, sku, map[string]int{"A": 8})
	path := "/v1/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/seat-holds"
	for i, body := range []string{
		`{"buyer":"mal","quantity":4,"ttl_seconds":5000}`,
		`{"buyer":"mal","quantity":4,"section":"A","ttl_seconds":86400}`,
		`{"buyer":"mal","quantity":6,"section":"A"}`,
	} {
		r := e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": fmt.Sprintf("bad-%d", i)}, body)
		if r.Status != http.StatusUnprocessableEntity {
			t.Errorf("%s = %d %s, want 422", body, r.Status, r.Body)
		}
	}
	if r := e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/end", nil, ""); r.Status != http.StatusOK {
		t.Fatalf("end = %d %s", r.Status, r.Body)
	}
	if r := e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "after-end"}, `{"buyer":"mal","quantity":4}`); r.Status != http.StatusConflict {
		t.Errorf("best seats after the end = %d %s, want 409", r.Status, r.Body)
	}
	var check sale.SeatCheck
	cr := e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/seats/check", nil, "")
	if err := json.Unmarshal(cr.Body, &check); err != nil || cr.Status != http.StatusOK {
		t.Fatalf("check = %d %s", cr.Status, cr.Body)
	}
	if len(check.Differed) != 0 {
		t.Errorf("refused seat holds left seats held in Redis: %v", check.Differed)
	}
}

// A seat map upload that moves a seat the map has (another section) is
// refused whole and changes nothing, in the ledger or in Redis.
func TestAttackSeatMapCannotMoveASeat(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 0, 1, 4)
		e.LoadSeats(t, sku, map[string]int{"A": 2})
		r := e.Do(t, http.MethodPut, systest.AdminPath(sku)+"/seats", nil,
			`{"seats":[{"id":"B-01","section":"B","row":"1","number":1},{"id":"A-01","section":"B","row":"1","number":2}]}`)
		if r.Status != http.StatusConflict || !strings.Contains(string(r.Body), "A-01") {
			t.Errorf("moving A-01 to section B = %d %s, want 409 naming A-01", r.Status, r.Body)
		}
		if r := e.Do(t, http.MethodGet, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/seats", nil, ""); !strings.Contains(string(r.Body), `"free":2`) || strings.Contains(string(r.Body), "B-01") {
			t.Errorf("seats after the refused upload = %s, want the 2 seats of A only", r.Body)
		}
		if r, _ := e.SeatHold(t, sku, "h", "ann", "A-01", "A-02"); r.Status != http.StatusCreated {
			t.Errorf("hold of A-01, A-02 = %d %s", r.Status, r.Body)
		}
	})
}

// A seat map no ledger can keep is the admin's mistake: 422, nothing
// loaded (helper-33: a number past 2^31-1 or a NUL in a row was a 503
// "outcome unknown" on PostgreSQL, whose INTEGER and text can't hold
// them, every time it was sent; SQLite took the number).
func TestSeatMapOutOfBoundsRefused(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 0, 1, 4)
		for _, seat := range []string{
			`{"id":"A-01","section":"A","row":"A","number":3000000000}`,
			`{"id":"A-01","section":"A","row":"A","number":2147483648}`,
			`{"id":"A-01","section":"A","row":"\u0000","number":1}`,
			`{"id":"A-01","section":"A","row":"A\nB","number":1}`,
			`{"id":"A-01","section":"A","row":"A","number":9223372036854775807}`,
		} {
			r := e.Do(t, http.MethodPut, systest.AdminPath(sku)+"/seats", nil, `{"seats":[`+seat+`]}`)
			if r.Status != http.StatusUnprocessableEntity || !strings.Contains(string(r.Body), "invalid-field") {
				t.Errorf("seat %s = %d %s, want 422 invalid-field", seat, r.Status, r.Body)
			}
		}
		if st, err := e.Ledger.SKU(context.Background(), sku); err != nil || st.Seated || st.Total != 0 {
			t.Errorf("after the refused maps: %+v %v, want no seats", st, err)
		}
		e.LoadSeats(t, sku, map[string]int{"A": 2}) // the bounds themselves are fine
	})
}

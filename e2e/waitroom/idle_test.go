package waitroom_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/stock"
)

// A replica with many programs and waiting rooms that have nothing to do
// (sold out, ended, not open yet) sends Redis next to nothing once its
// pacer has looked at each: the rooms sleep until stock comes back or they
// open, instead of being stepped five times a second. And a sleeping
// sold-out room still wakes when a ticket comes back: its next buyer is
// admitted.
func TestIdleRoomsCostNothing(t *testing.T) {
	t.Parallel() // its own env: its waits overlap the others'
	e := systest.Start(t, systest.Options{Driver: "sqlite", Pacer: true, Sweep: true, Tune: func(o *app.Options) {
		o.Sale.DriftEvery = time.Hour // this test counts the pacer's calls, not the drift check's
		// The harness's 1 s lock lapses when two renewals in a row miss
		// their 300 ms on a loaded machine (CI: 87 calls in 3 s, each of
		// the 40 rooms looked at again by the pacer that took over). A
		// new pacer looking at every room is by design; this test counts
		// a pacer at rest.
		o.Lock = lock.Options{TTL: 10 * time.Second, CallTimeout: time.Second}
	}})
	const programs, rooms = 100, 40
	room := func(p keys.ID, opensIn int) {
		t.Helper()
		r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+p.String()+"/queue", nil,
			fmt.Sprintf(`{"opens_in_seconds":%d,"rate_per_second":50,"window_seconds":60,"per_remaining":1}`, opensIn))
		if r.Status != http.StatusOK {
			t.Fatalf("PUT queue = %d %s", r.Status, r.Body)
		}
	}
	var soldOut stock.SKU
	for i := range programs {
		sku := stock.SKU{Program: keys.MustID(fmt.Sprintf("idle%d", i)), Ticket: keys.MustID("ga")}
		total := int64(10)
		if i < rooms/2 {
			total = 0 // sold out
		}
		e.PutSKU(t, sku, total, 2, 4)
		switch {
		case i < rooms/2:
			room(sku.Program, 0)
			soldOut = sku
		case i < rooms*3/4:
			if r := e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/end", nil, ""); r.Status != http.StatusOK {
				t.Fatalf("end = %d %s", r.Status, r.Body)
			}
			room(sku.Program, 0)
		case i < rooms:
			room(sku.Program, 3600) // opens in an hour
		}
	}
	// The pacer has looked at every room once: the sold-out ones say so.
	systest.WaitFor(t, 20*time.Second, "every sold-out room closed", func() bool {
		for i := range rooms / 2 {
			r := e.Do(t, http.MethodGet, fmt.Sprintf("/v1/admin/programs/idle%d/queue", i), nil, "")
			if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"sold_out":true`) {
				return false
			}
		}
		return true
	})
	c0, t0 := systest.Counter(t, e.Registry, "stockgate_redis_calls_total", nil), time.Now()
	systest.WaitFor(t, 10*time.Second, "three seconds of rest", func() bool { return time.Since(t0) >= 3*time.Second })
	calls, secs := systest.Counter(t, e.Registry, "stockgate_redis_calls_total", nil)-c0, time.Since(t0).Seconds()
	// Stepped five times a second, the 40 rooms alone made 200 calls a
	// second; asleep, what is left is the pacer's lock.
	if calls/secs > 10 {
		t.Errorf("an idle replica with %d rooms made %.0f Redis calls in %.1f s (%.1f/s), want at most 10/s", rooms, calls, secs, calls/secs)
	}
	t.Logf("idle: %.0f Redis calls in %.1f s", calls, secs)

	// A buyer waits in a sleeping sold-out room's line; a ticket comes
	// back: she is admitted and buys it.
	r, ann := queueJoin(t, e, soldOut.Program, "ann")
	if r.Status != http.StatusCreated {
		t.Fatalf("join = %d %s", r.Status, r.Body)
	}
	e.PutSKU(t, soldOut, 1, 2, 4)
	ann = untilAdmitted(t, e, soldOut.Program, ann.Ticket, "ann admitted after the restock", 20*time.Second)
	if r := buyWith(t, e, soldOut, "ann-1", "ann", 1, ann.Admission); r.Status != http.StatusCreated {
		t.Fatalf("ann buys the restocked ticket = %d %s", r.Status, r.Body)
	}
}

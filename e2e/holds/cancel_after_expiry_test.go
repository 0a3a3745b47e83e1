package holds_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/stock"
)

// A hold's fate is fixed at its expiry: a cancel that comes after it
// (the sweeper not run yet) ends the hold expired, as a read of it
// already said, answering 200 with state "expired"; a retry answers the
// same; the report and the events count one expiry and no cancel, and
// the units are back once.
func TestCancelAfterTheExpiryEndsItExpired(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver) // no sweeper: the hold stays held in the ledger past its expiry
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 10, 1, 4)
		r, h := e.Hold(t, sku, "h1", "ann", 3, 1)
		if r.Status != http.StatusCreated {
			t.Fatalf("hold = %d %s", r.Status, r.Body)
		}
		state := func() string { return e.HoldState(t, h.HoldID) }
		systest.WaitFor(t, 10*time.Second, "the hold read as expired", func() bool { return state() == "expired" })
		for n := range 2 { // the cancel, then its retry
			r := e.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c1", "ann")
			var got systest.HoldReply
			_ = json.Unmarshal(r.Body, &got)
			if r.Status != http.StatusOK || got.State != "expired" {
				t.Fatalf("cancel %d after the expiry = %d %s, want 200 with state expired", n, r.Status, r.Body)
			}
		}
		if s := state(); s != "expired" {
			t.Fatalf("hold after the cancel reads %q", s)
		}
		rep := reportOf(t, e, sku.Program)
		if !rep.Balanced || rep.SKUs[0].Held != 0 {
			t.Errorf("report: %+v", rep)
		}
		st, err := e.Ledger.SKU(t.Context(), sku)
		if err != nil || st.Remaining() != 10 || st.Held != 0 {
			t.Fatalf("ledger after the cancel: %+v %v", st, err)
		}
		systest.WaitSettled(t, e, sku)
		types := eventTypes(t, e, sku)
		if types["hold.expired"] != 1 || types["hold.cancelled"] != 0 {
			t.Errorf("events %v, want one hold.expired and no hold.cancelled", types)
		}
	})
}

// eventTypes counts the events of sku's program by type.
func eventTypes(t *testing.T, e *systest.Env, sku stock.SKU) map[string]int {
	t.Helper()
	evs, err := e.Ledger.Events(t.Context(), sku.Program, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, ev := range evs {
		n[ev.Type]++
	}
	return n
}

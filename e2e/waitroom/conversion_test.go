package waitroom_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
)

// A room's sold-out share: validated, 0.05 unless set, shown with the
// line's conversion. Buyers who let their windows pass teach the pacer the
// line converts poorly: a room with a share then admits past the tickets
// left, and one with share 0 never does.
func TestQueueSoldOutShare(t *testing.T) {
	t.Parallel() // its own env and programs
	e := systest.Start(t, systest.Options{Driver: "sqlite", Pacer: true})
	const tickets, buyers = 5, 80
	room := func(share string) string {
		return fmt.Sprintf(`{"opens_in_seconds":0,"rate_per_second":1000,"window_seconds":1,"per_remaining":1%s}`, share)
	}
	bad := systest.NewSKU(t)
	e.PutSKU(t, bad, tickets, 1, 1)
	for _, share := range []string{"-0.1", "0.51", `"0.1"`} {
		r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+bad.Program.String()+"/queue", nil, room(`,"sold_out_share":`+share))
		if r.Status != http.StatusUnprocessableEntity && r.Status != http.StatusBadRequest {
			t.Errorf("sold_out_share %s = %d %s, want 4xx", share, r.Status, r.Body)
		}
	}
	putQueue(t, e, bad.Program, room(""))
	if v := getRoom(t, e, bad.Program); v.SoldOutShare != 0.05 || v.Conversion != 1 {
		t.Fatalf("a room with no share set: %+v, want 0.05 and conversion 1", v)
	}

	withShare, without := systest.NewSKU(t), systest.NewSKU(t)
	e.PutSKU(t, withShare, tickets, 1, 1)
	e.PutSKU(t, without, tickets, 1, 1)
	putQueue(t, e, withShare.Program, room(`,"sold_out_share":0.5`))
	putQueue(t, e, without.Program, room(`,"sold_out_share":0`))
	for i := range buyers {
		for _, p := range []keys.ID{withShare.Program, without.Program} {
			if r, _ := queueJoin(t, e, p, fmt.Sprintf("w%d", i)); r.Status != http.StatusCreated {
				t.Fatalf("join = %d %s", r.Status, r.Body)
			}
		}
	}
	// Nobody buys: every window passes. The room with a share learns it
	// and lets more in than there are tickets; the other never does.
	// The two rooms' windows lapse on their own ticks, so each is waited
	// for: the one with a share past its tickets, the other with windows
	// abandoned (it has learned the same) and never past them.
	most := int64(0)
	systest.WaitFor(t, 30*time.Second, "the room with a share admitting past the tickets left, the other abandoning", func() bool {
		v := getRoom(t, e, without.Program)
		most = max(most, v.Unused)
		w := getRoom(t, e, withShare.Program)
		return w.Unused > tickets && w.Conversion < 1 && v.Abandoned > 0
	})
	if v := getRoom(t, e, without.Program); max(most, v.Unused) > tickets || v.Abandoned == 0 {
		t.Fatalf("share 0: %d admitted-but-unused at most for %d tickets (%+v)", max(most, v.Unused), tickets, v)
	}
}

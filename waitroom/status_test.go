package waitroom

import (
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// When a waiting buyer is told to look again: the estimate's quarter
// within half the window as before, and, as the stock runs down, at most
// a third of the time what is left lasts at the pace it sells, in whole
// seconds (a second at least); a second once nothing is left but holds, or the last few
// tickets are within reach of the buyers admitted (5 unused here). A sold-out answer says
// when to look for a returned ticket.
func TestRetryAfterShortensAsTheStockRunsDown(t *testing.T) {
	c := roomOf(ledger.QueueConfig{Program: keys.MustID("show"), Secret: "aa11", Rate: 100, Window: time.Minute,
		PerRemaining: 1000, OpensAt: time.Now().Add(-time.Hour)})
	buyer := keys.MustID("ann")
	place := Place{N: 100} // a late join: position 100
	line := State{Opened: true, Late: 200, Serving: 10, Unused: 5}
	cases := []struct {
		name       string
		left, held int64
		drain      float64
		state      string
		retry      time.Duration
	}{
		{"no sales seen yet", 50, 0, -1, Waiting, 22500 * time.Millisecond}, // 90 ahead at 1/s: 90 s / 4
		{"selling 10 a second", 70, 0, 10, Waiting, 2 * time.Second},        // 7 s left: a third, whole seconds
		{"selling 10 a second, 5 s left", 50, 0, 10, Waiting, time.Second},
		{"selling 100 a second", 50, 0, 100, Waiting, time.Second},
		{"held ones count as left", 60, 10, 10, Waiting, 2 * time.Second},
		{"only holds left", 0, 3, 0, Waiting, time.Second},
		{"the last few, within reach of the admitted", 5, 0, 0.1, Waiting, time.Second},
		{"the last few, nobody admitted to buy them", 6, 0, 0.1, Waiting, 20 * time.Second}, // 60 s left: a third
		{"sold out", 0, 0, 10, SoldOut, soldOutRecheck},
	}
	for _, tc := range cases {
		v := lineView{st: line, stock: ledger.ProgramStock{SKUs: 1, Remaining: tc.left, Held: tc.held}, pace: 1, drain: tc.drain, peak: tc.drain}
		st := queueStatus(c, v, buyer, place, "ticket")
		if st.State != tc.state || st.RetryAfter != tc.retry {
			t.Errorf("%s: %s, Retry-After %v; want %s, %v", tc.name, st.State, st.RetryAfter, tc.state, tc.retry)
		}
	}
	// A pause after a faster pace: 135 left at 15 a second, having sold
	// at 70, is under two seconds of its fastest.
	slowed := lineView{st: line, stock: ledger.ProgramStock{SKUs: 1, Remaining: 135}, pace: 1, drain: 15, peak: 70}
	if st := queueStatus(c, slowed, buyer, place, "ticket"); st.RetryAfter != time.Second {
		t.Errorf("135 left at 15 a second after 70: Retry-After %v, want 1s", st.RetryAfter)
	}
	// A room admitting past the tickets left pauses while more are
	// admitted than tickets left, then lets the rest in at once: a
	// second for the last few tickets at the fastest pace the line sold
	// at, however slowly they sell in the pause.
	shared := roomOf(ledger.QueueConfig{Program: keys.MustID("show"), Secret: "aa11", Rate: 100, Window: time.Minute,
		PerRemaining: 1000, SoldOutShare: 50, OpensAt: time.Now().Add(-time.Hour)})
	paused := State{Opened: true, Late: 200, Serving: 40, Unused: 30}
	for _, tc := range []struct {
		c     room
		left  int64
		peak  float64
		retry time.Duration
	}{
		{shared, 25, 3, time.Second},     // a third of 8.3 s at its fastest would be 2 s
		{shared, 31, 3, 3 * time.Second}, // more left than admitted: a third of 10.3 s
		{c, 25, 3, 2 * time.Second},      // share 0: nobody is let in past the tickets left
		{shared, 25, 2, 4 * time.Second}, // not the last few: 12.5 s at its fastest
	} {
		v := lineView{st: paused, stock: ledger.ProgramStock{SKUs: 1, Remaining: tc.left}, pace: 1, drain: 0.5, peak: tc.peak}
		if st := queueStatus(tc.c, v, buyer, place, "ticket"); st.RetryAfter != tc.retry {
			t.Errorf("paused line, share %v, %d left: Retry-After %v, want %v", tc.c.SoldOutShare, tc.left, st.RetryAfter, tc.retry)
		}
	}
}

// The sales pace a replica reads follows a sale that speeds up at its end
// within a few readings: 10 tickets a second for 20 s, then 100 a second.
// The slow average alone reads under 40 a second after the burst's first
// second; the pace that shortens Retry-After must not.
func TestDrainFollowsTheSalesEndingBurst(t *testing.T) {
	d := &drainPace{fast: linePace{span: drainFastSpan}}
	var peak float64
	now := time.Unix(0, 0)
	sold := int64(0)
	step := Refresh
	for range 80 { // 20 s at 10 a second
		sold += 10 * int64(step) / int64(time.Second)
		now = now.Add(step)
		d.see(sold, now)
	}
	var got float64
	for range 4 { // one second at 100 a second
		sold += 25
		now = now.Add(step)
		got, peak = d.see(sold, now)
	}
	if slow := d.slow.get(); slow >= 40 {
		t.Fatalf("the slow average reads %.1f a second: the test no longer shows a lag", slow)
	}
	if got < 50 {
		t.Errorf("after a second at 100 a second the pace reads %.1f, want at least 50", got)
	}
	if peak < got {
		t.Errorf("the peak %.1f is under the pace %.1f", peak, got)
	}
	// A pause: the pace falls, the peak stays; stock that comes back
	// starts it again.
	for range 20 {
		now = now.Add(step)
		got, peak = d.see(sold, now)
	}
	if got >= 40 || peak < 50 {
		t.Errorf("after 5 s of no sales: pace %.1f, peak %.1f; want the pace down and the peak kept", got, peak)
	}
	if _, peak = d.see(sold-10, now.Add(step)); peak > 50 {
		t.Errorf("stock came back: peak %.1f, want it started again", peak)
	}
}

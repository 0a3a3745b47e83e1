package waitroom

import (
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// When a waiting buyer is told to look again: the estimate's quarter
// within half the window as before, and, as the stock runs down, at most
// half the time what is left lasts at the pace it sells (a second at
// least); a second once nothing is left but holds, or the last few
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
		{"selling 10 a second", 50, 0, 10, Waiting, 2500 * time.Millisecond},
		{"selling 100 a second", 50, 0, 100, Waiting, time.Second},
		{"held ones count as left", 40, 10, 10, Waiting, 2500 * time.Millisecond},
		{"only holds left", 0, 3, 0, Waiting, time.Second},
		{"the last few, within reach of the admitted", 5, 0, 0.1, Waiting, time.Second},
		{"the last few, nobody admitted to buy them", 6, 0, 0.1, Waiting, 22500 * time.Millisecond},
		{"sold out", 0, 0, 10, SoldOut, soldOutRecheck},
	}
	for _, tc := range cases {
		v := lineView{st: line, stock: ledger.ProgramStock{SKUs: 1, Remaining: tc.left, Held: tc.held}, pace: 1, drain: tc.drain}
		st := queueStatus(c, v, buyer, place, "ticket")
		if st.State != tc.state || st.RetryAfter != tc.retry {
			t.Errorf("%s: %s, Retry-After %v; want %s, %v", tc.name, st.State, st.RetryAfter, tc.state, tc.retry)
		}
	}
}

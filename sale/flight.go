package sale

import (
	"sync"
	"sync/atomic"
	"time"
)

// flight bounds the takes (purchases, holds, carts) one replica has in
// flight: at most what it finished in the last second times the wait
// budget (Little's law: about a budget's worth of queue), and never fewer
// than floor. A replica whose cores, Redis or ledger are saturated then
// refuses the excess at once, before it costs anything (ErrBusy: 503 with
// Retry-After), instead of letting every request wait longer; the floor
// keeps a quiet replica's first burst (an on-sale's opening) from being
// refused before it has a pace to go by.
type flight struct {
	floor  int64
	budget time.Duration
	now    func() time.Time
	n      atomic.Int64
	mu     sync.Mutex
	sec    int64 // the second cur counts
	cur    int64 // takes finished in second sec
	last   int64 // in the second before it
}

func newFlight(floor int64, budget time.Duration) *flight {
	return &flight{floor: floor, budget: budget, now: time.Now}
}

// enter takes a place, false when the replica has as many in flight as it
// may; leave gives it back.
func (f *flight) enter() bool {
	if f.floor <= 0 || f.budget <= 0 {
		return true // no bound
	}
	limit := f.limit()
	if f.n.Add(1) > limit {
		f.n.Add(-1)
		return false
	}
	return true
}

func (f *flight) leave() {
	if f.floor <= 0 || f.budget <= 0 {
		return
	}
	f.n.Add(-1)
	f.mu.Lock()
	f.roll()
	f.cur++
	f.mu.Unlock()
}

// limit is what may be in flight now.
func (f *flight) limit() int64 {
	f.mu.Lock()
	f.roll()
	rate := f.last
	f.mu.Unlock()
	return max(f.floor, int64(float64(rate)*f.budget.Seconds()))
}

// roll moves the counts on to the current second (mu held).
func (f *flight) roll() {
	sec := f.now().Unix()
	switch {
	case sec == f.sec:
	case sec == f.sec+1:
		f.sec, f.last, f.cur = sec, f.cur, 0
	default: // a second or more with nothing finished
		f.sec, f.last, f.cur = sec, 0, 0
	}
}

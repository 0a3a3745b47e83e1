package sale

import (
	"context"
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
//
// A take that waits for a primary (resendWithoutPrimary: a failover
// under way) parks: it gives its place back while it waits and sends its
// write again. It was let in under the bound already; what the bound is
// for is new work. Counted against it, the takes waiting out a planned
// failover's 2 s without a primary filled it within 0.6 s at 1,700 a
// second, and the rest of the gap was refused (1,412 of 90,200 answered
// 503, stockbench faults). The parked are bounded of their own
// (parkFactor times the floor); each waits no longer than its request's
// deadline anyway.
//
// For a work timeout (patience) after a take is sent again, the new
// takes wait out the backlog the failover's gap left (the commit lanes'
// patient items) rather than being shed by the budget, so the bound is
// the pace before the gap (the most finished in a second within the
// patience) times half the patience: counted with the
// budget's quarter second, 1,075 of 93,757 were refused while that
// backlog drained (stockbench faults, 1,769 a second).
type flight struct {
	floor    int64
	budget   time.Duration
	patience time.Duration
	now      func() time.Time
	n        atomic.Int64
	parked   atomic.Int64
	// patientUntil: Unix ns until which the bound is the patient one.
	patientUntil atomic.Int64
	mu           sync.Mutex
	sec          int64 // the second cur counts
	cur          int64 // takes finished in second sec
	last         int64 // in the second before it
	// done counts the takes finished in each of the last ringSeconds
	// seconds (by second modulo ringSeconds): the most of them within
	// the patience is the pace a failover's gap interrupted, which the
	// patient bound goes by (peak).
	done [ringSeconds]struct{ sec, n int64 }
}

// ringSeconds is how many seconds of finished takes flight keeps; a
// patience of more is cut to it.
const ringSeconds = 16

func newFlight(floor int64, budget, patience time.Duration) *flight {
	return &flight{floor: floor, budget: budget, patience: patience, now: time.Now}
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

// parkFactor times the floor takes may be parked at once.
const parkFactor = 8

// heldPlaceKey marks the context of a take that holds a place (runTake).
type heldPlaceKey struct{}

// holdingPlace marks ctx as a take's that entered: only such a take has a
// place to give back while it waits (park). A late payment's take runs
// under its confirm, outside the bound: parked, it would give back a
// place it never took and let one more new take in than the bound says.
func holdingPlace(ctx context.Context) context.Context {
	return context.WithValue(ctx, heldPlaceKey{}, true)
}

// park gives the place of ctx's take back while it waits for a primary,
// false when it holds none (see holdingPlace) or as many are parked as may be
// (the take then ends as it would have without the wait); unpark takes
// the place again, past the bound if need be: the take was let in and
// holds its stock, and refusing it now would only waste its wait.
func (f *flight) park(ctx context.Context) bool {
	if ctx.Value(heldPlaceKey{}) == nil {
		return false
	}
	if f.floor <= 0 || f.budget <= 0 {
		return true
	}
	if f.parked.Add(1) > parkFactor*f.floor {
		f.parked.Add(-1)
		return false
	}
	f.n.Add(-1)
	return true
}

// resent marks a take sent again (a failover's gap): the bound is the
// patient one for the next patience.
func (f *flight) resent() {
	f.patientUntil.Store(f.now().Add(f.patience).UnixNano())
}

func (f *flight) unpark() {
	if f.floor <= 0 || f.budget <= 0 {
		return
	}
	f.n.Add(1)
	f.parked.Add(-1)
}

// limit is what may be in flight now.
func (f *flight) limit() int64 {
	f.mu.Lock()
	f.roll()
	rate := f.last
	patient := f.now().UnixNano() < f.patientUntil.Load()
	var peak int64
	if patient {
		peak = f.peak()
	}
	f.mu.Unlock()
	wait := f.budget
	if patient {
		// Waiting out a failover: its gap finished next to nothing, so
		// the last second's count would shrink the bound to the floor
		// just as the gap's arrivals need it (at 1,800 a second, a
		// 1.5 s gap refused 375-1,234 of them, stockbench faults). The
		// pace before the gap is what the backlog drains at once a
		// primary takes writes.
		// Half the patience, not all a take may wait: let in for longer
		// gaps, the arrivals of a two-standby formation's 3-4 s gap
		// waited most of their time and were refused then, late (1.3 %,
		// 6.5 % and 3.0 % of a run 503, against 1.3-1.7 % at half).
		wait, rate = max(wait, f.patience/2), max(rate, peak)
	}
	return max(f.floor, int64(float64(rate)*wait.Seconds()))
}

// roll moves the counts on to the current second (mu held).
func (f *flight) roll() {
	sec := f.now().Unix()
	if sec == f.sec {
		return
	}
	f.done[f.sec%ringSeconds] = struct{ sec, n int64 }{f.sec, f.cur}
	if sec == f.sec+1 {
		f.sec, f.last, f.cur = sec, f.cur, 0
	} else { // a second or more with nothing finished
		f.sec, f.last, f.cur = sec, 0, 0
	}
}

// peak is the most takes finished in one whole second within the last
// patience (mu held, rolled): a sliding maximum, so the pace before a
// gap stands for as long as the patience, however old the record second
// was when the gap began (a peak kept as one second and replaced once
// older than the patience fell to the gap's own count mid-gap;
// helper-87 #2).
func (f *flight) peak() int64 {
	// Whole seconds, rounded up: a patience of 1.5 s looks back two.
	window := min(int64((f.patience+time.Second-1)/time.Second), ringSeconds-1)
	var most int64
	for _, d := range f.done {
		if age := f.sec - d.sec; age >= 1 && age <= window {
			most = max(most, d.n)
		}
	}
	return most
}

package sale

import (
	"context"
	"testing"
	"time"
)

// A replica's bound of takes in flight is its floor until it has a pace,
// then what it finished in the last second times the budget; a take past
// it is refused, and one finishing makes room again. The clock is the
// test's.
func TestFlightBound(t *testing.T) {
	clock := time.Unix(1000, 0)
	f := newFlight(2, 250*time.Millisecond, 5*time.Second)
	f.now = func() time.Time { return clock }
	if first, second := f.enter(), f.enter(); !first || !second {
		t.Fatal("a take within the floor was refused")
	}
	if f.enter() {
		t.Fatal("a third take in flight with a floor of 2 and no pace was let in")
	}
	f.leave()
	if !f.enter() {
		t.Fatal("a take was refused after one finished")
	}
	f.leave()
	f.leave()
	// 40 finish in one second: the next second's bound is 40 × 0.25 = 10.
	finish(t, f, 40)
	clock = clock.Add(time.Second)
	if got := f.limit(); got != 10 {
		t.Fatalf("limit after 40 finished in a second = %d, want 10", got)
	}
	for i := range 10 {
		if !f.enter() {
			t.Fatalf("take %d of 10 refused", i+1)
		}
	}
	if f.enter() {
		t.Fatal("an eleventh take let in with a bound of 10")
	}
	// A quiet second later the pace is forgotten: the floor again.
	clock = clock.Add(3 * time.Second)
	if got := f.limit(); got != 2 {
		t.Fatalf("limit after a quiet spell = %d, want the floor 2", got)
	}
	// No bound when turned off.
	off := newFlight(-1, 250*time.Millisecond, 5*time.Second)
	for range 100 {
		if !off.enter() {
			t.Fatal("refused with no bound")
		}
	}
}

// A take waiting for a primary parks: its place goes to new work, up to
// parkFactor times the floor parked; back, it takes its place past the
// bound. After a re-send the bound is the pace times half the patience,
// for the patience, then the budget's again.
func TestFlightParksAndWaitsOutAFailover(t *testing.T) {
	clock := time.Unix(1000, 0)
	f := newFlight(2, 250*time.Millisecond, 4*time.Second)
	f.now = func() time.Time { return clock }
	ctx := holdingPlace(context.Background())
	for i := range 2 {
		if !f.enter() {
			t.Fatalf("take %d of the floor's 2 refused", i+1)
		}
	}
	if f.enter() {
		t.Fatal("a third take let in with a floor of 2")
	}
	if !f.park(ctx) {
		t.Fatal("a take could not park")
	}
	if !f.enter() {
		t.Fatal("a parked take's place was not given to a new one")
	}
	f.unpark()
	if got := f.n.Load(); got != 3 {
		t.Fatalf("in flight after the parked take came back = %d, want 3 (past the bound)", got)
	}
	// A take that never entered (a late payment's, under its confirm)
	// has no place to give: it waits in none, and lets no one in.
	if f.park(context.Background()) {
		t.Fatal("a take outside the bound parked")
	}
	if got := f.n.Load(); got != 3 {
		t.Fatalf("in flight after a take outside the bound tried to park = %d, want 3", got)
	}
	for range 3 {
		f.leave()
	}
	for i := range parkFactor * 2 {
		if !f.park(ctx) {
			t.Fatalf("park %d of %d refused", i+1, parkFactor*2)
		}
	}
	if f.park(ctx) {
		t.Fatal("parked past parkFactor times the floor")
	}
	for range parkFactor * 2 {
		f.unpark()
		f.leave()
	}
	// A quiet spell, then 40 finished in a second: the budget's bound is
	// 10, the patient 80.
	clock = clock.Add(2 * time.Second)
	finish(t, f, 40)
	clock = clock.Add(time.Second)
	if got := f.limit(); got != 10 {
		t.Fatalf("limit = %d, want 10", got)
	}
	f.resent()
	if got := f.limit(); got != 80 {
		t.Fatalf("limit after a re-send = %d, want 40 × 2 s = 80", got)
	}
	// A patience after the re-send, 40 more in the second before: the
	// budget's bound again.
	clock = clock.Add(3 * time.Second)
	finish(t, f, 40)
	clock = clock.Add(time.Second)
	if got := f.limit(); got != 10 {
		t.Fatalf("limit a patience after the re-send = %d, want the budget's 10", got)
	}
}

// finish lets n takes in and out of f within its clock's second.
func finish(t *testing.T, f *flight, n int) {
	t.Helper()
	for range n {
		if !f.enter() {
			t.Fatal("a take refused while none was in flight")
		}
		f.leave()
	}
}

// A failover's gap finishes next to nothing: while the takes wait it out
// (a re-send), the bound goes by the pace before the gap, not by the
// empty second, so the gap's arrivals are let in to wait; once the
// patience has passed the pace is the last second's again.
func TestFlightKeepsItsPaceThroughAGap(t *testing.T) {
	clock := time.Unix(1000, 0)
	f := newFlight(2, 250*time.Millisecond, 4*time.Second)
	f.now = func() time.Time { return clock }
	finish(t, f, 400)
	clock = clock.Add(time.Second)
	finish(t, f, 3) // the gap begins: three more finish
	f.resent()
	clock = clock.Add(time.Second)
	if got := f.limit(); got != 800 {
		t.Fatalf("limit a second into a gap after 400 a second = %d, want 400 × 2 s = 800", got)
	}
	clock = clock.Add(time.Second) // nothing finished in the second before
	if got := f.limit(); got != 800 {
		t.Fatalf("limit two seconds into the gap = %d, want 800", got)
	}
	// The patience passed with no re-send, 40 a second since: the
	// budget's bound on the last second.
	clock = clock.Add(3 * time.Second)
	finish(t, f, 40)
	clock = clock.Add(time.Second)
	if got := f.limit(); got != 10 {
		t.Fatalf("limit after the gap and the patience = %d, want 40 × 0.25 = 10", got)
	}
	// A later gap goes by the pace of its own time, not the first's.
	finish(t, f, 40)
	clock = clock.Add(time.Second)
	f.resent()
	clock = clock.Add(time.Second)
	if got := f.limit(); got != 80 {
		t.Fatalf("limit in a second gap after 40 a second = %d, want 80", got)
	}
}

// The pace before a gap stands through it however old the busiest second
// was when the gap began: kept as one record second and replaced once
// older than the patience, it fell to the gap's own count (3) a second
// into a gap that began as the record aged out, and the bound to its
// floor just as the gap's arrivals needed room (helper-87 #2).
func TestFlightPaceOutlivesAnAgedRecord(t *testing.T) {
	clock := time.Unix(1000, 0)
	f := newFlight(2, 250*time.Millisecond, 4*time.Second)
	f.now = func() time.Time { return clock }
	finish(t, f, 800) // the record, at second 0
	for range 3 {     // seconds 1-3: the steady pace
		clock = clock.Add(time.Second)
		finish(t, f, 400)
	}
	clock = clock.Add(time.Second)
	finish(t, f, 3) // second 4: the gap begins
	f.resent()
	for sec := 5; sec <= 7; sec++ {
		clock = clock.Add(time.Second)
		if got := f.limit(); got != 800 {
			t.Fatalf("limit at second %d, in a gap after 400 a second = %d, want 400 × 2 s = 800", sec, got)
		}
	}
}

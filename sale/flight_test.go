package sale

import (
	"testing"
	"time"
)

// A replica's bound of takes in flight is its floor until it has a pace,
// then what it finished in the last second times the budget; a take past
// it is refused, and one finishing makes room again. The clock is the
// test's.
func TestFlightBound(t *testing.T) {
	clock := time.Unix(1000, 0)
	f := newFlight(2, 250*time.Millisecond)
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
	for range 40 {
		if !f.enter() {
			t.Fatal("refused within the floor")
		}
		f.leave()
	}
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
	off := newFlight(-1, 250*time.Millisecond)
	for range 100 {
		if !off.enter() {
			t.Fatal("refused with no bound")
		}
	}
}

package sale

import (
	"testing"
	"time"
)

// One line of a kind a second goes through; the next one says how many
// were left out; kinds are counted apart.
func TestLogEvery(t *testing.T) {
	var l logEvery
	t0 := time.Unix(1000, 0)
	if ok, n := l.allow("ledger commit", t0); !ok || n != 0 {
		t.Fatalf("first line = %v %d, want through", ok, n)
	}
	for i := range 5 {
		if ok, _ := l.allow("ledger commit", t0.Add(time.Duration(i+1)*100*time.Millisecond)); ok {
			t.Fatalf("line %d within the second went through", i)
		}
	}
	if ok, _ := l.allow("other", t0.Add(time.Millisecond)); !ok {
		t.Fatal("another kind's first line was held back")
	}
	if ok, n := l.allow("ledger commit", t0.Add(time.Second)); !ok || n != 5 {
		t.Fatalf("a second later = %v %d, want through saying 5 were left out", ok, n)
	}
}

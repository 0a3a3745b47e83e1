package wait

import (
	"sync/atomic"
	"testing"
	"time"
)

// Until returns once the condition holds, and reports false when it
// never does within the time.
func TestUntil(t *testing.T) {
	var n atomic.Int64
	if !Until(10*time.Second, func() bool { return n.Add(1) >= 5 }) {
		t.Fatal("a condition that holds on the fifth check was not waited for")
	}
	if got := n.Load(); got != 5 {
		t.Fatalf("checked %d times, want 5 (no check after it held)", got)
	}
	if Until(5*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds was reported held")
	}
}

// Package wait is the tests' one way to wait for a condition: polled,
// bounded, and failing the test with what it waited for. A test waits for
// what it needs to be true, never for a fixed time: on a busy 2-core
// machine any fixed time is sometimes too short.
package wait

import (
	"testing"
	"time"
)

// maxPoll bounds the pause between two checks: the first checks come a
// millisecond apart (a unit test's condition is usually a moment away),
// later ones back off so a long wait costs the machine little.
const maxPoll = 20 * time.Millisecond

// For checks ok until it holds, and fails t (Fatal) if it does not
// within the given time; what says what was waited for.
func For(t testing.TB, within time.Duration, what string, ok func() bool) {
	t.Helper()
	if !Until(within, ok) {
		t.Fatalf("no %s within %v", what, within)
	}
}

// Until checks ok until it holds or the time is up, and reports whether
// it held: for a caller that fails with more than For says.
func Until(within time.Duration, ok func() bool) bool {
	deadline := time.Now().Add(within)
	for pause := time.Millisecond; !ok(); pause = min(2*pause, maxPoll) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
	}
	return true
}

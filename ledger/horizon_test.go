package ledger

import "testing"

// The horizon settles a note once the oldest running transaction is
// past the note's id, never before, and starts again when the sequence
// goes back (a promoted standby that had not replayed all of it): the
// old primary's settled seq would otherwise serve events on the new one
// without waiting for the transactions below them (helper-59).
func TestHorizon(t *testing.T) {
	var h horizon
	if got := h.settle(10, 100, 100); got != 10 {
		t.Fatalf("nothing older running: settled %d, want 10", got)
	}
	if got := h.settle(20, 105, 103); got != 10 {
		t.Fatalf("a transaction older than the note still running: settled %d, want 10", got)
	}
	if got := h.advance(105); got != 20 {
		t.Fatalf("xmin past the note: settled %d, want 20", got)
	}
	// The new primary's sequence is at 15, its ids elsewhere.
	if got := h.settle(15, 7, 5); got != 0 {
		t.Fatalf("after the sequence went back: settled %d, want 0 until the new note settles", got)
	}
	if got := h.advance(7); got != 15 {
		t.Fatalf("the new primary's note: settled %d, want 15", got)
	}
}

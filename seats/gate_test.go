package seats

import (
	"slices"
	"testing"
)

func TestGateRecord(t *testing.T) {
	g := EncodeGate("A", []string{"A-01", "A-02"})
	section, ids, ok := DecodeGate(g)
	if !ok || section != "A" || !slices.Equal(ids, []string{"A-01", "A-02"}) {
		t.Fatalf("DecodeGate(%q) = %q %q %v", g, section, ids, ok)
	}
	for _, bad := range []string{"", "0:3,1:2", "seats:", "seats:A", "seats:A:", "seats::A-01", "seats:A:A-01,,A-02", "seats:A:A 01"} {
		if _, _, ok := DecodeGate(bad); ok {
			t.Errorf("DecodeGate(%q) ok, want refused", bad)
		}
	}
}

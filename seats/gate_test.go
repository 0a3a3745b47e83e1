package seats

import (
	"slices"
	"testing"

	"github.com/stockgate/stockgate/keys"
)

func TestGateRecord(t *testing.T) {
	want := []keys.ID{keys.MustID("A-01"), keys.MustID("A-02")}
	g := EncodeGate(keys.MustID("A"), want)
	section, ids, ok := DecodeGate(g)
	if !ok || section != keys.MustID("A") || !slices.Equal(ids, want) {
		t.Fatalf("DecodeGate(%q) = %q %q %v", g, section, ids, ok)
	}
	for _, bad := range []string{"", "0:3,1:2", "seats:", "seats:A", "seats:A:", "seats::A-01", "seats:A:A-01,,A-02", "seats:A:A 01"} {
		if _, _, ok := DecodeGate(bad); ok {
			t.Errorf("DecodeGate(%q) ok, want refused", bad)
		}
	}
}

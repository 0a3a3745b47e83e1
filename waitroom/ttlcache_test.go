package waitroom

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
)

// A ttlCache of programs stays bounded however many made-up programs
// clients name, and still answers each from one load.
func TestTTLCacheBounded(t *testing.T) {
	c := newTTLCache[int](time.Hour)
	loads := 0
	for i := range 3 * ttlCacheMax {
		k := keys.MustID(fmt.Sprintf("p%d", i))
		v, err := c.get(context.Background(), k, func(context.Context) (int, error) { loads++; return i, nil })
		if err != nil || v != i {
			t.Fatalf("get(%s) = %d %v", k, v, err)
		}
		if n := len(c.m); n > ttlCacheMax {
			t.Fatalf("%d entries after %d programs, want at most %d", n, i+1, ttlCacheMax)
		}
	}
	if loads != 3*ttlCacheMax {
		t.Fatalf("%d loads for %d programs", loads, 3*ttlCacheMax)
	}
	// A program asked again within its ttl is not loaded again.
	k := keys.MustID(fmt.Sprintf("p%d", 3*ttlCacheMax-1))
	if _, _ = c.get(context.Background(), k, func(context.Context) (int, error) { loads++; return 0, nil }); loads != 3*ttlCacheMax {
		t.Fatal("a fresh entry was loaded again")
	}
}

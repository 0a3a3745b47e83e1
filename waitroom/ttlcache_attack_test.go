package waitroom

import (
	"context"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
)

// TestAttackBehindTTLCacheForgetNeverStale: the door answers a program's
// last room setting at once while the cache is slow (e6af8d7: once any
// caller waited 50 ms for any program's reload). A room turned on (or
// off, or made again with a new secret) is announced, and each replica
// forgets the program's entry: its next get must wait for the ledger and
// answer the new setting, never the one before the change, however slow
// the cache is (another program's reload hung). Else a buyer would pass
// the door of a room just turned on without a token, or be checked
// against a deleted room's secret.
func TestAttackBehindTTLCacheForgetNeverStale(t *testing.T) {
	c := newTTLCache[int](time.Millisecond)
	ctx := context.Background()
	p, x := keys.MustID("p"), keys.MustID("x")
	for _, k := range []keys.ID{p, x} {
		if v, err := c.get(ctx, k, func(context.Context) (int, error) { return 1, nil }); v != 1 || err != nil {
			t.Fatalf("get(%s) = %d %v", k, v, err)
		}
	}
	time.Sleep(2 * time.Millisecond) // time under test: past the 1 ms ttl
	release := make(chan struct{})
	defer close(release)
	hung := func(context.Context) (int, error) { <-release; return 9, nil }
	// x's reload hangs: the first caller waits 50 ms, and the cache is slow.
	if v, _ := c.get(ctx, x, hung); v != 1 {
		t.Fatalf("x while its reload hangs = %d, want its last value 1", v)
	}
	if !c.slow.Load() {
		t.Fatal("not slow after a caller waited for a hung reload")
	}
	// p's room changes (value 2 in the ledger); the notice forgets p.
	c.forget(p)
	began := time.Now()
	v, err := c.get(ctx, p, func(context.Context) (int, error) {
		time.Sleep(20 * time.Millisecond) // time under test: a ledger read
		return 2, nil
	})
	if v != 2 || err != nil {
		t.Fatalf("p after its room changed and was forgotten, the cache slow = %d %v (after %v); want the new setting 2, not the old 1",
			v, err, time.Since(began))
	}
	// And stays so while a later reload of p hangs: the last value is the
	// new one.
	time.Sleep(2 * time.Millisecond) // time under test: past the ttl
	if v, _ := c.get(ctx, p, hung); v != 2 {
		t.Fatalf("p while a reload after the change hangs = %d, want 2", v)
	}
}

package waitroom

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/wait"
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

// While a reload is slow or fails, a ttlCache answers the value the
// reload replaces; without one, the caller waits for the load and gets
// its error.
func TestTTLCacheStaleWhileTheSourceIsSlow(t *testing.T) {
	c := newTTLCache[int](time.Millisecond)
	k := keys.MustID("p")
	ctx := context.Background()
	fail := errors.New("ledger unreachable")
	if _, err := c.get(ctx, k, func(context.Context) (int, error) { return 0, fail }); !errors.Is(err, fail) {
		t.Fatalf("a first load's failure = %v, want it", err)
	}
	if v, err := c.get(ctx, k, func(context.Context) (int, error) { return 1, nil }); v != 1 || err != nil {
		t.Fatalf("get = %d %v, want 1", v, err)
	}
	time.Sleep(2 * time.Millisecond) // time under test: past the 1 ms ttl
	release := make(chan struct{})
	slow := func(context.Context) (int, error) { <-release; return 2, nil }
	if v, err := c.get(ctx, k, slow); v != 1 || err != nil {
		t.Fatalf("get while the reload hangs = %d %v, want the last value 1", v, err)
	}
	close(release)
	wait.For(t, 10*time.Second, "the reload's value 2 got after it ended", func() bool {
		v, _ := c.get(ctx, k, func(context.Context) (int, error) { return 2, nil })
		return v == 2
	})
	time.Sleep(2 * time.Millisecond) // time under test: past the ttl again
	if v, err := c.get(ctx, k, func(context.Context) (int, error) { return 0, fail }); v != 2 || err != nil {
		t.Fatalf("get when the reload fails = %d %v, want the last value 2", v, err)
	}
	c.forget(k)
	if _, err := c.get(ctx, k, func(context.Context) (int, error) { return 0, fail }); !errors.Is(err, fail) {
		t.Fatalf("after forget, a failing load = %v, want its error", err)
	}
}

// Once a reload took longer than staleAfter, callers wait for no reload
// (they are answered the last value at once) until a reload ends in time
// again.
func TestTTLCacheStopsWaitingWhileTheSourceStaysSlow(t *testing.T) {
	c := newTTLCache[int](time.Millisecond)
	k := keys.MustID("p")
	ctx := context.Background()
	if v, err := c.get(ctx, k, func(context.Context) (int, error) { return 1, nil }); v != 1 || err != nil {
		t.Fatalf("get = %d %v, want 1", v, err)
	}
	if c.slow.Load() {
		t.Fatal("slow after a load that ended at once")
	}
	time.Sleep(2 * time.Millisecond) // time under test: past the 1 ms ttl
	slowLoad := func(context.Context) (int, error) {
		time.Sleep(staleAfter + 50*time.Millisecond) // time under test: a reload slower than staleAfter
		return 2, nil
	}
	if v, _ := c.get(ctx, k, slowLoad); v != 1 {
		t.Fatalf("get while the reload is slow = %d, want the last value 1", v)
	}
	// The slow reload ends (its value 2 is then the last), and the cache
	// is slow.
	wait.For(t, 10*time.Second, "end of the reload slower than staleAfter, the cache slow", func() bool {
		c.mu.Lock()
		e := c.m[k]
		c.mu.Unlock()
		select {
		case <-e.done:
			return c.slow.Load()
		default:
			return false
		}
	})
	// Slow: the next caller is answered without a wait, however soon its
	// reload would end; that reload, in time, makes the cache wait again.
	wait.For(t, 10*time.Second, "end of the slow mark after reloads that end at once", func() bool {
		if v, _ := c.get(ctx, k, func(context.Context) (int, error) { return 3, nil }); v != 2 && v != 3 {
			t.Fatalf("get = %d, want the last value 2 or the new 3", v)
		}
		return !c.slow.Load()
	})
}

// The first caller that waits staleAfter for a reload still running marks
// the source slow: the callers after it are answered the last value at
// once, though that reload has not ended (with a ledger link cut, it runs
// for its whole 5 s).
func TestTTLCacheSlowOnceAReloadOutlivesStaleAfter(t *testing.T) {
	c := newTTLCache[int](time.Millisecond)
	k := keys.MustID("p")
	ctx := context.Background()
	if v, err := c.get(ctx, k, func(context.Context) (int, error) { return 1, nil }); v != 1 || err != nil {
		t.Fatalf("get = %d %v, want 1", v, err)
	}
	time.Sleep(2 * time.Millisecond) // time under test: past the 1 ms ttl
	release := make(chan struct{})
	defer close(release)
	hung := func(context.Context) (int, error) {
		<-release // the source does not answer while the test runs
		return 2, nil
	}
	if v, _ := c.get(ctx, k, hung); v != 1 {
		t.Fatalf("get while the reload hangs = %d, want the last value 1", v)
	}
	if !c.slow.Load() {
		t.Fatal("not slow after a caller waited staleAfter for a reload still running: every caller waits for it")
	}
}

// A value nobody asked for in idle is not answered at once while the
// source is slow: with the cache marked slow and the reload slower than
// staleAfter, the first caller after the quiet spell waits for it (up to
// idleWait) and gets the new value, not the old memory. (A quiet line's
// poll after one slow load anywhere was answered with the line as it
// stood seconds before.) Asked again within idle, the last value is
// answered while the reload is slow, as before; and a reload slower than
// idleWait answers the last value after idleWait.
func TestTTLCacheAnswersNoOldMemoryAfterIdle(t *testing.T) {
	c := newTTLCache[int](time.Millisecond).answerStaleAfterIdle(time.Second, 500*time.Millisecond)
	k := keys.MustID("p")
	ctx := context.Background()
	if v, err := c.get(ctx, k, func(context.Context) (int, error) { return 1, nil }); v != 1 || err != nil {
		t.Fatalf("get = %d %v, want 1", v, err)
	}
	c.slow.Store(true)                            // as after a slow load of another program
	time.Sleep(time.Second + 50*time.Millisecond) // time under test: past idle (1 s)
	slowLoad := func(v int) func(context.Context) (int, error) {
		return func(context.Context) (int, error) {
			time.Sleep(staleAfter + 20*time.Millisecond) // time under test: a reload slower than staleAfter
			return v, nil
		}
	}
	if v, err := c.get(ctx, k, slowLoad(2)); v != 2 || err != nil {
		t.Fatalf("get after idle, reload slow = %d %v, want the reload's 2, not the old 1", v, err)
	}
	// Within idle of that entry (made 70 ms ago, before its slow load;
	// the cache is slow since): the last value at once.
	c.mu.Lock()
	c.m[k].started = time.Time{} // due for a reload, as expire does
	c.mu.Unlock()
	if v, _ := c.get(ctx, k, slowLoad(3)); v != 2 {
		t.Fatalf("get within idle while the reload is slow = %d, want the last value 2", v)
	}
	// After idle again, a reload that hangs: the last value (2, or 3 if
	// that reload has ended), after idleWait.
	time.Sleep(time.Second + 50*time.Millisecond) // time under test: past idle (1 s)
	release := make(chan struct{})
	defer close(release)
	start := time.Now()
	if v, _ := c.get(ctx, k, func(context.Context) (int, error) { <-release; return 4, nil }); v != 2 && v != 3 {
		t.Fatalf("get after idle, reload hung = %d, want the last value", v)
	}
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Fatalf("answered after %v, want after idleWait (500ms) of waiting for the reload", d)
	}
}

// With reloads slower than the ttl and callers steady, each new entry is
// made while the last one still loads; a reload that ends is answered
// from then on, though a newer entry was made before it ended. (Each
// entry used to carry the value answered when it was made: every answer
// stayed the first reading, 6 s old and growing.)
func TestTTLCacheAnswersTheFreshestReload(t *testing.T) {
	c := newTTLCache[int](time.Millisecond)
	k := keys.MustID("p")
	ctx := context.Background()
	if v, _ := c.get(ctx, k, func(context.Context) (int, error) { return 1, nil }); v != 1 {
		t.Fatalf("get = %d, want 1", v)
	}
	hang := func(rel chan struct{}, v int) func(context.Context) (int, error) {
		return func(context.Context) (int, error) { <-rel; return v, nil }
	}
	rel2, rel3, rel4 := make(chan struct{}), make(chan struct{}), make(chan struct{})
	defer close(rel3)
	defer close(rel4)
	time.Sleep(2 * time.Millisecond) // time under test: past the 1 ms ttl
	if v, _ := c.get(ctx, k, hang(rel2, 2)); v != 1 {
		t.Fatalf("get while reload 2 hangs = %d, want 1", v)
	}
	time.Sleep(2 * time.Millisecond) // time under test: past the ttl
	if v, _ := c.get(ctx, k, hang(rel3, 3)); v != 1 {
		t.Fatalf("get while reloads 2 and 3 hang = %d, want 1", v)
	}
	close(rel2) // reload 2 ends; reload 3's entry is the current one
	wait.For(t, 10*time.Second, "reload 2's value kept once it ended", func() bool {
		c.mu.Lock()
		b := c.m[k].best.Load()
		c.mu.Unlock()
		return b.v == 2
	})
	time.Sleep(2 * time.Millisecond) // time under test: past the ttl
	if v, _ := c.get(ctx, k, hang(rel4, 4)); v != 2 {
		t.Fatalf("get while reloads 3 and 4 hang = %d, want 2 (reload 2 ended)", v)
	}
}

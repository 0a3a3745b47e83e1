package cache_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/maypok86/otter/v2/stats"

	"github.com/stockgate/stockgate/cache"
	"github.com/stockgate/stockgate/internal/wait"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

var sku = stock.SKU{Program: keys.MustID("p"), Ticket: keys.MustID("t")}

func TestSoldOutAndEmptyShards(t *testing.T) {
	c, err := cache.New(cache.Options{SoldOutTTL: 50 * time.Millisecond, EmptyShardTTL: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if c.SoldOut(sku) {
		t.Fatal("SoldOut before MarkSoldOut")
	}
	c.MarkSoldOut(sku, c.Since())
	c.MarkEmpty(sku, 4, 2)
	if !c.SoldOut(sku) || !c.IsEmpty(sku, 4, 2) || c.IsEmpty(sku, 4, 1) || c.IsEmpty(sku, 8, 2) {
		t.Fatal("flags not remembered per SKU and shard")
	}
	c.MarkStocked(sku, 4, 2)
	if c.SoldOut(sku) || c.IsEmpty(sku, 4, 2) {
		t.Fatal("MarkStocked left flags set")
	}
	c.MarkSoldOut(sku, c.Since())
	wait.For(t, 2*time.Second, "sold-out flag's end (its TTL is far shorter)", func() bool { return !c.SoldOut(sku) })
}

func TestLoadingLoadsOncePerKey(t *testing.T) {
	var loads atomic.Int64
	release := make(chan struct{})
	rec := stats.NewCounter()
	l, err := cache.NewLoading(time.Minute, 100, rec, func(ctx context.Context, s stock.SKU) (int, error) {
		loads.Add(1)
		<-release
		return 42, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			v, err := l.Get(context.Background(), sku)
			if err != nil || v != 42 {
				t.Errorf("Get = %d, %v, want 42", v, err)
			}
		})
	}
	// Released once every Get has missed: all 50 came while it loads.
	wait.For(t, 10*time.Second, "50 Gets missed", func() bool { return rec.Snapshot().Misses >= 50 })
	close(release)
	wg.Wait()
	if n := loads.Load(); n != 1 {
		t.Errorf("50 concurrent Gets ran the loader %d times, want 1", n)
	}
}

func TestLoadingDoesNotCacheErrors(t *testing.T) {
	var loads atomic.Int64
	l, err := cache.NewLoading(time.Minute, 100, nil, func(ctx context.Context, s stock.SKU) (int, error) {
		if loads.Add(1) == 1 {
			return 0, stock.ErrUnknownSKU
		}
		return 7, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Get(context.Background(), sku); !errors.Is(err, stock.ErrUnknownSKU) {
		t.Fatalf("first Get = %v, want ErrUnknownSKU", err)
	}
	if v, err := l.Get(context.Background(), sku); err != nil || v != 7 {
		t.Fatalf("second Get = %d, %v, want 7", v, err)
	}
}

func TestOptionsValidated(t *testing.T) {
	if _, err := cache.New(cache.Options{SoldOutTTL: -1}); err == nil {
		t.Error("New accepted a negative TTL")
	}
	if _, err := cache.NewLoading[stock.SKU, int](0, 1, nil, nil); err == nil {
		t.Error("NewLoading accepted ttl 0 and no loader")
	}
}

// Past its TTL a sold-out flag lets exactly one caller through to re-check
// while everyone else is still told sold out; gone after a second TTL.
func TestStaleSoldOutLetsOneThrough(t *testing.T) {
	c, err := cache.New(cache.Options{SoldOutTTL: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c.MarkSoldOut(sku, c.Since())
	// A TTL of 500 ms, not 100: the callers below must all ask while the flag
	// is stale and not yet gone (between one TTL and two). With 100 ms, on
	// a loaded 2-core make test, 57 of 64 goroutines ran past 200 ms and
	// found it gone.
	time.Sleep(550 * time.Millisecond) // time under test: the 500 ms TTL lapses
	var through atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			if !c.SoldOut(sku) {
				through.Add(1)
			}
		})
	}
	wg.Wait()
	if through.Load() != 1 {
		t.Errorf("%d of 64 callers let through to re-check a stale flag, want 1", through.Load())
	}
	c.MarkSoldOut(sku, c.Since()) // the re-check found it still sold out
	if !c.SoldOut(sku) {
		t.Error("a renewed flag is not fresh")
	}
	time.Sleep(1050 * time.Millisecond) // time under test: two TTLs lapse
	if c.SoldOut(sku) {
		t.Error("flag alive after two TTLs")
	}
}

// SoldOutFresh reads the flag without taking the re-check turn: after the
// TTL it answers false, and SoldOut still picks exactly one caller.
func TestSoldOutFreshLeavesTheRecheck(t *testing.T) {
	const ttl = 200 * time.Millisecond
	c, err := cache.New(cache.Options{SoldOutTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	// The re-check turn lives from the flag's TTL to twice it. A machine
	// that stalls the test past that window is no answer: try again, with
	// another SKU, a few times.
	for try := range 5 {
		sku := stock.MustSKU("p", fmt.Sprintf("t%d", try))
		marked := time.Now()
		c.MarkSoldOut(sku, c.Since())
		if !c.SoldOutFresh(sku) || !c.SoldOut(sku) {
			t.Fatal("a fresh flag reads sold out")
		}
		wait.Until(5*time.Second, func() bool { return !c.SoldOutFresh(sku) }) // the TTL itself lapsing, the condition under test
		for range 3 {
			if c.SoldOutFresh(sku) {
				t.Fatal("a stale flag reads fresh")
			}
		}
		picked := 0
		for range 5 {
			if !c.SoldOut(sku) {
				picked++
			}
		}
		if time.Since(marked) >= 2*ttl {
			continue // past the window before the last call: not a verdict
		}
		if picked != 1 {
			t.Errorf("SoldOut picked %d callers to re-check after SoldOutFresh was asked, want exactly 1", picked)
		}
		return
	}
	t.Fatal("the machine stalled past the re-check window in every try")
}

// A refreshing cache past its TTL answers the old value at once while one
// load replaces it in the background, on a context the read that started
// it cannot cancel; a key never loaded waits for its load.
func TestRefreshingServesTheOldValueWhileItLoads(t *testing.T) {
	var loads atomic.Int64
	release := make(chan struct{})
	canceled := make(chan error, 1)
	l, err := cache.NewRefreshing(20*time.Millisecond, time.Minute, 100, nil, func(ctx context.Context, s stock.SKU) (int, error) {
		n := loads.Add(1)
		if n == 1 {
			return 1, nil // the first load: at once
		}
		<-release // the refresh: as slow as the test wants
		select {
		case canceled <- ctx.Err():
		default: // a later refresh: the test asked about the first
		}
		return int(n), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := l.Get(context.Background(), sku); err != nil || v != 1 {
		t.Fatalf("first Get = %d, %v, want 1 (a miss waits for its load)", v, err)
	}
	time.Sleep(30 * time.Millisecond) // time under test: the 20 ms TTL lapses
	ctx, cancel := context.WithCancel(context.Background())
	v, err := l.Get(ctx, sku)
	cancel() // the read is over; its refresh must go on
	if err != nil || v != 1 {
		t.Fatalf("stale Get = %d, %v, want the old 1 at once", v, err)
	}
	wait.For(t, 10*time.Second, "refresh started by the stale read", func() bool { return loads.Load() >= 2 })
	for range 100 {
		if v, _ := l.Get(context.Background(), sku); v != 1 {
			t.Fatalf("Get during the refresh = %d, want the old 1", v)
		}
	}
	if n := loads.Load(); n != 2 {
		t.Errorf("%d loads during the refresh, want 2: one refresh however many stale reads", n)
	}
	close(release)
	if err := <-canceled; err != nil {
		t.Fatalf("the refresh ran on a context its reader ended: %v", err)
	}
	wait.For(t, 10*time.Second, "refreshed value 2 served", func() bool {
		v, _ := l.Get(context.Background(), sku)
		return v == 2
	})
	if _, err := cache.NewRefreshing[stock.SKU, int](time.Second, time.Second, 1, nil, func(context.Context, stock.SKU) (int, error) { return 0, nil }); err == nil {
		t.Error("NewRefreshing accepted stale == ttl")
	}
}

// While the notices are heard, a flag stands past its TTL until a notice
// forgets it: a storm of askers is told sold out without a re-check turn.
func TestSoldOutStandsUntilANotice(t *testing.T) {
	c, err := cache.New(cache.Options{SoldOutTTL: 20 * time.Millisecond, NoticeMaxAge: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c.Trust()
	c.MarkSoldOut(sku, c.Since())
	time.Sleep(100 * time.Millisecond) // time under test: five TTLs lapse
	for i := range 64 {
		if !c.SoldOut(sku) || !c.SoldOutFresh(sku) {
			t.Fatalf("asker %d let through to re-check a flag the notices still stand behind", i)
		}
	}
	c.Forget(sku)
	if c.SoldOut(sku) || c.SoldOutFresh(sku) {
		t.Fatal("a flag outlived the notice that stock came back")
	}
}

// A flag marked while the notices were heard lives its TTL only once they
// may be missed (Distrust), and is not trusted again by a later
// subscription (Trust): a notice may have been lost in between.
func TestDistrustEndsTheFlagsStanding(t *testing.T) {
	c, err := cache.New(cache.Options{SoldOutTTL: 20 * time.Millisecond, NoticeMaxAge: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c.Trust()
	c.MarkSoldOut(sku, c.Since())
	c.Distrust()
	c.Trust()
	time.Sleep(50 * time.Millisecond) // time under test: two TTLs lapse
	if c.SoldOut(sku) {
		t.Fatal("a flag from before a lapse in the notices stood past two TTLs")
	}
	// Marked while nothing is heard: the TTL as well.
	c.Distrust()
	c.MarkSoldOut(sku, c.Since())
	c.Trust()
	time.Sleep(50 * time.Millisecond) // time under test: two TTLs lapse
	if c.SoldOut(sku) {
		t.Fatal("a flag marked while the notices were not heard stood past two TTLs")
	}
}

// A notice that overtakes the read a flag is marked from (heard after
// Since, before MarkSoldOut) leaves that flag its TTL only, however the
// two interleave: it cannot stand on news older than the notice.
func TestNoticeOvertakingTheReadIsNotLost(t *testing.T) {
	c, err := cache.New(cache.Options{SoldOutTTL: time.Nanosecond, NoticeMaxAge: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c.Trust()
	other := stock.SKU{Program: keys.MustID("p"), Ticket: keys.MustID("other")}
	since := c.Since()
	c.Forget(other) // any SKU's notice: the cache counts them, not per SKU
	c.MarkSoldOut(sku, since)
	if c.SoldOutFresh(sku) {
		t.Fatal("a flag marked from a read a notice overtook stands")
	}
	for i := range 2000 {
		since := c.Since()
		var wg sync.WaitGroup
		wg.Go(func() { c.Forget(sku) })
		c.MarkSoldOut(sku, since)
		wg.Wait()
		if c.SoldOutFresh(sku) {
			t.Fatalf("round %d: a flag stands after the notice that raced its marking", i)
		}
	}
}

// A Viewed value stands past its TTL while the notices are heard, until
// its key is invalidated; without them, or loaded across a notice or a
// lapse in them, it lives its TTL.
func TestViewedStandsPerChange(t *testing.T) {
	const ttl = 20 * time.Millisecond
	c, err := cache.New(cache.Options{SoldOutTTL: ttl, NoticeMaxAge: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var loads atomic.Int64
	var during func() // runs inside the next load
	v, err := cache.NewViewed(c, ttl, 100, nil, func(ctx context.Context, s stock.SKU) (int64, error) {
		if f := during; f != nil {
			during = nil
			f()
		}
		return loads.Add(1), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	get := func() int64 {
		t.Helper()
		n, err := v.Get(context.Background(), sku)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	lapse := func() { time.Sleep(3 * ttl) } // time under test: past the TTL
	// Not heard: the TTL.
	get()
	lapse()
	if get() != 2 {
		t.Fatal("a value loaded while no notice is heard outlived its TTL")
	}
	c.Trust()
	v.Invalidate(sku)
	first := get()
	lapse()
	if get() != first {
		t.Fatal("a value loaded while the notices are heard did not stand past its TTL")
	}
	v.Invalidate(sku) // its change notice
	if get() == first {
		t.Fatal("a value outlived the notice of its change")
	}
	// A notice heard during the load: its TTL only.
	v.Invalidate(sku)
	during = c.Heard
	overtaken := get()
	lapse()
	if get() == overtaken {
		t.Fatal("a value whose load a notice overtook stood past its TTL")
	}
	// A lapse in the notices ends a standing value, even once they are back.
	standing := get()
	c.Distrust()
	c.Trust()
	lapse()
	if get() == standing {
		t.Fatal("a value from before a lapse in the notices stood past its TTL")
	}
}

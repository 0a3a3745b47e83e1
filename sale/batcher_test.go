package sale

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/wait"
	"github.com/stockgate/stockgate/ledger"
)

// A lane that commits 100 items a second, with a budget of 250 ms, queues
// the 25 items it can commit within the budget behind its flush and
// refuses the next at once, unqueued, saying when to come back; once the
// queue drains it takes items again.
func TestBatcherRefusesPastTheBudget(t *testing.T) {
	release, holding := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var flushed []int
	b := newBatcher(1, 1000, time.Minute, 250*time.Millisecond, laneMetrics{}, func(_ context.Context, items []int, answer func(int, int)) {
		if items[0] == 0 {
			close(holding)
			<-release // the first flush holds the lane
		}
		mu.Lock()
		flushed = append(flushed, items...)
		mu.Unlock()
		for i, v := range items {
			answer(i, v)
		}
	})
	defer b.close()
	l := b.lanes[0]
	l.rate.Store(math.Float64bits(100))
	var wg sync.WaitGroup
	errs := make(chan error, 30)
	for i := range 26 {
		wg.Go(func() {
			if _, err := b.do(context.Background(), i); err != nil {
				errs <- err
			}
		})
		if i == 0 {
			<-holding
		}
	}
	wait.For(t, 10*time.Second, "25 waiting behind the first", func() bool { return l.queued.Load() >= 25 })
	_, err := b.do(context.Background(), 99)
	if !errors.Is(err, errLedgerBusy) || !errors.Is(err, ledger.ErrNotCommitted) || busyWait(err) < 250*time.Millisecond {
		t.Fatalf("do(27th) = %v (wait %v), want a busy refusal asking to wait at least the budget", err, busyWait(err))
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("an item within the budget: %v", err)
	}
	if got := len(flushedNow(&mu, &flushed)); got != 26 {
		t.Errorf("flushed %d items, want the 26 within the budget", got)
	}
	if v, err := b.do(context.Background(), 7); err != nil || v != 7 {
		t.Errorf("do after the queue drained = %d, %v; want 7", v, err)
	}
}

// An item that waited longer than the budget behind a slow flush, on a
// lane whose queue is longer than it commits within the budget, is
// refused when its turn comes, never flushed. (On a lane that keeps up
// and whose flushes are fast, it is flushed however long it waited:
// TestBatcherRefusesWhatQueuedBehindASlowLedger. Here the held flush
// itself runs past the budget, which makes the lane slow.)
func TestBatcherRefusesWhatWaitedTooLong(t *testing.T) {
	for _, tc := range []struct {
		name string
		rate float64 // what the lane learned, set once the three wait
		shed bool
	}{{"overloaded", 10, true}, {"slow, keeping up", 1e6, true}} {
		t.Run(tc.name, func(t *testing.T) {
			const budget = 20 * time.Millisecond
			release, holding := make(chan struct{}), make(chan struct{})
			var mu sync.Mutex
			var flushed []int
			b := newBatcher(1, 1000, time.Minute, budget, laneMetrics{}, func(_ context.Context, items []int, answer func(int, int)) {
				if items[0] == 0 {
					close(holding)
					<-release // the first flush holds the lane
				}
				mu.Lock()
				flushed = append(flushed, items...)
				mu.Unlock()
				for i, v := range items {
					answer(i, v)
				}
			})
			defer b.close()
			first := make(chan error, 1)
			go func() { _, err := b.do(context.Background(), 0); first <- err }()
			<-holding
			late := make(chan error, 3)
			for i := 1; i <= 3; i++ {
				go func() { _, err := b.do(context.Background(), i); late <- err }()
			}
			wait.For(t, 10*time.Second, "the three queued", func() bool { return b.lanes[0].queued.Load() >= 3 })
			// From the last one's arrival: on a busy machine the third may
			// be queued well after the first two.
			for queued := time.Now(); time.Since(queued) <= budget; {
				time.Sleep(time.Millisecond) // time under test: until the three have waited past the budget
			}
			b.lanes[0].rate.Store(math.Float64bits(tc.rate))
			close(release)
			if err := <-first; err != nil {
				t.Fatalf("first item: %v", err)
			}
			for range 3 {
				if err := <-late; errors.Is(err, errLedgerBusy) != tc.shed || (!tc.shed && err != nil) {
					t.Errorf("an item that waited past the budget = %v, want shed %v", err, tc.shed)
				}
			}
			want := 4
			if tc.shed {
				want = 1
			}
			if got := flushedNow(&mu, &flushed); len(got) != want {
				t.Errorf("flushed %v, want %d items", got, want)
			}
		})
	}
}

func flushedNow(mu *sync.Mutex, s *[]int) []int {
	mu.Lock()
	defer mu.Unlock()
	return append([]int(nil), (*s)...)
}

// A lane whose batch ran out of time (a ledger that hangs) gives its next
// batch no more than its items' earliest deadline, so no request is
// answered past its own; once a batch ends in time, the next has the
// whole timeout again, however near its items' deadlines. An item whose
// request ran out of time while it waited is refused, never flushed.
func TestBatcherAfterAHungBatchEndsAtTheDeadline(t *testing.T) {
	var mu sync.Mutex
	var deadlines []time.Time
	var flushed []int
	b := newBatcher(1, 1000, 30*time.Millisecond, 0, laneMetrics{}, func(ctx context.Context, items []int, answer func(int, int)) {
		d, _ := ctx.Deadline()
		mu.Lock()
		deadlines = append(deadlines, d)
		flushed = append(flushed, items...)
		mu.Unlock()
		if items[0] == 0 {
			<-ctx.Done() // the ledger hangs until the batch's time is out
		}
		for i, v := range items {
			answer(i, v)
		}
	})
	defer b.close()
	if _, err := b.do(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	// Set before the next item is sent, which the lane receives after.
	b.timeout = time.Hour

	ctx1, cancel1 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel1()
	d1, _ := ctx1.Deadline()
	if _, err := b.do(ctx1, 1); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	d2, _ := ctx2.Deadline()
	if _, err := b.do(ctx2, 2); err != nil {
		t.Fatal(err)
	}
	gone, cancel3 := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel3()
	if _, err := b.do(gone, 3); !errors.Is(err, errLedgerBusy) {
		t.Errorf("an item whose request ran out of time = %v, want refused busy", err)
	}

	mu.Lock()
	defer mu.Unlock()
	switch {
	case len(deadlines) != 3:
		t.Fatalf("flushed %v in %d batches, want 3 (the expired item never flushed)", flushed, len(deadlines))
	case !deadlines[1].Equal(d1.Add(-answerMargin)):
		t.Errorf("the batch after a hung one ends at %v, want its item's deadline less the answer's margin %v", deadlines[1], d1.Add(-answerMargin))
	case !deadlines[2].After(d2.Add(time.Minute)):
		t.Errorf("a batch after one that ended in time ends at %v, want the whole timeout (its item's deadline is %v)", deadlines[2], d2)
	}
}

// A slow ledger (each flush longer than the budget) never fills a batch,
// so no pace is learned: the lane refuses at once an item that would wait
// for the running flush's rest and its own, past the budget, while an
// idle lane takes any item (it measures the ledger again).
func TestBatcherRefusesBehindASlowFlush(t *testing.T) {
	release, holding := make(chan struct{}), make(chan struct{})
	b := newBatcher(1, 100, time.Minute, 250*time.Millisecond, laneMetrics{}, func(_ context.Context, items []int, answer func(int, int)) {
		if items[0] == 0 {
			close(holding)
			<-release
		}
		for i, v := range items {
			answer(i, v)
		}
	})
	defer b.close()
	l := b.lanes[0]
	l.flushTime.Store(math.Float64bits(0.6)) // the ledger's flushes take 600 ms
	first := make(chan error, 1)
	go func() { _, err := b.do(context.Background(), 0); first <- err }()
	<-holding
	_, err := b.do(context.Background(), 1)
	if !errors.Is(err, errLedgerBusy) || busyWait(err) <= 250*time.Millisecond {
		t.Errorf("do behind a 600 ms flush = %v (wait %v), want a busy refusal past the budget", err, busyWait(err))
	}
	close(release)
	if err := <-first; err != nil {
		t.Errorf("the item an idle lane took = %v", err)
	}
	// The answer goes out before the flush has ended: wait for the lane
	// to be idle (make test, once: refused behind the flush still ending).
	wait.For(t, 10*time.Second, "the lane idle after its flush answered", func() bool { return l.busySince.Load() == 0 })
	if v, err := b.do(context.Background(), 2); err != nil || v != 2 {
		t.Errorf("do on the idle lane again = %d, %v; want 2 (an idle lane is never slow)", v, err)
	}
}

// Items that queued behind a flush before it had run the budget (a
// ledger turning slow or silent: the door still took them) are answered
// busy once they have waited the budget, while that flush still hangs,
// not when it ends; nothing of theirs is flushed.
func TestBatcherShedsWhatQueuedBehindAHangingFlush(t *testing.T) {
	var flushed atomic.Int64
	b, first, unhang := hungBatcher(t, time.Minute, 50*time.Millisecond, func(items []int) { flushed.Add(int64(len(items))) })
	// Queued at the onset, as the door takes items before the flush has
	// run the budget.
	l := b.lanes[0]
	var behind []*pendingItem[int, int]
	for i := 1; i <= 3; i++ {
		p := &pendingItem[int, int]{item: i, at: time.Now(), out: make(chan outcome[int], 1)}
		l.queued.Add(1)
		l.q <- p
		behind = append(behind, p)
	}
	for _, p := range behind {
		select {
		case o := <-p.out:
			if !errors.Is(o.err, errLedgerBusy) || busyWait(o.err) <= 50*time.Millisecond {
				t.Errorf("item %d behind the hanging flush = %d, %v; want a busy refusal past the budget", p.item, o.r, o.err)
			}
		case <-time.After(10 * time.Second): // bounded: the flush hangs until release
			t.Fatalf("item %d behind a hanging flush was not answered while it hung", p.item)
		}
	}
	unhang()
	if err := <-first; err != nil {
		t.Errorf("the flushing item = %v", err)
	}
	if n, q := flushed.Load(), l.queued.Load(); n != 1 || q != 0 {
		t.Errorf("%d flushed, %d still counted queued; want only the first flushed, none queued", n, q)
	}
}

// The wait slow predicts: the running flush's rest, one flush per max
// items ahead, and the item's own; a running flush longer than the
// average counts as the pace; it refuses only when flushes take longer
// than the budget (a busy ledger is the pace's to judge); an idle lane or
// no budget waits nothing.
func TestBatcherSlowWait(t *testing.T) {
	now := time.Unix(1000, 0)
	ms := time.Millisecond
	for _, tc := range []struct {
		name      string
		avg, ran  time.Duration // flushTime, and how long the running flush has run (0: idle)
		n         int64
		wait      time.Duration
		over      bool
		budgetOff bool
	}{
		{"idle", 600 * ms, 0, 50, 0, false, false},
		{"fast ledger", 10 * ms, 4 * ms, 1, 16 * ms, false, false},
		{"fast ledger, 3 batches ahead", 10 * ms, 4 * ms, 31, 46 * ms, false, false},
		{"busy, its flushes within the budget", 200 * ms, 100 * ms, 1, 300 * ms, false, false},
		{"slow ledger", 600 * ms, 100 * ms, 1, 1100 * ms, true, false},
		{"slower than learned", 10 * ms, 300 * ms, 1, 300 * ms, true, false},
		{"no history yet", 0, 200 * ms, 1, 200 * ms, false, false},
		{"no budget", 600 * ms, 100 * ms, 1, 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &lane[int, int]{}
			l.flushTime.Store(math.Float64bits(tc.avg.Seconds()))
			if tc.ran > 0 {
				l.busySince.Store(now.Add(-tc.ran).UnixNano())
			}
			b := &batcher[int, int]{max: 10, budget: 250 * time.Millisecond}
			if tc.budgetOff {
				b.budget = -1
			}
			wait, over := b.slow(l, tc.n, now)
			if wait.Round(ms) != tc.wait || over != tc.over {
				t.Errorf("slow = %v, %v; want %v, %v", wait, over, tc.wait, tc.over)
			}
		})
	}
}

// An item that queued past the budget on a lane whose flushes take longer
// than the budget is refused unflushed (the onset of a slow ledger: items
// queued before the first slow flush had run long would each wait out a
// slow flush in turn); on a fast lane it is flushed, however long it
// waited, and so is a fresh item on the slow lane.
func TestBatcherRefusesWhatQueuedBehindASlowLedger(t *testing.T) {
	for _, tc := range []struct {
		name    string
		avg     time.Duration // the lane's flushTime
		waited  time.Duration // how long the item had queued
		refused bool
	}{
		{"slow lane, queued past the budget", 600 * time.Millisecond, time.Second, true},
		{"slow lane, fresh item", 600 * time.Millisecond, 0, false},
		{"fast lane, queued past the budget", 10 * time.Millisecond, time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var flushed atomic.Int64
			b := newBatcher(1, 100, time.Minute, 250*time.Millisecond, laneMetrics{}, func(_ context.Context, items []int, answer func(int, int)) {
				flushed.Add(int64(len(items)))
				for i, v := range items {
					answer(i, v)
				}
			})
			defer b.close()
			l := b.lanes[0]
			l.flushTime.Store(math.Float64bits(tc.avg.Seconds()))
			l.rate.Store(math.Float64bits(1e6)) // the pace keeps up: only slowness refuses
			p := &pendingItem[int, int]{item: 7, at: time.Now().Add(-tc.waited), out: make(chan outcome[int], 1)}
			l.queued.Add(1)
			l.q <- p
			o := <-p.out
			switch {
			case tc.refused && (!errors.Is(o.err, errLedgerBusy) || flushed.Load() != 0):
				t.Errorf("answer %d, %v with %d flushed; want a busy refusal, nothing flushed", o.r, o.err, flushed.Load())
			case !tc.refused && (o.err != nil || o.r != 7 || flushed.Load() != 1):
				t.Errorf("answer %d, %v with %d flushed; want 7 from one flush", o.r, o.err, flushed.Load())
			}
		})
	}
}

// A batch has the whole timeout, however near its items' deadlines, but
// one carrying an item that may have waited most of its time already
// ends by that item's deadline: a take sent again late in its request
// (withinDeadline: retried while no primary took writes), or a patient
// one (enqueued in a re-send's patience, behind a failover's backlog).
// Either is answered within its work time.
func TestBatcherEndsByALateItemsDeadline(t *testing.T) {
	for _, tc := range []struct {
		name string
		late func(ctx context.Context, b *batcher[int, int]) context.Context
	}{
		{"strict", func(ctx context.Context, _ *batcher[int, int]) context.Context { return withinDeadline(ctx) }},
		{"patient", func(ctx context.Context, b *batcher[int, int]) context.Context {
			b.resent.Store(time.Now().UnixNano()) // a re-send just now: what comes next is patient
			return ctx
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ends := make(chan time.Time, 1)
			b := newBatcher(1, 10, time.Hour, 50*time.Millisecond, laneMetrics{}, func(ctx context.Context, items []int, answer func(int, int)) {
				dl, _ := ctx.Deadline()
				ends <- dl
				for i, v := range items {
					answer(i, v)
				}
			})
			defer b.close()
			deadline := time.Now().Add(time.Minute)
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			defer cancel()
			if _, err := b.do(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if end := <-ends; !end.After(deadline) {
				t.Fatalf("a batch of an item due in a minute ends at %v: want the whole hour's timeout", end)
			}
			if _, err := b.do(tc.late(ctx, b), 2); err != nil {
				t.Fatal(err)
			}
			if end, want := <-ends, deadline.Add(-answerMargin); !end.Equal(want) {
				t.Fatalf("a batch of a %s item ends at %v, want its deadline less the answer's margin %v", tc.name, end, want)
			}
		})
	}
}

// A lane whose learned pace is far below the budget's (its last full
// batches ran on a stalled machine) still takes an item when idle: it
// flushes at once, and with no full batch the pace is never learned
// again, so refusing it refused every item after the storm.
func TestBatcherIdleLaneTakesAnItemWhateverItsPace(t *testing.T) {
	b := newBatcher(1, 16, time.Minute, 100*time.Millisecond, laneMetrics{}, func(_ context.Context, items []int, answer func(int, int)) {
		for i, v := range items {
			answer(i, v)
		}
	})
	defer b.close()
	b.lanes[0].rate.Store(math.Float64bits(1)) // one item a second: a second's wait, ten budgets
	for i := range 3 {
		if _, err := b.do(context.Background(), i); err != nil {
			t.Fatalf("item %d on an idle lane: %v", i, err)
		}
	}
}

// A lane answers its items before it marks itself idle: the item a
// client sends on its answer can find the lane still in that flush, with
// nothing queued. It waits only for that flush's end, so a stale pace
// must not refuse it either (a loaded make test did, once in a run).
func TestBatcherLaneEndingAFlushTakesTheNextItem(t *testing.T) {
	gate := make(chan struct{})
	b := newBatcher(1, 16, time.Minute, 100*time.Millisecond, laneMetrics{}, func(_ context.Context, items []int, answer func(int, int)) {
		for i, v := range items {
			answer(i, v)
		}
		<-gate // answered, not yet idle
	})
	defer b.close()
	b.lanes[0].rate.Store(math.Float64bits(1)) // one item a second: a second's wait, ten budgets
	for i := range 3 {
		res := make(chan error, 1)
		go func() {
			_, err := b.do(context.Background(), i)
			res <- err
		}()
		if i > 0 {
			wait.For(t, time.Minute, "the item queued or refused", func() bool {
				return b.lanes[0].queued.Load() == 1 || len(res) == 1
			})
			gate <- struct{}{} // the previous flush ends
		}
		if err := <-res; err != nil {
			t.Fatalf("item %d behind a flush that answered: %v", i, err)
		}
	}
	gate <- struct{}{}
}

// Items fill the first lane while it keeps up: behind a running flush, a
// lane of 4 queues 4 more, all on the first lane, and only the item after
// a full batch opens the second lane, which flushes it at once beside the
// first. Spread over the lanes by key instead, those items made two
// batches half the size.
func TestBatcherOpensALaneOnlyWhenTheFirstCantKeepUp(t *testing.T) {
	release := make(chan struct{})
	var running, most atomic.Int32
	var mu sync.Mutex
	var sizes []int
	b := newBatcher(2, 4, time.Minute, 0, laneMetrics{}, func(_ context.Context, items []int, answer func(int, int)) {
		n := running.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		mu.Lock()
		sizes = append(sizes, len(items))
		mu.Unlock()
		if items[0] == 0 {
			<-release // the first flush holds the first lane
		}
		running.Add(-1)
		for i, v := range items {
			answer(i, v)
		}
	})
	defer b.close()
	first, second := b.lanes[0], b.lanes[1]
	var wg sync.WaitGroup
	do := func(v int) {
		wg.Go(func() {
			if got, err := b.do(context.Background(), v); err != nil || got != v {
				t.Errorf("do(%d) = %d, %v", v, got, err)
			}
		})
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		wait.For(t, 10*time.Second, what, ok)
	}
	do(0)
	waitFor("the first flush", func() bool { return running.Load() == 1 })
	for v := 1; v <= 4; v++ {
		do(v)
		waitFor("the item queued", func() bool { return first.queued.Load()+second.queued.Load() == int64(v) })
		if second.queued.Load() != 0 || most.Load() != 1 {
			t.Fatalf("item %d of a batch that is not full yet went to the second lane (%d queued there, %d flushes at once)", v, second.queued.Load(), most.Load())
		}
	}
	do(5) // a full batch waits behind the first lane's flush: the second opens
	waitFor("the second lane's flush", func() bool { return most.Load() == 2 })
	close(release)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) != 3 || sizes[0] != 1 || sizes[1] != 1 || sizes[2] != 4 {
		t.Errorf("batches %v, want [1 1 4]: the first alone, the sixth on the second lane, then the four that waited", sizes)
	}
	if first.queued.Load() != 0 || second.queued.Load() != 0 {
		t.Errorf("queued counts %d, %d after every answer, want 0", first.queued.Load(), second.queued.Load())
	}
}

// A lane that would make one more item wait past the budget opens the
// next lane instead of refusing it: the first lane, learned at 100 items a
// second behind a held flush, queues the 25 it commits within 250 ms, and
// the next item is flushed at once on the second lane.
func TestBatcherOpensALaneRatherThanRefuse(t *testing.T) {
	release, holding := make(chan struct{}), make(chan struct{})
	b := newBatcher(2, 1000, time.Minute, 250*time.Millisecond, laneMetrics{}, func(_ context.Context, items []int, answer func(int, int)) {
		if items[0] == 0 {
			close(holding)
			<-release // the first flush holds the first lane
		}
		for i, v := range items {
			answer(i, v)
		}
	})
	defer b.close()
	first := b.lanes[0]
	first.rate.Store(math.Float64bits(100))
	var wg sync.WaitGroup
	for i := range 26 {
		wg.Go(func() {
			if _, err := b.do(context.Background(), i); err != nil {
				t.Errorf("do(%d) = %v", i, err)
			}
		})
		if i == 0 {
			<-holding
		}
	}
	wait.For(t, 10*time.Second, "25 waiting behind the first", func() bool { return first.queued.Load() >= 25 })
	if v, err := b.do(context.Background(), 99); err != nil || v != 99 {
		t.Fatalf("do(27th) = %d, %v, want it committed on the second lane while the first is held", v, err)
	}
	close(release)
	wg.Wait()
}

// A lane between two flushes (none running, a queue waiting its turn) is
// judged by its queue, not taken for idle: work it can't take within the
// budget goes to the next lane rather than being refused there while that
// one idles (found by review: pick took any lane with no flush running).
func TestBatcherJudgesALaneBetweenFlushesByItsQueue(t *testing.T) {
	b := newBatcher(2, 1000, time.Minute, 250*time.Millisecond, laneMetrics{}, func(_ context.Context, items []int, answer func(int, int)) {
		for i, v := range items {
			answer(i, v)
		}
	})
	defer b.close()
	first := b.lanes[0]
	first.rate.Store(math.Float64bits(10))
	first.queued.Store(50) // between two flushes: none running, 50 waiting at 10/s
	defer first.queued.Store(0)
	if v, err := b.do(context.Background(), 7); err != nil || v != 7 {
		t.Fatalf("do = %d, %v, want it committed on the second lane", v, err)
	}
	if got := first.queued.Load(); got != 50 {
		t.Fatalf("first lane's queue = %d, want 50: the item went to it", got)
	}
}

// A lane whose flushes run past the budget (a slow ledger link) refuses
// the item rather than opening the next lane: that lane's flush would be
// as slow, and items queued behind it would each wait it out
// (TestFaultLedgerSlowShedsAtOnce: 45 to 67 past the budget when pick
// opened lanes for a slow ledger).
func TestBatcherRefusesOnASlowLedgerRatherThanOpenALane(t *testing.T) {
	release, holding := make(chan struct{}), make(chan struct{})
	b := newBatcher(2, 1000, time.Minute, 250*time.Millisecond, laneMetrics{}, func(_ context.Context, items []int, answer func(int, int)) {
		if items[0] == 0 {
			close(holding)
			<-release // the first flush holds the first lane
		}
		for i, v := range items {
			answer(i, v)
		}
	})
	defer b.close()
	first := b.lanes[0]
	first.flushTime.Store(math.Float64bits(0.5)) // its flushes take 500 ms
	done := make(chan error, 1)
	go func() {
		_, err := b.do(context.Background(), 0)
		done <- err
	}()
	<-holding
	_, err := b.do(context.Background(), 1)
	if !errors.Is(err, errLedgerBusy) {
		t.Errorf("do behind a 500 ms flush = %v, want errLedgerBusy", err)
	}
	if w := busyWait(err); w <= 250*time.Millisecond {
		t.Errorf("busy wait = %v, want the slow flush's (> 250ms)", w)
	}
	if got := b.lanes[1].flushTime.Load(); got != 0 {
		t.Errorf("the second lane ran a flush: it was opened for a slow ledger")
	}
	close(release)
	if err := <-done; err != nil {
		t.Errorf("first item = %v", err)
	}
}

// A flush past twice the budget makes its lane slow at once; one merely
// long (a loaded machine) is averaged in with the fast ones before it.
func TestBatcherLearnsASlowLedgerFromOneFlush(t *testing.T) {
	b := newBatcher(1, 10, time.Minute, 250*time.Millisecond, laneMetrics{}, func(context.Context, []int, func(int, int)) {})
	defer b.close()
	fast := 0.015
	if got := b.learnFlush(fast, 1100*time.Millisecond); got < 0.25 {
		t.Errorf("after a 1.1 s flush beside 15 ms ones: %v s, want past the 250 ms budget (slow at once)", got)
	}
	if got := b.learnFlush(fast, 400*time.Millisecond); got > 0.25 {
		t.Errorf("after a 400 ms flush beside 15 ms ones: %v s, want averaged under the budget", got)
	}
	if got := b.learnFlush(1.1, 15*time.Millisecond); got < 0.8 || got > 0.9 {
		t.Errorf("a fast flush after slow ones: %v s, want the average (0.883)", got)
	}
	if got := b.learnFlush(0, 15*time.Millisecond); got != 0.015 {
		t.Errorf("first flush: %v s, want it (0.015)", got)
	}
}

// A failover's backlog is waited out, not shed: behind a flush that
// hangs past the budget, an item sent again (withinDeadline) and one that
// came within a timeout of it stay queued and are committed once the
// ledger answers, while one that was not patient is refused.
func TestBatcherWaitsOutAFailoversBacklog(t *testing.T) {
	b, first, unhang := hungBatcher(t, time.Minute, 50*time.Millisecond, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	answers := make(chan error, 2)
	go func() { _, err := b.do(withinDeadline(ctx), 1); answers <- err }() // sent again
	l := b.lanes[0]
	for l.queued.Load() < 1 { // bounded: the item queues or answers
		select {
		case err := <-answers:
			t.Fatalf("the item sent again was answered while the ledger hung: %v", err)
		default:
			time.Sleep(time.Millisecond) // polling the queue's count
		}
	}
	go func() { _, err := b.do(ctx, 2); answers <- err }() // patient: within a timeout of the re-send
	for l.queued.Load() < 2 {
		select {
		case err := <-answers:
			t.Fatalf("an item behind the re-send was answered while the ledger hung: %v", err)
		default:
			time.Sleep(time.Millisecond) // polling the queue's count
		}
	}
	// Time under test: both have waited past the budget (twice over)
	// before the one that is not patient queues.
	queuedAt := time.Now()
	for time.Since(queuedAt) < 2*b.budget {
		time.Sleep(time.Millisecond) // time under test: the wait past the budget
	}
	// One that queued a second ago, before the re-send (not patient when
	// it came): while the lane is patient nothing is shed behind the
	// hanging flush, and once it ends the next batch commits all three:
	// the early one is part of the gap's backlog too.
	impatient := &pendingItem[int, int]{item: 3, at: time.Now().Add(-time.Second), out: make(chan outcome[int], 1)}
	l.queued.Add(1)
	l.q <- impatient
	select {
	case err := <-answers:
		t.Fatalf("a patient item was answered while the ledger hung: %v", err)
	default:
	}
	unhang()
	if o := <-impatient.out; o.err != nil || o.r != 3 {
		t.Errorf("the item queued before the re-send = %d, %v; want it committed", o.r, o.err)
	}
	for range 2 {
		if err := <-answers; err != nil {
			t.Errorf("a patient item = %v, want it committed", err)
		}
	}
	if err := <-first; err != nil {
		t.Errorf("the flushing item = %v", err)
	}
}

// A patient item whose batch would have less time than the budget or two
// of its lane's flushes is refused unflushed: its deadline would cut its
// batch.
func TestBatcherRefusesAPatientItemTooLateToFlush(t *testing.T) {
	b := newBatcher(1, 10, time.Minute, 50*time.Millisecond, laneMetrics{}, func(context.Context, []int, func(int, int)) {})
	defer b.close()
	l := b.lanes[0]
	l.flushTime.Store(math.Float64bits(0.1)) // flushes take 100 ms
	start := time.Now()
	for _, tc := range []struct {
		name    string
		patient bool
		left    time.Duration
		want    bool
	}{
		{"patient, 150 ms left", true, 150 * time.Millisecond, true},
		// Its batch ends answerMargin (100 ms) before the deadline: 150 ms
		// for two flushes of 100 ms (helper-97 #3).
		{"patient, 250 ms left", true, 250 * time.Millisecond, true},
		{"patient, 350 ms left", true, 350 * time.Millisecond, false},
		{"not patient, 10 ms left", false, 10 * time.Millisecond, false},
	} {
		p := &pendingItem[int, int]{patient: tc.patient, deadline: start.Add(tc.left)}
		if got := b.tooLate(l, p, start); got != tc.want {
			t.Errorf("%s: tooLate = %v, want %v", tc.name, got, tc.want)
		}
	}
	if p := (&pendingItem[int, int]{patient: true}); b.tooLate(l, p, start) {
		t.Error("a patient item with no deadline is too late")
	}
}

// An item queued behind a flush that runs past the item's deadline is
// answered busy at its deadline and never flushed: a failover's connect
// attempts took 2 s each, and the re-sends queued behind them (patient,
// so not shed by the budget) were answered up to 1.1 s past their work
// timeout (stockbench faults, node lost: 2,362 purchases the gateway
// answered past 5 s). One the lane has taken is answered by its batch.
func TestBatcherAnswersAQueuedItemByItsDeadline(t *testing.T) {
	var flushed sync.Map
	b, first, unhang := hungBatcher(t, time.Hour, 50*time.Millisecond, func(items []int) {
		for _, v := range items {
			flushed.Store(v, true)
		}
	})
	b.resent.Store(time.Now().UnixNano()) // a failover's re-sends: patient, not shed by the budget
	deadline := time.Now().Add(answerMargin + 200*time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	late := make(chan error, 1)
	go func() { _, err := b.do(withinDeadline(ctx), 1); late <- err }()
	select {
	case err := <-late:
		if !errors.Is(err, errLedgerBusy) {
			t.Fatalf("an item queued behind a hanging flush = %v at its deadline; want a busy refusal", err)
		}
	case <-time.After(time.Minute): // bounded: the flush hangs until release
		t.Fatal("an item queued behind a hanging flush was not answered by its deadline")
	}
	if time.Now().Before(deadline.Add(-answerMargin)) {
		t.Fatal("answered before its deadline less the margin, while its flush could still come")
	}
	unhang()
	if err := <-first; err != nil {
		t.Errorf("the flushing item = %v", err)
	}
	// The lane drops the withdrawn item when it comes to it: an item
	// after it is flushed, and the withdrawn one never is.
	if _, err := b.do(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	if _, ok := flushed.Load(1); ok {
		t.Error("the item answered busy at its deadline was flushed after all")
	}
	if q := b.lanes[0].queued.Load(); q != 0 {
		t.Errorf("%d still counted queued, want 0", q)
	}
}

// hungBatcher is a one-lane batcher (max 100) whose flush of item 0
// hangs until unhang (or the test's end): it returns once that flush
// hangs, item 0's answer to come on first. seen, if not nil, sees each
// batch as it is flushed.
func hungBatcher(t *testing.T, timeout, budget time.Duration, seen func(items []int)) (b *batcher[int, int], first <-chan error, unhang func()) {
	t.Helper()
	release, holding := make(chan struct{}), make(chan struct{})
	b = newBatcher(1, 100, timeout, budget, laneMetrics{}, func(_ context.Context, items []int, answer func(int, int)) {
		if seen != nil {
			seen(items)
		}
		if items[0] == 0 {
			close(holding)
			<-release // the ledger hangs until the test has its answers
		}
		for i, v := range items {
			answer(i, v)
		}
	})
	var once sync.Once
	unhang = func() { once.Do(func() { close(release) }) }
	t.Cleanup(b.close)
	t.Cleanup(unhang) // before close, which waits for the flush
	answer := make(chan error, 1)
	go func() { _, err := b.do(context.Background(), 0); answer <- err }() // owned by the test: unhang ends it
	<-holding
	return b, answer, unhang
}

// A batch held behind a hung flush ends a work timeout after its oldest
// request's item queued, less the answer's margin, not a whole timeout
// after it began: the items that queued behind a hung flush (the ledger's link
// black-holed) were answered past their work timeout by as long as they
// had waited (stockbench faults: 3 of 23,860 past 5 s).
func TestBatcherBatchEndsByItsOldestItemsTimeout(t *testing.T) {
	const timeout = time.Second
	var mu sync.Mutex
	var ends []time.Time
	b, first, unhang := hungBatcher(t, timeout, 0, nil)
	b.flush = func(ctx context.Context, items []int, answer func(int, int)) {
		d, _ := ctx.Deadline()
		mu.Lock()
		ends = append(ends, d)
		mu.Unlock()
		for i, v := range items {
			answer(i, v)
		}
	}
	// A request's item (with a deadline, here a late one: only the
	// timeout from its queueing bounds the batch).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := b.do(ctx, 1); done <- err }() // owned by the test: answered once unhung
	wait.For(t, time.Minute, "item 1 queued", func() bool { return b.lanes[0].queued.Load() == 1 })
	queued := time.Now()               // no earlier than the item's own time
	time.Sleep(300 * time.Millisecond) // it waits behind the hung flush (a third of its timeout)
	unhang()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ends) != 1 {
		t.Fatalf("%d batches after the hung one, want 1", len(ends))
	}
	if latest := queued.Add(timeout - answerMargin); ends[0].After(latest) {
		t.Errorf("the batch behind a hung flush ends at %v, %v after its item queued; want by %v (a timeout less the margin)",
			ends[0].Format(time.StampMicro), ends[0].Sub(queued), latest.Format(time.StampMicro))
	}
}

// An item with no request's deadline (a sweeper's) that waited longer
// than a timeout behind a hung flush does not cut its batch at once: the
// bound of a request's time is not its.
func TestBatcherItemWithoutADeadlineKeepsItsBatchsTime(t *testing.T) {
	const timeout = 100 * time.Millisecond
	flushErr := make(chan error, 1)
	b, first, unhang := hungBatcher(t, timeout, 0, nil)
	b.flush = func(ctx context.Context, items []int, answer func(int, int)) {
		flushErr <- ctx.Err()
		for i, v := range items {
			answer(i, v)
		}
	}
	done := make(chan error, 1)
	go func() { _, err := b.do(context.Background(), 1); done <- err }() // owned by the test: answered once unhung
	wait.For(t, time.Minute, "item 1 queued", func() bool { return b.lanes[0].queued.Load() == 1 })
	time.Sleep(2 * timeout) // it waits behind the hung flush past a timeout
	unhang()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-flushErr; err != nil {
		t.Errorf("the batch of an item without a deadline began already out of time: %v", err)
	}
}

// Behind a flush stalled past the budget, a patient item (a failover's
// re-sends began) is judged by the lane's learned pace, not by the
// stalled flush: slow multiplied a second's stall by the batches queued
// behind it, past the half of its time a patient item may wait, and a
// planned failover's arrivals were refused at the door (1,534 in one
// second, stockbench faults). Without a re-send (a black-holed or slow
// link) the door refuses as before.
func TestBatcherPatientItemJudgedByThePaceBehindAStall(t *testing.T) {
	b, first, unhang := hungBatcher(t, 5*time.Second, 50*time.Millisecond, nil)
	l := b.lanes[0]
	l.rate.Store(math.Float64bits(10_000)) // the lane committed 10,000 a second while healthy
	b.resent.Store(time.Now().UnixNano())  // a take was sent again: patient (shedBehind leaves the queue alone)
	queued := make(chan error, 300)
	for i := range 250 {
		go func() { _, err := b.do(context.Background(), 1+i); queued <- err }() // owned by the test: answered once unhung
	}
	wait.For(t, time.Minute, "250 queued behind the stalled flush", func() bool { return l.queued.Load() == 250 })
	wait.For(t, time.Minute, "the flush stalled 300 ms", func() bool {
		since := l.busySince.Load()
		return since != 0 && time.Since(time.Unix(0, since)) > 300*time.Millisecond
	})
	// Three batches ahead at 300 ms each by the stalled flush; 25 ms at
	// the lane's pace. The item has 1 s: it may wait half of it.
	refusedAtTheDoor := func(item int) error { // a patient item with 1 s, which may wait 500 ms
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		b.resent.Store(time.Now().UnixNano()) // a take was sent again: patient
		_, err := b.do(ctx, item)
		if n := l.queued.Load(); n != 251 {
			t.Errorf("item %d was queued (%d queued), then answered %v: want refused at the door", item, n, err)
		}
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	b.resent.Store(time.Now().UnixNano()) // again: the 250 may have taken seconds to queue on a loaded machine
	refused := make(chan error, 1)
	go func() { _, err := b.do(ctx, 1000); refused <- err }() // owned by the test: answered once unhung
	if !wait.Until(time.Minute, func() bool { return l.queued.Load() == 251 || len(refused) > 0 }) || len(refused) > 0 {
		t.Fatalf("a patient item behind a stalled flush was refused at the door: %v", <-refused)
	}
	// Not a stall: the lane's finished flushes were slow too (a new
	// primary that is slow), or it has no pace to judge by (a replica
	// started mid-failover). The door refuses at once as for a slow
	// ledger, not after the item waited its time out.
	l.flushTime.Store(math.Float64bits(0.6))
	if err := refusedAtTheDoor(3000); !errors.Is(err, errLedgerBusy) {
		t.Errorf("a patient item behind a lane whose flushes take 600 ms = %v, want refused busy", err)
	}
	l.flushTime.Store(0)
	l.rate.Store(0)
	if err := refusedAtTheDoor(4000); !errors.Is(err, errLedgerBusy) {
		t.Errorf("a patient item behind a stalled lane with no pace = %v, want refused busy", err)
	}
	b.resent.Store(0) // no re-send: the stall is a slow ledger's, for all the door knows
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if _, err := b.do(ctx2, 2000); !errors.Is(err, errLedgerBusy) {
		t.Errorf("an item behind a stalled flush with no re-send = %v, want refused busy", err)
	}
	unhang()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range 250 {
		if err := <-queued; err != nil {
			t.Errorf("an item queued behind the stall: %v", err)
		}
	}
	if err := <-refused; err != nil { // its answer after the door: flushed, or refused too late to flush
		t.Logf("the patient item, after the door: %v", err)
	}
}

// The flush that ends a failover's stall with no primary marks the lanes
// patient itself (resending) before its time would be learned, and a
// stall while patient teaches the lane nothing: it ends before any of its
// takes is sent again, and learned (even averaged in) its stall made the
// lane slow for the door while the backlog behind it drained. A stall
// with no failover is a slow ledger's, taken at its word.
func TestBatcherStallThatFoundNoPrimaryIsNotLearnedAsThePace(t *testing.T) {
	for _, noPrimary := range []bool{false, true} {
		release := make(chan struct{})
		var b *batcher[int, int]
		b = newBatcher(1, 10, 5*time.Second, 250*time.Millisecond, laneMetrics{}, func(_ context.Context, items []int, answer func(int, int)) {
			<-release // stalled: a COMMIT waiting on a standby that went away
			if noPrimary {
				b.resending() // as the committer does when a take found no primary
			}
			for i, v := range items {
				answer(i, v)
			}
		})
		l := b.lanes[0]
		l.flushTime.Store(math.Float64bits(0.01)) // 10 ms flushes while healthy
		l.rate.Store(math.Float64bits(2000))      // 2,000 a second
		done := make(chan error, 1)
		go func() { _, err := b.do(context.Background(), 1); done <- err }() // owned by the test: released below
		wait.For(t, time.Minute, "the flush stalled past twice the budget", func() bool {
			since := l.busySince.Load()
			return since != 0 && time.Since(time.Unix(0, since)) > 500*time.Millisecond
		})
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// The lane runs one flush at a time: once a second item is
		// answered, the first flush's time has been learned or not.
		if _, err := b.do(context.Background(), 2); err != nil {
			t.Fatal(err)
		}
		got, pace := math.Float64frombits(l.flushTime.Load()), math.Float64frombits(l.rate.Load())
		switch {
		case noPrimary && (got > 0.05 || pace != 2000):
			t.Errorf("after a stall that found no primary: flush time %.3f s, pace %.0f/s; want the 10 ms and 2,000/s before it (a quick flush averaged in)", got, pace)
		case !noPrimary && got < 0.4:
			t.Errorf("after a stall with no failover (a slow ledger): flush time %.3f s, want it taken at its word (past 400 ms after one quick flush)", got)
		}
		b.close()
	}
}

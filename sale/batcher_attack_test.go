package sale

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// behindLedger is a fake ledger for the attacks on shedBehind: each flush
// takes a random time around the budget (some past it, so the lane's
// timer sheds what queued behind), and records which items it flushed.
type behindLedger struct {
	mu      sync.Mutex
	flushed map[int]int // item: times flushed
	hang    chan struct{}
	maxWait time.Duration
	// longs: one flush in longs (0: none) takes long instead, past the
	// budget, while the rest stay well within it (so the door keeps
	// taking items and the lane's average stays below the budget).
	longs int
	long  time.Duration
}

func (f *behindLedger) flush(_ context.Context, items []int, answer func(int, int)) {
	if f.hang != nil {
		<-f.hang
	}
	d := time.Duration(rand.Int64N(int64(f.maxWait)))
	if f.longs > 0 && rand.IntN(f.longs) == 0 {
		d = f.long
	}
	time.Sleep(d) // time under test: a flush within or past the budget
	f.mu.Lock()
	for _, v := range items {
		f.flushed[v]++
	}
	f.mu.Unlock()
	for i, v := range items {
		answer(i, v)
	}
}

// checkBehind checks each item's answer against what the ledger flushed:
// an item answered is flushed exactly once, an item refused (busy or
// closing: "nothing was done") never; every lane counts none queued.
func checkBehind(t *testing.T, b *batcher[int, int], f *behindLedger, got map[int]error, vals map[int]int) (ok, busy, closing int) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for item, err := range got {
		n := f.flushed[item]
		switch {
		case err == nil:
			ok++
			if n != 1 || vals[item] != item {
				t.Errorf("item %d answered %d (ok) but flushed %d times", item, vals[item], n)
			}
		case errors.Is(err, errLedgerBusy), errors.Is(err, errClosing):
			if errors.Is(err, errLedgerBusy) {
				busy++
			} else {
				closing++
			}
			if n != 0 {
				t.Errorf("item %d refused (%v: nothing done) but flushed %d times", item, err, n)
			}
		default:
			t.Errorf("item %d: unexpected error %v", item, err)
		}
	}
	for i, l := range b.lanes {
		if q := l.queued.Load(); q != 0 {
			t.Errorf("lane %d counts %d queued once every item was answered", i, q)
		}
		if len(l.q) != 0 {
			t.Errorf("lane %d still has %d items in its queue", i, len(l.q))
		}
	}
	return ok, busy, closing
}

// TestAttackBehindBatcherExactlyOnce: many items from many goroutines on
// two lanes whose flushes take 0-3x the budget. shedBehind's timer takes
// items out of the queue and puts the young back while the lane's own
// goroutine may end its flush and drain the same queue. Each item must be
// answered once: flushed exactly once when answered with a result, never
// when refused, and the lanes' queued counts must come back to 0.
func TestAttackBehindBatcherExactlyOnce(t *testing.T) {
	f := &behindLedger{flushed: map[int]int{}, maxWait: time.Millisecond, longs: 8, long: 25 * time.Millisecond}
	b := newBatcher(2, 4, time.Second, 10*time.Millisecond, laneMetrics{}, f.flush)
	defer b.close()
	const workers, each = 64, 60
	var mu sync.Mutex
	got, vals := map[int]error{}, map[int]int{}
	shedLate := 0 // refused after waiting past the budget: shedBehind's (or flushAll's)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				item := w*each + i
				began := time.Now()
				v, err := b.do(context.Background(), item)
				mu.Lock()
				got[item], vals[item] = err, v
				if errors.Is(err, errLedgerBusy) && time.Since(began) > 10*time.Millisecond {
					shedLate++
				}
				mu.Unlock()
				if errors.Is(err, errLedgerBusy) {
					time.Sleep(time.Millisecond) // a client's backoff
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second): // bounded: every item is answered within a few flushes
		t.Fatal("items not answered within 30 s: one was lost (taken out of a queue, never answered)")
	}
	ok, busy, closing := checkBehind(t, b, f, got, vals)
	t.Logf("%d answered, %d refused busy (%d after waiting past the budget), %d closing", ok, busy, shedLate, closing)
	if shedLate == 0 {
		t.Log("no item was shed: the attack did not reach shedBehind")
	}
}

// TestAttackBehindBatcherCloseWhileHung: the lane's flush hangs past the
// budget with items queued behind it, some old (shed by the timer) and
// some young (put back); the batcher is closed while it hangs, then the
// flush ends. Every item is answered once, none refused and flushed, and
// do after close refuses with errClosing.
func TestAttackBehindBatcherCloseWhileHung(t *testing.T) {
	for round := range 20 {
		f := &behindLedger{flushed: map[int]int{}, hang: make(chan struct{}), maxWait: time.Millisecond}
		b := newBatcher(1, 4, time.Second, 10*time.Millisecond, laneMetrics{}, f.flush)
		var mu sync.Mutex
		got, vals := map[int]error{}, map[int]int{}
		var wg sync.WaitGroup
		send := func(item int) {
			wg.Go(func() {
				v, err := b.do(context.Background(), item)
				mu.Lock()
				got[item], vals[item] = err, v
				mu.Unlock()
			})
		}
		send(0) // the flush that hangs
		for b.lanes[0].busySince.Load() == 0 {
			time.Sleep(100 * time.Microsecond) // poll interval
		}
		// Queued straight into the lane, as the door takes items before
		// the flush has run the budget; some now, some while the timer
		// runs.
		l := b.lanes[0]
		enqueue := func(item int) {
			p := &pendingItem[int, int]{item: item, at: time.Now(), out: make(chan outcome[int], 1)}
			l.queued.Add(1)
			l.q <- p
			wg.Go(func() {
				o := <-p.out
				mu.Lock()
				got[item], vals[item] = o.err, o.r
				mu.Unlock()
			})
		}
		for i := 1; i <= 4; i++ {
			enqueue(i)
		}
		time.Sleep(time.Duration(8+round%5) * time.Millisecond) // time under test: around the budget, so the timer meets young and old
		for i := 5; i <= 8; i++ {
			enqueue(i)
		}
		closed := make(chan struct{})
		go func() { b.close(); close(closed) }()
		time.Sleep(time.Duration(round%4) * 5 * time.Millisecond) // time under test: the close waits on the hung flush
		close(f.hang)
		select {
		case <-closed:
		case <-time.After(10 * time.Second): // bounded
			t.Fatalf("round %d: close did not return after the flush ended", round)
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second): // bounded
			t.Fatalf("round %d: an item queued behind the hung flush was never answered after close", round)
		}
		if _, err := b.do(context.Background(), 99); !errors.Is(err, errClosing) {
			t.Errorf("round %d: do after close = %v, want errClosing", round, err)
		}
		checkBehind(t, b, f, got, vals)
		if got[0] != nil {
			t.Errorf("round %d: the hung flush's own item = %v, want its answer", round, got[0])
		}
	}
}

// TestAttackBehindBatcherCountsStayTrue: after a storm that sheds behind
// long flushes, an idle lane must take an item at once and flush it (a
// queued count left above 0 would make the door judge an idle lane
// busy, forever).
func TestAttackBehindBatcherCountsStayTrue(t *testing.T) {
	f := &behindLedger{flushed: map[int]int{}, maxWait: 20 * time.Millisecond}
	b := newBatcher(1, 2, time.Second, 2*time.Millisecond, laneMetrics{}, f.flush)
	defer b.close()
	var wg sync.WaitGroup
	var sent atomic.Int64
	for w := range 32 {
		wg.Go(func() {
			for i := range 50 {
				_, _ = b.do(context.Background(), 1_000_000+w*100+i)
				sent.Add(1)
			}
		})
	}
	wg.Wait()
	time.Sleep(30 * time.Millisecond) // time under test: past any flush and its timer
	f.maxWait = time.Nanosecond
	for i := range 5 {
		// An answer comes before its flush has marked the lane idle: the
		// next item waits for that (an item sent in that moment is judged
		// by the lane's pace, as before shedBehind).
		for b.lanes[0].busySince.Load() != 0 {
			time.Sleep(100 * time.Microsecond) // poll interval
		}
		if _, err := b.do(context.Background(), i); err != nil {
			t.Errorf("item %d on an idle lane after the storm (%d sent) = %v; want flushed (queued %d)",
				i, sent.Load(), err, b.lanes[0].queued.Load())
		}
	}
}

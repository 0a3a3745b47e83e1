package sale

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

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
			if _, err := b.do(context.Background(), 0, i); err != nil {
				errs <- err
			}
		})
		if i == 0 {
			<-holding
		}
	}
	for l.queued.Load() < 25 {
		time.Sleep(time.Millisecond) // until 25 wait behind the first
	}
	_, err := b.do(context.Background(), 0, 99)
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
	if v, err := b.do(context.Background(), 0, 7); err != nil || v != 7 {
		t.Errorf("do after the queue drained = %d, %v; want 7", v, err)
	}
}

// An item that waited longer than the budget behind a slow flush, on a
// lane whose queue is longer than it commits within the budget, is
// refused when its turn comes, never flushed; on a lane that keeps up,
// it is flushed however long it waited.
func TestBatcherRefusesWhatWaitedTooLong(t *testing.T) {
	for _, tc := range []struct {
		name string
		rate float64 // what the lane learned, set once the three wait
		shed bool
	}{{"overloaded", 10, true}, {"keeping up", 1e6, false}} {
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
			go func() { _, err := b.do(context.Background(), 0, 0); first <- err }()
			<-holding
			late := make(chan error, 3)
			for i := 1; i <= 3; i++ {
				go func() { _, err := b.do(context.Background(), 0, i); late <- err }()
			}
			for b.lanes[0].queued.Load() < 3 {
				time.Sleep(time.Millisecond) // until the three are queued
			}
			// From the last one's arrival: on a busy machine the third may
			// be queued well after the first two.
			for queued := time.Now(); time.Since(queued) <= budget; {
				time.Sleep(time.Millisecond) // until the three have waited past the budget
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

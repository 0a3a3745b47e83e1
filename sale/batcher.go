package sale

import (
	"context"
	"sync"
	"time"
)

// batcher group-commits work: items queue on partitions, and each
// partition hands whatever queued while its previous flush ran (up to max)
// to one flush. Under load the ledger then sees one transaction per batch,
// not per item; a lone item still goes at once, alone. Each partition is a
// goroutine owned by the batcher and ended by close.
type batcher[T, R any] struct {
	max     int
	timeout time.Duration
	// flush decides items and calls answer once for each index, as soon
	// as that item's outcome is known.
	flush  func(ctx context.Context, items []T, answer func(i int, r R))
	queues []chan *pendingItem[T, R]
	stop   chan struct{}
	wg     sync.WaitGroup
	// mu orders do's enqueue against close: once closed is set, no item is
	// queued where no partition will take it.
	mu     sync.RWMutex
	closed bool
}

type pendingItem[T, R any] struct {
	item T
	out  chan R
}

func newBatcher[T, R any](partitions, max int, timeout time.Duration,
	flush func(ctx context.Context, items []T, answer func(i int, r R))) *batcher[T, R] {
	b := &batcher[T, R]{max: max, timeout: timeout, flush: flush, stop: make(chan struct{})}
	for range partitions {
		q := make(chan *pendingItem[T, R], 4*max)
		b.queues = append(b.queues, q)
		b.wg.Go(func() { b.run(q) })
	}
	return b
}

// do queues item on partition part (mod the partition count) and waits for
// its answer; ok is false once the batcher is closed (nothing was done).
func (b *batcher[T, R]) do(part uint32, item T) (_ R, ok bool) {
	p := &pendingItem[T, R]{item: item, out: make(chan R, 1)}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		var zero R
		return zero, false
	}
	b.queues[part%uint32(len(b.queues))] <- p // the partition drains its queue before it stops
	b.mu.RUnlock()
	return <-p.out, true
}

func (b *batcher[T, R]) run(q chan *pendingItem[T, R]) {
	for {
		var first *pendingItem[T, R]
		select {
		case first = <-q:
		case <-b.stop:
			for { // answer whatever is still queued before leaving
				select {
				case p := <-q:
					b.flushAll([]*pendingItem[T, R]{p})
				default:
					return
				}
			}
		}
		batch := []*pendingItem[T, R]{first}
	drain:
		for len(batch) < b.max {
			select {
			case p := <-q:
				batch = append(batch, p)
			default:
				break drain
			}
		}
		b.flushAll(batch)
	}
}

func (b *batcher[T, R]) flushAll(batch []*pendingItem[T, R]) {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	items := make([]T, len(batch))
	for i, p := range batch {
		items[i] = p.item
	}
	b.flush(ctx, items, func(i int, r R) { batch[i].out <- r })
}

// close stops the partitions once they have answered what was queued; do
// after it returns ok false. A second close does nothing.
func (b *batcher[T, R]) close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	b.mu.Unlock()
	close(b.stop)
	b.wg.Wait()
}

// aloneLimit bounds how many items split out of one batch are decided
// alone at once.
const aloneLimit = 16

// eachAlone runs decide for each index, at most aloneLimit at a time, and
// returns when all have run: the items a batch could not decide together.
func eachAlone(idx []int, decide func(i int)) {
	sem := make(chan struct{}, aloneLimit)
	var wg sync.WaitGroup
	for _, i := range idx {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			decide(i)
		})
	}
	wg.Wait()
}

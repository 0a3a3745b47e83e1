package sale

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/stockgate/stockgate/ledger"
)

// committer group-commits the purchases and holds the Redis gate admitted
// (takes): takes of one SKU queue on one partition, and each partition commits whatever
// queued while its previous transaction ran as one ledger transaction. The
// winners of a hot SKU then wait on one row lock per batch, not per order,
// so ledger load grows with batches, not with winners; a quiet SKU's
// purchase still commits at once, alone.
type committer struct {
	s      *Service
	max    int
	direct bool // sales around the Redis gate (breaker open): optimistic batches
	queues []chan *pendingCommit
	stop   chan struct{}
	wg     sync.WaitGroup
	// mu orders commit's enqueue against close: once closed is set, no
	// request is queued where no partition will take it.
	mu     sync.RWMutex
	closed bool
}

type pendingCommit struct {
	take ledger.Take
	out  chan commitOut
}

type commitOut struct {
	order ledger.Order
	hold  ledger.Hold
	err   error
}

var errClosing = fmt.Errorf("gateway: shutting down: %w", ledger.ErrNotCommitted)

func newCommitter(s *Service, partitions, max int, direct bool) *committer {
	c := &committer{s: s, max: max, direct: direct, stop: make(chan struct{})}
	for range partitions {
		q := make(chan *pendingCommit, 4*max)
		c.queues = append(c.queues, q)
		c.wg.Go(func() { c.run(q) }) // owned by c; ends with close
	}
	return c
}

// commit waits for o's turn in a batch and returns what Ledger.Purchase
// would have: the order, ErrDuplicate with the stored one, a refusal, or
// an error (ErrNotCommitted when nothing was written).
func (c *committer) commit(o ledger.Order) (ledger.Order, error) {
	r := c.commitTake(ledger.Take{Order: o})
	return r.order, r.err
}

// commitHold is commit for a gate-admitted counted hold: it answers as
// Ledger.Hold would.
func (c *committer) commitHold(h ledger.Hold) (ledger.Hold, error) {
	r := c.commitTake(ledger.Take{Hold: &h})
	return r.hold, r.err
}

func (c *committer) commitTake(t ledger.Take) commitOut {
	p := &pendingCommit{take: t, out: make(chan commitOut, 1)}
	q := c.queues[crc32.ChecksumIEEE([]byte(t.SKU().String()))%uint32(len(c.queues))]
	c.mu.RLock()
	if c.closed {
		c.mu.RUnlock()
		return commitOut{err: errClosing}
	}
	q <- p // the partition drains its queue before it stops
	c.mu.RUnlock()
	return <-p.out
}

// alone commits one take by itself through the gate: what a take split out
// of a batch gets.
func (c *committer) takeAlone(ctx context.Context, t ledger.Take) commitOut {
	if t.Hold != nil {
		h, err := c.s.ledger.Hold(ctx, *t.Hold, -1)
		return commitOut{hold: h, err: err}
	}
	o, err := c.s.ledger.Purchase(ctx, t.Order)
	return commitOut{order: o, err: err}
}

func (c *committer) run(q chan *pendingCommit) {
	for {
		var first *pendingCommit
		select {
		case first = <-q:
		case <-c.stop:
			// Answer whatever is still queued before leaving.
			for {
				select {
				case p := <-q:
					c.flush([]*pendingCommit{p})
				default:
					return
				}
			}
		}
		batch := []*pendingCommit{first}
	drain:
		for len(batch) < c.max {
			select {
			case p := <-q:
				batch = append(batch, p)
			default:
				break drain
			}
		}
		c.flush(batch)
	}
}

func (c *committer) flush(batch []*pendingCommit) {
	ctx, cancel := context.WithTimeout(context.Background(), c.s.opts.WorkTimeout)
	defer cancel()
	if c.direct {
		c.flushDirect(ctx, batch)
		return
	}
	if len(batch) == 1 {
		batch[0].out <- c.takeAlone(ctx, batch[0].take)
		return
	}
	takes := make([]ledger.Take, len(batch))
	for i, p := range batch {
		takes[i] = p.take
	}
	res, err := c.s.ledger.CommitBatch(ctx, takes, false)
	for i, p := range batch {
		switch {
		case err != nil:
			p.out <- commitOut{err: err}
		case errors.Is(res[i].Err, ledger.ErrSplit):
			// Its SKU could not take the whole batch: the ledger decides
			// this one alone (sold out, over a cap, or fine after all).
			p.out <- c.takeAlone(ctx, p.take)
		default:
			p.out <- commitOut{res[i].Order, res[i].Hold, res[i].Err}
		}
	}
}

// flushDirect commits a batch of sales around the gate, optimistically:
// the ledger reads each SKU's version in the transaction and updates at it;
// when another replica moved it meanwhile, the whole batch is retried after
// a jittered, growing pause, up to FallbackAttempts times. One replica's
// buyers of a SKU never conflict with each other: they share a batch.
func (c *committer) flushDirect(ctx context.Context, batch []*pendingCommit) {
	orders := make([]ledger.Order, len(batch))
	for i, p := range batch {
		orders[i] = p.take.Order // around the gate only purchases batch
	}
	var res []ledger.BatchResult
	var err error
	for attempt := range c.s.opts.FallbackAttempts {
		if attempt > 0 {
			pause := time.Duration(rand.Int64N(int64(c.s.opts.FallbackBackoff) << attempt))
			time.Sleep(pause)
		}
		if res, err = c.s.ledger.PurchaseBatch(ctx, orders, true); !errors.Is(err, ledger.ErrConflict) {
			break
		}
	}
	for i, p := range batch {
		switch {
		case err != nil:
			p.out <- commitOut{err: err}
		case errors.Is(res[i].Err, ledger.ErrSplit):
			// Its SKU could not take the whole batch: decide this one alone,
			// so one buyer over a cap or the stock never refuses the others.
			o, err := c.alone(ctx, p.take.Order)
			p.out <- commitOut{order: o, err: err}
		default:
			p.out <- commitOut{order: res[i].Order, err: res[i].Err}
		}
	}
}

// alone commits one order around the gate by itself: read the version,
// commit at it, and on a conflict read again after a jittered pause.
func (c *committer) alone(ctx context.Context, o ledger.Order) (ledger.Order, error) {
	var err error
	for attempt := range c.s.opts.FallbackAttempts {
		if attempt > 0 {
			time.Sleep(time.Duration(rand.Int64N(int64(c.s.opts.FallbackBackoff) << attempt)))
		}
		st, rerr := c.s.ledger.SKU(ctx, o.SKU)
		if rerr != nil {
			return ledger.Order{}, fmt.Errorf("%w: %w", ledger.ErrNotCommitted, rerr)
		}
		var got ledger.Order
		if got, err = c.s.ledger.PurchaseDirect(ctx, o, st.Version); !errors.Is(err, ledger.ErrConflict) {
			return got, err
		}
	}
	return ledger.Order{}, err
}

// close stops the partitions once they have answered what was queued;
// commits after it return errClosing. A second close does nothing.
func (c *committer) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()
	close(c.stop)
	c.wg.Wait()
}

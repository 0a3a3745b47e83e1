package sale

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"time"

	"github.com/stockgate/stockgate/ledger"
)

// committer group-commits the purchases and holds the Redis gate admitted
// (takes): takes of one SKU queue on one partition of a batcher, and each
// partition commits whatever queued while its previous transaction ran as
// one ledger transaction. The winners of a hot SKU then wait on one row
// lock per batch, not per order, so ledger load grows with batches, not
// with winners; a quiet SKU's purchase still commits at once, alone.
type committer struct {
	s      *Service
	direct bool // sales around the Redis gate (breaker open): optimistic batches
	b      *batcher[ledger.Take, commitOut]
}

type commitOut struct {
	order ledger.Order
	hold  ledger.Hold
	err   error
}

var errClosing = fmt.Errorf("gateway: shutting down: %w", ledger.ErrNotCommitted)

func newCommitter(s *Service, partitions, max int, direct bool) *committer {
	c := &committer{s: s, direct: direct}
	flush := c.flush
	if direct {
		flush = c.flushDirect
	}
	c.b = newBatcher(partitions, max, s.opts.WorkTimeout, flush)
	return c
}

// commit waits for o's turn in a batch and returns what Ledger.Purchase
// would have: the order, ErrDuplicate with the stored one, a refusal, or
// an error (ErrNotCommitted when nothing was written).
func (c *committer) commit(o ledger.Order) (ledger.Order, error) {
	r := c.commitTake(ledger.Take{Order: o})
	return r.order, r.err
}

// commitHold is commit for a gate-admitted hold, counted or of seats: it
// answers as Ledger.Hold would.
func (c *committer) commitHold(h ledger.Hold) (ledger.Hold, error) {
	r := c.commitTake(ledger.Take{Hold: &h})
	return r.hold, r.err
}

func (c *committer) commitTake(t ledger.Take) commitOut {
	out, ok := c.b.do(crc32.ChecksumIEEE([]byte(t.SKU().String())), t)
	if !ok {
		return commitOut{err: errClosing}
	}
	return out
}

// close stops the partitions once they have answered what was queued;
// commits after it return errClosing. A second close does nothing.
func (c *committer) close() { c.b.close() }

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

// flush commits a batch of gate-admitted takes in one transaction, answers
// them, and then decides alone, at most aloneLimit at once, the takes whose
// SKU could not take the whole batch: one of those never delays the others'
// answers.
func (c *committer) flush(ctx context.Context, takes []ledger.Take, answer func(int, commitOut)) {
	if len(takes) == 1 {
		answer(0, c.takeAlone(ctx, takes[0]))
		return
	}
	res, err := c.s.ledger.CommitBatch(ctx, takes, false)
	var split []int
	for i := range takes {
		switch {
		case err != nil:
			answer(i, commitOut{err: err})
		case errors.Is(res[i].Err, ledger.ErrSplit):
			split = append(split, i) // sold out, over a cap, or fine after all
		default:
			answer(i, commitOut{res[i].Order, res[i].Hold, res[i].Err})
		}
	}
	eachAlone(split, func(i int) { answer(i, c.takeAlone(ctx, takes[i])) })
}

// flushDirect commits a batch of sales around the gate, optimistically:
// the ledger reads each SKU's version in the transaction and updates at it;
// when another replica moved it meanwhile, the whole batch is retried after
// a jittered, growing pause, up to FallbackAttempts times. One replica's
// buyers of a SKU never conflict with each other: they share a batch.
func (c *committer) flushDirect(ctx context.Context, takes []ledger.Take, answer func(int, commitOut)) {
	var res []ledger.BatchResult
	var err error
	for attempt := range c.s.opts.FallbackAttempts {
		if attempt > 0 {
			pause := time.Duration(rand.Int64N(int64(c.s.opts.FallbackBackoff) << attempt))
			time.Sleep(pause)
		}
		if res, err = c.s.ledger.CommitBatch(ctx, takes, true); !errors.Is(err, ledger.ErrConflict) {
			break
		}
	}
	var split []int
	for i := range takes {
		switch {
		case err != nil:
			answer(i, commitOut{err: err})
		case errors.Is(res[i].Err, ledger.ErrSplit):
			// Its SKU could not take the whole batch: decide this one alone,
			// so one buyer over a cap or the stock never refuses the others.
			split = append(split, i)
		default:
			answer(i, commitOut{res[i].Order, res[i].Hold, res[i].Err})
		}
	}
	eachAlone(split, func(i int) { answer(i, c.alone(ctx, takes[i])) })
}

// alone commits one take around the gate by itself: read the version,
// commit at it, and on a conflict read again after a jittered pause.
func (c *committer) alone(ctx context.Context, t ledger.Take) commitOut {
	var out commitOut
	for attempt := range c.s.opts.FallbackAttempts {
		if attempt > 0 {
			time.Sleep(time.Duration(rand.Int64N(int64(c.s.opts.FallbackBackoff) << attempt)))
		}
		st, err := c.s.ledger.SKU(ctx, t.SKU())
		if err != nil {
			return commitOut{err: fmt.Errorf("%w: %w", ledger.ErrNotCommitted, err)}
		}
		if t.Hold != nil {
			out.hold, out.err = c.s.ledger.Hold(ctx, *t.Hold, st.Version)
		} else {
			out.order, out.err = c.s.ledger.PurchaseDirect(ctx, t.Order, st.Version)
		}
		if !errors.Is(out.err, ledger.ErrConflict) {
			return out
		}
	}
	return out
}

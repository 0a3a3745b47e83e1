package sale

import (
	"context"
	"errors"

	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// committer group-commits the takes of stock (purchases, holds, seat
// holds, carts): takes queue on the partitions of a batcher, by the SKU of
// their first line, and each partition commits whatever queued while its
// previous transaction ran as one ledger transaction (Ledger.Commit). The
// winners of a hot SKU then wait on one row lock per batch, not per take,
// so ledger load grows with batches, not with winners; a quiet SKU's
// purchase still commits at once, alone. A take the ledger refuses is
// refused alone, never failing its batch.
type committer struct {
	s      *Service
	direct bool // takes around the Redis gate (breaker open)
	b      *batcher[ledger.Take, ledger.TakeResult]
}

func newCommitter(s *Service, partitions, max int, direct bool) *committer {
	c := &committer{s: s, direct: direct}
	work := "takes"
	if direct {
		work = "direct_takes"
	}
	c.b = newBatcher(partitions, max, s.opts.WorkTimeout, s.opts.LedgerWaitBudget, s.metrics.batchMetrics(work), func(ctx context.Context, takes []ledger.Take, answer func(int, ledger.TakeResult)) {
		for i, r := range s.ledger.Commit(ctx, takes, direct) {
			answer(i, r)
		}
	})
	return c
}

// commit waits for o's turn in a batch and returns what Ledger.Purchase
// would have: the order, ErrDuplicate with the stored one, a refusal, or
// an error (ErrNotCommitted when nothing was written).
func (c *committer) commit(o ledger.Order) (ledger.Order, error) {
	r := c.commitTake(ledger.PurchaseTake(o))
	return r.Order(), r.Err
}

// commitHold is commit for a hold, counted or of seats: it answers as
// Ledger.Hold would.
func (c *committer) commitHold(h ledger.Hold) (ledger.Hold, error) {
	r := c.commitTake(ledger.HoldTake(h))
	return r.Hold(), r.Err
}

// commitCart is commit for a cart: it answers as Ledger.PurchaseCart (or
// HoldCart) would.
func (c *committer) commitCart(cart ledger.Cart) (ledger.Cart, error) {
	r := c.commitTake(ledger.CartTake(cart))
	if r.Cart == nil || (r.Err != nil && !errors.Is(r.Err, ledger.ErrDuplicate)) {
		return ledger.Cart{}, r.Err
	}
	return *r.Cart, r.Err
}

func (c *committer) commitTake(t ledger.Take) ledger.TakeResult {
	var sku stock.SKU
	switch {
	case len(t.Orders) > 0:
		sku = t.Orders[0].SKU
	case len(t.Holds) > 0:
		sku = t.Holds[0].SKU
	}
	out, err := c.b.do(ledger.SKULane(sku), t)
	if err != nil {
		return ledger.TakeResult{Take: t, Err: err}
	}
	return out
}

// close stops the partitions once they have answered what was queued;
// commits after it return errClosing. A second close does nothing.
func (c *committer) close() { c.b.close() }

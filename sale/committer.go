package sale

import (
	"context"

	"github.com/stockgate/stockgate/ledger"
)

// committer group-commits the takes of stock (purchases, holds, seat
// holds, carts): takes queue on the lanes of a batcher, and each lane
// commits whatever queued while its previous transaction ran as one ledger
// transaction (Ledger.Commit). The winners of a hot SKU then wait on one
// row lock per batch, not per take, so ledger load grows with batches, not with winners; a quiet SKU's
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
		results := s.ledger.Commit(ctx, takes, direct)
		for _, r := range results {
			if ledger.NoPrimary(r.Err) {
				// Its takes will be sent again: the lanes are patient
				// from now, before this flush's time is learned (a
				// failover's stall, not the ledger's pace).
				c.b.resending()
				break
			}
		}
		for i, r := range results {
			answer(i, r)
		}
	})
	return c
}

func (c *committer) commitTake(ctx context.Context, t ledger.Take) ledger.TakeResult {
	out, err := c.b.do(ctx, t)
	if err != nil {
		return ledger.TakeResult{Take: t, Err: err}
	}
	return out
}

// close stops the partitions once they have answered what was queued;
// commits after it return errClosing. A second close does nothing.
func (c *committer) close() { c.b.close() }

package sale

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stockgate/stockgate/stock"
)

// Change notices: a replica that changed a SKU's stock (a take committed,
// a rebuild, an end of sale) tells every replica, at most once per
// StockTTL for all the SKUs it changed in it, and every replica drops its
// stock view of them (cache.Viewed). While the notices are heard, a view
// then stands until its SKU changes: a read flood of a SKU nobody buys
// costs Redis no call, and one of a SKU on sale reads it again once per
// StockTTL, as before.

// changeChannel carries change notices: SKUs, one per line.
const changeChannel = "sg:notices:changed"

// changesPerNotice bounds one notice's payload (a SKU is under 130 bytes).
const changesPerNotice = 500

// changes are the SKUs this replica changed since its last notice. A SKU
// keeps its flag once it has one (one per SKU ever changed here): marking
// a SKU marked already is then a lock-free read on the hot path. The SKUs
// marked since the last drain are also listed (due), so a drain costs the
// SKUs changed, not every SKU ever changed (a Range over all of them, five
// times a second, took 144 µs a drain at 10,000 SKUs; 7 ns now with
// nothing marked: BenchmarkChangesDrainNothingMarked). A flag is set, and
// cleared by a drain, under mu with its SKU's place in due, so a mark
// that finds it set returns with the SKU already in due: a drain begun
// after that mark returned reports it.
type changes struct {
	m   sync.Map // stock.SKU → *atomic.Bool: set while the SKU is in due
	mu  sync.Mutex
	due []stock.SKU
}

func (c *changes) mark(sku stock.SKU) {
	v, ok := c.m.Load(sku)
	if !ok {
		v, _ = c.m.LoadOrStore(sku, new(atomic.Bool))
	}
	b := v.(*atomic.Bool)
	if b.Load() {
		return // in due already (set after its append): the next drain has it
	}
	c.mu.Lock()
	if !b.Load() {
		c.due = append(c.due, sku)
		b.Store(true)
	}
	c.mu.Unlock()
}

// drain returns the SKUs marked since the last drain, each once.
func (c *changes) drain() []stock.SKU {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.due
	c.due = nil
	for _, sku := range out {
		if v, ok := c.m.Load(sku); ok {
			v.(*atomic.Bool).Store(false)
		}
	}
	return out
}

// stockChanged drops this replica's view of sku's stock now, and tells
// the others with the next change notice.
func (s *Service) stockChanged(sku stock.SKU) {
	s.stock.Invalidate(sku)
	s.changes.mark(sku)
}

// publishChanges sends the change notices, once per StockTTL, until ctx
// is done, and the restock notices whose publish failed. A publish that
// fails is tried again at the next tick; until one goes through, the
// views' and flags' max age bounds what other replicas serve.
func (s *Service) publishChanges(ctx context.Context) {
	t := time.NewTicker(s.opts.StockTTL)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return // Close sends what is left
		case <-t.C:
		}
		s.sendNotices(ctx)
	}
}

// sendNotices publishes the change notices due and the restock notices
// owed; what fails is marked again for the next round.
func (s *Service) sendNotices(ctx context.Context) {
	for skus := s.changes.drain(); len(skus) > 0; {
		n := min(len(skus), changesPerNotice)
		lines := make([]string, n)
		for i, sku := range skus[:n] {
			lines[i] = sku.String()
		}
		if err := s.opts.Notifier.Publish(ctx, changeChannel, strings.Join(lines, "\n")).Err(); err != nil && ctx.Err() == nil {
			for _, sku := range skus[:n] {
				s.changes.mark(sku) // with the next notice
			}
			if ok, left := s.logs.Allow("change notice", time.Now()); ok {
				s.log.WarnContext(ctx, "publish change notice; sent again with the next", "skus", n, "err", err, "left_out", left)
			}
		}
		skus = skus[n:]
	}
	for _, sku := range s.restocksOwed.drain() {
		if err := s.opts.Notifier.Publish(ctx, noticeChannel, sku.String()).Err(); err != nil && ctx.Err() == nil {
			s.restocksOwed.mark(sku)
		}
	}
}

// applyChanges applies a change notice (another replica's, or this
// one's): each SKU's stock view is read again at its next read.
func (s *Service) applyChanges(payload string) {
	for line := range strings.SplitSeq(payload, "\n") {
		program, ticket, _ := strings.Cut(line, "/")
		sku, err := stock.ParseStored(program, ticket)
		if err != nil {
			continue // another replica's message: parsed like any input
		}
		// Counted before the view goes: a load this notice overtook is
		// then not trusted past its TTL (cache.Viewed).
		s.cache.Heard()
		s.stock.Invalidate(sku)
	}
}

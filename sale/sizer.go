package sale

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/stock"
)

// Self-sized shards (Options.AutoShards): a SKU's shard count follows how
// hard it is taken from, so a flash sale needs no guess. One shard is one
// Redis key on one master, and every take of the SKU runs a script there;
// spread over n shards its takes spread over the masters the shards hash
// to. Too many shards cost the other way: each holds fewer units, so
// buyers probe more shards as they run empty, and near the end units sit
// on shards the buyers' start points miss. The sizer grows a SKU while its
// takes outrun what its shards are sized for, and folds it back as the
// sale cools or its units thin out, each move a fenced resize (the rebuild
// a reseed does), so no unit or place is lost or doubled.

// sizeEvery is how often the sizer looks: a flash sale's opening second
// shows its rate, and a resize is a few milliseconds behind the fence.
const sizeEvery = time.Second

// sizeCoolTicks is how many looks in a row a SKU must want fewer shards
// before it is folded: a sale that pauses for a second is not cool.
const sizeCoolTicks = 3

// sizeIdleTicks: a SKU with no takes for this many looks is forgotten
// (folded first, when it has more shards than one).
const sizeIdleTicks = 30

// sizer counts each SKU's takes and probes on this replica between looks.
type sizer struct {
	skus sync.Map // stock.SKU → *sizeSeen
}

type sizeSeen struct {
	takes, probes atomic.Int64
	// Owned by the sizer's loop:
	moved int64     // sold + held in the ledger at the last look
	at    time.Time // when
	cool  int       // looks in a row that wanted fewer shards
	idle  int       // looks in a row with no takes here
}

// note records one take of sku that ran probes shard scripts. It is on
// the purchase path: a map read and two atomic adds.
func (z *sizer) note(sku stock.SKU, probes int) {
	v, ok := z.skus.Load(sku)
	if !ok {
		v, _ = z.skus.LoadOrStore(sku, &sizeSeen{})
	}
	seen := v.(*sizeSeen)
	seen.takes.Add(1)
	seen.probes.Add(int64(probes))
}

// RunSizer sizes the shards of the SKUs this replica takes from, each
// sizeEvery, until ctx is done. It does nothing unless
// Options.AutoShards is set.
func (s *Service) RunSizer(ctx context.Context) {
	if s.opts.AutoShards < 1 {
		return
	}
	t := time.NewTicker(sizeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.sizer.skus.Range(func(k, v any) bool {
			if ctx.Err() != nil {
				return false
			}
			s.sizeOne(ctx, k.(stock.SKU), v.(*sizeSeen))
			return true
		})
	}
}

// sizeOne looks at one SKU and resizes it when its shards no longer fit.
func (s *Service) sizeOne(ctx context.Context, sku stock.SKU, seen *sizeSeen) {
	takes, probes := seen.takes.Swap(0), seen.probes.Swap(0)
	if takes == 0 {
		seen.idle++
	} else {
		seen.idle = 0
	}
	st, err := s.ledger.SKU(ctx, sku)
	if err != nil {
		if errors.Is(err, stock.ErrUnknownSKU) {
			s.sizer.skus.Delete(sku)
		}
		return
	}
	now := time.Now()
	moved := st.Sold + st.Held
	dt := sizeEvery.Seconds()
	if !seen.at.IsZero() {
		dt = max(now.Sub(seen.at).Seconds(), 1e-3)
	}
	// Takes a second, as well as this replica can tell: its own (the
	// refused ones too, which ran scripts as well) or every replica's,
	// counted in units from the ledger (a take moves one unit or more, so
	// this errs towards more shards, by at most the per-order maximum).
	rate := float64(takes) / dt
	if !seen.at.IsZero() {
		rate = max(rate, float64(moved-seen.moved)/dt)
	}
	seen.moved, seen.at = moved, now
	if st.Seated || !st.EndedAt.IsZero() {
		s.sizer.skus.Delete(sku)
		return
	}
	if seen.idle >= sizeIdleTicks && st.Shards == 1 {
		s.sizer.skus.Delete(sku)
		return
	}
	// Grown at once when the takes outrun the shards; folded only to
	// what twice the rate would want, after sizeCoolTicks looks in a row
	// (or at once when the units thin out): two replicas that measure a
	// little apart do not fold and grow the SKU by turns.
	left, per := st.Remaining(), float64(probes)/float64(max(takes, 1))
	want := shardsFor(rate, per, left, st.MaxPerOrder, st.Shards, s.opts.AutoShards, s.opts.AutoShardRate)
	switch down := shardsFor(2*rate, per, left, st.MaxPerOrder, st.Shards, s.opts.AutoShards, s.opts.AutoShardRate); {
	case want > st.Shards:
		seen.cool = 0
	case down < st.Shards && (seen.cool+1 >= sizeCoolTicks || thin(left, st.MaxPerOrder, st.Shards)):
		seen.cool, want = 0, down
	case down < st.Shards:
		seen.cool++
		return
	default:
		seen.cool = 0
		return
	}
	if _, err := s.Resize(ctx, sku, want); err != nil && !errors.Is(err, lock.ErrBusy) {
		s.log.WarnContext(ctx, "resize shards", "sku", sku.String(), "from", st.Shards, "to", want, "err", err)
	}
}

// minPerShard is the fewest units a shard is sized to hold: four of the
// largest orders, so an order rarely has to be assembled from several.
func minPerShard(maxPerOrder int64) int64 { return 4 * max(maxPerOrder, 1) }

// thin reports whether n shards hold too few units each: the folding then
// waits for no cooling.
func thin(left, maxPerOrder int64, n int) bool {
	return n > 1 && left < minPerShard(maxPerOrder)*int64(n)
}

// shardsFor is the shard count a SKU wants: enough shards that none takes
// more than perShard scripts a second, no more than its units fill (each
// at least minPerShard), at most most. A take that probed more than two
// shards on average means the shards run empty under the buyers: the SKU
// then wants half of what it has, whatever the rate.
func shardsFor(rate, probesPerTake float64, left, maxPerOrder int64, have, most int, perShard float64) int {
	want := int(math.Ceil(rate / perShard))
	if probesPerTake > 2 && have > 1 {
		want = min(want, have/2)
	}
	want = min(want, int(left/minPerShard(maxPerOrder)), most)
	return max(want, 1)
}

// Resize moves a SKU's Redis stock onto n shards now, behind the fence,
// unless another replica is rebuilding it (lock.ErrBusy).
func (s *Service) Resize(ctx context.Context, sku stock.SKU, n int) (Rebuild, error) {
	if sku.Program.IsZero() || sku.Ticket.IsZero() {
		return Rebuild{}, refuse(ErrInvalid, "program and ticket ids must match [A-Za-z0-9_-]{1,64}")
	}
	if n < 1 || n > stock.MaxShards {
		return Rebuild{}, refuse(ErrInvalid, "shards not in 1..256")
	}
	return s.rebuildWith(ctx, sku, reasonResize, true, 0, func(ctx context.Context) error {
		return s.ledger.SetShards(ctx, sku, n)
	})
}

// Package cache is the gateway's local memory, built on otter: SKU settings
// and stock reads loaded at most once per key at a time, the sold-out flag,
// and shards recently found empty. Everything has a short TTL, so a replica
// that missed a change is wrong for a bounded, configured time only; the
// sold-out TTL is the bound on a false sold-out answer from memory.
package cache

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/maypok86/otter/v2/stats"

	"github.com/stockgate/stockgate/internal/opt"
	"github.com/stockgate/stockgate/stock"
)

// Options configures a Cache. Zero values take the defaults.
type Options struct {
	// SoldOutTTL is how long a SKU found sold out is answered sold out from
	// memory without asking Redis. Default 500ms.
	SoldOutTTL time.Duration
	// EmptyShardTTL is how long a shard found empty is skipped. Default 250ms.
	EmptyShardTTL time.Duration
	// MaxEntries bounds each of the caches. Default 100,000.
	MaxEntries int
	// Stats receives otter's hit, miss and load counts. Optional.
	Stats stats.Recorder
}

// DefaultOptions are the settings a zero field takes.
func DefaultOptions() Options {
	return Options{SoldOutTTL: 500 * time.Millisecond, EmptyShardTTL: 250 * time.Millisecond, MaxEntries: 100_000}
}

// Validate reports the first field that cannot work (an *opt.Error).
func (o Options) Validate() error {
	switch {
	case o.SoldOutTTL < 0:
		return opt.Bad("SoldOutTTL", "must not be negative")
	case o.EmptyShardTTL < 0:
		return opt.Bad("EmptyShardTTL", "must not be negative")
	case o.MaxEntries < 0:
		return opt.Bad("MaxEntries", "must be at least 1")
	}
	return nil
}

func (o *Options) defaults() error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	d := DefaultOptions()
	opt.Fill(&o.SoldOutTTL, d.SoldOutTTL)
	opt.Fill(&o.EmptyShardTTL, d.EmptyShardTTL)
	opt.Fill(&o.MaxEntries, d.MaxEntries)
	return nil
}

type shardID struct {
	sku  stock.SKU
	n, i int
}

// Cache holds the sold-out flags and the known-empty shards.
type Cache struct {
	soldOut *otter.Cache[stock.SKU, *flag]
	empty   *otter.Cache[shardID, struct{}]
	ttl     time.Duration
}

// flag is a sold-out flag. It is fresh for the TTL; for one more TTL it is
// stale: one caller re-checks Redis while everyone else is still told sold
// out, so the flag's expiry does not let a herd through to Redis.
type flag struct {
	fresh      time.Time
	rechecking atomic.Bool
}

// New validates opts and returns a Cache.
func New(opts Options) (*Cache, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	soldOut, err := otter.New(&otter.Options[stock.SKU, *flag]{
		MaximumSize:      opts.MaxEntries,
		ExpiryCalculator: otter.ExpiryWriting[stock.SKU, *flag](2 * opts.SoldOutTTL),
		StatsRecorder:    opts.Stats,
	})
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	empty, err := otter.New(&otter.Options[shardID, struct{}]{
		MaximumSize:      opts.MaxEntries,
		ExpiryCalculator: otter.ExpiryWriting[shardID, struct{}](opts.EmptyShardTTL),
	})
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	return &Cache{soldOut: soldOut, empty: empty, ttl: opts.SoldOutTTL}, nil
}

// SoldOut reports whether the SKU was found sold out within the TTL. Past
// the TTL (and within one more), exactly one caller gets false, to ask Redis
// again and mark the flag anew or clear it; the others still get true.
func (c *Cache) SoldOut(sku stock.SKU) bool {
	f, ok := c.soldOut.GetIfPresent(sku)
	if !ok {
		return false
	}
	if time.Now().Before(f.fresh) {
		return true
	}
	return !f.rechecking.CompareAndSwap(false, true)
}

// SoldOutFresh reports whether the SKU was found sold out within the TTL,
// without SoldOut's side effect: past the TTL it answers false and leaves
// the re-check to the caller SoldOut picks. For answers given before the
// request's own path runs, which must not take that turn from it.
func (c *Cache) SoldOutFresh(sku stock.SKU) bool {
	f, ok := c.soldOut.GetIfPresent(sku)
	return ok && time.Now().Before(f.fresh)
}

// MarkSoldOut remembers the SKU as sold out for the TTL.
func (c *Cache) MarkSoldOut(sku stock.SKU) {
	c.soldOut.Set(sku, &flag{fresh: time.Now().Add(c.ttl)})
}

// ClearSoldOut forgets a sold-out flag, after stock came back or was added.
// It is called after every successful take, so it only writes when there
// is a flag to forget (a lock-free read otherwise).
func (c *Cache) ClearSoldOut(sku stock.SKU) {
	if _, ok := c.soldOut.GetIfPresent(sku); ok {
		c.soldOut.Invalidate(sku)
	}
}

// IsEmpty reports whether shard i of n was found empty within the TTL.
func (c *Cache) IsEmpty(sku stock.SKU, n, i int) bool {
	_, ok := c.empty.GetIfPresent(shardID{sku, n, i})
	return ok
}

// MarkEmpty remembers shard i of n as empty for the TTL.
func (c *Cache) MarkEmpty(sku stock.SKU, n, i int) { c.empty.Set(shardID{sku, n, i}, struct{}{}) }

// MarkStocked forgets that shard i of n was empty, and the SKU's sold-out
// flag with it: stock came back on this replica's watch.
func (c *Cache) MarkStocked(sku stock.SKU, n, i int) {
	c.empty.Invalidate(shardID{sku, n, i})
	c.soldOut.Invalidate(sku)
}

// Loading is a read-through cache (keyed by SKU, or anything comparable):
// concurrent misses for one key share one load, and a value lives for the
// TTL.
type Loading[K comparable, V any] struct {
	c    *otter.Cache[K, V]
	load otter.Loader[K, V]
}

// NewLoading returns a Loading cache that fills itself with load.
func NewLoading[K comparable, V any](ttl time.Duration, maxEntries int, rec stats.Recorder,
	load func(ctx context.Context, key K) (V, error)) (*Loading[K, V], error) {
	return newLoading(ttl, 0, maxEntries, rec, load)
}

// NewRefreshing returns a Loading cache whose values are fresh for ttl
// and then served, up to stale after they were loaded, while one load in
// the background replaces them (otter's refresh-after-write). Only a key
// never loaded, or not refreshed within stale, waits for its load.
//
// Why: with an expiring value, one request per key waits for the load
// each ttl. When the source is slow (a ledger half a second away), those
// loads pile up in its connection pool and requests wait seconds at the
// door (stockbench faults, PostgreSQL 500 ms slower: p99 11.6 s). A value
// a few round trips old is what the door needs; the source re-checks
// what it commits.
func NewRefreshing[K comparable, V any](ttl, stale time.Duration, maxEntries int, rec stats.Recorder,
	load func(ctx context.Context, key K) (V, error)) (*Loading[K, V], error) {
	if stale <= ttl {
		return nil, fmt.Errorf("cache: refreshing cache needs stale (%v) > ttl (%v)", stale, ttl)
	}
	return newLoading(ttl, stale, maxEntries, rec, load)
}

func newLoading[K comparable, V any](ttl, stale time.Duration, maxEntries int, rec stats.Recorder,
	load func(ctx context.Context, key K) (V, error)) (*Loading[K, V], error) {
	if ttl <= 0 || maxEntries < 1 || load == nil {
		return nil, fmt.Errorf("cache: loading cache needs ttl > 0 (%v), maxEntries >= 1 (%d) and a loader", ttl, maxEntries)
	}
	o := &otter.Options[K, V]{
		MaximumSize:      maxEntries,
		ExpiryCalculator: otter.ExpiryWriting[K, V](ttl),
		StatsRecorder:    rec,
	}
	var loader otter.Loader[K, V] = otter.LoaderFunc[K, V](load)
	if stale > 0 {
		o.ExpiryCalculator = otter.ExpiryWriting[K, V](stale)
		o.RefreshCalculator = otter.RefreshWriting[K, V](ttl)
		// A failed refresh leaves the old value to the next read, which
		// tries again; otter would log each failure.
		o.Logger = &otter.NoopLogger{}
		loader = refresher[K, V]{load: load, within: stale}
	}
	c, err := otter.New(o)
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	return &Loading[K, V]{c: c, load: loader}, nil
}

// refresher loads a missing value on its caller's context, and reloads a
// stale one on a context of its own: the read that started the refresh
// has its answer already and may end (and cancel its context) at once.
type refresher[K comparable, V any] struct {
	load   func(ctx context.Context, key K) (V, error)
	within time.Duration
}

func (r refresher[K, V]) Load(ctx context.Context, key K) (V, error) { return r.load(ctx, key) }

func (r refresher[K, V]) Reload(ctx context.Context, key K, _ V) (V, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.within)
	defer cancel()
	return r.load(ctx, key)
}

// Get returns the cached value or loads it; load errors are not cached.
func (l *Loading[K, V]) Get(ctx context.Context, key K) (V, error) {
	return l.c.Get(ctx, key, l.load)
}

// Invalidate drops a key's value so the next Get loads it again.
func (l *Loading[K, V]) Invalidate(key K) { l.c.Invalidate(key) }

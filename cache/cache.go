// Package cache is the gateway's local memory, built on otter: SKU settings
// and stock reads loaded at most once per key at a time, the sold-out flag,
// and shards recently found empty. Everything has a bounded life, so a
// replica that missed a change is wrong for a bounded, configured time
// only.
//
// The sold-out flag lives per change, not per unit of time, while the
// replica hears the restock notices (Trust): it stands until a notice says
// stock came back (Forget), up to NoticeMaxAge, the bound for a notice
// whose publish failed. A replica that does not hear them (no subscription,
// or one broken: Distrust) trusts a flag for SoldOutTTL only, re-checking
// Redis once per TTL, as before notices existed. A sold-out storm then
// costs Redis a call per SKU per NoticeMaxAge instead of per SoldOutTTL.
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
	// memory without asking Redis while restock notices are not heard.
	// Default 500ms.
	SoldOutTTL time.Duration
	// NoticeMaxAge is how long a sold-out flag stands while the notices
	// are heard and none said the SKU's stock came back: the bound on a
	// false sold-out when a notice's publish was lost. At or below
	// SoldOutTTL, flags live SoldOutTTL whatever is heard. Default 10s.
	NoticeMaxAge time.Duration
	// EmptyShardTTL is how long a shard found empty is skipped. Default 250ms.
	EmptyShardTTL time.Duration
	// MaxEntries bounds each of the caches. Default 100,000.
	MaxEntries int
	// Stats receives otter's hit, miss and load counts. Optional.
	Stats stats.Recorder
}

// DefaultOptions are the settings a zero field takes.
func DefaultOptions() Options {
	return Options{SoldOutTTL: 500 * time.Millisecond, NoticeMaxAge: 10 * time.Second, EmptyShardTTL: 250 * time.Millisecond,
		MaxEntries: 100_000}
}

// Validate reports the first field that cannot work (an *opt.Error).
func (o Options) Validate() error {
	switch {
	case o.SoldOutTTL < 0:
		return opt.Bad("SoldOutTTL", "must not be negative")
	case o.NoticeMaxAge < 0:
		return opt.Bad("NoticeMaxAge", "must not be negative")
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
	opt.Fill(&o.NoticeMaxAge, d.NoticeMaxAge)
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
	soldOut     *otter.Cache[stock.SKU, *flag]
	empty       *otter.Cache[shardID, struct{}]
	ttl, maxAge time.Duration
	// heard: the notices are heard now (Trust), in the period numbered
	// epoch (each Trust and Distrust starts one: a flag marked in an
	// earlier period may have missed a notice lost between them).
	// notices counts the notices heard, so a flag marked from a read that
	// a notice overtook is not trusted past the TTL.
	heard   atomic.Bool
	epoch   atomic.Uint64
	notices atomic.Uint64
}

// Since is the cache's moment, taken before a caller asks Redis whether a
// SKU is sold out and given back to MarkSoldOut with the answer. The zero
// Since marks a flag for its TTL only: it is never the cache's moment
// while notices are heard (Trust starts epoch 1).
type Since struct{ epoch, notices uint64 }

// flag is a sold-out flag. It is fresh for the TTL, or until the max age
// while it is trusted (marked while notices were heard, none overtaking
// its read, and heard since in the same period). For one TTL after it is
// fresh it is stale: one caller re-checks Redis while everyone else is
// still told sold out, so the flag's end does not let a herd through.
type flag struct {
	fresh, trustedUntil time.Time
	epoch               uint64
	trusted, rechecking atomic.Bool
}

// freshUntil is when f stops being fresh, as of now.
func (c *Cache) freshUntil(f *flag) time.Time {
	if f.trusted.Load() && c.heard.Load() && f.epoch == c.epoch.Load() {
		return f.trustedUntil
	}
	return f.fresh
}

// New validates opts and returns a Cache.
func New(opts Options) (*Cache, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	soldOut, err := otter.New(&otter.Options[stock.SKU, *flag]{
		MaximumSize:      opts.MaxEntries,
		ExpiryCalculator: otter.ExpiryWriting[stock.SKU, *flag](max(opts.SoldOutTTL, opts.NoticeMaxAge) + opts.SoldOutTTL),
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
	return &Cache{soldOut: soldOut, empty: empty, ttl: opts.SoldOutTTL, maxAge: opts.NoticeMaxAge}, nil
}

// SoldOut reports whether the SKU's flag is fresh. For one TTL after
// that, exactly one caller gets false, to ask Redis again and mark the
// flag anew or clear it; the others still get true.
func (c *Cache) SoldOut(sku stock.SKU) bool {
	f, ok := c.soldOut.GetIfPresent(sku)
	if !ok {
		return false
	}
	now, until := time.Now(), c.freshUntil(f)
	switch {
	case now.Before(until):
		return true
	case !now.Before(until.Add(c.ttl)):
		return false // past its stale time too (trust was lost): as gone
	}
	return !f.rechecking.CompareAndSwap(false, true)
}

// SoldOutFresh reports whether the SKU's flag is fresh, without
// SoldOut's side effect: once it is not it answers false and leaves the
// re-check to the caller SoldOut picks. For answers given before the
// request's own path runs, which must not take that turn from it.
func (c *Cache) SoldOutFresh(sku stock.SKU) bool {
	f, ok := c.soldOut.GetIfPresent(sku)
	return ok && time.Now().Before(c.freshUntil(f))
}

// Since returns the moment to give MarkSoldOut: take it before asking.
func (c *Cache) Since() Since { return Since{epoch: c.epoch.Load(), notices: c.notices.Load()} }

// MarkSoldOut remembers the SKU as sold out, as a read begun at since
// found it: for the TTL, or up to the max age when nothing was missed
// (the notices heard throughout, none heard since).
func (c *Cache) MarkSoldOut(sku stock.SKU, since Since) {
	now := time.Now()
	f := &flag{fresh: now.Add(c.ttl), trustedUntil: now.Add(c.maxAge), epoch: since.epoch}
	trusted := c.maxAge > c.ttl && c.heard.Load() && c.Since() == since
	f.trusted.Store(trusted)
	c.soldOut.Set(sku, f)
	if trusted && c.Since() != since {
		// A notice came between the check and the Set: Forget may have
		// found no flag to clear. Counted first and cleared after, it is
		// seen here or clears this flag.
		f.trusted.Store(false)
	}
}

// Trust says the restock notices are heard from now on (a subscription
// confirmed); flags marked from now on may stand until a notice.
func (c *Cache) Trust() {
	c.epoch.Add(1)
	c.heard.Store(true)
}

// Distrust says notices may be missed from now on (a subscription broke
// or ended): every flag lives its TTL only, those marked before included.
func (c *Cache) Distrust() {
	c.heard.Store(false)
	c.epoch.Add(1)
}

// Forget applies a restock notice for sku: its flag goes, and a flag a
// read begun before the notice marks later lives its TTL only.
func (c *Cache) Forget(sku stock.SKU) {
	c.notices.Add(1)
	c.ClearSoldOut(sku)
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

// Heard counts a notice that changes no flag (a SKU's stock view moved):
// a view loaded from a read it overtook lives its TTL only (see Viewed).
func (c *Cache) Heard() { c.notices.Add(1) }

// trusts reports whether a value read at since may stand past its TTL:
// the notices heard since, and none heard since (any SKU's: they are
// counted, not kept).
func (c *Cache) trusts(since Since) bool {
	return c.maxAge > 0 && c.heard.Load() && c.Since() == since
}

// stillTrusts reports whether a value trusted when stored, read at at in
// the period since.epoch, still stands past its TTL as of now.
func (c *Cache) stillTrusts(since Since, at time.Time) bool {
	return c.heard.Load() && since.epoch == c.epoch.Load() && time.Since(at) < c.maxAge
}

// Viewed is a read-through cache of a view that changes only when a
// notice says so (a SKU's stock: see sale's change notices). While the
// notices are heard (Cache.Trust), a value stands until its key is
// invalidated, up to the Cache's NoticeMaxAge; otherwise it lives ttl,
// as a Loading's does. A view nobody changes then costs no load.
type Viewed[K comparable, V any] struct {
	c     *otter.Cache[K, *view[V]]
	trust *Cache
	ttl   time.Duration
	load  otter.Loader[K, *view[V]]
}

type view[V any] struct {
	v     V
	since Since
	at    time.Time
	// checked: the first read after the value was stored decided trusted
	// (so a notice counted before then is seen, and one counted after
	// invalidates the stored value).
	checked, trusted atomic.Bool
}

// NewViewed returns a Viewed cache that fills itself with load and
// trusts its values as trust hears the notices.
func NewViewed[K comparable, V any](trust *Cache, ttl time.Duration, maxEntries int, rec stats.Recorder,
	load func(ctx context.Context, key K) (V, error)) (*Viewed[K, V], error) {
	if trust == nil || ttl <= 0 || maxEntries < 1 || load == nil {
		return nil, fmt.Errorf("cache: viewed cache needs a Cache, ttl > 0 (%v), maxEntries >= 1 (%d) and a loader", ttl, maxEntries)
	}
	c, err := otter.New(&otter.Options[K, *view[V]]{
		MaximumSize:      maxEntries,
		ExpiryCalculator: otter.ExpiryWriting[K, *view[V]](max(ttl, trust.maxAge)),
		StatsRecorder:    rec,
	})
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	l := &Viewed[K, V]{c: c, trust: trust, ttl: ttl}
	l.load = otter.LoaderFunc[K, *view[V]](func(ctx context.Context, key K) (*view[V], error) {
		since := trust.Since()
		v, err := load(ctx, key)
		if err != nil {
			return nil, err
		}
		// Its TTL runs from the load's end, as a Loading's: a load slower
		// than the TTL still answers the reads that waited for it.
		return &view[V]{v: v, since: since, at: time.Now()}, nil
	})
	return l, nil
}

// Get returns the value if it still stands, or loads it; load errors are
// not cached.
func (l *Viewed[K, V]) Get(ctx context.Context, key K) (V, error) {
	for {
		w, err := l.c.Get(ctx, key, l.load)
		if err != nil {
			var zero V
			return zero, err
		}
		if !w.checked.Load() && w.checked.CompareAndSwap(false, true) {
			w.trusted.Store(l.ttl < l.trust.maxAge && l.trust.trusts(w.since))
		}
		if time.Since(w.at) < l.ttl || w.trusted.Load() && l.trust.stillTrusts(w.since, w.at) {
			return w.v, nil
		}
		// Its time is up: read again (only the value this caller found
		// goes; another may have stored a newer one meanwhile).
		l.c.Compute(key, func(old *view[V], found bool) (*view[V], otter.ComputeOp) {
			if found && old == w {
				return nil, otter.InvalidateOp
			}
			return old, otter.CancelOp
		})
	}
}

// Invalidate drops a key's value so the next Get loads it again.
func (l *Viewed[K, V]) Invalidate(key K) { l.c.Invalidate(key) }

package sale

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/stock"
)

// Why a SKU's shards were rebuilt; the values label a metric.
const (
	reasonBypass    = "bypass"     // the ledger sold around Redis (breaker fallback)
	reasonNotSeeded = "not-seeded" // Redis lost the shards, or never had them
	reasonFenced    = "fenced"     // a re-seed closed the gate and did not reopen it
	reasonAdmin     = "admin"      // the SKU's settings changed
	reasonReconcile = "reconcile"  // an admin asked
	reasonDrift     = "drift"      // the drift check found Redis and the ledger apart
	reasonCollapse  = "collapse"   // the tail of a sale moved onto one shard
	reasonResize    = "resize"     // the sizer followed the SKU's takes (AutoShards)
	reasonStale     = "stale"      // Redis is at an older gate epoch than the ledger
)

// Rebuild is what one re-seed found and did.
type Rebuild struct {
	SKU stock.SKU
	// RedisBefore is the Redis remaining before the rebuild, -1 when some
	// shard was missing.
	RedisBefore int64
	// Ledger is the remaining stock the shards were rebuilt with.
	Ledger int64
	Shards int
	// Rebuilt is false when nothing needed doing.
	Rebuilt bool
}

// reseed makes sure the SKU's Redis shards match the ledger before Redis
// serves it again, waiting up to ReseedWait for another replica's re-seed.
// Without force it does nothing when the shards are all present and open and
// the ledger sold nothing around them. One replica runs one re-seed of a SKU
// at a time; concurrent callers share its result.
func (s *Service) reseed(ctx context.Context, sku stock.SKU, reason string, force bool) error {
	key := sku.String()
	if force {
		key += "\x00force"
	}
	_, err, _ := s.reseeds.Do(key, func() (any, error) {
		return s.rebuild(ctx, sku, reason, force, s.opts.ReseedWait)
	})
	return err
}

// A request's patience for its SKU's stale-gate rebuild (reseedSoon):
// rebuildPatience for Redis to answer for the SKU's lock, then
// rebuildPatienceLocked for the rebuild under way to end.
const (
	rebuildPatience       = 50 * time.Millisecond
	rebuildPatienceLocked = 500 * time.Millisecond
)

// reseedSoon starts the rebuild of sku's stale gate, or joins the one
// under way, and reports whether it rebuilt the gate; false: not (yet),
// so the request goes around the gate, as it may safely.
//
// A rebuild whose lock Redis answered for (taken, or held by another
// replica's rebuild) is waited out for up to rebuildPatienceLocked: a
// rebuild takes milliseconds, and takes that went around one under way
// would commit past its fence and leave the gate it reopens stale again
// (helper-87 #1). Not longer: one stalled on a master it writes besides
// the lock's (a silent link, a slow node) or on the ledger would hold
// every request of the SKU, and with them the replica's in-flight bound
// (helper-88 #1). A rebuild whose lock Redis has not answered for within
// rebuildPatience is not waited for: its master may be out, and waiting
// for the lock's retries (ReseedWait, a second) held every request of the
// SKU, which with all of Redis down at 2,564 purchases a second filled
// the in-flight bound once every breaker period (1,400 refused every 3 s;
// stockbench faults, its 503s by second). Once one request's patience
// has run out, the others go around at once until the rebuild ends
// (helper-88 #4). The rebuild goes on without them, bounded by a work
// timeout of its own, and a failure is noted so the SKU's requests try
// again only a breaker period later.
func (s *Service) reseedSoon(ctx context.Context, sku stock.SKU) bool {
	f := s.startRebuild(ctx, sku)
	if f.slow.Load() {
		select {
		case <-f.done:
			return f.ok
		default:
			return false
		}
	}
	t := time.NewTimer(rebuildPatience)
	defer t.Stop()
	select {
	case <-f.done:
		return f.ok
	case <-f.locked:
		t.Reset(rebuildPatienceLocked)
		select {
		case <-f.done:
			return f.ok
		case <-t.C:
			f.slow.Store(true)
			return false
		case <-ctx.Done():
			return false
		}
	case <-t.C:
		f.slow.Store(true)
		return false
	case <-ctx.Done():
		return false
	}
}

// rebuildFlight is one detached rebuild of a stale gate (reseedSoon).
type rebuildFlight struct {
	locked chan struct{} // closed once Redis has answered for the SKU's lock
	done   chan struct{} // closed when it has ended; ok then says how
	ok     bool
	slow   atomic.Bool // a request's patience with it ran out
}

// rebuildFlights are the detached rebuilds under way, one per SKU; Close
// waits for them.
type rebuildFlights struct {
	mu     sync.Mutex
	m      map[stock.SKU]*rebuildFlight
	wg     sync.WaitGroup
	closed bool // Close began: no rebuild starts
}

// startRebuild returns sku's detached rebuild under way, or starts one
// (after Close: one that failed).
func (s *Service) startRebuild(ctx context.Context, sku stock.SKU) *rebuildFlight {
	s.rebuilds.mu.Lock()
	defer s.rebuilds.mu.Unlock()
	if f := s.rebuilds.m[sku]; f != nil {
		return f
	}
	f := &rebuildFlight{locked: make(chan struct{}), done: make(chan struct{})}
	if s.rebuilds.closed {
		close(f.done)
		return f
	}
	if s.rebuilds.m == nil {
		s.rebuilds.m = map[stock.SKU]*rebuildFlight{}
	}
	s.rebuilds.m[sku] = f
	s.rebuilds.wg.Add(1)
	go func() { // owned by s.rebuilds: Close waits; it ends by its work timeout
		defer s.rebuilds.wg.Done()
		// Its own deadline, not the request's: a Redis call it cuts short
		// is the rebuild giving up, not the node failing.
		rctx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), s.opts.WorkTimeout, breaker.ErrCallerOutOfTime)
		defer cancel()
		err := s.rebuildDetached(rctx, sku, f)
		if err != nil {
			s.rebuildFailed(sku)
		} else {
			s.rebuildsFailed.Delete(sku)
		}
		s.rebuilds.mu.Lock()
		delete(s.rebuilds.m, sku)
		s.rebuilds.mu.Unlock()
		f.ok = err == nil
		close(f.done)
	}()
	return f
}

// closeRebuilds stops new rebuilds from starting and waits for those
// under way: one left half-way would leave its gate fenced until the
// next; each ends within a work timeout.
func (s *Service) closeRebuilds() {
	s.rebuilds.mu.Lock()
	s.rebuilds.closed = true
	s.rebuilds.mu.Unlock()
	s.rebuilds.wg.Wait()
}

// rebuildDetached runs f's rebuild, a panic turned into an error: no
// request is there to answer 500 for it. It does not join a reseed of the
// SKU under way on this replica (the fence's, the drift loop's): joined,
// it could not tell its requests when Redis answered for the lock, and
// they went around that rebuild after 50 ms (helper-88 #2). Run beside
// it, it finds the lock busy (locked: its requests wait), then the gate
// rebuilt.
func (s *Service) rebuildDetached(ctx context.Context, sku stock.SKU, f *rebuildFlight) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("sale: rebuild of %s panicked: %v", sku, r)
			s.log.ErrorContext(ctx, "rebuild panicked", "sku", sku.String(), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		}
	}()
	var once sync.Once
	_, err = s.rebuildNotify(ctx, sku, reasonBypass, false, s.opts.ReseedWait, nil, func() { once.Do(func() { close(f.locked) }) })
	return err
}

// rebuild is the fenced re-seed, under the SKU's cross-replica lock:
//
//  1. close every shard to deductions (the fence in Redis);
//  2. make the ledger change, if any (an admin lowering the total, ending
//     the sale, a resize);
//  3. move the ledger's gate epoch on and read the facts, in one ledger
//     transaction (AdvanceGate): the update waits for every commit holding
//     the SKU row, and from then on a request admitted under the old epoch
//     is refused (ErrStaleGate) and taken again through the new gate, so
//     the facts are final without waiting for anything to settle;
//  4. write the shards from the facts, at the new epoch (deduction records,
//     give-backs and returns of other epochs no longer count);
//  5. retire the old layout if the shard count changed;
//  6. record in the ledger which bypass sales the rebuild includes;
//  7. reopen.
//
// If it stops part-way (a crash, a lost lock, Redis failing), the gate stays
// closed or behind the ledger's epoch: deductions answer fenced, or their
// commits are refused as stale, and the next purchase or drift check runs
// the rebuild again. The lock's expiry bounds how long that waits.
func (s *Service) rebuild(ctx context.Context, sku stock.SKU, reason string, force bool, wait time.Duration) (Rebuild, error) {
	return s.rebuildWith(ctx, sku, reason, force, wait, nil)
}

// lockReseed names the lock one replica at a time rebuilds a SKU under.
var lockReseed = keys.MustID("reseed")

// rebuildWith is rebuild with a ledger change made while the gate is
// closed (an admin lowering the total, ending the sale): Redis never shows
// more than the changed ledger allows, at any moment.
func (s *Service) rebuildWith(ctx context.Context, sku stock.SKU, reason string, force bool, wait time.Duration,
	change func(ctx context.Context) error) (Rebuild, error) {
	return s.rebuildNotify(ctx, sku, reason, force, wait, change, nil)
}

// rebuildNotify is rebuildWith calling locked (when not nil) once it holds
// the SKU's lock.
func (s *Service) rebuildNotify(ctx context.Context, sku stock.SKU, reason string, force bool, wait time.Duration,
	change func(ctx context.Context) error, locked func()) (Rebuild, error) {
	return s.rebuildBy(ctx, sku, reason, force, wait, rebuildHow{change: change, locked: locked})
}

// rebuildHow is what a rebuild does besides reseeding the gate.
type rebuildHow struct {
	// change, when not nil, changes the ledger under the SKU's lock,
	// behind its fence, before the gate is rebuilt from it.
	change func(ctx context.Context) error
	// creates: change may create the SKU, so one the ledger does not
	// know has no gate to close yet (PutSKU of a new SKU). Any other
	// change of an unknown SKU is refused as unknown.
	creates bool
	// locked, when not nil, is called once Redis has answered for the
	// lock (acquireRebuildLock).
	locked func()
}

// rebuildBy is the rebuild of sku under its lock, as how says.
func (s *Service) rebuildBy(ctx context.Context, sku stock.SKU, reason string, force bool, wait time.Duration, how rebuildHow) (Rebuild, error) {
	change := how.change
	r := Rebuild{SKU: sku, RedisBefore: -1}
	lease, err := s.acquireRebuildLock(ctx, sku, wait, how.locked)
	if err != nil {
		return r, err
	}
	defer func() {
		if err := lease.Release(context.WithoutCancel(ctx)); err != nil {
			s.log.WarnContext(ctx, "release re-seed lock", "sku", sku.String(), "err", err)
		}
	}()
	// Stop if the lock is lost: another replica may be rebuilding now.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(lease.Context(), cancel)()

	st, err := s.ledger.SKU(ctx, sku)
	// A change that creates sku finds no gate to close yet.
	created := how.creates && change != nil && errors.Is(err, stock.ErrUnknownSKU)
	if err != nil && !created {
		return r, err
	}
	open := false
	if !created {
		var before int64
		if open, before, err = s.gateOpen(ctx, sku, st); err != nil {
			return r, err
		}
		if open {
			r.RedisBefore = before
		}
		if !force && open && !st.GateStale() {
			r.Ledger, r.Shards = st.Remaining(), st.Shards
			return r, nil // someone else rebuilt it while we waited for the lock
		}
		if err := s.gate.Fence(ctx, sku, st.Shards, true); err != nil {
			return r, err
		}
	}
	if change != nil {
		if err := change(ctx); err != nil {
			if !changedNothing(err) {
				// The change may have landed (its COMMIT's reply lost): the
				// old gate stays closed, and the next request rebuilds it
				// from what the ledger says. Reopened, it served the old
				// total (and an old shard layout, a zombie beside the new
				// one) until the settings' notice, TTL or drift check
				// caught up (helper-91 S1).
				s.log.WarnContext(ctx, "change's outcome unknown: the gate stays closed for a rebuild", "sku", sku.String(), "err", err)
				return r, err
			}
			// Nothing changed: reopen as it was, if open (one an earlier
			// unknown outcome closed waits for its rebuild, helper-92 #2).
			if !open {
				return r, err
			}
			if ferr := s.gate.Fence(ctx, sku, st.Shards, false); ferr != nil {
				s.log.WarnContext(ctx, "reopen after refused change", "sku", sku.String(), "err", ferr)
			}
			return r, err
		}
		if err := s.fenceNewLayout(ctx, sku, st.Shards); err != nil {
			return r, err
		}
	}
	if err := lease.Context().Err(); err != nil {
		return r, context.Cause(lease.Context())
	}
	fresh, err := s.ledger.AdvanceGate(ctx, sku)
	if err != nil {
		return r, err
	}
	left, err := s.seedFresh(ctx, sku, st, fresh)
	if err != nil {
		return r, err
	}
	s.reopened(ctx, sku, fresh, left)
	s.metrics.reseeds.WithLabelValues(reason).Inc()
	r.Ledger, r.Shards, r.Rebuilt = left, fresh.Shards, true
	s.log.InfoContext(ctx, "re-seeded", "sku", sku.String(), "reason", reason, "redis_before", r.RedisBefore,
		"ledger_remaining", r.Ledger, "shards", r.Shards, "epoch", fresh.GateEpoch)
	return r, nil
}

// acquireRebuildLock takes sku's rebuild lock, waiting up to wait.
// locked (when not nil) is called once Redis has answered for the lock:
// taken, or held by another replica's rebuild, whose end this one then
// waits for (and finds the gate rebuilt); with locked, a Redis that does
// not answer fails the call at once.
func (s *Service) acquireRebuildLock(ctx context.Context, sku stock.SKU, wait time.Duration, locked func()) (*lock.Lease, error) {
	key := keys.Lock(sku.Program, sku.Ticket, lockReseed)
	if locked == nil {
		return s.locker.Acquire(ctx, key, wait)
	}
	lease, err := s.locker.Acquire(ctx, key, 0)
	if err == nil || errors.Is(err, lock.ErrBusy) {
		locked()
	}
	if err == nil || wait <= 0 || !errors.Is(err, lock.ErrBusy) {
		// Redis did not answer for the lock (its master out, its breaker
		// open): the rebuild fails now rather than retry for a second,
		// so its SKU's requests hear at once when the master is probed
		// again (rebuildIn: their Retry-After) and stop waiting for it.
		return lease, err
	}
	if lease, err = s.locker.Acquire(ctx, key, wait); err == nil {
		locked()
	}
	return lease, err
}

// fenceNewLayout fences the layout a change moved sku to (a resize)
// before the epoch moves on: a return committed after AdvanceGate is
// stamped with the new layout, and its refill must find a rebuild under
// way there (try again) rather than no gate (nothing to do), or the seed,
// from facts older than the return, would leave its units out for good
// (helper-80 #2).
func (s *Service) fenceNewLayout(ctx context.Context, sku stock.SKU, was int) error {
	cur, err := s.ledger.SKU(ctx, sku)
	if err != nil || cur.Shards == was {
		return err
	}
	return s.gate.Fence(ctx, sku, cur.Shards, true)
}

// gateOpen reports whether sku's gate serves at the ledger's epoch st
// (every shard seeded and unfenced), and the units its shards hold.
func (s *Service) gateOpen(ctx context.Context, sku stock.SKU, st ledger.SKUState) (open bool, avail int64, err error) {
	shards, err := s.gate.Read(ctx, sku, st.Shards)
	if err != nil {
		return false, 0, err
	}
	open = true
	for _, sh := range shards {
		open = open && sh.Seeded && !sh.Fenced && sh.Epoch == st.GateEpoch
		avail += sh.Avail
	}
	return open, avail, nil
}

// seedFresh writes the fenced gate of sku from the ledger as fresh has it
// (st before the epoch advanced) and opens it again; it returns the units
// seeded.
func (s *Service) seedFresh(ctx context.Context, sku stock.SKU, st, fresh ledger.SKUState) (int64, error) {
	if fresh.Shards != st.Shards {
		// The shard count changed: fence the new set too before writing it
		// (a layout used before may still hold old stock, open).
		if err := s.gate.Fence(ctx, sku, fresh.Shards, true); err != nil {
			return 0, err
		}
	}
	left := fresh.Remaining()
	if !fresh.EndedAt.IsZero() {
		left = 0 // an ended sale admits no one
	}
	if err := s.gate.Seed(ctx, sku, fresh.Shards, left, fresh.GateEpoch, true); err != nil {
		return 0, err
	}
	if fresh.Shards != st.Shards && st.Shards > 0 {
		// A resize: retire the old layout. Its shards stay closed at the new
		// epoch, so a late give-back of a deduction taken there is refused
		// (the ledger facts above already count it).
		if err := s.gate.Seed(ctx, sku, st.Shards, 0, fresh.GateEpoch, true); err != nil {
			return 0, err
		}
	}
	if err := s.ledger.MarkGateSeeded(ctx, sku, fresh.BypassSeq); err != nil {
		// Redis is right but the ledger still says stale: the next purchase
		// rebuilds again, which is wasteful but harmless. Stay closed.
		return 0, err
	}
	if err := s.gate.Fence(ctx, sku, fresh.Shards, false); err != nil {
		return 0, err
	}
	return left, nil
}

// reopened tells this replica's caches, and the buyers waiting for stock,
// that sku's gate holds left units again.
func (s *Service) reopened(ctx context.Context, sku stock.SKU, fresh ledger.SKUState, left int64) {
	s.settings.Invalidate(sku)
	s.stockChanged(sku)
	if fresh.Remaining() > 0 {
		s.clearSoldOut(sku)
	}
	s.replays.unseal(sku, left > 0)
	if left > 0 {
		s.notifyRestocked(ctx, sku)
	}
}

// Reconcile rebuilds a SKU's Redis shards from the ledger now, unless
// another replica is already doing so (ErrRebuildBusy).
func (s *Service) Reconcile(ctx context.Context, sku stock.SKU) (Rebuild, error) {
	if sku.Program.IsZero() || sku.Ticket.IsZero() {
		return Rebuild{}, refuse(ErrInvalid, "program and ticket ids must match [A-Za-z0-9_-]{1,64}")
	}
	ctx, cancel := s.detach(ctx)
	defer cancel()
	r, err := s.rebuild(ctx, sku, reasonReconcile, true, 0)
	switch {
	case err == nil:
		return r, nil
	case errors.Is(err, stock.ErrUnknownSKU) && !sku.Pool().IsZero():
		return r, ErrUnknownPool
	case errors.Is(err, stock.ErrUnknownSKU):
		return r, ErrUnknownSKU
	case errors.Is(err, lock.ErrBusy):
		return r, ErrRebuildBusy
	}
	s.log.ErrorContext(ctx, "reconcile", "sku", sku.String(), "err", err)
	return r, refuse(ErrUnavailable, "reconcile failed: "+err.Error())
}

// rebuildDue reports whether a stale gate of sku may be rebuilt now: not
// within a breaker period of a rebuild of it that failed, so a SKU whose
// master is out costs the ledger and Redis one attempt per period, not
// one per take.
func (s *Service) rebuildDue(sku stock.SKU) bool {
	at, ok := s.rebuildsFailed.Load(sku)
	if !ok {
		return true
	}
	if time.Since(at.(time.Time)) < cmp.Or(s.opts.Breaker.OpenFor, breaker.DefaultOptions().OpenFor) {
		return false
	}
	s.rebuildsFailed.Delete(sku)
	return true
}

// rebuildIn is how long until a rebuild of sku's stale gate is tried
// again (0 when it is due): when its master's breaker probes again, as
// near as this replica knows.
func (s *Service) rebuildIn(sku stock.SKU) time.Duration {
	at, ok := s.rebuildsFailed.Load(sku)
	if !ok {
		return 0
	}
	return max(time.Until(at.(time.Time).Add(cmp.Or(s.opts.Breaker.OpenFor, breaker.DefaultOptions().OpenFor))), 0)
}

// rebuildFailed notes that sku's gate could not be rebuilt just now.
func (s *Service) rebuildFailed(sku stock.SKU) {
	if _, ok := s.rebuildsFailed.Load(sku); !ok {
		s.rebuildsFailed.Store(sku, time.Now())
	}
}

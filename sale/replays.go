package sale

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// replays knows, per SKU that takes no more requests (sold out or ended),
// the requests that committed stock of it, so that a storm of new keys is
// refused from memory while a retry of a committed request still gets its
// answer, on any replica. The set is bounded by the SKU's sales.
//
// It is read from the ledger incrementally (the requests stamped after the
// last row version seen). A set read while the ledger had nothing left, or
// after the sale ended, is sealed: no request can commit stock until stock
// comes back, so a key it lacks is answered at once. An unsealed set (the
// ledger still had stock: admitted requests still committing) is read
// again, once for all concurrent askers, before a key it lacks is refused:
// a retry can only arrive after its original committed or while it is
// still in flight, and either way the new read sees it or it is not yet a
// sale. Marking a SKU sold out again unseals its set, so a sale of returned
// stock is read at the next miss.
type replays struct {
	ledger Ledger
	sets   *otter.Cache[stock.SKU, *keySet]
	// inFlight is how long after this replica first missed a key in a
	// SKU's unsealed set an attempt of that request may still be
	// committing on another replica (its work timeout, and a COMMIT it
	// sent then): lookup's open.
	inFlight time.Duration
}

func newReplays(l Ledger, idle, inFlight time.Duration) (*replays, error) {
	sets, err := otter.New(&otter.Options[stock.SKU, *keySet]{
		MaximumSize: 10_000,
		// Expiry on writes only: an access-time expiry would make every
		// read of a storm a write. A set that expires is read again whole.
		ExpiryCalculator: otter.ExpiryWriting[stock.SKU, *keySet](idle),
	})
	if err != nil {
		return nil, err
	}
	return &replays{ledger: l, sets: sets, inFlight: inFlight}, nil
}

type keySet struct {
	mu   sync.RWMutex
	keys map[scopedKey]struct{}
	// byKey is keys without their scope: whether any buyer committed a
	// request under a key, for answers given before the buyer is known.
	byKey   map[keys.ID]struct{}
	version int64 // the SKU row version read up to
	sealed  bool
	// missedAt is the first miss of the set since it was last sealed or
	// its SKU restocked: about when this replica found the gate empty
	// while the ledger still had stock.
	missedAt time.Time
	started  int           // reads started
	done     int           // the last read finished
	cur      chan struct{} // closed when the read in flight ends
	// unseals counts unseal's changes: a read that began before one does
	// not seal the set, its snapshot older than the stock that came back
	// (helper-79).
	unseals uint64
	// armed is whether unseal has anything to do (sealed, missedAt set,
	// or a read in flight), for a lock-free look: every take that finds
	// stock asks it.
	armed atomic.Bool
}

// rearm sets armed from the set; mu is held.
func (ks *keySet) rearm() { ks.armed.Store(ks.sealed || !ks.missedAt.IsZero() || ks.cur != nil) }

type scopedKey struct{ scope, key keys.ID }

// committed reports whether (scope, key) committed a request that took
// stock of the SKU.
func (r *replays) committed(ctx context.Context, sku stock.SKU, scope, key keys.ID) (bool, error) {
	return r.committedAt(ctx, sku, scope, key, 0)
}

// committedAt is committed for a caller that knows the SKU's row version
// was at most known a moment ago (its cached settings): a set read up to
// that version has every request committed until then, so a miss is
// answered from memory. 0 knows nothing.
func (r *replays) committedAt(ctx context.Context, sku stock.SKU, scope, key keys.ID, known int64) (bool, error) {
	found, _, err := r.lookup(ctx, sku, scope, key, known, false)
	return found, err
}

// lookup is committedAt that also says whether a miss may not be final
// (open): the set is not sealed (the ledger still had stock when it was
// read) and this replica first missed in it less than inFlight ago, so
// an attempt of the request may still be committing (its units taken at
// the gate, its batch not yet committed). Past that, the ledger's stock
// is units the gate lost or strands (a replica that died mid-take), and
// a miss is final, as when sealed: no attempt still running can commit.
// Only a miss of a take the sold-out flag refused (flagged) starts that
// time: a cap's or a door's refusal may miss long before any sell-out.
func (r *replays) lookup(ctx context.Context, sku stock.SKU, scope, key keys.ID, known int64, flagged bool) (found, open bool, err error) {
	ks, ok := r.sets.GetIfPresent(sku)
	if !ok {
		ks, _ = r.sets.ComputeIfAbsent(sku, func() (*keySet, bool) {
			return &keySet{keys: map[scopedKey]struct{}{}, byKey: map[keys.ID]struct{}{}}, false
		})
	}
	id := scopedKey{scope, key}
	// The storm's path: a sealed set answers under a read lock.
	ks.mu.RLock()
	_, found = ks.keys[id]
	sealed := ks.sealed
	ks.mu.RUnlock()
	if found || sealed {
		return found, false, nil
	}
	ks.mu.RLock()
	current := known > 0 && ks.version >= known
	ks.mu.RUnlock()
	if current {
		return false, false, nil
	}
	ks.mu.Lock()
	if _, ok := ks.keys[id]; ok || ks.sealed {
		ks.mu.Unlock()
		return ok, false, nil
	}
	// A read that began after this call arrived, shared with every caller
	// that arrives before it begins.
	need := ks.started + 1
	for ks.done < need {
		if ks.cur == nil {
			ks.started++
			idx, ch := ks.started, make(chan struct{})
			ks.cur = ch
			after, unseals := ks.version, ks.unseals
			ks.rearm()
			ks.mu.Unlock()
			c, err := r.ledger.CommittedSince(ctx, sku, after)
			ks.mu.Lock()
			ks.cur = nil
			close(ch)
			if err != nil {
				// Not done: a caller that waited for this read starts one
				// of its own. Counted done, it answered "not committed"
				// from the set as it was, no error (helper-97: a read
				// started under a client's context that went away failed
				// the door's look-up of a token-less retry of a committed
				// purchase, answered with its refusal).
				ks.rearm()
				ks.mu.Unlock()
				return false, false, err
			}
			ks.done = idx
			for _, k := range c.Keys {
				ks.keys[scopedKey{k.Scope, k.Key}] = struct{}{}
				ks.byKey[k.Key] = struct{}{}
			}
			if c.Version > ks.version {
				ks.version = c.Version
			}
			ks.sealed = c.Sealed() && ks.unseals == unseals
			ks.rearm()
			continue
		}
		ch := ks.cur
		ks.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false, false, ctx.Err()
		}
		ks.mu.Lock()
		if ks.sealed {
			// That read began before this call, but found nothing left to
			// take: no request could commit after it, this one included.
			break
		}
	}
	_, found = ks.keys[id]
	if !found && !ks.sealed && flagged {
		now := time.Now()
		if ks.missedAt.IsZero() {
			ks.missedAt = now
			ks.rearm()
		}
		open = now.Sub(ks.missedAt) < r.inFlight
	}
	ks.mu.Unlock()
	return found, open, nil
}

// sealedWithout reports, from memory alone, that the SKU's set is sealed
// and no buyer committed a request of it under key: the request cannot be
// a retry of a sale, whoever sends it. false means "not known here".
func (r *replays) sealedWithout(sku stock.SKU, key keys.ID) bool {
	ks, ok := r.sets.GetIfPresent(sku)
	if !ok {
		return false
	}
	ks.mu.RLock()
	defer ks.mu.RUnlock()
	_, found := ks.byKey[key]
	return ks.sealed && !found
}

// unseal makes the next miss read the ledger again: stock may have come
// back and been sold since the set was sealed. restocked (stock is back
// in the gate) also starts lookup's inFlight anew, as a set sealed until
// now does: the next sell-out is a new one.
func (r *replays) unseal(sku stock.SKU, restocked bool) {
	if ks, ok := r.sets.GetIfPresent(sku); ok {
		// Every take that finds stock says restocked: the usual case,
		// nothing to change, costs an atomic load.
		if !ks.armed.Load() {
			return
		}
		ks.mu.Lock()
		if ks.sealed || restocked {
			// Stock came back: the next sell-out is a new one, and a read
			// in flight may predate the stock (it must not seal).
			ks.missedAt = time.Time{}
			ks.unseals++
		}
		ks.sealed = false
		ks.rearm()
		ks.mu.Unlock()
	}
}

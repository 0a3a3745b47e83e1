package waitroom

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stockgate/stockgate/keys"
)

// ttlCache: the rooms' configs and line views kept in memory for a
// moment, reloaded by one caller at a time; a caller that would wait past
// staleAfter for a hung reload is served the stale value.

// ttlCache keeps one value per program for a short time, loading it once
// at a time.
type ttlCache[V any] struct {
	ttl time.Duration
	// idle, when set: a value nobody asked for in this long is not
	// answered stale; its next caller waits for the reload. A buyer
	// polling a quiet line after one slow load anywhere was told the
	// line as it stood seconds before (TestModel, on CI: serving 0 where
	// 65 had been admitted 3 s earlier). Stale answers are for a source
	// that turns slow under steady demand, not for an old memory.
	idle time.Duration
	mu   sync.Mutex
	m    map[keys.ID]*ttlEntry[V]
	// slow: the last load to end took longer than staleAfter or failed.
	// A caller then waits for no reload, since every purchase at the door
	// would otherwise pay staleAfter while the source stays slow
	// (stockbench faults, PostgreSQL 500 ms slower: every 503 took 252 ms,
	// where the wait budget promises one at once). The next load that
	// ends in time clears it.
	slow atomic.Bool
}

type ttlEntry[V any] struct {
	done    chan struct{} // closed when the load ended: v and err are set
	started time.Time     // made (and its load started) then: its value is never older than ttl
	made    time.Time     // as started, but never moved by expire
	v       V
	err     error
	// last is the value this entry replaces (nil: none, or it failed),
	// answered while this one's load is slow or fails.
	last *ttlValue[V]
}

type ttlValue[V any] struct {
	v   V
	err error
}

// staleAfter is how long a caller waits for a reload before it is
// answered the value the reload replaces: a ledger that is slow or cut
// off (a failover, a lost link) keeps the door at its last known setting
// instead of holding every purchase for the load's 5 s. Every purchase of
// a queued program meets the door before the ledger's wait budget
// (250 ms) starts, so this wait adds to it at the onset of a slow ledger:
// at 250 ms, the 503s of a black-holed link's first second took 500 ms
// (stockbench faults). A room's row is read in about a millisecond.
const staleAfter = 50 * time.Millisecond

func newTTLCache[V any](ttl time.Duration) *ttlCache[V] {
	return &ttlCache[V]{ttl: ttl, m: map[keys.ID]*ttlEntry[V]{}}
}

// answerStaleWithin sets c.idle (see it) and returns c.
func (c *ttlCache[V]) answerStaleWithin(idle time.Duration) *ttlCache[V] {
	c.idle = idle
	return c
}

// get returns k's value, loading it when the one remembered is older than
// ttl. A caller waits for a load in flight only if it started within ttl,
// so every answer reflects the source as of ttl ago or later, but while
// the source does not answer within staleAfter (or fails): then it is
// the last value the source gave, at once while the source stays slow.
func (c *ttlCache[V]) get(ctx context.Context, k keys.ID, load func(context.Context) (V, error)) (V, error) {
	c.mu.Lock()
	e := c.m[k]
	if e == nil || time.Since(e.started) > c.ttl {
		if e == nil && len(c.m) >= ttlCacheMax {
			c.sweep()
		}
		now := time.Now()
		n := &ttlEntry[V]{started: now, made: now, done: make(chan struct{}), last: lastOf(e)}
		if e != nil && c.idle > 0 && now.Sub(e.made) > c.idle {
			n.last = nil
		}
		c.m[k] = n
		e = n
		// One load for every caller, not cut short by any of them
		// leaving; it ends by itself within 5 s.
		go c.load(context.WithoutCancel(ctx), k, e, load)
	}
	c.mu.Unlock()
	if e.last == nil {
		<-e.done
		return e.v, e.err
	}
	select {
	case <-e.done:
		// Loaded already, the common case: no timer for it (this is one
		// call per purchase at the door).
		if e.err == nil || errors.Is(e.err, ErrNoRoom) {
			return e.v, e.err
		}
		return e.last.v, e.last.err
	default:
	}
	if c.slow.Load() {
		return e.last.v, e.last.err
	}
	t := time.NewTimer(staleAfter)
	defer t.Stop()
	select {
	case <-e.done:
		if e.err == nil || errors.Is(e.err, ErrNoRoom) {
			return e.v, e.err
		}
	case <-t.C:
		// The load has run staleAfter: the source is slow now, whatever
		// its last load said, and the callers after this one are answered
		// at once until a load ends in time. Marked only when a load
		// ended, every purchase at the door waited staleAfter for as long
		// as the first slow load ran: with the ledger's link black-holed,
		// 5 s of 503s that each took 250 ms (stockbench faults).
		c.slow.Store(true)
	}
	return e.last.v, e.last.err
}

// lastOf is what an entry replacing e answers while it loads: e's value
// when its load ended well, else what e itself answered while loading.
func lastOf[V any](e *ttlEntry[V]) *ttlValue[V] {
	if e == nil {
		return nil
	}
	select {
	case <-e.done:
		if e.err == nil || errors.Is(e.err, ErrNoRoom) {
			return &ttlValue[V]{v: e.v, err: e.err}
		}
	default:
	}
	return e.last
}

func (c *ttlCache[V]) load(ctx context.Context, k keys.ID, e *ttlEntry[V], load func(context.Context) (V, error)) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	began := time.Now()
	v, err := load(ctx)
	c.slow.Store(time.Since(began) > staleAfter || err != nil && !errors.Is(err, ErrNoRoom))
	if err != nil && !errors.Is(err, ErrNoRoom) && e.last == nil {
		c.mu.Lock()
		if c.m[k] == e {
			delete(c.m, k) // a failure is not remembered
		}
		c.mu.Unlock()
	}
	e.v, e.err = v, err
	close(e.done)
}

// ttlCacheMax bounds a ttlCache: requests name programs, so a client
// naming made-up ones must not grow it without end.
const ttlCacheMax = 10_000

// sweep drops the entries past their ttl, and if that is not enough, half
// of the rest (any: they are a ttl's worth of loads at most). c.mu is held.
func (c *ttlCache[V]) sweep() {
	for k, e := range c.m {
		if time.Since(e.started) > c.ttl {
			delete(c.m, k)
		}
	}
	for k := range c.m {
		if len(c.m) < ttlCacheMax/2 {
			break
		}
		delete(c.m, k)
	}
}

// expire makes k's value due for a reload at its next get, which answers
// as one past its ttl does (the old value while the reload is slow).
func (c *ttlCache[V]) expire(k keys.ID) {
	c.mu.Lock()
	if e := c.m[k]; e != nil {
		e.started = time.Time{}
	}
	c.mu.Unlock()
}

func (c *ttlCache[V]) forget(k keys.ID) {
	c.mu.Lock()
	delete(c.m, k)
	c.mu.Unlock()
}

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
// staleAfter for a hung reload is served the freshest value loaded.

// ttlCache keeps one value per program for a short time, loading it once
// at a time.
type ttlCache[V any] struct {
	ttl time.Duration
	// idle, when set: the first caller after nobody asked for a value in
	// this long waits up to idleWait for its reload, not staleAfter, and
	// not at all only when slow is set: a buyer polling a quiet line after
	// one slow load anywhere was told the line as it stood seconds before
	// (TestModel, on CI: serving 0 where 65 had been admitted 3 s
	// earlier). Stale answers at once are for a source that turns slow
	// under steady demand, not for an old memory.
	idle, idleWait time.Duration
	mu             sync.Mutex
	m              map[keys.ID]*ttlEntry[V]
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
	// best is the freshest value the key's loads gave (nil: none gave
	// one), answered while this entry's load is slow or fails. Shared by
	// the key's successive entries: a load that ends after the next entry
	// was made still counts (else, with loads slower than ttl, every
	// answer stayed the first reading).
	best *atomic.Pointer[ttlValue[V]]
}

type ttlValue[V any] struct {
	v   V
	err error
	at  time.Time // when its load began
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

// answerStaleAfterIdle sets c.idle and c.idleWait (see them) and returns
// c.
func (c *ttlCache[V]) answerStaleAfterIdle(idle, wait time.Duration) *ttlCache[V] {
	c.idle, c.idleWait = idle, wait
	return c
}

// get returns k's value, loading it when the one remembered is older than
// ttl. A caller waits for a load in flight only if it started within ttl,
// so every answer reflects the source as of ttl ago or later, but while
// the source does not answer within staleAfter (or fails): then it is
// the freshest value the source gave, at once while the source stays
// slow (see idle for a caller after a quiet spell).
func (c *ttlCache[V]) get(ctx context.Context, k keys.ID, load func(context.Context) (V, error)) (V, error) {
	c.mu.Lock()
	e := c.m[k]
	afterIdle := false // this caller made the entry after a quiet spell
	if e == nil || time.Since(e.started) > c.ttl {
		if e == nil && len(c.m) >= ttlCacheMax {
			c.sweep()
		}
		now := time.Now()
		n := &ttlEntry[V]{started: now, made: now, done: make(chan struct{})}
		if e != nil {
			n.best = e.best
			afterIdle = c.idle > 0 && now.Sub(e.made) > c.idle
		} else {
			n.best = new(atomic.Pointer[ttlValue[V]])
		}
		c.m[k] = n
		e = n
		// One load for every caller, not cut short by any of them
		// leaving; it ends by itself within 5 s.
		go c.load(context.WithoutCancel(ctx), k, e, load)
	}
	c.mu.Unlock()
	last := e.best.Load()
	if last == nil {
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
		return c.freshest(e)
	default:
	}
	wait := staleAfter
	switch {
	case afterIdle:
		wait = c.idleWait
	case c.slow.Load():
		return c.freshest(e)
	}
	t := time.NewTimer(wait)
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
	return c.freshest(e)
}

// freshest is the freshest value e's key was loaded with.
func (c *ttlCache[V]) freshest(e *ttlEntry[V]) (V, error) {
	b := e.best.Load()
	return b.v, b.err
}

func (c *ttlCache[V]) load(ctx context.Context, k keys.ID, e *ttlEntry[V], load func(context.Context) (V, error)) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	began := time.Now()
	v, err := load(ctx)
	good := err == nil || errors.Is(err, ErrNoRoom)
	c.slow.Store(time.Since(began) > staleAfter || !good)
	if good {
		// Kept unless a load that began later has given one already.
		nv := &ttlValue[V]{v: v, err: err, at: began}
		for {
			old := e.best.Load()
			if old != nil && old.at.After(began) || e.best.CompareAndSwap(old, nv) {
				break
			}
		}
	} else if e.best.Load() == nil {
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

// Package lock coordinates one-at-a-time work (re-seeding a SKU, repairing
// drift) across gateway replicas with a Redis lock, in the manner of the
// seed lock component: SET NX PX with a random token, release by
// compare-and-delete in Lua so a late release never frees another owner's
// lock, renewal while the work runs, and a bounded wait with retry. A holder
// that crashes simply stops renewing, and its lock expires after TTL.
//
// The lock is advisory and best-effort, as any single-Redis lock is: a holder
// paused for longer than TTL can overlap the next one. Work done under it must
// therefore be safe to repeat; stockgate's re-seed is (it rebuilds from the
// ledger, and the ledger is what keeps stock right).
package lock

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/internal/opt"
	"github.com/stockgate/stockgate/lua"
)

// Errors.
var (
	// ErrBusy: another owner holds the lock and it was not freed within the
	// wait.
	ErrBusy = errors.New("lock: held by another owner")
	// ErrLost: the lease ended before its release: renewal found another
	// owner, or could not reach Redis for a whole TTL.
	ErrLost = errors.New("lock: lease lost")
)

// Redis is what a Locker calls: SET NX PX and GET to take a lock, and
// its two scripts (package lua's unlock and renew) to give it back and
// keep it. A *redis.ClusterClient is one; so is package shard/shardmem's
// in-memory Scripter, for tests that start no server.
type Redis interface {
	redis.Scripter
	SetNX(ctx context.Context, key string, value any, expiration time.Duration) *redis.BoolCmd
	Get(ctx context.Context, key string) *redis.StringCmd
}

// Options configures a Locker.
type Options struct {
	// Redis holds the locks. Required.
	Redis Redis
	// TTL is how long a lock outlives its last renewal: how long a crashed
	// holder blocks the others. Default 10s.
	TTL time.Duration
	// RenewEvery is how often a held lock is extended. Default TTL/3, so two
	// renewals can fail before the lock is at risk.
	RenewEvery time.Duration
	// RetryEvery is the mean pause between attempts while waiting; each pause
	// is jittered ±50% so waiting replicas do not retry in step. Default 50ms.
	RetryEvery time.Duration
	// CallTimeout bounds each Redis call. Default 1s.
	CallTimeout time.Duration
}

// Locker takes locks.
type Locker struct {
	rdb    Redis
	opts   Options
	unlock *redis.Script
	renew  *redis.Script
}

// MinTTL is the shortest lock TTL: renewals must fit in it.
const MinTTL = 100 * time.Millisecond

// DefaultOptions are the settings a zero field takes (RenewEvery: TTL/3).
func DefaultOptions() Options {
	return Options{TTL: 10 * time.Second, RetryEvery: 50 * time.Millisecond, CallTimeout: time.Second}
}

// Validate reports the first field that cannot work (an *opt.Error).
func (o Options) Validate() error {
	switch {
	case o.TTL != 0 && o.TTL < MinTTL:
		return opt.Bad("TTL", "must be at least "+MinTTL.String())
	case o.RenewEvery < 0 || o.RetryEvery < 0 || o.CallTimeout < 0:
		return opt.Bad("RenewEvery", "RenewEvery, RetryEvery and CallTimeout must not be negative")
	case o.RenewEvery != 0 && o.TTL != 0 && o.RenewEvery >= o.TTL:
		return opt.Bad("RenewEvery", "must be below TTL")
	}
	// A renewal slower than the lease would let it lapse while its holder
	// still works: another replica could rebuild at the same time.
	d := DefaultOptions()
	ttl, call := cmp.Or(o.TTL, d.TTL), cmp.Or(o.CallTimeout, d.CallTimeout)
	if call >= ttl {
		return opt.Bad("TTL", fmt.Sprintf("must be above CallTimeout (%v)", call))
	}
	return nil
}

// New validates opts and returns a Locker.
func New(opts Options) (*Locker, error) {
	if opts.Redis == nil {
		return nil, errors.New("lock: Options.Redis is required")
	}
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	d := DefaultOptions()
	opt.Fill(&opts.TTL, d.TTL)
	opt.Fill(&opts.RenewEvery, opts.TTL/3)
	opt.Fill(&opts.RetryEvery, d.RetryEvery)
	opt.Fill(&opts.CallTimeout, d.CallTimeout)
	if opts.RenewEvery >= opts.TTL {
		return nil, fmt.Errorf("lock: %w", opt.Bad("RenewEvery", "must be below TTL"))
	}
	return &Locker{rdb: opts.Redis, opts: opts,
		unlock: redis.NewScript(lua.Unlock), renew: redis.NewScript(lua.Renew)}, nil
}

// Acquire takes the lock at key, retrying for up to wait (0: one attempt).
// It returns ErrBusy when the lock stayed held, or the Redis or context
// error that stopped it. The caller must Release the lease.
func (l *Locker) Acquire(ctx context.Context, key string, wait time.Duration) (*Lease, error) {
	token := newToken()
	deadline := time.Now().Add(wait)
	lost := false // a SET's reply was lost: it may have taken the lock for token
	for {
		cctx, cancel := context.WithTimeout(ctx, l.opts.CallTimeout)
		ok, err := l.rdb.SetNX(cctx, key, token, l.opts.TTL).Result()
		if err == nil && !ok && lost {
			// Held: maybe by the SET whose reply was lost, so by us.
			var v string
			v, err = l.rdb.Get(cctx, key).Result()
			ok = err == nil && v == token
			if errors.Is(err, redis.Nil) {
				err = nil // expired meanwhile: try again
			}
		}
		cancel()
		switch {
		case ok:
			return l.start(key, token), nil
		case err != nil && (ctx.Err() != nil || !time.Now().Before(deadline)):
			return nil, fmt.Errorf("lock: acquire %s: %w", key, err)
		case err != nil:
			// A slow node, not a lost one, is the common case on a busy
			// machine: within the wait, ask again, and since a SET whose
			// reply was lost may have taken the lock for token, look whose
			// it is then.
			lost = true
		}
		pause := l.opts.RetryEvery/2 + rand.N(l.opts.RetryEvery)
		if time.Now().Add(pause).After(deadline) {
			if err != nil {
				return nil, fmt.Errorf("lock: acquire %s: %w", key, err)
			}
			return nil, fmt.Errorf("%w: %s", ErrBusy, key)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pause):
		}
	}
}

// Lease is a held lock. Its renewal goroutine runs until Release or until
// the lease is lost.
type Lease struct {
	l      *Locker
	key    string
	token  string
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

func (l *Locker) start(key, token string) *Lease {
	ctx, cancel := context.WithCancelCause(context.Background())
	ls := &Lease{l: l, key: key, token: token, ctx: ctx, cancel: cancel,
		stop: make(chan struct{}), done: make(chan struct{})}
	go ls.keepAlive()
	return ls
}

// Context is done when the lease ends: released, or lost (context.Cause
// is then ErrLost). Work under the lock should stop when it is done.
func (ls *Lease) Context() context.Context { return ls.ctx }

// keepAlive renews the lock every RenewEvery. A renewal that finds another
// owner ends the lease at once; renewals that cannot reach Redis end it when
// the lock may have expired.
func (ls *Lease) keepAlive() {
	defer close(ls.done)
	t := time.NewTicker(ls.l.opts.RenewEvery)
	defer t.Stop()
	renewed := time.Now()
	for {
		select {
		case <-ls.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(ls.ctx, ls.l.opts.CallTimeout)
		code, err := replyCode(ls.l.renew.Run(ctx, ls.l.rdb, []string{ls.key}, ls.token, ls.l.opts.TTL.Milliseconds()))
		cancel()
		switch {
		case err == nil && code == lua.LockDone:
			renewed = time.Now()
		case err == nil:
			ls.cancel(ErrLost)
			return
		case time.Since(renewed) >= ls.l.opts.TTL:
			ls.cancel(fmt.Errorf("%w: renew: %w", ErrLost, err))
			return
		}
	}
}

// Release stops renewal and deletes the lock if it is still this lease's.
// It returns ErrLost when the lease had already been lost. Calling it more
// than once is safe.
func (ls *Lease) Release(ctx context.Context) error {
	var err error
	ls.once.Do(func() {
		close(ls.stop)
		<-ls.done
		if cause := context.Cause(ls.ctx); cause != nil {
			err = cause
			return
		}
		ls.cancel(context.Canceled)
		cctx, cancel := context.WithTimeout(ctx, ls.l.opts.CallTimeout)
		defer cancel()
		code, rerr := replyCode(ls.l.unlock.Run(cctx, ls.l.rdb, []string{ls.key}, ls.token))
		switch {
		case rerr != nil:
			err = fmt.Errorf("lock: release %s: %w", ls.key, rerr)
		case code != lua.LockDone:
			err = ErrLost
		}
	})
	return err
}

func newToken() string {
	var b [16]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// replyCode reads a lock script's {code} reply: LockDone or LockNotOwner.
func replyCode(cmd *redis.Cmd) (int64, error) {
	v, err := cmd.Int64Slice()
	if err != nil {
		return 0, err
	}
	if len(v) != 1 || (v[0] != lua.LockDone && v[0] != lua.LockNotOwner) {
		return 0, fmt.Errorf("lock: unexpected script reply %v", v)
	}
	return v[0], nil
}

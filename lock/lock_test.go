package lock_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/shard/shardmem"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func newLocker(t *testing.T, ttl time.Duration) *lock.Locker {
	t.Helper()
	rdb := testenv.SharedCluster(t).Client()
	t.Cleanup(func() { rdb.Close() })
	return newLockerOn(t, rdb, ttl)
}

func newLockerOn(t *testing.T, r lock.Redis, ttl time.Duration) *lock.Locker {
	t.Helper()
	l, err := lock.New(lock.Options{Redis: r, TTL: ttl, RetryEvery: 10 * time.Millisecond, CallTimeout: ttl / 3})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// eachBackend runs test on a real Redis Cluster and on package
// shard/shardmem's locks in memory (the unit tier's), holding the one to
// the other: make test runs both, the unit tier skips the Redis half.
func eachBackend(t *testing.T, test func(t *testing.T, r lock.Redis)) {
	t.Helper()
	t.Run("redis", func(t *testing.T) {
		rdb := testenv.SharedCluster(t).Client()
		t.Cleanup(func() { rdb.Close() })
		test(t, rdb)
	})
	t.Run("memory", func(t *testing.T) { test(t, shardmem.New()) })
}

func TestOneHolderAtATime(t *testing.T) {
	eachBackend(t, func(t *testing.T, r lock.Redis) {
		l := newLockerOn(t, r, time.Second)
		ctx := context.Background()
		key := keys.Lock(keys.MustID(testenv.ID(t, "p")), keys.MustID("t"), keys.MustID("test"))
		var inside, most, entered atomic.Int32
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				lease, err := l.Acquire(ctx, key, 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				n := inside.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				entered.Add(1)
				time.Sleep(5 * time.Millisecond) // time under test: each holder stays 5 ms, a window for an overlap
				inside.Add(-1)
				if err := lease.Release(ctx); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if most.Load() != 1 || entered.Load() != 20 {
			t.Errorf("at most %d holders at once, %d of 20 entered; want 1 and 20", most.Load(), entered.Load())
		}
	})
}

func TestBusyThenFreed(t *testing.T) {
	eachBackend(t, func(t *testing.T, r lock.Redis) {
		l := newLockerOn(t, r, time.Second)
		ctx := context.Background()
		key := keys.Lock(keys.MustID(testenv.ID(t, "p")), keys.MustID("t"), keys.MustID("test"))
		a, err := l.Acquire(ctx, key, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Acquire(ctx, key, 300*time.Millisecond); !errors.Is(err, lock.ErrBusy) {
			t.Fatalf("second Acquire = %v, want ErrBusy", err)
		}
		time.AfterFunc(100*time.Millisecond, func() { _ = a.Release(ctx) })
		b, err := l.Acquire(ctx, key, 2*time.Second)
		if err != nil {
			t.Fatalf("Acquire while the holder releases = %v", err)
		}
		if err := b.Release(ctx); err != nil {
			t.Error(err)
		}
		if err := b.Release(ctx); err != nil {
			t.Errorf("second Release = %v, want nil", err)
		}
	})
}

func TestRenewalOutlivesTTL(t *testing.T) {
	eachBackend(t, func(t *testing.T, r lock.Redis) {
		l := newLockerOn(t, r, time.Second)
		ctx := context.Background()
		key := keys.Lock(keys.MustID(testenv.ID(t, "p")), keys.MustID("t"), keys.MustID("test"))
		// A wait, not 0: on a loaded machine one SET took longer than the
		// call timeout (a third of the TTL) and a first try alone failed.
		a, err := l.Acquire(ctx, key, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(3500 * time.Millisecond) // time under test: more than three TTLs
		if _, err := l.Acquire(ctx, key, 500*time.Millisecond); !errors.Is(err, lock.ErrBusy) {
			t.Errorf("Acquire after 3 TTLs of a renewed lock = %v, want ErrBusy", err)
		}
		if a.Context().Err() != nil {
			t.Errorf("renewed lease ended: %v", context.Cause(a.Context()))
		}
		if err := a.Release(ctx); err != nil {
			t.Error(err)
		}
	})
}

// A lease whose key was taken over (it expired during a pause, say) ends
// itself, and its late release leaves the new owner's lock alone.
func TestLostLeaseNeverFreesTheNewOwner(t *testing.T) {
	l := newLocker(t, time.Second)
	rdb := testenv.SharedCluster(t).Client()
	defer rdb.Close()
	ctx := context.Background()
	key := keys.Lock(keys.MustID(testenv.ID(t, "p")), keys.MustID("t"), keys.MustID("test"))
	a, err := l.Acquire(ctx, key, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, key, "someone-else", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Context().Done():
	case <-time.After(2 * time.Second):
		t.Fatal("lease did not notice it was lost")
	}
	if !errors.Is(context.Cause(a.Context()), lock.ErrLost) {
		t.Errorf("cause = %v, want ErrLost", context.Cause(a.Context()))
	}
	if err := a.Release(ctx); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Release of a lost lease = %v, want ErrLost", err)
	}
	if v, _ := rdb.Get(ctx, key).Result(); v != "someone-else" {
		t.Errorf("lock value after the late release = %q, want the new owner's", v)
	}
}

// A holder that dies without releasing (here: a raw SET NX PX with nobody
// renewing it) blocks others for TTL, then its lock expires.
func TestCrashedHolderExpires(t *testing.T) {
	eachBackend(t, func(t *testing.T, r lock.Redis) {
		// A TTL of 1 s: its call timeout (a third) outlasts a starved
		// machine's Redis round trip (at 300 ms, one SET took over 100 ms in
		// a loaded make test and the first Acquire failed on its deadline).
		l := newLockerOn(t, r, time.Second)
		ctx := context.Background()
		key := keys.Lock(keys.MustID(testenv.ID(t, "p")), keys.MustID("t"), keys.MustID("test"))
		if ok, err := r.SetNX(ctx, key, "dead-holder", time.Second).Result(); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if _, err := l.Acquire(ctx, key, 300*time.Millisecond); !errors.Is(err, lock.ErrBusy) {
			t.Fatalf("Acquire against a live dead holder's lock = %v, want ErrBusy", err)
		}
		a, err := l.Acquire(ctx, key, 3*time.Second)
		if err != nil {
			t.Fatalf("Acquire after the dead holder's TTL = %v", err)
		}
		_ = a.Release(ctx)
	})
}

func TestNewValidates(t *testing.T) {
	rdb := testenv.SharedCluster(t).Client()
	defer rdb.Close()
	for _, o := range []lock.Options{{}, {Redis: rdb, TTL: time.Millisecond}, {Redis: rdb, TTL: time.Second, RenewEvery: 2 * time.Second},
		{Redis: rdb, TTL: 500 * time.Millisecond}, // renewals (CallTimeout 1s) could outlast the lease
	} {
		if _, err := lock.New(o); err == nil {
			t.Errorf("New(%+v) succeeded", o)
		}
	}
}

// failHook tells failed once a command fails.
type failHook struct {
	once   sync.Once
	failed chan struct{}
}

func (h *failHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && !errors.Is(err, redis.Nil) {
			h.once.Do(func() { close(h.failed) })
		}
		return err
	}
}

// A SET that times out on a stalled node (on a busy machine, a slow one)
// is asked again within the wait, and one whose reply was lost after it
// took the lock is found to be the caller's: Acquire holds the lease
// instead of failing at the first slow reply (a cart's copies then went
// around each other).
func TestSlowReplyStillAcquires(t *testing.T) {
	c := testenv.SharedCluster(t)
	rdb := c.Client()
	t.Cleanup(func() { rdb.Close() })
	h := &failHook{failed: make(chan struct{})}
	rdb.AddHook(h)
	l, err := lock.New(lock.Options{Redis: rdb, TTL: 30 * time.Second, RetryEvery: 10 * time.Millisecond, CallTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := keys.Lock(keys.MustID(testenv.ID(t, "p")), keys.MustID("t"), keys.MustID("test"))
	master, err := c.MasterOf(ctx, keys.KeySlot(key))
	if err != nil {
		t.Fatal(err)
	}
	if err := master.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := make(chan error, 1)
	go func() {
		// The first SET timed out: the node runs it once resumed. (The
		// bound only keeps a broken build from hanging the run.)
		select {
		case <-h.failed:
		case <-time.After(15 * time.Second):
		}
		resumed <- master.Resume()
	}()
	lease, err := l.Acquire(ctx, key, 20*time.Second)
	if rerr := <-resumed; rerr != nil {
		t.Fatal(rerr)
	}
	if err != nil {
		t.Fatalf("acquire across a slow reply: %v", err)
	}
	if _, err := l.Acquire(ctx, key, 300*time.Millisecond); !errors.Is(err, lock.ErrBusy) {
		t.Fatalf("second acquire = %v, want ErrBusy", err)
	}
	// The lease is the caller's: releasing it frees the lock (a TTL of
	// 30 s would still hold it otherwise).
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := l.Acquire(ctx, key, 3*time.Second)
	if err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
	_ = again.Release(ctx)
}

package shard_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/lua"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func newStore(t testing.TB) (*shard.Store, *redis.ClusterClient) {
	t.Helper()
	rdb := testenv.SharedCluster(t).Client()
	t.Cleanup(func() { rdb.Close() })
	s, err := shard.New(shard.Options{Redis: rdb})
	if err != nil {
		t.Fatal(err)
	}
	return s, rdb
}

func newSKU(t *testing.T) stock.SKU {
	return stock.SKU{Program: keys.MustID(testenv.ID(t, "p")), Ticket: keys.MustID("ga")}
}

// eachGate runs test on a Store over each of the two script runners the
// tests hold alike: a real Redis Cluster, and package shardmem's scripts
// in memory (the unit tier's gate). The Redis half is skipped only in the
// unit tier; make test runs both.
func eachGate(t *testing.T, test func(t *testing.T, s *shard.Store, sc redis.Scripter)) {
	t.Helper()
	t.Run("redis", func(t *testing.T) {
		s, rdb := newStore(t)
		test(t, s, rdb)
	})
	t.Run("memory", func(t *testing.T) {
		mem := shardmem.New()
		s, err := shard.New(shard.Options{Redis: mem})
		if err != nil {
			t.Fatal(err)
		}
		test(t, s, mem)
	})
}

// seedOn seeds a new SKU on s with units over n shards.
func seedOn(t *testing.T, s *shard.Store, n int, units int64) stock.SKU {
	t.Helper()
	sku := newSKU(t)
	if err := s.Seed(context.Background(), sku, n, units, 1, true); err != nil {
		t.Fatal(err)
	}
	return sku
}

// seeded returns a store and a new SKU seeded with units over n shards.
func seeded(t *testing.T, n int, units int64) (*shard.Store, *redis.ClusterClient, stock.SKU) {
	t.Helper()
	s, rdb := newStore(t)
	sku := newSKU(t)
	if err := s.Seed(context.Background(), sku, n, units, 1, true); err != nil {
		t.Fatal(err)
	}
	return s, rdb, sku
}

func remaining(t *testing.T, s *shard.Store, sku stock.SKU, n int) int64 {
	t.Helper()
	r, seeded, err := s.Remaining(context.Background(), sku, n)
	if err != nil || !seeded {
		t.Fatalf("Remaining(%v) = %d, %v, %v", sku, r, seeded, err)
	}
	return r
}

func TestDeductResentMovesOnce(t *testing.T) {
	eachGate(t, func(t *testing.T, s *shard.Store, sc redis.Scripter) {
		ctx := context.Background()
		sku := seedOn(t, s, 1, 10)
		// The script itself, twice with the same request id, as the Redis client
		// re-sends it after a timeout.
		k := keys.Shard(sku.Program, sku.Ticket, 0, 1)
		script := redis.NewScript(lua.Deduct)
		for n := range 2 {
			v, err := script.Run(ctx, sc, []string{k.Stock(), k.Deduction(keys.MustID("req-1"))}, 3, 3, 4, 60000).Int64Slice()
			if err != nil {
				t.Fatal(err)
			}
			wantCode := int64(lua.OK)
			if n == 1 {
				wantCode = lua.Already
			}
			if v[0] != wantCode || v[1] != 3 {
				t.Errorf("deduct #%d = %v, want code %d taken 3", n+1, v, wantCode)
			}
		}
		if got := remaining(t, s, sku, 1); got != 7 {
			t.Errorf("remaining = %d, want 7", got)
		}
		// And through the Store.
		r := shard.Request{SKU: sku, Shards: 1, RequestID: keys.MustID("req-2"), Quantity: 2, MaxQuantity: 4}
		d1, err := s.Deduct(ctx, r)
		if err != nil || d1.Replayed {
			t.Fatalf("Deduct = %+v, %v", d1, err)
		}
		d2, err := s.Deduct(ctx, r)
		if err != nil || !d2.Replayed || d2.Parts[0].Taken != 2 {
			t.Fatalf("second Deduct = %+v, %v, want replayed 2", d2, err)
		}
		if got := remaining(t, s, sku, 1); got != 5 {
			t.Errorf("remaining = %d, want 5", got)
		}
	})
}

func TestScriptsRefuseBadArguments(t *testing.T) {
	eachGate(t, func(t *testing.T, s *shard.Store, sc redis.Scripter) {
		ctx := context.Background()
		sku := seedOn(t, s, 1, 10)
		k := keys.Shard(sku.Program, sku.Ticket, 0, 1)
		deduct := redis.NewScript(lua.Deduct)
		for _, args := range [][]any{
			{0, 0, 4, 60000},
			{-1, -1, 4, 60000},
			{"1.5", 1, 4, 60000},
			{"1e3", 1, 4000, 60000},
			{5, 5, 4, 60000},                     // over the max
			{"9223372036854775808", 1, 4, 60000}, // 2^63
			{" 1", 1, 4, 60000},
			{1, 2, 4, 60000}, // min above q
			{1, 1, 4, 10},    // ttl too short
			{"0x1", 1, 4, 60000},
		} {
			v, err := deduct.Run(ctx, sc, []string{k.Stock(), k.Deduction(keys.MustID("bad"))}, args...).Int64Slice()
			if err != nil || v[0] != lua.BadArg {
				t.Errorf("deduct%v = %v, %v, want code %d", args, v, err, lua.BadArg)
			}
		}
		seed := redis.NewScript(lua.Seed)
		for _, args := range [][]any{{5, 4, 1}, {-1, 4, 1}, {1, 1, 2}, {"1.0", 2, 1}} {
			v, err := seed.Run(ctx, sc, []string{k.Stock()}, args...).Int64Slice()
			if err != nil || v[0] != lua.BadArg {
				t.Errorf("seed%v = %v, %v, want code %d", args, v, err, lua.BadArg)
			}
		}
		if got := remaining(t, s, sku, 1); got != 10 {
			t.Errorf("remaining = %d after refused calls, want 10", got)
		}
	})
}

func TestRestoreOnceCappedAndOnlyAfterDeduct(t *testing.T) {
	eachGate(t, func(t *testing.T, s *shard.Store, sc redis.Scripter) {
		ctx := context.Background()
		sku := seedOn(t, s, 1, 5)
		d, err := s.Deduct(ctx, shard.Request{SKU: sku, Shards: 1, RequestID: keys.MustID("r1"), Quantity: 3, MaxQuantity: 4})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		results := make(chan shard.RestoreResult, 10)
		for range 10 {
			wg.Go(func() {
				res, err := s.RestorePart(ctx, sku, keys.MustID("r1"), "", d.Parts[0])
				if err != nil {
					t.Error(err)
				}
				results <- res
			})
		}
		wg.Wait()
		close(results)
		var moved int64
		for r := range results {
			moved += r.Restored
		}
		if moved != 3 {
			t.Errorf("10 concurrent restores moved %d, want 3", moved)
		}
		if got := remaining(t, s, sku, 1); got != 5 {
			t.Errorf("remaining = %d, want 5", got)
		}
		// A request id that never deducted is refused by the script.
		res, err := s.RestorePart(ctx, sku, keys.MustID("never"), "", shard.Part{Shards: 1, Shard: 0, Taken: 3, Gen: 1})
		if err != nil || res.Code != lua.NoRecord || res.Restored != 0 {
			t.Errorf("restore of unknown request = %+v, %v, want code %d", res, err, lua.NoRecord)
		}
		// A deduction made before a re-seed is not given back after it: the
		// ledger facts the seed used already count it.
		d2, err := s.Deduct(ctx, shard.Request{SKU: sku, Shards: 1, RequestID: keys.MustID("r2"), Quantity: 2, MaxQuantity: 4})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Seed(ctx, sku, 1, 4, 2, true); err != nil {
			t.Fatal(err)
		}
		res, err = s.RestorePart(ctx, sku, keys.MustID("r2"), "", d2.Parts[0])
		if err != nil || res.Code != lua.Stale {
			t.Errorf("restore across re-seed = %+v, %v, want code %d", res, err, lua.Stale)
		}
		if got := remaining(t, s, sku, 1); got != 4 {
			t.Errorf("remaining = %d, want 4", got)
		}
	})
}

// TestRestoreWaitsForEveryHolder: a deduction found by other attempts of
// its request (copies on other replicas, a client's retry) goes back only
// when every attempt that holds it has let go, since any one of them may
// commit on it; an attempt that asks or lets go twice (a re-send after a
// timeout) counts once; AllHolders gives it back at once; a record
// written before holders were kept had an unknown maker.
func TestRestoreWaitsForEveryHolder(t *testing.T) {
	ctx := context.Background()
	s, rdb, sku := seeded(t, 1, 10)
	r := shard.Request{SKU: sku, Shards: 1, RequestID: keys.MustID("held-3"), Quantity: 3, MaxQuantity: 4}
	var d shard.Deduction
	for n, h := range []string{"maker", "maker", "f1", "f2", "f1"} {
		r.Holder = h
		var err error
		if d, err = s.Deduct(ctx, r); err != nil || d.Replayed != (n > 0) {
			t.Fatalf("deduct #%d by %s = %+v, %v", n+1, h, d, err)
		}
	}
	for n, step := range []struct {
		holder string
		code   int64
		left   int64
	}{{"f1", lua.Shared, 7}, {"f1", lua.Shared, 7}, {"maker", lua.Shared, 7}, {"f2", lua.OK, 10}, {"f2", lua.Already, 10}} {
		res, err := s.RestorePart(ctx, sku, r.RequestID, step.holder, d.Parts[0])
		if err != nil || res.Code != step.code {
			t.Fatalf("restore #%d by %s = %+v, %v, want code %d", n+1, step.holder, res, err, step.code)
		}
		if got := remaining(t, s, sku, 1); got != step.left {
			t.Fatalf("after restore #%d remaining = %d, want %d", n+1, got, step.left)
		}
	}
	// AllHolders moves a held deduction at once, once.
	r.RequestID = keys.MustID("held-all")
	r.Holder = "maker"
	d1, err := s.Deduct(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	r.Holder = "finder"
	if d2, err := s.Deduct(ctx, r); err != nil || !d2.Replayed {
		t.Fatalf("second deduct = %+v, %v", d2, err)
	}
	for range 2 {
		if _, err := s.Restore(ctx, sku, r.RequestID, shard.AllHolders, d1.Parts); err != nil {
			t.Fatal(err)
		}
	}
	if got := remaining(t, s, sku, 1); got != 10 {
		t.Errorf("after giving back to all remaining = %d, want 10", got)
	}
	// A record from before holders were kept: its maker, unknown, holds
	// it until it is given back to all.
	r.RequestID = keys.MustID("held-old")
	r.Holder = "maker"
	d1, err = s.Deduct(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	k := keys.Shard(sku.Program, sku.Ticket, 0, 1)
	if err := rdb.HDel(ctx, k.Deduction(r.RequestID), "h:maker", "n").Err(); err != nil {
		t.Fatal(err)
	}
	r.Holder = "finder"
	if d2, err := s.Deduct(ctx, r); err != nil || !d2.Replayed {
		t.Fatalf("deduct over the old record = %+v, %v", d2, err)
	}
	for n, h := range []string{"finder", shard.AllHolders} {
		want := map[string]int64{"finder": lua.Shared, shard.AllHolders: lua.OK}[h]
		if res, err := s.RestorePart(ctx, sku, r.RequestID, h, d1.Parts[0]); err != nil || res.Code != want {
			t.Fatalf("restore #%d of the old record by %s = %+v, %v, want code %d", n+1, h, res, err, want)
		}
	}
	if got := remaining(t, s, sku, 1); got != 10 {
		t.Errorf("remaining = %d, want 10", got)
	}
}

func TestDeductProbesAndSellsOut(t *testing.T) {
	eachGate(t, func(t *testing.T, s *shard.Store, sc redis.Scripter) {
		ctx := context.Background()
		sku := newSKU(t)
		const n = 8
		if err := s.Seed(ctx, sku, n, 20, 1, true); err != nil {
			t.Fatal(err)
		}
		var taken int64
		var mu sync.Mutex
		var wg sync.WaitGroup
		for g := range 50 {
			wg.Go(func() {
				q := int64(g%4 + 1)
				d, err := s.Deduct(ctx, shard.Request{SKU: sku, Shards: n, RequestID: keys.MustID(testenv.ID(t, "r") + string(rune('a'+g%26)) + "-" + string(rune('a'+g/26))), Quantity: q, MaxQuantity: 4})
				switch {
				case errors.Is(err, stock.ErrSoldOut):
				case err != nil:
					t.Error(err)
				default:
					var sum int64
					for _, p := range d.Parts {
						sum += p.Taken
					}
					if sum != q {
						t.Errorf("Deduct(q=%d) took %d", q, sum)
					}
					mu.Lock()
					taken += sum
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		left := remaining(t, s, sku, n)
		if taken+left != 20 {
			t.Errorf("taken %d + remaining %d != 20", taken, left)
		}
		// Drain what is left one unit at a time: the last unit, wherever it sits,
		// must be found before sold out is answered.
		for i := range left {
			if _, err := s.Deduct(ctx, shard.Request{SKU: sku, Shards: n, RequestID: keys.MustID("drain-" + string(rune('a'+i))), Quantity: 1, MaxQuantity: 4}); err != nil {
				t.Fatalf("drain %d of %d: %v", i+1, left, err)
			}
		}
		if _, err := s.Deduct(ctx, shard.Request{SKU: sku, Shards: n, RequestID: keys.MustID("after"), Quantity: 1, MaxQuantity: 4}); !errors.Is(err, stock.ErrSoldOut) {
			t.Errorf("Deduct after drain = %v, want ErrSoldOut", err)
		}
	})
}

func TestAssembleAcrossShards(t *testing.T) {
	eachGate(t, func(t *testing.T, s *shard.Store, sc redis.Scripter) {
		ctx := context.Background()
		// 4 units over 4 shards: 1 each, so q=3 needs three shards and q=2
		// after it must fail with everything given back.
		sku := seedOn(t, s, 4, 4)
		d, err := s.Deduct(ctx, shard.Request{SKU: sku, Shards: 4, RequestID: keys.MustID("big"), Quantity: 3, MaxQuantity: 4})
		if err != nil || len(d.Parts) != 3 {
			t.Fatalf("Deduct(3) = %+v, %v, want 3 parts", d, err)
		}
		if _, err := s.Deduct(ctx, shard.Request{SKU: sku, Shards: 4, RequestID: keys.MustID("two"), Quantity: 2, MaxQuantity: 4}); !errors.Is(err, stock.ErrSoldOut) {
			t.Fatalf("Deduct(2) = %v, want ErrSoldOut", err)
		}
		if got := remaining(t, s, sku, 4); got != 1 {
			t.Errorf("remaining = %d, want 1 (partial take given back)", got)
		}
		// A retry of the assembled purchase finds all its parts, moves nothing.
		d2, err := s.Deduct(ctx, shard.Request{SKU: sku, Shards: 4, RequestID: keys.MustID("big"), Quantity: 3, MaxQuantity: 4})
		if err != nil || !d2.Replayed {
			t.Fatalf("retry = %+v, %v, want replayed", d2, err)
		}
		if got := remaining(t, s, sku, 4); got != 1 {
			t.Errorf("remaining = %d after retry, want 1", got)
		}
	})
}

// TestScriptKeysShareSlotOnCluster asks the real cluster for the slot of
// every key each script is given, and checks that a SKU's 12 shards land on
// all 3 masters.
func TestScriptKeysShareSlotOnCluster(t *testing.T) {
	ctx := context.Background()
	c := testenv.SharedCluster(t)
	_, rdb := newStore(t)
	sku := newSKU(t)
	for _, n := range []int{1, 12} {
		masters := map[string]int{}
		for i := range n {
			k := keys.Shard(sku.Program, sku.Ticket, i, n)
			scripts := map[string][]string{
				"seed":    {k.Stock()},
				"deduct":  {k.Stock(), k.Deduction(keys.MustID("some-request"))},
				"restore": {k.Stock(), k.Deduction(keys.MustID("some-request"))},
				"read":    {k.Stock()},
			}
			for name, ks := range scripts {
				var first int64 = -1
				for _, key := range ks {
					slot, err := rdb.ClusterKeySlot(ctx, key).Result()
					if err != nil {
						t.Fatal(err)
					}
					if first == -1 {
						first = slot
					}
					if slot != first || slot != int64(k.Slot()) {
						t.Errorf("%s shard %d: CLUSTER KEYSLOT %q = %d, want %d", name, i, key, slot, first)
					}
				}
			}
			m, err := c.MasterOf(ctx, k.Slot())
			if err != nil {
				t.Fatal(err)
			}
			masters[m.Addr]++
		}
		if n == 12 {
			if len(masters) != 3 {
				t.Errorf("12 shards on %d masters, want 3: %v", len(masters), masters)
			}
			for addr, cnt := range masters {
				if cnt != 4 {
					t.Errorf("master %s has %d of 12 shards, want 4", addr, cnt)
				}
			}
		}
	}
}

func TestDeductValidates(t *testing.T) {
	eachGate(t, func(t *testing.T, s *shard.Store, sc redis.Scripter) {
		ctx := context.Background()
		for _, r := range []shard.Request{
			{SKU: stock.SKU{Ticket: keys.MustID("x")}, Shards: 1, RequestID: keys.MustID("r"), Quantity: 1, MaxQuantity: 1},
			{SKU: stock.SKU{Program: keys.MustID("a"), Ticket: keys.MustID("x")}, Shards: 1, RequestID: keys.ID{}, Quantity: 1, MaxQuantity: 1},
			{SKU: stock.SKU{Program: keys.MustID("a"), Ticket: keys.MustID("x")}, Shards: 0, RequestID: keys.MustID("r"), Quantity: 1, MaxQuantity: 1},
			{SKU: stock.SKU{Program: keys.MustID("a"), Ticket: keys.MustID("x")}, Shards: 1, RequestID: keys.MustID("r"), Quantity: 2, MaxQuantity: 1},
		} {
			if _, err := s.Deduct(ctx, r); !errors.Is(err, stock.ErrInvalid) {
				t.Errorf("Deduct(%+v) = %v, want ErrInvalid", r, err)
			}
		}
	})
}

// A fenced shard moves nothing and says so; reopened, it serves again. Read
// shows the fence, also on a shard the fence created (not seeded yet).
func TestFence(t *testing.T) {
	eachGate(t, func(t *testing.T, s *shard.Store, sc redis.Scripter) {
		sku := seedOn(t, s, 2, 10)
		ctx := context.Background()
		req := shard.Request{SKU: sku, Shards: 2, RequestID: keys.MustID("f1"), Quantity: 1, MaxQuantity: 4}
		if err := s.Fence(ctx, sku, 2, true); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Deduct(ctx, req); !errors.Is(err, stock.ErrFenced) {
			t.Fatalf("Deduct on a fenced SKU = %v, want ErrFenced", err)
		}
		shards, err := s.Read(ctx, sku, 2)
		if err != nil || !shards[0].Fenced || !shards[0].Seeded || remaining(t, s, sku, 2) != 10 {
			t.Fatalf("fenced shards = %+v, %v; want fenced, seeded, 10 left", shards, err)
		}
		if err := s.Fence(ctx, sku, 2, false); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Deduct(ctx, req); err != nil {
			t.Fatalf("Deduct after reopening = %v", err)
		}
		fresh := newSKU(t)
		if err := s.Fence(ctx, fresh, 1, true); err != nil {
			t.Fatal(err)
		}
		shards, _ = s.Read(ctx, fresh, 1)
		if !shards[0].Fenced || shards[0].Seeded {
			t.Errorf("fence on an absent shard reads %+v, want fenced and not seeded", shards[0])
		}
		if err := s.Seed(ctx, fresh, 1, 3, 1, false); err != nil {
			t.Fatal(err)
		}
		if shards, _ = s.Read(ctx, fresh, 1); !shards[0].Seeded || !shards[0].Fenced || shards[0].Avail != 3 {
			t.Errorf("seed under a fence reads %+v, want seeded with 3 and still fenced", shards[0])
		}
	})
}

// A deduction record from before a re-seed does not replay: the seed was
// built from ledger facts without it, so a retry of that request takes anew,
// and a late restore of the old deduction is refused.
func TestRecordFromBeforeReseedDoesNotReplay(t *testing.T) {
	eachGate(t, func(t *testing.T, s *shard.Store, sc redis.Scripter) {
		sku := seedOn(t, s, 1, 10)
		ctx := context.Background()
		req := shard.Request{SKU: sku, Shards: 1, RequestID: keys.MustID("r1"), Quantity: 2, MaxQuantity: 4}
		first, err := s.Deduct(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Seed(ctx, sku, 1, 10, 2, true); err != nil { // a rebuild: the ledger still says 10
			t.Fatal(err)
		}
		again, err := s.Deduct(ctx, req)
		if err != nil || again.Replayed || remaining(t, s, sku, 1) != 8 {
			t.Fatalf("retry after re-seed = %+v, %v, %d left; want a fresh take leaving 8", again, err, remaining(t, s, sku, 1))
		}
		res, err := s.RestorePart(ctx, sku, keys.MustID("r1"), "", first.Parts[0])
		if err != nil || res.Restored != 0 || remaining(t, s, sku, 1) != 8 {
			t.Errorf("late restore of the pre-seed deduction = %+v, %v; want nothing moved", res, err)
		}
	})
}

func TestNotRun(t *testing.T) {
	if shard.NotRun(nil) || shard.NotRun(errors.New("i/o timeout")) || shard.NotRun(context.DeadlineExceeded) {
		t.Error("NotRun is true for an error after which the script may have run")
	}
	if !shard.NotRun(&net.OpError{Op: "dial", Err: errors.New("connection refused")}) || !shard.NotRun(redis.ErrPoolTimeout) {
		t.Error("NotRun is false for a dial failure or a pool timeout")
	}
	// An error reply from a real server: the script never ran.
	_, rdb := newStore(t)
	err := rdb.Do(context.Background(), "EVALSHA", "0000000000000000000000000000000000000000", 0).Err()
	if err == nil || !shard.NotRun(err) {
		t.Errorf("NotRun(%v) = false for a server error reply", err)
	}
}

// Failed tells Redis failing from Redis answering: the breaker counts only
// failures, so any new kind of answer is safe by default.
func TestFailed(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("deduct shard 0: %w", stock.ErrSoldOut), stock.ErrNotSeeded, stock.ErrFenced, stock.ErrLimit,
		stock.ErrInvalid, errors.New("seats: taken: [A-01]"), nil,
	} {
		if shard.Failed(err) {
			t.Errorf("Failed(%v) = true for an answer", err)
		}
	}
	_, rdb := newStore(t)
	reply := rdb.Do(context.Background(), "EVALSHA", "0000000000000000000000000000000000000000", 0).Err()
	for _, err := range []error{
		&net.OpError{Op: "dial", Err: errors.New("connection refused")}, context.DeadlineExceeded,
		fmt.Errorf("read: %w", io.ErrUnexpectedEOF), redis.ErrPoolTimeout, fmt.Errorf("x: %w", shard.ErrScript), reply,
	} {
		if !shard.Failed(err) {
			t.Errorf("Failed(%v) = false for Redis failing", err)
		}
	}
}

// Refill adds a return to the gate of its own epoch only, once: a gate
// rebuilt since counts it already, a gate not yet rebuilt to it must wait,
// and the allotment grows with it so the units are never capped away.
func TestRefillByEpochOnce(t *testing.T) {
	s, _, sku := seeded(t, 2, 0) // sold out at epoch 1
	ctx := context.Background()
	cases := []struct {
		name     string
		id       string
		epoch, q int64
		want     int
		left     int64
	}{
		{"not yet at epoch 2", "ret-a", 2, 3, shard.NotYet, 0},
		{"added at epoch 1", "ret-b", 1, 2, shard.Refilled, 2},
		{"same return again", "ret-b", 1, 2, shard.Counted, 2},
		{"another return", "ret-c", 1, 1, shard.Refilled, 3},
	}
	for _, c := range cases {
		got, err := s.Refill(ctx, sku, 2, keys.MustID(c.id), c.epoch, c.q)
		if err != nil || got != c.want || remaining(t, s, sku, 2) != c.left {
			t.Errorf("%s: Refill(%s, epoch %d, %d) = %d, %v, %d left; want %d, %d left",
				c.name, c.id, c.epoch, c.q, got, err, remaining(t, s, sku, 2), c.want, c.left)
		}
	}
	// A rebuild to epoch 2 (from facts that count every return so far).
	if err := s.Seed(ctx, sku, 2, 6, 2, true); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Refill(ctx, sku, 2, keys.MustID("ret-d"), 1, 1); err != nil || got != shard.Counted || remaining(t, s, sku, 2) != 6 {
		t.Errorf("refill of an epoch-1 return after the rebuild = %d, %v; want counted, 6 left", got, err)
	}
	if got, err := s.Refill(ctx, sku, 2, keys.MustID("ret-a"), 2, 3); err != nil || got != shard.Refilled || remaining(t, s, sku, 2) != 9 {
		t.Errorf("refill of the epoch-2 return = %d, %v, %d left; want refilled, 9 left", got, err, remaining(t, s, sku, 2))
	}
	shards, err := s.Read(ctx, sku, 2)
	if err != nil {
		t.Fatal(err)
	}
	var allot int64
	for _, sh := range shards {
		allot += sh.Allot
	}
	if allot != 9 {
		t.Errorf("allotments add up to %d, want 9 (6 seeded + 3 returned)", allot)
	}
	// A gate Redis lost (never seeded here): its seed counts the return;
	// the caller is told, to tell the other replicas stock is back.
	lost := newSKU(t)
	if got, err := s.Refill(ctx, lost, 2, keys.MustID("ret-e"), 1, 1); err != nil || got != shard.Unseeded {
		t.Errorf("refill of a gate never seeded = %d, %v; want unseeded", got, err)
	}
	// A rebuild under way (fenced, not yet written) may seed from facts
	// older than the return: it waits for the seed (helper-80 #2).
	if err := s.Fence(ctx, lost, 2, true); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Refill(ctx, lost, 2, keys.MustID("ret-e"), 1, 1); err != nil || got != shard.NotYet {
		t.Errorf("refill of a gate fenced before its seed = %d, %v; want not yet", got, err)
	}
	for _, bad := range []struct {
		id       keys.ID
		epoch, q int64
	}{{keys.ID{}, 1, 1}, {keys.MustID("ok"), -1, 1}, {keys.MustID("ok"), 1, 0}} {
		if _, err := s.Refill(ctx, sku, 2, bad.id, bad.epoch, bad.q); !errors.Is(err, stock.ErrInvalid) {
			t.Errorf("Refill(%q, %d, %d) = %v, want ErrInvalid", bad.id, bad.epoch, bad.q, err)
		}
	}
}

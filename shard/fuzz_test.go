package shard_test

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/lua"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// canonical reports whether s is how the scripts expect an integer in
// lo..hi: decimal digits only, at most 18 of them.
func canonical(s string, lo, hi int64) (int64, bool) {
	if len(s) == 0 || len(s) > 18 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n >= lo && n <= hi
}

// fuzzShard is a shard seeded with 10 units, and its reader.
func fuzzShard(f *testing.F) (*redis.ClusterClient, keys.ShardKeys, func() (avail, allot string)) {
	// A small cluster of its own: each fuzz worker process runs this.
	rdb := testenv.NewCluster(f, testenv.ClusterOptions{}).Client()
	f.Cleanup(func() { rdb.Close() })
	s, err := shard.New(shard.Options{Redis: rdb})
	if err != nil {
		f.Fatal(err)
	}
	sku := stock.SKU{Program: keys.MustID("fuzz"), Ticket: keys.MustID(strconv.Itoa(len(f.Name())))}
	k := keys.Shard(sku.Program, sku.Ticket, 0, 1)
	if err := s.Seed(context.Background(), sku, 1, 10, 1, true); err != nil {
		f.Fatal(err)
	}
	read := func() (string, string) {
		v, _ := rdb.HMGet(context.Background(), k.Stock(), "avail", "allot").Result()
		a, _ := v[0].(string)
		b, _ := v[1].(string)
		return a, b
	}
	return rdb, k, read
}

// FuzzDeductArgs: deduct.lua refuses (-2, nothing moved) every argument
// that is not a canonical integer in its range, and otherwise takes at
// most what was asked; it never errors.
func FuzzDeductArgs(f *testing.F) {
	f.Add("1", "1", "4", "60000")
	f.Add("2", "1", "4", "1000")
	f.Add("1.5", "1", "4", "60000")
	f.Add("-1", "1", "4", "60000")
	f.Add("5", "1", "4", "60000")
	f.Add("1", "2", "4", "60000")
	f.Add("1e3", "1", "4", "60000")
	f.Add("1", "1", "4", "999")
	f.Add("0x10", "1", "99999999999999999999", "60000")
	rdb, k, read := fuzzShard(f)
	script := redis.NewScript(lua.Deduct)
	n := 0
	f.Fuzz(func(t *testing.T, q, min, max, ttl string) {
		n++
		before, _ := read()
		v, err := script.Run(context.Background(), rdb, []string{k.Stock(), k.Deduction(keys.MustID("f" + strconv.Itoa(n)))}, q, min, max, ttl).Int64Slice()
		if err != nil || len(v) != 5 {
			t.Fatalf("deduct(%q, %q, %q, %q) = %v, %v", q, min, max, ttl, v, err)
		}
		after, _ := read()
		mx, okMax := canonical(max, 1, 1e9)
		qq, okQ := canonical(q, 1, mx)
		_, okMin := canonical(min, 1, qq)
		_, okTTL := canonical(ttl, 1000, 1e12)
		valid := okMax && okQ && okMin && okTTL
		switch {
		case !valid && (v[0] != lua.BadArg || after != before):
			t.Fatalf("deduct(%q, %q, %q, %q) = %v, avail %s → %s; want -2 and nothing moved", q, min, max, ttl, v, before, after)
		case valid && v[0] == lua.BadArg:
			t.Fatalf("deduct(%q, %q, %q, %q) refused valid arguments", q, min, max, ttl)
		case valid && v[0] == lua.OK && v[1] > qq:
			t.Fatalf("deduct(%q, ...) took %d", q, v[1])
		}
		if v[0] == lua.OK { // put it back for the next input
			rdb.HIncrBy(context.Background(), k.Stock(), "avail", v[1])
		}
	})
}

// FuzzRefillArgs: refill.lua refuses (-2, nothing moved) every argument
// that is not a canonical integer in its range; it never errors.
func FuzzRefillArgs(f *testing.F) {
	f.Add("1", "1", "60000")
	f.Add("1", "0", "60000")
	f.Add("-1", "1", "60000")
	f.Add("1", "1.0", "60000")
	f.Add("2", "1", "60000")
	f.Add("1", "1", "10")
	rdb, k, read := fuzzShard(f)
	script := redis.NewScript(lua.Refill)
	n := 0
	f.Fuzz(func(t *testing.T, epoch, q, ttl string) {
		n++
		beforeAvail, beforeAllot := read()
		v, err := script.Run(context.Background(), rdb, []string{k.Stock(), k.Refill(keys.MustID("f" + strconv.Itoa(n)))}, epoch, q, ttl).Int64Slice()
		if err != nil || len(v) != 2 {
			t.Fatalf("refill(%q, %q, %q) = %v, %v", epoch, q, ttl, v, err)
		}
		avail, allot := read()
		_, okE := canonical(epoch, 0, 1e15)
		qq, okQ := canonical(q, 1, 1e9)
		_, okT := canonical(ttl, 1000, 1e12)
		if !(okE && okQ && okT) && (v[0] != lua.BadArg || avail != beforeAvail || allot != beforeAllot) {
			t.Fatalf("refill(%q, %q, %q) = %v; want -2 and nothing moved", epoch, q, ttl, v)
		}
		if v[0] == lua.OK { // undo, for the next input
			rdb.HIncrBy(context.Background(), k.Stock(), "avail", -qq)
			rdb.HIncrBy(context.Background(), k.Stock(), "allot", -qq)
		}
	})
}

// FuzzSeedArgs: seed.lua refuses (-2, nothing written) every argument that
// is not canonical, or avail above allot; it never errors.
func FuzzSeedArgs(f *testing.F) {
	f.Add("10", "10", "1", "1")
	f.Add("11", "10", "1", "1")
	f.Add("10", "10", "2", "1")
	f.Add("10", "10", "1", "-1")
	f.Add("1e1", "10", "1", "1")
	rdb, k, read := fuzzShard(f)
	script := redis.NewScript(lua.Seed)
	f.Fuzz(func(t *testing.T, avail, allot, mode, epoch string) {
		beforeAvail, beforeAllot := read()
		v, err := script.Run(context.Background(), rdb, []string{k.Stock()}, avail, allot, mode, epoch).Int64Slice()
		if err != nil || len(v) != 2 {
			t.Fatalf("seed(%q, %q, %q, %q) = %v, %v", avail, allot, mode, epoch, v, err)
		}
		al, okAl := canonical(allot, 0, 1e15)
		_, okAv := canonical(avail, 0, al)
		_, okE := canonical(epoch, 0, 1e15)
		valid := okAl && okAv && okE && (mode == "0" || mode == "1")
		gotAvail, gotAllot := read()
		if !valid && (v[0] != lua.BadArg || gotAvail != beforeAvail || gotAllot != beforeAllot) {
			t.Fatalf("seed(%q, %q, %q, %q) = %v; want -2 and nothing written", avail, allot, mode, epoch, v)
		}
		if valid && v[0] == lua.BadArg {
			t.Fatalf("seed(%q, %q, %q, %q) refused valid arguments", avail, allot, mode, epoch)
		}
	})
}

// FuzzScriptReplies: every script, given any arguments, answers in the one
// shape (a table whose first element is one of its documented codes) and
// never fails with a Lua error.
func FuzzScriptReplies(f *testing.F) {
	f.Add(uint8(0), "1", "1", "4", "60000")
	f.Add(uint8(3), "r1", "2", "4", "60000")
	f.Add(uint8(5), "h1", "A-01", "A-02", "")
	f.Add(uint8(6), "h1", "3", "", "")
	f.Add(uint8(7), "", "h1", "A-01", "")
	f.Add(uint8(8), "tok", "1000", "", "")
	f.Add(uint8(9), "1", "x", "", "")
	rdb, k, _ := fuzzShard(f)
	tag := k.Stock()
	seatsKey := keys.Seats(keys.MustID("fuzz"), keys.MustID("t"), keys.MustID("A"))
	scripts := []struct {
		name  string
		src   string
		keys  []string
		codes []int64
	}{
		{"deduct", lua.Deduct, []string{tag, k.Deduction(keys.MustID("fz"))}, []int64{lua.OK, lua.Already, lua.Empty, lua.NotSeeded, lua.BadArg, lua.Fenced}},
		{"restore", lua.Restore, []string{tag, k.Deduction(keys.MustID("fz"))}, []int64{lua.OK, lua.Already, lua.Shared, lua.NoRecord, lua.Stale, lua.NotSeeded, lua.BadArg}},
		{"refill", lua.Refill, []string{tag, k.Refill(keys.MustID("fz"))}, []int64{lua.OK, lua.Already, lua.RefillCounted, lua.RefillNotYet, lua.NotSeeded, lua.BadArg}},
		{"quota", lua.Quota, []string{keys.Quota(keys.MustID("fuzz"), keys.MustID("t"), keys.MustID("b"))}, []int64{lua.OK, lua.Already, lua.Empty, lua.QuotaKeyKnown, lua.BadArg}},
		{"unquota", lua.Unquota, []string{keys.Quota(keys.MustID("fuzz"), keys.MustID("t"), keys.MustID("b"))}, []int64{lua.OK, lua.NoRecord, lua.BadArg}},
		{"seats_hold", lua.SeatsHold, []string{seatsKey}, []int64{lua.SeatsHeld, lua.SeatsTaken, lua.SeatsUnknown, lua.BadArg}},
		{"seats_best", lua.SeatsBest, []string{seatsKey, keys.SeatLayout(keys.MustID("fuzz"), keys.MustID("t"), keys.MustID("A"))}, []int64{lua.SeatsHeld, lua.SeatsAgain, lua.SeatsTaken, lua.BadArg}},
		{"seats_set", lua.SeatsSet, []string{seatsKey}, []int64{lua.OK}},
		{"renew", lua.Renew, []string{keys.Lock(keys.MustID("fuzz"), keys.MustID("t"), keys.MustID("fz"))}, []int64{lua.LockDone, lua.LockNotOwner, lua.BadArg}},
		{"fence", lua.Fence, []string{tag}, []int64{lua.OK, lua.BadArg}},
		{"unlock", lua.Unlock, []string{keys.Lock(keys.MustID("fuzz"), keys.MustID("t"), keys.MustID("fz"))}, []int64{lua.LockDone, lua.LockNotOwner, lua.BadArg}},
		{"read", lua.Read, []string{tag}, []int64{lua.OK, lua.NotSeeded}},
		{"seed", lua.Seed, []string{tag}, []int64{lua.OK, lua.Exists, lua.BadArg}},
	}
	for _, sc := range scripts {
		for _, key := range sc.keys {
			if keys.KeySlot(key) != keys.KeySlot(sc.keys[0]) {
				f.Fatalf("%s: keys in two slots", sc.name)
			}
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, a, b, c, d string) {
		sc := scripts[int(which)%len(scripts)]
		v, err := redis.NewScript(sc.src).Run(context.Background(), rdb, sc.keys, a, b, c, d, "k1").Slice()
		if err != nil {
			t.Fatalf("%s(%q, %q, %q, %q): %v", sc.name, a, b, c, d, err)
		}
		code, ok := v[0].(int64)
		if !ok || !slices.Contains(sc.codes, code) {
			t.Fatalf("%s(%q, %q, %q, %q) = %v: not {code, ...} with a documented code", sc.name, a, b, c, d, v)
		}
	})
}

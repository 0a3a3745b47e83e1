package keys

import (
	"math"
	"strings"
	"testing"
)

func TestCheckID(t *testing.T) {
	tests := []struct {
		id string
		ok bool
	}{
		{"a", true},
		{"Show-2026_A", true},
		{strings.Repeat("x", 64), true},
		{strings.Repeat("x", 65), false},
		{"", false},
		{"{tag}", false},
		{"a}", false},
		{"a b", false},
		{"a:b", false},
		{"é", false},
		{"a\x00", false},
	}
	for _, tt := range tests {
		if got := CheckID(tt.id) == nil; got != tt.ok {
			t.Errorf("CheckID(%q) ok = %v, want %v", tt.id, got, tt.ok)
		}
	}
}

func TestKeySlotKnownValues(t *testing.T) {
	// Values from the Redis Cluster specification and CLUSTER KEYSLOT.
	if got := CRC16([]byte("123456789")); got != 0x31C3 {
		t.Errorf("CRC16(123456789) = %#x, want 0x31c3", got)
	}
	for key, want := range map[string]int{
		"foo":                  12182,
		"{user1000}.following": KeySlot("user1000"),
		"foo{}{bar}":           KeySlot("foo{}{bar}"),
		"{}x":                  int(CRC16([]byte("{}x")) % Slots),
	} {
		if got := KeySlot(key); got != want {
			t.Errorf("KeySlot(%q) = %d, want %d", key, got, want)
		}
	}
}

func TestShardKeysShareSlot(t *testing.T) {
	for n := 1; n <= 64; n++ {
		for i := range n {
			k := Shard("prog", "vip", i, n)
			for _, key := range []string{k.Stock(), k.Deduction("req-1")} {
				if got := KeySlot(key); got != k.Slot() {
					t.Fatalf("KeySlot(%q) = %d, want %d", key, got, k.Slot())
				}
			}
			if k.Slot() != ShardSlot("prog", "vip", i, n) {
				t.Fatalf("Shard(%d,%d).Slot() = %d, want ShardSlot %d", i, n, k.Slot(), ShardSlot("prog", "vip", i, n))
			}
		}
	}
}

func TestShardKeysDistinct(t *testing.T) {
	seen := map[string]bool{}
	for _, sku := range [][2]string{{"a", "b"}, {"a", "bb"}, {"ab", "b"}} {
		for _, n := range []int{1, 8, 12} {
			for i := range n {
				key := Shard(sku[0], sku[1], i, n).Stock()
				if seen[key] {
					t.Fatalf("key %q built twice", key)
				}
				seen[key] = true
			}
		}
	}
}

func TestShardPanicsOnUncheckedIDs(t *testing.T) {
	for _, args := range []struct {
		p, t string
		i, n int
	}{{"a{", "b", 0, 1}, {"a", "", 0, 1}, {"a", "b", 1, 1}, {"a", "b", 0, 0}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Shard(%q, %q, %d, %d) did not panic", args.p, args.t, args.i, args.n)
				}
			}()
			Shard(args.p, args.t, args.i, args.n)
		}()
	}
}

func TestSlotTagsCoverEverySlot(t *testing.T) {
	for slot, tag := range slotTags() {
		if tag == "" || KeySlot("{"+tag+"}") != slot {
			t.Fatalf("slot %d: tag %q hashes to %d", slot, tag, KeySlot("{"+tag+"}"))
		}
	}
}

// TestShardSpread checks, for every possible SKU base slot, that a SKU's
// shards split over 3 masters (the standard even split) as ⌊N/3⌋..⌈N/3⌉.
func TestShardSpread(t *testing.T) {
	const masters = 3
	bounds := []int{0, 5461, 10923, Slots} // redis-cli --cluster create, 3 masters
	for _, n := range []int{1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64, 128} {
		for base := 2; base < Slots; base += 4 {
			counts := make([]int, masters)
			for i := range n {
				slot := spread(base, i, n)
				for m := range masters {
					if slot >= bounds[m] && slot < bounds[m+1] {
						counts[m]++
					}
				}
			}
			lo, hi := n/masters, int(math.Ceil(float64(n)/masters))
			for m, c := range counts {
				if c < lo || c > hi {
					t.Fatalf("n=%d base=%d: master %d has %d shards, want %d..%d (%v)", n, base, m, c, lo, hi, counts)
				}
			}
		}
	}
}

func BenchmarkShardKeys(b *testing.B) {
	for b.Loop() {
		k := Shard("program-2026", "vip", 5, 12)
		_ = k.Stock()
		_ = k.Deduction("0f8fad5b-d9cb-469f-a165-70867728950e")
	}
}

func BenchmarkCheckID(b *testing.B) {
	for b.Loop() {
		_ = CheckID("0f8fad5b-d9cb-469f-a165-70867728950e")
	}
}

func TestLockKey(t *testing.T) {
	k := Lock("show-1", "ga", "reseed")
	if got, want := KeySlot(k), Shard("show-1", "ga", 0, 1).Slot(); got != want {
		t.Errorf("lock key %q in slot %d, want the SKU's shard-0 slot %d", k, got, want)
	}
	defer func() {
		if recover() == nil {
			t.Error("Lock with a bad purpose did not panic")
		}
	}()
	Lock("show-1", "ga", "re seed")
}

func TestSeatsKey(t *testing.T) {
	a, b := Seats("show-1", "stalls", "A"), Seats("show-1", "stalls", "B")
	if a == b || a != Seats("show-1", "stalls", "A") {
		t.Errorf("sections share a key: %q %q", a, b)
	}
	defer func() {
		if recover() == nil {
			t.Error("Seats with a bad section did not panic")
		}
	}()
	Seats("show-1", "stalls", "A{1}")
}

package keys

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
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
			k := Shard(MustID("prog"), MustID("vip"), i, n)
			for _, key := range []string{k.Stock(), k.Deduction(MustID("req-1"))} {
				if got := KeySlot(key); got != k.Slot() {
					t.Fatalf("KeySlot(%q) = %d, want %d", key, got, k.Slot())
				}
			}
			if k.Slot() != ShardSlot(MustID("prog"), MustID("vip"), i, n) {
				t.Fatalf("Shard(%d,%d).Slot() = %d, want ShardSlot %d", i, n, k.Slot(), ShardSlot(MustID("prog"), MustID("vip"), i, n))
			}
		}
	}
}

func TestShardKeysDistinct(t *testing.T) {
	seen := map[string]bool{}
	for _, sku := range [][2]string{{"a", "b"}, {"a", "bb"}, {"ab", "b"}} {
		for _, n := range []int{1, 8, 12} {
			for i := range n {
				key := Shard(MustID(sku[0]), MustID(sku[1]), i, n).Stock()
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
			Shard(MustID(args.p), MustID(args.t), args.i, args.n)
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
		k := Shard(MustID("program-2026"), MustID("vip"), 5, 12)
		_ = k.Stock()
		_ = k.Deduction(MustID("0f8fad5b-d9cb-469f-a165-70867728950e"))
	}
}

func BenchmarkCheckID(b *testing.B) {
	for b.Loop() {
		_ = CheckID("0f8fad5b-d9cb-469f-a165-70867728950e")
	}
}

func TestLockKey(t *testing.T) {
	k := Lock(MustID("show-1"), MustID("ga"), MustID("reseed"))
	if got, want := KeySlot(k), Shard(MustID("show-1"), MustID("ga"), 0, 1).Slot(); got != want {
		t.Errorf("lock key %q in slot %d, want the SKU's shard-0 slot %d", k, got, want)
	}
	defer func() {
		if recover() == nil {
			t.Error("Lock with no purpose did not panic")
		}
	}()
	Lock(MustID("show-1"), MustID("ga"), ID{})
}

// A request's lock lives beside the SKU's shard 0, one key per request.
func TestRequestLockKey(t *testing.T) {
	p, tk, cart := MustID("show-1"), MustID("ga"), MustID("cart")
	a, b := RequestLock(p, tk, cart, MustID("r1")), RequestLock(p, tk, cart, MustID("r2"))
	if a == b {
		t.Errorf("two requests share a lock: %q", a)
	}
	if got, want := KeySlot(a), Shard(p, tk, 0, 1).Slot(); got != want || KeySlot(b) != want {
		t.Errorf("request lock %q in slot %d, want the SKU's shard-0 slot %d", a, got, want)
	}
}

func TestSeatsKey(t *testing.T) {
	a, b := Seats(MustID("show-1"), MustID("stalls"), MustID("A")), Seats(MustID("show-1"), MustID("stalls"), MustID("B"))
	if a == b || a != Seats(MustID("show-1"), MustID("stalls"), MustID("A")) {
		t.Errorf("sections share a key: %q %q", a, b)
	}
	defer func() {
		if recover() == nil {
			t.Error("Seats with no section did not panic")
		}
	}()
	Seats(MustID("show-1"), MustID("stalls"), ID{})
}

// An ID is made only from text CheckID accepts, whichever way it is made:
// ParseID, JSON or text decoding, or a SQL scan. A zero ID is "no id", and
// every key function refuses it.
func TestIDIsMadeOnlyFromValidText(t *testing.T) {
	for _, text := range []string{"", strings.Repeat("x", 65), "{tag}", "a}", "a b", "a:b", "é", "a\x00", "a,b"} {
		if _, err := ParseID(text); !errors.Is(err, ErrInvalidID) {
			t.Errorf("ParseID(%q) = %v, want ErrInvalidID", text, err)
		}
		var id ID
		if text != "" {
			if err := id.UnmarshalText([]byte(text)); err == nil {
				t.Errorf("UnmarshalText(%q) accepted it", text)
			}
			if err := json.Unmarshal([]byte(strconv.Quote(text)), &id); err == nil {
				t.Errorf("json.Unmarshal(%q) accepted it", text)
			}
			if err := id.Scan(text); err == nil {
				t.Errorf("Scan(%q) accepted it", text)
			}
			if err := id.Scan([]byte(text)); err == nil {
				t.Errorf("Scan([]byte %q) accepted it", text)
			}
		}
		if !id.IsZero() {
			t.Errorf("a refused %q left the ID %q", text, id)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("MustID(%q) did not panic", text)
				}
			}()
			MustID(text)
		}()
	}
	for _, text := range []string{"a", "Show-2026_A", strings.Repeat("x", 64)} {
		id, err := ParseID(text)
		if err != nil || id.String() != text || id.IsZero() {
			t.Errorf("ParseID(%q) = %q, %v", text, id, err)
		}
		b, _ := json.Marshal(struct{ ID ID }{id})
		if want := `{"ID":` + strconv.Quote(text) + `}`; string(b) != want {
			t.Errorf("json.Marshal = %s, want %s", b, want)
		}
		var back ID
		if err := back.Scan(text); err != nil || back != id {
			t.Errorf("Scan(%q) = %q, %v", text, back, err)
		}
		if v, _ := id.Value(); v != text {
			t.Errorf("Value() = %v, want %q", v, text)
		}
	}
	if err := new(ID).Scan(42); err == nil {
		t.Error("Scan(42) accepted an int")
	}
	p, tk := MustID("p"), MustID("t")
	for name, f := range map[string]func(){
		"Shard":       func() { Shard(ID{}, tk, 0, 1) },
		"Deduction":   func() { Shard(p, tk, 0, 1).Deduction(ID{}) },
		"Refill":      func() { Shard(p, tk, 0, 1).Refill(ID{}) },
		"Quota":       func() { Quota(p, tk, ID{}) },
		"Seats":       func() { Seats(p, ID{}, MustID("A")) },
		"Lock":        func() { Lock(p, tk, ID{}) },
		"RequestLock": func() { RequestLock(p, tk, MustID("cart"), ID{}) },
		"Bench":       func() { Bench(p, tk, ID{}) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s with a zero ID did not panic", name)
				}
			}()
			f()
		}()
	}
	// The program-wide quota key (zero ticket) is its own key.
	if Quota(p, ID{}, MustID("b")) == Quota(p, tk, MustID("b")) {
		t.Error("program-wide and SKU quota keys are the same")
	}
}

// A derived id is stored and read back, and no client id equals it: a
// client's Idempotency-Key can never take a record the service derives.
func TestDerivedIsNoClientID(t *testing.T) {
	hold := MustID("8962d0fa0f4cb1a7")
	d := Derived("late", hold)
	if _, err := ParseID(d.String()); err == nil {
		t.Fatalf("client input %q parses: a client's key could take the derived id", d)
	}
	back, err := ParseStored(d.String())
	if err != nil || back != d {
		t.Fatalf("stored %q reads back as %q, %v", d, back, err)
	}
	if Derived("late", hold) == Derived("confirm", hold) {
		t.Fatal("two purposes give one id")
	}
}

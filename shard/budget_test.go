package shard_test

import (
	"context"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/shard"
)

// A hold's budget count moves with its extensions, later only: an
// extension's answer replayed after a later one (its retry; sale's
// extend replays move the count again) leaves the later expiry standing,
// or the buyer's count would leave while the hold still lives.
func TestBudgetExtendMovesLaterOnly(t *testing.T) {
	ctx := context.Background()
	s, rdb := newStore(t)
	b := shard.Budget{Program: keys.MustID(newSKU(t).Program.String()), Buyer: keys.MustID("ann")}
	entry := keys.MustID("hold-1")
	now := time.Now()
	if _, _, err := s.TakeBudget(ctx, b, entry, 1, 4, now.Add(time.Minute), ""); err != nil {
		t.Fatal(err)
	}
	entries, _ := keys.HoldBudget(b.Program, "b", b.Buyer.String())
	score := func() int64 {
		t.Helper()
		v, err := rdb.ZScore(ctx, entries, entry.String()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return int64(v)
	}
	later, earlier := now.Add(10*time.Minute), now.Add(5*time.Minute)
	for _, to := range []time.Time{later, earlier} {
		if _, err := s.ExtendBudget(ctx, b, entry, to); err != nil {
			t.Fatal(err)
		}
	}
	if got := score(); got != later.UnixMilli() {
		t.Errorf("after extending to +10m and then to +5m, the count leaves at %v, want +10m (%v)",
			time.UnixMilli(got).Sub(now), later.Sub(now))
	}
}

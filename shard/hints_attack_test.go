package shard_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// hookHints is staleHints with a hook run when Deduct asks about a shard:
// another replica's sale, run at a known point of this replica's deduction.
type hookHints struct {
	staleHints
	onAsk func(i int)
}

func (h *hookHints) IsEmpty(sku stock.SKU, n, i int) bool {
	if h.onAsk != nil {
		h.onAsk(i)
	}
	return h.staleHints.IsEmpty(sku, n, i)
}

func partsSorted(ps []shard.Part) []shard.Part {
	out := slices.Clone(ps)
	slices.SortFunc(out, func(a, b shard.Part) int { return a.Shard - b.Shard })
	return out
}

// TestAttackAssembledCopyOnHintedShards: replica A assembles a purchase of 2
// from shards 1 and 2 (1 unit each; its start shard 0 is empty). Replica B,
// which found shards 1 and 2 empty (rightly: A emptied them), gets a copy of
// the same request. Its answer must be A's deduction, replayed, moving
// nothing: not sold out (the case 976f108 fixes for a quantity of 1), and
// never a second take of the same request.
func TestAttackAssembledCopyOnHintedShards(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.SharedCluster(t).Client()
	t.Cleanup(func() { rdb.Close() })
	const n = 3
	setup := func(t *testing.T) (a, b *shard.Store, sku stock.SKU, first shard.Deduction, firstReq, req shard.Request, da shard.Deduction) {
		var err error
		if a, err = shard.New(shard.Options{Redis: rdb}); err != nil {
			t.Fatal(err)
		}
		hintsB := &staleHints{}
		if b, err = shard.New(shard.Options{Redis: rdb, Empty: hintsB}); err != nil {
			t.Fatal(err)
		}
		sku = newSKU(t)
		if err := a.Seed(ctx, sku, n, 3, 1, true); err != nil {
			t.Fatal(err)
		}
		firstReq = shard.Request{SKU: sku, Shards: n, RequestID: idStartingAt(t, "first", n, 0), Quantity: 1, MaxQuantity: 4}
		if first, err = a.Deduct(ctx, firstReq); err != nil || first.Parts[0].Shard != 0 {
			t.Fatalf("first sale = %+v, %v; want shard 0's unit", first, err)
		}
		req = shard.Request{SKU: sku, Shards: n, RequestID: idStartingAt(t, "pair", n, 0), Quantity: 2, MaxQuantity: 4}
		da, err = a.Deduct(ctx, req)
		if err != nil || len(da.Parts) != 2 {
			t.Fatalf("A's deduct of 2 = %+v, %v; want shards 1 and 2", da, err)
		}
		hintsB.MarkEmpty(sku, n, 1)
		hintsB.MarkEmpty(sku, n, 2)
		return a, b, sku, first, firstReq, req, da
	}

	t.Run("start shard empty", func(t *testing.T) {
		a, b, sku, _, _, req, da := setup(t)
		db, err := b.Deduct(ctx, req)
		if err != nil {
			t.Fatalf("B's copy of A's request = %+v, %v; want the replay of A's deduction %+v", db, err, da.Parts)
		}
		if !db.Replayed || !slices.Equal(partsSorted(db.Parts), partsSorted(da.Parts)) {
			t.Errorf("B's copy = %+v, want A's parts %+v replayed", db, da.Parts)
		}
		if left := remaining(t, a, sku, n); left != 0 {
			t.Errorf("remaining = %d, want 0", left)
		}
	})

	t.Run("a unit back on the start shard", func(t *testing.T) {
		a, b, sku, first, firstReq, req, da := setup(t)
		// The first sale is given back: shard 0 has 1 unit again.
		if _, err := a.Restore(ctx, sku, firstReq.RequestID, firstReq.Holder, first.Parts); err != nil {
			t.Fatal(err)
		}
		db, err := b.Deduct(ctx, req)
		if err != nil {
			t.Fatalf("B's copy of A's request = %+v, %v; want the replay of A's deduction %+v", db, err, da.Parts)
		}
		if left := remaining(t, a, sku, n); left != 1 {
			t.Errorf("remaining = %d, want 1: the copy took stock a second time for one request (parts %+v, A's %+v)", left, db.Parts, da.Parts)
		}
		if !db.Replayed || !slices.Equal(partsSorted(db.Parts), partsSorted(da.Parts)) {
			t.Errorf("B's copy = %+v, want A's parts %+v replayed", db, da.Parts)
		}
	})
}

// TestAttackAssembleSoldOutOnAHint: a purchase of 3 over 3 shards of 2 units
// each, on a replica whose hint says shard 2 is empty (stale: it has 2).
// The first pass sees 2+2 (enough together, no shard alone), so it
// assembles; meanwhile (between the first pass and the assembly) another
// replica sells shards 0 and 1. The assembly finds nothing and answers sold
// out with Left 0, which makes the gateway mark the SKU sold out for every
// buyer while shard 2 holds 2 units: a verdict resting on the hint.
func TestAttackAssembleSoldOutOnAHint(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.SharedCluster(t).Client()
	t.Cleanup(func() { rdb.Close() })
	const n = 3
	a, err := shard.New(shard.Options{Redis: rdb})
	if err != nil {
		t.Fatal(err)
	}
	hintsB := &hookHints{}
	b, err := shard.New(shard.Options{Redis: rdb, Empty: hintsB})
	if err != nil {
		t.Fatal(err)
	}
	sku := newSKU(t)
	if err := a.Seed(ctx, sku, n, 6, 1, true); err != nil {
		t.Fatal(err)
	}
	hintsB.MarkEmpty(sku, n, 2)
	fired := false
	hintsB.onAsk = func(i int) {
		if i != 2 || fired {
			return
		}
		fired = true
		for s := range 2 {
			r := shard.Request{SKU: sku, Shards: n, RequestID: idStartingAt(t, "other", n, s), Quantity: 2, MaxQuantity: 4}
			if d, err := a.Deduct(ctx, r); err != nil || d.Parts[0].Shard != s {
				t.Errorf("other replica's sale on shard %d = %+v, %v", s, d, err)
			}
		}
	}
	d, err := b.Deduct(ctx, shard.Request{SKU: sku, Shards: n, RequestID: idStartingAt(t, "three", n, 0), Quantity: 3, MaxQuantity: 4})
	if !fired {
		t.Fatal("the hint was never asked about shard 2")
	}
	if !errors.Is(err, stock.ErrSoldOut) {
		t.Fatalf("Deduct(3) = %+v, %v; want sold out (2 units left)", d, err)
	}
	if d.Left == 0 {
		t.Errorf("sold out with Left 0 (the SKU is marked sold out) while shard 2 holds %d units", remaining(t, a, sku, n))
	}
}

package shard_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// staleHints is a replica's memory of empty shards that never forgets by
// itself, so a hint stays stale for as long as a test needs it to.
type staleHints struct {
	mu    sync.Mutex
	empty map[string]bool
}

func (h *staleHints) name(sku stock.SKU, n, i int) string { return fmt.Sprintf("%s/%d/%d", sku, n, i) }

func (h *staleHints) IsEmpty(sku stock.SKU, n, i int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.empty[h.name(sku, n, i)]
}

func (h *staleHints) MarkEmpty(sku stock.SKU, n, i int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.empty == nil {
		h.empty = map[string]bool{}
	}
	h.empty[h.name(sku, n, i)] = true
}

func (h *staleHints) MarkStocked(sku stock.SKU, n, i int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.empty, h.name(sku, n, i))
}

// idStartingAt returns a request id whose Start over n shards is i.
func idStartingAt(t *testing.T, prefix string, n, i int) keys.ID {
	for k := range 1000 {
		id := keys.MustID(fmt.Sprintf("%s-%d", prefix, k))
		if shard.Start(id, n) == i {
			return id
		}
	}
	t.Fatalf("no id starting at shard %d of %d", i, n)
	return keys.ID{}
}

// TestSoldOutNeverRestsOnAHint: two replicas on one SKU of 2 shards, one
// unit each. Replica B found shard 1 empty a moment ago; its unit came back
// since. A sold-out answer from B must rest on what Redis says: the copy of
// a request that replica A is selling from shard 1 finds A's record there
// (a replay, not "sold out" to a buyer being sold a ticket), and a new
// request finds the returned unit.
func TestSoldOutNeverRestsOnAHint(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.SharedCluster(t).Client()
	t.Cleanup(func() { rdb.Close() })
	const n = 2
	stores := func() (a, b *shard.Store, hintsB *staleHints) {
		hintsB = &staleHints{}
		var err error
		if a, err = shard.New(shard.Options{Redis: rdb}); err != nil {
			t.Fatal(err)
		}
		if b, err = shard.New(shard.Options{Redis: rdb, Empty: hintsB}); err != nil {
			t.Fatal(err)
		}
		return a, b, hintsB
	}
	seed := func(sku stock.SKU, a *shard.Store) {
		if err := a.Seed(ctx, sku, n, 2, 1, true); err != nil {
			t.Fatal(err)
		}
		// Shard 0 empties: its unit sold by A.
		if _, err := a.Deduct(ctx, shard.Request{SKU: sku, Shards: n, RequestID: idStartingAt(t, "first", n, 0), Quantity: 1, MaxQuantity: 4}); err != nil {
			t.Fatal(err)
		}
		if left := remaining(t, a, sku, n); left != 1 {
			t.Fatalf("remaining after the first sale = %d, want 1", left)
		}
	}

	t.Run("a copy of a request in flight elsewhere", func(t *testing.T) {
		a, b, hintsB := stores()
		sku := newSKU(t)
		seed(sku, a)
		hintsB.MarkEmpty(sku, n, 1)
		req := shard.Request{SKU: sku, Shards: n, RequestID: idStartingAt(t, "buyer", n, 0), Quantity: 1, MaxQuantity: 4}
		da, err := a.Deduct(ctx, req)
		if err != nil || len(da.Parts) != 1 || da.Parts[0].Shard != 1 {
			t.Fatalf("A's deduct = %+v, %v; want shard 1's unit", da, err)
		}
		db, err := b.Deduct(ctx, req)
		if err != nil {
			t.Fatalf("B's copy of the same request = %v; want the replay of A's deduction", err)
		}
		if !db.Replayed || len(db.Parts) != 1 || db.Parts[0] != da.Parts[0] {
			t.Errorf("B's copy = %+v, want A's part %+v replayed", db, da.Parts[0])
		}
		if left := remaining(t, a, sku, n); left != 0 {
			t.Errorf("remaining = %d, want 0: the copy moved stock", left)
		}
	})

	t.Run("a unit that came back", func(t *testing.T) {
		a, b, hintsB := stores()
		sku := newSKU(t)
		seed(sku, a)
		hintsB.MarkEmpty(sku, n, 1)
		d, err := b.Deduct(ctx, shard.Request{SKU: sku, Shards: n, RequestID: idStartingAt(t, "late", n, 0), Quantity: 1, MaxQuantity: 4})
		if err != nil || d.Replayed || len(d.Parts) != 1 || d.Parts[0].Shard != 1 {
			t.Fatalf("B's deduct = %+v, %v; want shard 1's unit", d, err)
		}
		if !hintsB.IsEmpty(sku, n, 1) {
			t.Errorf("shard 1 sold its last unit: B should hint it empty")
		}
	})
}

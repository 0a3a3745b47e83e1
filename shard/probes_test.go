package shard_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/cache"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// TestProbesPerPurchase sells 1,000 units over 16 shards to 32 concurrent
// buyers asking for 1 to 4, with the known-empty memory the gateway uses,
// and measures the Redis calls (probes) each purchase made: over the whole
// sale, and over the purchases that took the last 1% of the stock. Every
// unit is sold; none twice.
func TestProbesPerPurchase(t *testing.T) {
	rdb := testenv.SharedCluster(t).Client()
	defer rdb.Close()
	mem, err := cache.New(cache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := shard.New(shard.Options{Redis: rdb, Empty: mem})
	if err != nil {
		t.Fatal(err)
	}
	sku := stock.SKU{Program: keys.MustID(testenv.ID(t, "p")), Ticket: keys.MustID("ga")}
	const total, shards = 1000, 16
	ctx := context.Background()
	if err := s.Seed(ctx, sku, shards, total, 1, true); err != nil {
		t.Fatal(err)
	}
	type sale struct {
		probes int
		taken  int64
		order  int64 // units sold before this one finished, in order of completion
	}
	var mu sync.Mutex
	var sold int64
	var sales []sale
	var refusedProbes []int
	deadline := time.Now().Add(20 * time.Second)
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Go(func() {
			for n := 0; ; n++ {
				q := int64(1 + rand.IntN(4))
				d, err := s.Deduct(ctx, shard.Request{SKU: sku, Shards: shards, RequestID: keys.MustID(fmt.Sprintf("w%d-%d", w, n)), Quantity: q, MaxQuantity: 4})
				mu.Lock()
				switch {
				case err == nil:
					sold += q
					sales = append(sales, sale{probes: d.Probes, taken: q, order: sold})
				case errors.Is(err, stock.ErrSoldOut):
					refusedProbes = append(refusedProbes, d.Probes)
				default:
					t.Error(err)
				}
				// Stop once everything is sold. A refusal seeing no stock is
				// not the end: another buyer's partial take may be on its
				// way back (an assembly that fell short gives back).
				done := sold == total || time.Now().After(deadline)
				mu.Unlock()
				if done {
					return
				}
			}
		})
	}
	wg.Wait()
	if sold != total {
		t.Fatalf("sold %d, want exactly %d", sold, total)
	}
	if left := remaining(t, s, sku, shards); left != 0 {
		t.Errorf("redis remaining %d after the sale", left)
	}
	stats := func(ps []int) (float64, int) {
		if len(ps) == 0 {
			return 0, 0
		}
		sum := 0
		for _, p := range ps {
			sum += p
		}
		slices.Sort(ps)
		return float64(sum) / float64(len(ps)), ps[(len(ps)*99)/100]
	}
	var all, tail []int
	for _, sl := range sales {
		all = append(all, sl.probes)
		if sl.order > total*99/100 {
			tail = append(tail, sl.probes)
		}
	}
	am, ap := stats(all)
	tm, tp := stats(tail)
	rm, rp := stats(refusedProbes)
	t.Logf("probes per purchase, 1000 units / 16 shards / q 1..4: whole sale mean %.2f p99 %d (%d purchases); last 1%% mean %.2f p99 %d (%d purchases); refusals mean %.2f p99 %d (%d)",
		am, ap, len(all), tm, tp, len(tail), rm, rp, len(refusedProbes))
	if ap > shards*2 {
		t.Errorf("p99 probes %d above two passes over %d shards", ap, shards)
	}
}

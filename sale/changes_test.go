package sale

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// Every mark is reported by a drain that runs while it is made or after
// it, each SKU once a drain, while marks and drains race: a mark that
// returned before a drain began is in that drain or an earlier one, never
// in none (a change notice left out: other replicas serve their stale
// views until they expire).
func TestChangesDrainReportsEveryMarkOnce(t *testing.T) {
	skus := make([]stock.SKU, 50)
	for i := range skus {
		skus[i] = stock.SKU{Program: keys.MustID("p"), Ticket: keys.MustID(fmt.Sprintf("t%d", i))}
	}
	var c changes
	var started atomic.Int64 // drains begun: drain n sees every mark that returned before it began
	type made struct {
		sku           stock.SKU
		before, after int64 // drains begun before the mark, and when it had returned
	}
	const markers, marksEach = 4, 2000
	marks := make([][]made, markers)
	var wg sync.WaitGroup
	for w := range markers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 1))
			for range marksEach {
				sku := skus[rnd.IntN(len(skus))]
				before := started.Load()
				c.mark(sku)
				marks[w] = append(marks[w], made{sku, before, started.Load()})
			}
		})
	}
	var drains [][]stock.SKU // drains[n-1]: what drain n returned
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }() // ends when the markers do
	drain := func() {
		started.Add(1)
		got := c.drain()
		seen := map[stock.SKU]bool{}
		for _, s := range got {
			if seen[s] {
				t.Fatalf("drain %d returned %v twice: %v", len(drains)+1, s, got)
			}
			seen[s] = true
		}
		drains = append(drains, got)
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		drain()
	}
	drain() // after every mark returned
	if got := c.drain(); len(got) != 0 {
		t.Fatalf("a drain after the last one returned %v", got)
	}
	for _, ms := range marks {
		for _, m := range ms {
			// Drain m.before may still have been running as the mark was
			// made; drain m.after+1 began after it returned.
			if !slices.ContainsFunc(drains[max(m.before, 1)-1:m.after+1], func(d []stock.SKU) bool { return slices.Contains(d, m.sku) }) {
				t.Fatalf("a mark of %v made while drains %d to %d began was in none of drains %d to %d", m.sku, m.before, m.after, max(m.before, 1), m.after+1)
			}
		}
	}
	t.Logf("%d marks, %d drains", markers*marksEach, len(drains))
}

// A drain with nothing marked costs the SKUs marked since the last one,
// not every SKU ever marked: the notices' publisher drains five times a
// second on every replica, changed or not.
func BenchmarkChangesDrainNothingMarked(b *testing.B) {
	var c changes
	for i := range 10_000 {
		c.mark(stock.SKU{Program: keys.MustID("p"), Ticket: keys.MustID(fmt.Sprintf("t%d", i))})
	}
	c.drain()
	for b.Loop() {
		if got := c.drain(); len(got) != 0 {
			b.Fatal(got)
		}
	}
}

package shard_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stockgate/stockgate/cache"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

var callsRE = regexp.MustCompile(`cmdstat_(?:evalsha|eval):calls=(\d+)`)

// scriptCalls is how many scripts each master of the cluster has run.
func scriptCalls(b *testing.B, c *testenv.Cluster) []int64 {
	b.Helper()
	out := make([]int64, c.Masters)
	for i, n := range c.Nodes[:c.Masters] {
		cl := n.Client()
		info, err := cl.Info(context.Background(), "commandstats").Result()
		cl.Close()
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range callsRE.FindAllStringSubmatch(info, -1) {
			v, _ := strconv.ParseInt(m[1], 10, 64)
			out[i] += v
		}
	}
	return out
}

// BenchmarkHotSKUMasterShare runs a flash sale on one hot SKU (stock = 10%
// of the purchases, the rest sold out) straight through package shard, and
// reports the share of the SKU's Redis scripts each master served, from
// INFO commandstats deltas, for N = 1 and N = 12 shards. Run:
//
//	go test -run '^$' -bench HotSKUMasterShare -benchtime 20000x ./shard
func BenchmarkHotSKUMasterShare(b *testing.B) {
	c := testenv.SharedCluster(b)
	rdb := c.Client()
	defer rdb.Close()
	for _, n := range []int{1, 12} {
		b.Run(fmt.Sprintf("shards=%d", n), func(b *testing.B) {
			mem, err := cache.New(cache.Options{})
			if err != nil {
				b.Fatal(err)
			}
			s, err := shard.New(shard.Options{Redis: rdb, Empty: mem})
			if err != nil {
				b.Fatal(err)
			}
			sku := stock.SKU{Program: keys.MustID(testenv.ID(b, "bench")), Ticket: keys.MustID("ga")}
			ctx := context.Background()
			if err := s.Seed(ctx, sku, n, int64(max(b.N/10, 1)), 1, true); err != nil {
				b.Fatal(err)
			}
			before := scriptCalls(b, c)
			var seq atomic.Int64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := "r" + strconv.FormatInt(seq.Add(1), 10)
					_, _ = s.Deduct(ctx, shard.Request{SKU: sku, Shards: n, RequestID: keys.MustID(id), Quantity: 1, MaxQuantity: 4})
				}
			})
			b.StopTimer()
			after := scriptCalls(b, c)
			var total int64
			for i := range after {
				total += after[i] - before[i]
			}
			var shares []string
			for i := range after {
				share := float64(after[i]-before[i]) / float64(total)
				b.ReportMetric(share*100, fmt.Sprintf("%%master%d", i))
				shares = append(shares, fmt.Sprintf("%.1f%%", share*100))
			}
			b.Logf("N=%d: %d scripts, per master %s", n, total, strings.Join(shares, " / "))
		})
	}
}

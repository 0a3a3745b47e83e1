package sale_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// quotaFaults is the in-memory gate with the faults of a master out of
// reach for the buyers' counts: while release is set, unquota.lua fails
// unrun (the gate's one script of two arguments); while lose is set,
// quota.lua (its one of five) runs and its reply is lost.
type quotaFaults struct {
	*shardmem.Scripter
	release, lose atomic.Bool
}

// run runs a script call (call) through the faults: args tell which
// script it is.
func (f *quotaFaults) run(args []any, call func() *redis.Cmd) *redis.Cmd {
	switch {
	case f.release.Load() && len(args) == 2:
		return redis.NewCmdResult(nil, context.DeadlineExceeded) // not run
	case f.lose.Load() && len(args) == 5:
		call() // run, its reply lost
		return redis.NewCmdResult(nil, context.DeadlineExceeded)
	}
	return call()
}

func (f *quotaFaults) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return f.run(args, func() *redis.Cmd { return f.Scripter.EvalSha(ctx, sha, keys, args...) })
}

func (f *quotaFaults) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return f.run(args, func() *redis.Cmd { return f.Scripter.Eval(ctx, script, keys, args...) })
}

// A purchase refused after its buyer's count was taken gives the count
// back, even when Redis fails it: a release that fails is given back by
// the sweeper once Redis answers again, and a count whose reply was lost
// (the script may have run) is released by its request id. Left there,
// the buyer, who owns nothing, would be refused at the cap.
func TestQuotaCountsGoBackThroughFaults(t *testing.T) {
	for _, c := range []struct {
		name  string
		fault func(f *quotaFaults) *atomic.Bool
	}{
		{"the release fails", func(f *quotaFaults) *atomic.Bool { return &f.release }},
		{"the count's reply is lost", func(f *quotaFaults) *atomic.Bool { return &f.lose }},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem := &quotaFaults{Scripter: shardmem.New()}
			svc, _ := unitServiceOn(t, mem)
			ctx, stop := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); svc.RunSweeper(ctx) }()
			t.Cleanup(func() { stop(); <-done })

			sku := stock.SKU{Program: keys.MustID("quota"), Ticket: keys.MustID("t")}
			if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 1, Shards: 1, MaxPerOrder: 2, PerBuyer: 2}); err != nil {
				t.Fatal(err)
			}
			ann := keys.MustID("ann")
			on := c.fault(mem)
			on.Store(true)
			// Counted 2 at the cap of 2, then refused: one ticket left.
			if _, err := svc.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: ann, Key: keys.MustID("two")}, SKU: sku, Quantity: 2}); !errors.Is(err, sale.ErrSoldOut) {
				t.Fatalf("purchase of 2 of 1 = %v, want sold out", err)
			}
			on.Store(false)
			// Until the count is given back, a purchase of the one left is
			// refused at the cap; then it is sold. Each try is a new request.
			deadline := time.Now().Add(30 * time.Second)
			for i := 0; ; i++ {
				res, err := svc.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: ann, Key: keys.MustID(fmt.Sprintf("one-%d", i))}, SKU: sku, Quantity: 1})
				if err == nil && res.Order != nil {
					break
				}
				if !errors.Is(err, sale.ErrLimit) {
					t.Fatalf("purchase of the one left = %+v, %v; want limit reached until the count is given back, then sold", res, err)
				}
				if time.Now().After(deadline) {
					t.Fatal("30 s on, the refused purchase's count was never given back: a buyer who owns nothing is refused at the cap")
				}
				time.Sleep(50 * time.Millisecond) // poll interval: the sweeper runs once a second
			}
		})
	}
}

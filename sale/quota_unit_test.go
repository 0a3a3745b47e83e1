package sale_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
	stuck         atomic.Value // string: unquota fails on the keys holding it
}

// run runs a script call (call) on keys through the faults: args tell
// which script it is.
func (f *quotaFaults) run(keys []string, args []any, call func() *redis.Cmd) *redis.Cmd {
	stuck, _ := f.stuck.Load().(string)
	switch {
	case len(args) == 2 && (f.release.Load() || stuck != "" && strings.Contains(keys[0], stuck)):
		return redis.NewCmdResult(nil, context.DeadlineExceeded) // not run
	case f.lose.Load() && len(args) == 5:
		call() // run, its reply lost
		return redis.NewCmdResult(nil, context.DeadlineExceeded)
	}
	return call()
}

func (f *quotaFaults) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return f.run(keys, args, func() *redis.Cmd { return f.Scripter.EvalSha(ctx, sha, keys, args...) })
}

func (f *quotaFaults) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return f.run(keys, args, func() *redis.Cmd { return f.Scripter.Eval(ctx, script, keys, args...) })
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
			svc, ctx := sweeping(t, mem)

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
			// refused at the cap; then it is sold.
			buysOnceGivenBack(t, svc, sku, ann)
		})
	}
}

// sweeping is a unit Service on mem with its sweeper running (stopped at
// the test's end), and the context to call it with.
func sweeping(t *testing.T, mem *quotaFaults) (*sale.Service, context.Context) {
	t.Helper()
	svc, _ := unitServiceOn(t, mem)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); svc.RunSweeper(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	return svc, ctx
}

// buysOnceGivenBack waits until buyer's purchase of one ticket of sku
// is sold (its leftover count given back), refused at the cap till then;
// each try is a new request.
func buysOnceGivenBack(t *testing.T, svc *sale.Service, sku stock.SKU, buyer keys.ID) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		res, err := svc.Purchase(context.Background(), sale.Take{Ask: sale.Ask{Buyer: buyer, Key: keys.MustID(fmt.Sprintf("one-%d", i))}, SKU: sku, Quantity: 1})
		if err == nil && res.Order != nil {
			return
		}
		if !errors.Is(err, sale.ErrLimit) {
			t.Fatalf("%v's purchase of the one left = %+v, %v; want limit reached until the count is given back, then sold", buyer, res, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s on, %v's refused purchase's count was never given back: a buyer who owns nothing is refused at the cap", buyer)
		}
		time.Sleep(50 * time.Millisecond) // poll interval: the sweeper runs once a second
	}
}

// The sweeper's retries of one master's releases, failing slowly, hold up
// no other master's: a release that fails again waits behind those not
// tried. Here ann's count's master stays out and bob's comes back.
func TestOwedReleasesOfOneMasterHoldUpNoOther(t *testing.T) {
	mem := &quotaFaults{Scripter: shardmem.New()}
	svc, ctx := sweeping(t, mem)

	skus := map[string]stock.SKU{}
	for _, b := range []string{"ann", "bob"} {
		sku := stock.SKU{Program: keys.MustID("owed"), Ticket: keys.MustID("t" + b)}
		if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 1, Shards: 1, MaxPerOrder: 2, PerBuyer: 2}); err != nil {
			t.Fatal(err)
		}
		skus[b] = sku
	}
	mem.release.Store(true)
	for _, b := range []string{"ann", "bob"} { // ann's release first in the sweeper's list
		if _, err := svc.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID(b), Key: keys.MustID("two")}, SKU: skus[b], Quantity: 2}); !errors.Is(err, sale.ErrSoldOut) {
			t.Fatalf("%s's purchase of 2 of 1 = %v, want sold out", b, err)
		}
	}
	mem.stuck.Store("ann")
	mem.release.Store(false)
	buysOnceGivenBack(t, svc, skus["bob"], keys.MustID("bob"))
}

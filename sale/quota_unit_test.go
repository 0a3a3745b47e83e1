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

	"github.com/stockgate/stockgate/breaker"
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
	endStuck      atomic.Value // string: budget.lua's end fails unrun on the keys holding it
	down          atomic.Bool  // every script fails unrun: the masters out of reach
	outKeys       atomic.Value // string: scripts on the keys holding it fail unrun, their master's breaker open
}

// run runs a script call (call) on keys through the faults: args tell
// which script it is.
func (f *quotaFaults) run(keys []string, args []any, call func() *redis.Cmd) *redis.Cmd {
	stuck, _ := f.stuck.Load().(string)
	endStuck, _ := f.endStuck.Load().(string)
	outKeys, _ := f.outKeys.Load().(string)
	switch {
	case f.down.Load():
		return redis.NewCmdResult(nil, context.DeadlineExceeded) // not run
	case outKeys != "" && len(keys) > 0 && strings.Contains(keys[0], outKeys):
		return redis.NewCmdResult(nil, fmt.Errorf("test: %w", breaker.ErrOpen)) // not run
	case endStuck != "" && len(args) > 0 && args[0] == "end" && strings.Contains(keys[0], endStuck):
		return redis.NewCmdResult(nil, context.DeadlineExceeded) // not run
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
	// Every 20 ms, not the default second: the tests wait for a sweep.
	svc, _ := sale.TestService(t, mem, nil, func(o *sale.Options) { o.SweepEvery = 20 * time.Millisecond })
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
		time.Sleep(10 * time.Millisecond) // poll interval: the sweeper runs every 20 ms
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

// A hold budget count whose end Redis fails is ended by the sweeper once
// Redis answers: left there, it refused a buyer (or a device) who held
// nothing with 409 hold-budget-reached until the old hold's expiry
// (helper-64). The buyer's count and the device's fail alone or together,
// for a hold that ended (cancelled, confirmed) and for one refused after
// it was counted.
func TestHoldBudgetEndsGoBackThroughFaults(t *testing.T) {
	for _, c := range []struct {
		name, stuck string // stuck: which counts' ends fail (their keys' kind)
		end         string // how ann's hold ends: cancel, confirm, refused
	}{
		{"buyer's end fails at a cancel", ":b:", "cancel"},
		{"device's end fails at a confirm", ":d:", "confirm"},
		{"both ends fail at a cancel", ":budget:", "cancel"},
		{"both ends fail at a refusal", ":budget:", "refused"},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem := &quotaFaults{Scripter: shardmem.New()}
			svc, ctx := sweeping(t, mem)
			program := keys.MustID("budget")
			if err := svc.PutProgram(ctx, sale.Program{ID: program, HoldBudget: 2, DeviceHoldBudget: 2}); err != nil {
				t.Fatal(err)
			}
			sku := stock.SKU{Program: program, Ticket: keys.MustID("t")}
			total := int64(10)
			if c.end == "refused" {
				total = 1
			}
			if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: total, Shards: 1, MaxPerOrder: 4, HoldTTL: 10 * time.Minute}); err != nil {
				t.Fatal(err)
			}
			ann := sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID("h2"), Device: "phone-1"}
			hold := sale.Take{Ask: ann, SKU: sku, Quantity: 2}
			mem.endStuck.Store(c.stuck)
			switch res, err := svc.Hold(ctx, hold); c.end {
			case "refused":
				if !errors.Is(err, sale.ErrSoldOut) {
					t.Fatalf("hold of 2 of 1 = %+v, %v; want sold out", res, err)
				}
			default:
				if err != nil || res.Hold == nil {
					t.Fatalf("hold of 2 = %+v, %v", res, err)
				}
				end := svc.Cancel
				if c.end == "confirm" {
					end = svc.Confirm
				}
				if _, err := end(ctx, res.Hold.ID, sale.Ask{Buyer: ann.Buyer, Key: keys.MustID("end")}); err != nil {
					t.Fatalf("%s of the hold: %v", c.end, err)
				}
			}
			mem.endStuck.Store("")
			// ann holds nothing, and neither does her phone: each is
			// refused 1 more while the 2 are counted, and held it once the
			// counts are ended.
			holdsOnceEnded(t, svc, sale.Take{Ask: sale.Ask{Buyer: ann.Buyer}, SKU: sku, Quantity: 1})
			holdsOnceEnded(t, svc, sale.Take{Ask: sale.Ask{Buyer: keys.MustID("cat"), Device: "phone-1"}, SKU: sku, Quantity: 1})
		})
	}
}

// holdsOnceEnded waits until hold t is made, refused at a hold budget
// until then (each try a new request, cancelled at once so that it
// counts nothing after).
func holdsOnceEnded(t *testing.T, svc *sale.Service, tk sale.Take) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		tk.Key = keys.MustID(fmt.Sprintf("try-%s-%d", tk.Buyer, i))
		res, err := svc.Hold(context.Background(), tk)
		if err == nil && res.Hold != nil {
			if _, err := svc.Cancel(context.Background(), res.Hold.ID, sale.Ask{Buyer: tk.Buyer, Key: keys.MustID(fmt.Sprintf("cancel-%s-%d", tk.Buyer, i))}); err != nil {
				t.Fatalf("cancel of %v's hold: %v", tk.Buyer, err)
			}
			return
		}
		if !errors.Is(err, sale.ErrHoldBudget) {
			t.Fatalf("%v's hold of %d (device %q) = %+v, %v; want refused at the budget until the counts are ended, then held", tk.Buyer, tk.Quantity, tk.Device, res, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s on, %v (device %q) is still refused (%v): an ended hold's budget count was never ended", tk.Buyer, tk.Device, err)
		}
		time.Sleep(10 * time.Millisecond) // poll interval: the sweeper runs every 20 ms
	}
}

// A refused hold's count whose give-back Redis failed is not given back
// once a retry of the request under its key has made its hold on it: the
// retry finds the count made and takes it as its own, so the sweeper's
// end would have let the buyer hold past the budget (helper-66).
func TestOwedBudgetGiveBackSparesARetrysHold(t *testing.T) {
	mem := &quotaFaults{Scripter: shardmem.New()}
	svc, ctx := sweeping(t, mem)
	program := keys.MustID("retried")
	if err := svc.PutProgram(ctx, sale.Program{ID: program, HoldBudget: 2}); err != nil {
		t.Fatal(err)
	}
	sku := stock.SKU{Program: program, Ticket: keys.MustID("t")}
	put := func(total int64) {
		if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: total, Shards: 1, MaxPerOrder: 4, HoldTTL: 10 * time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	put(1)
	hold := sale.Take{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID("h1")}, SKU: sku, Quantity: 2}
	mem.endStuck.Store(":budget:")
	if _, err := svc.Hold(ctx, hold); !errors.Is(err, sale.ErrSoldOut) {
		t.Fatalf("hold of 2 of 1 = %v, want sold out", err)
	}
	put(3)
	if res, err := svc.Hold(ctx, hold); err != nil || res.Hold == nil {
		t.Fatalf("the hold's retry after a restock = %+v, %v; want held", res, err)
	}
	mem.endStuck.Store("")
	deadline := time.Now().Add(30 * time.Second)
	for sale.OwedBudgetCalls(svc) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("30 s on, the sweeper still owes the give-back")
		}
		time.Sleep(10 * time.Millisecond) // poll interval: the sweeper runs every 20 ms
	}
	if res, err := svc.Hold(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID("h2")}, SKU: sku, Quantity: 1}); !errors.Is(err, sale.ErrHoldBudget) {
		t.Fatalf("ann's third unit on hold, her budget 2 = %+v, %v; want hold-budget-reached", res, err)
	}
}

package sale_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// copyCommitsFirst is a ledger whose next commit runs first (before
// failing unwritten) a copy of the same request on another replica, as
// the client's retry there does while this attempt's commit is lost.
type copyCommitsFirst struct {
	sale.Ledger
	copy atomic.Pointer[func()]
}

func (l *copyCommitsFirst) Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult {
	f := l.copy.Swap(nil)
	if f == nil {
		return l.Ledger.Commit(ctx, takes, direct)
	}
	(*f)()
	out := make([]ledger.TakeResult, len(takes))
	for i, tk := range takes {
		out[i] = ledger.TakeResult{Take: tk, Err: fmt.Errorf("%w: test: the link reset before the write", ledger.ErrNotCommitted)}
	}
	return out
}

// A hold answered 503 after counting against its buyer's hold budget,
// while a copy of the same request on another replica committed the hold
// on that count (it found the count made, so it was not its own to keep):
// the count stays with the hold. Ended at once by the failed attempt, the
// hold stood uncounted and the buyer held past the budget (helper-95 B1).
func TestHoldBudgetCountStaysWithACopysHold(t *testing.T) {
	ctx := context.Background()
	mem := shardmem.New()
	led := &copyCommitsFirst{}
	a, _ := sale.TestService(t, mem, nil, func(o *sale.Options) { led.Ledger = o.Ledger; o.Ledger = led })
	b, _ := sale.TestService(t, mem, nil, func(o *sale.Options) { o.Ledger = led.Ledger })
	sku := stock.SKU{Program: keys.MustID("budgetcopy"), Ticket: keys.MustID("t")}
	if _, err := a.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 20, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	if err := a.PutProgram(ctx, sale.Program{ID: sku.Program, HoldBudget: 1}); err != nil {
		t.Fatal(err)
	}
	hold := func(s *sale.Service, key string) error {
		_, err := s.Hold(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID(key)}, SKU: sku, Quantity: 1})
		return err
	}
	var copyErr error
	copyFirst := func() { copyErr = hold(b, "k1") }
	led.copy.Store(&copyFirst)
	if err := hold(a, "k1"); !errors.Is(err, sale.ErrUnavailable) {
		t.Fatalf("the attempt whose commit failed unwritten = %v, want ErrUnavailable", err)
	}
	if copyErr != nil {
		t.Fatalf("the copy on the other replica: %v", copyErr)
	}
	// Whatever the sweeper does with the failed attempt's count, the
	// copy's hold keeps it.
	sctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.RunSweeper(sctx) }() // owned by the test: stopped below
	for sale.OwedBudgetCalls(a) > 0 {
		time.Sleep(10 * time.Millisecond) // polling the sweeper's owed calls
	}
	stop()
	<-done
	if err := hold(b, "k2"); !errors.Is(err, sale.ErrHoldBudget) {
		t.Fatalf("a second hold with a budget of 1 and the copy's hold standing = %v, want ErrHoldBudget", err)
	}
}

// A held cart's lines count against the buyer's hold budget when the
// device budget's master is out: only the device counts are skipped.
// The first line's device count failing left every later line's buyer
// count uncounted (helper-95 N4): a buyer with a budget of 2 held a cart
// of 2 and then a third ticket.
func TestCartHoldCountsItsBuyerWithTheDeviceSlotOut(t *testing.T) {
	ctx := context.Background()
	mem := &quotaFaults{Scripter: shardmem.New()}
	svc, _ := sale.TestService(t, mem, nil)
	program := keys.MustID("budgetdevout")
	for _, tk := range []string{"t1", "t2"} {
		if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: stock.SKU{Program: program, Ticket: keys.MustID(tk)}, Total: 20, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
	}
	if err := svc.PutProgram(ctx, sale.Program{ID: program, HoldBudget: 2, DeviceHoldBudget: 10}); err != nil {
		t.Fatal(err)
	}
	mem.outKeys.Store(":budget:" + program.String() + ":d:")
	ask := func(key string) sale.Ask {
		return sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID(key), Device: "phone-1"}
	}
	if _, err := svc.HoldCart(ctx, sale.CartTake{Ask: ask("cart"), Program: program,
		Lines: []sale.CartLine{{Ticket: keys.MustID("t1"), Quantity: 1}, {Ticket: keys.MustID("t2"), Quantity: 1}}}); err != nil {
		t.Fatal(err)
	}
	_, err := svc.Hold(ctx, sale.Take{Ask: ask("third"), SKU: stock.SKU{Program: program, Ticket: keys.MustID("t1")}, Quantity: 1})
	if !errors.Is(err, sale.ErrHoldBudget) {
		t.Fatalf("a third hold after a held cart of 2, with a buyer budget of 2 = %v, want ErrHoldBudget", err)
	}
}

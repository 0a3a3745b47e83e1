package sale_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// heldCommits is a ledger whose commits of one request key wait until
// release is closed: a slow ledger (a stalled synchronous standby) under
// the first attempt of that request.
type heldCommits struct {
	sale.Ledger
	key     keys.ID
	entered chan struct{} // closed when the first commit of key waits
	release chan struct{}
	once    sync.Once
}

func (h *heldCommits) Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult {
	if slices.ContainsFunc(takes, func(tk ledger.Take) bool { return tk.Req.Key == h.key }) {
		h.once.Do(func() { close(h.entered) })
		<-h.release
	}
	return h.Ledger.Commit(ctx, takes, direct)
}

// A retry of a purchase whose first attempt holds the last unit at the
// gate and is still committing is not told sold out by a replica that
// remembers the SKU as sold out: that 409 says nothing was sold, and the
// first attempt's order then stood (helper-74 #1). The flag is this
// replica's memory; while the ledger still has the unit free, the retry
// goes on to the gate, whose record of the first attempt's deduction
// makes it that request's copy.
func TestRetryOfACommittingTakeIsNotToldSoldOut(t *testing.T) {
	ctx := context.Background()
	held := &heldCommits{key: keys.MustID("k1"), entered: make(chan struct{}), release: make(chan struct{})}
	a, b := sale.TwoReplicas(t, shardmem.New(), func(o *sale.Options) {
		if held.Ledger == nil { // a's; b is then given a's, held
			held.Ledger = o.Ledger
			o.Ledger = held
		}
	})
	sku := stock.SKU{Program: keys.MustID("last"), Ticket: keys.MustID("t")}
	if _, err := a.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 1, Shards: 1, MaxPerOrder: 1}); err != nil {
		t.Fatal(err)
	}
	first := sale.Take{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID("k1")}, SKU: sku, Quantity: 1}
	type reply struct {
		res sale.Result
		err error
	}
	onA := make(chan reply, 1)
	go func() {
		res, err := a.Purchase(ctx, first)
		onA <- reply{res, err}
	}()
	<-held.entered // a holds the last unit and commits
	if _, err := b.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID("bob"), Key: keys.MustID("k2")}, SKU: sku, Quantity: 1}); !errors.Is(err, sale.ErrSoldOut) {
		t.Fatalf("another buyer on b: %v, want sold out", err)
	}
	onB := make(chan reply, 1)
	go func() {
		res, err := b.Purchase(ctx, first) // ann's client gave up on a
		onB <- reply{res, err}
	}()
	// The retry either answered already (the bug: sold out, at once) or
	// waits on a's attempt; a's commit goes on now either way.
	close(held.release)
	ra, rb := <-onA, <-onB
	if ra.err != nil || ra.res.Order == nil {
		t.Fatalf("a's attempt = %+v, %v", ra.res, ra.err)
	}
	if rb.err != nil || rb.res.Order == nil || rb.res.Order.ID != ra.res.Order.ID {
		t.Fatalf("the retry on b = %+v, %v; want order %v (a's attempt committed it)", rb.res, rb.err, ra.res.Order.ID)
	}
}

// A retry refused at the bound of takes in flight moved nothing, but its
// first attempt may still commit (here on the same replica, waiting on a
// slow ledger): the refusal is ErrBusyShared, whose outcome is unknown,
// never ErrBusy's "unchanged" (helper-74 #2).
func TestTakeShedInFlightSaysItsOutcomeIsUnknown(t *testing.T) {
	ctx := context.Background()
	held := &heldCommits{key: keys.MustID("k1"), entered: make(chan struct{}), release: make(chan struct{})}
	svc, _ := sale.TestService(t, shardmem.New(), nil, func(o *sale.Options) {
		held.Ledger, o.Ledger = o.Ledger, held
		o.TakesInFlight = 1
	})
	sku := stock.SKU{Program: keys.MustID("shed"), Ticket: keys.MustID("t")}
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 5, Shards: 1, MaxPerOrder: 1}); err != nil {
		t.Fatal(err)
	}
	first := sale.Take{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID("k1")}, SKU: sku, Quantity: 1}
	done := make(chan error, 1)
	go func() {
		_, err := svc.Purchase(ctx, first)
		done <- err
	}()
	<-held.entered
	_, err := svc.Purchase(ctx, first)
	close(held.release)
	if !errors.Is(err, sale.ErrBusyShared) {
		t.Errorf("the retry at the bound: %v, want %v (outcome unknown)", err, sale.ErrBusyShared)
	}
	if err := <-done; err != nil {
		t.Fatalf("the first attempt: %v", err)
	}
}

package sale_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// gateAtWithdraw is a ledger that notes what the gate holds when a
// withdrawal reaches it.
type gateAtWithdraw struct {
	sale.Ledger
	gate *shard.Store
	sku  stock.SKU
	left int64
}

func (l *gateAtWithdraw) Withdraw(ctx context.Context, id, seller keys.ID, expect, epoch int64, r ledger.Request) (ledger.Listing, []ledger.Event, error) {
	l.left, _, _ = l.gate.Remaining(ctx, l.sku, 1)
	return l.Ledger.Withdraw(ctx, id, seller, expect, epoch, r)
}

// A withdrawal under a key another request of the seller's used is
// refused (422) by the ledger from its record; it takes nothing out of
// the gate on its way there. It took the listing's units out until the
// refusal, buyers told sold out meanwhile (helper-90 #2).
func TestWithdrawWithAReusedKeyTakesNothingFromTheGate(t *testing.T) {
	led := &gateAtWithdraw{}
	svc, gate := sale.TestService(t, shardmem.New(), nil, func(o *sale.Options) { led.Ledger = o.Ledger; o.Ledger = led })
	led.gate = gate
	ctx := context.Background()
	sku := stock.SKU{Program: keys.MustID("wdreused"), Ticket: keys.MustID("t")}
	led.sku = sku
	ann := keys.MustID("ann")
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	o, err := svc.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: ann, Key: keys.MustID("buy")}, SKU: sku, Quantity: 3})
	if err != nil {
		t.Fatal(err)
	}
	x, err := svc.ListForResale(ctx, o.Order.ID, sale.Ask{Buyer: ann, Key: keys.MustID("list")}, 2)
	if err != nil {
		t.Fatal(err)
	}
	before, _, err := gate.Remaining(ctx, sku, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = svc.WithdrawListing(ctx, x.Listing.ID, sale.Ask{Buyer: ann, Key: keys.MustID("buy")})
	if !errors.Is(err, sale.ErrKeyReused) {
		t.Fatalf("a withdrawal under the purchase's key = %v, want ErrKeyReused", err)
	}
	if led.left != before {
		t.Errorf("the gate held %d as the ledger was asked, %d before: the withdrawal took units out for a reused key", led.left, before)
	}
	if after, _, _ := gate.Remaining(ctx, sku, 1); after != before {
		t.Errorf("the gate holds %d after the refusal, %d before", after, before)
	}
	if _, err := svc.WithdrawListing(ctx, x.Listing.ID, sale.Ask{Buyer: ann, Key: keys.MustID("withdraw")}); err != nil {
		t.Fatalf("a withdrawal under a key of its own: %v", err)
	}
}

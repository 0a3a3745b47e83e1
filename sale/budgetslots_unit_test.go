package sale_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

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

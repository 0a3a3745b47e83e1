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

// An end of a sale whose gate cannot be closed (its masters out of reach)
// changes nothing, and its 503 says so (ErrGateNotClosed: outcome
// unchanged); it said "could not end the sale" with the outcome unknown,
// though the ledger was never asked (helper-67).
func TestEndSaleWithItsGateOutChangesNothing(t *testing.T) {
	mem := &quotaFaults{Scripter: shardmem.New()}
	svc, _ := unitServiceOn(t, mem)
	ctx := context.Background()
	sku := stock.SKU{Program: keys.MustID("ending"), Ticket: keys.MustID("t")}
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 5, Shards: 1, MaxPerOrder: 2}); err != nil {
		t.Fatal(err)
	}
	mem.down.Store(true)
	if _, err := svc.EndSale(ctx, sku); !errors.Is(err, sale.ErrGateNotClosed) {
		t.Fatalf("end sale with the gate out = %v, want ErrGateNotClosed (nothing changed)", err)
	}
	if st, err := svc.SKU(ctx, sku); err != nil || st.Ended {
		t.Fatalf("after the refused end: %+v, %v; want the sale still on", st, err)
	}
}

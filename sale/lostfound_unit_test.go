package sale_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// landsLost is a ledger whose commits of one request key land and then
// lose their reply: the caller is told the COMMIT failed.
type landsLost struct {
	sale.Ledger
	key keys.ID
}

func (l *landsLost) Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult {
	out := l.Ledger.Commit(ctx, takes, direct)
	for i, tk := range takes {
		if tk.Req.Key == l.key && out[i].Err == nil {
			out[i] = ledger.TakeResult{Take: tk, Err: errors.New("ledger: take: commit: EOF")}
		}
	}
	return out
}

// A sale whose COMMIT reply was lost and whose row is then found is a
// sale like one answered: every replica's stock view hears of it at the
// next change notice. Answered from its row, it told no one, and other
// replicas served their stale views until they expired (helper-111 #3).
func TestASaleFoundAfterALostReplyIsTold(t *testing.T) {
	ctx := context.Background()
	lost := &landsLost{key: keys.MustID("k1")}
	a, _ := sale.TwoReplicas(t, shardmem.New(), func(o *sale.Options) {
		if lost.Ledger == nil {
			lost.Ledger = o.Ledger
			o.Ledger = lost
		}
	})
	sku := stock.SKU{Program: keys.MustID("found"), Ticket: keys.MustID("t")}
	if _, err := a.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 5, Shards: 1, MaxPerOrder: 2}); err != nil {
		t.Fatal(err)
	}
	sale.Changed(a) // the put's
	res, err := a.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID("k1")}, SKU: sku, Quantity: 1})
	if err != nil || res.Order == nil {
		t.Fatalf("a purchase whose reply was lost, its row found = %+v, %v; want its order", res, err)
	}
	if got := sale.Changed(a); !slices.Contains(got, sku) {
		t.Errorf("changes to tell after the sale = %v, want %v", got, sku)
	}
}

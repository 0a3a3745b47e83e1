package sale_test

import (
	"context"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/wait"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// A hold's retry, replayed after its expiry time, answers as first told:
// held, with the same expiry. It said "expired" with no order though the
// hold had been confirmed (helper-69 #4): a platform reading that refunds
// a payment whose order stands.
func TestHoldReplayAnswersAsFirstTold(t *testing.T) {
	svc, _ := unitServiceOn(t, shardmem.New())
	ctx := context.Background()
	sku := stock.SKU{Program: keys.MustID("replays"), Ticket: keys.MustID("t")}
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 5, Shards: 1, MaxPerOrder: 2}); err != nil {
		t.Fatal(err)
	}
	take := sale.Take{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID("h1")}, SKU: sku, Quantity: 1, TTL: time.Second}
	first, err := svc.Hold(ctx, take)
	if err != nil || first.Hold == nil || first.Hold.State != ledger.Held {
		t.Fatalf("hold = %+v, %v", first, err)
	}
	if _, err := svc.Confirm(ctx, first.Hold.ID, sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID("c1")}); err != nil {
		t.Fatalf("confirm: %v", err)
	}
	if !wait.Until(10*time.Second, func() bool { return time.Now().After(first.Hold.ExpiresAt) }) {
		t.Fatal("the hold's expiry time never came")
	}
	again, err := svc.Hold(ctx, take)
	if err != nil || again.Hold == nil || !again.Replayed {
		t.Fatalf("retry = %+v, %v; want the replay", again, err)
	}
	if again.Hold.State != ledger.Held || !again.Hold.ExpiresAt.Equal(first.Hold.ExpiresAt) {
		t.Errorf("replay = %s expiring %v; want %s expiring %v, as first told", again.Hold.State, again.Hold.ExpiresAt, ledger.Held, first.Hold.ExpiresAt)
	}
}

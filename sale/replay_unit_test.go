package sale_test

import (
	"context"
	"errors"
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

// A confirm under the key of another request the buyer made about the
// time the hold expired (a purchase of another ticket) is a reuse of that
// key, 422, once the hold was paid late under a key of its own: it was
// answered 201 with the late order, as if the purchase's key had paid it
// (helper-75 #1). The window exists for a late payment whose own key
// another request took while it sold; this payment's key is recorded.
func TestConfirmUnderAPurchasesKeyAfterALatePayment(t *testing.T) {
	svc, _ := sale.TestService(t, shardmem.New(), nil, func(o *sale.Options) { o.LatePayment = time.Minute })
	ctx := context.Background()
	program := keys.MustID("late-keys")
	show := stock.SKU{Program: program, Ticket: keys.MustID("show")}
	other := stock.SKU{Program: program, Ticket: keys.MustID("other")}
	for _, sku := range []stock.SKU{show, other} {
		if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 5, Shards: 1, MaxPerOrder: 2}); err != nil {
			t.Fatal(err)
		}
	}
	ann := keys.MustID("ann")
	h, err := svc.Hold(ctx, sale.Take{Ask: sale.Ask{Buyer: ann, Key: keys.MustID("h1")}, SKU: show, Quantity: 1, TTL: ledger.MinHoldTTL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: ann, Key: keys.MustID("k2")}, SKU: other, Quantity: 1}); err != nil {
		t.Fatal(err)
	}
	if !wait.Until(10*time.Second, func() bool { return time.Now().After(h.Hold.ExpiresAt) }) {
		t.Fatal("the hold's expiry time never came")
	}
	late, err := svc.Confirm(ctx, h.Hold.ID, sale.Ask{Buyer: ann, Key: keys.MustID("k1")})
	if err != nil || late.Order == nil {
		t.Fatalf("the late payment = %+v, %v", late, err)
	}
	if res, err := svc.Confirm(ctx, h.Hold.ID, sale.Ask{Buyer: ann, Key: keys.MustID("k2")}); !errors.Is(err, sale.ErrKeyReused) {
		t.Errorf("a confirm under the purchase's key = %+v, %v; want %v", res, err, sale.ErrKeyReused)
	}
	if again, err := svc.Confirm(ctx, h.Hold.ID, sale.Ask{Buyer: ann, Key: keys.MustID("k1")}); err != nil || again.Order == nil || again.Order.ID != late.Order.ID || !again.Replayed {
		t.Errorf("the late payment's retry = %+v, %v; want order %v replayed", again, err, late.Order.ID)
	}
}

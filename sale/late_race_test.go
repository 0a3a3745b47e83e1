package sale

import (
	"context"
	"testing"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// A confirm that read its hold held past its expiry, while another
// confirm (begun before the expiry) committed, is answered the other's
// order as a confirm of a confirmed hold, on its first answer: not a
// replay. The late-payment path recorded its key a second time and then
// read its own record as another copy's (Idempotent-Replayed: true on
// the first and only answer, helper-64). The race is driven here by
// handing lateConfirm the hold as the losing confirm read it.
func TestConfirmAfterTheRaceAtExpiryIsNoReplay(t *testing.T) {
	ctx := context.Background()
	s, _ := testService(t, shardmem.New(), nil)
	sku := stock.SKU{Program: keys.MustID("late"), Ticket: keys.MustID("t")}
	if _, err := s.PutSKU(ctx, SKUConfig{SKU: sku, Total: 2, Shards: 1, MaxPerOrder: 2}); err != nil {
		t.Fatal(err)
	}
	hal := keys.MustID("hal")
	res, err := s.Hold(ctx, Take{Ask: Ask{Buyer: hal, Key: keys.MustID("h1")}, SKU: sku, Quantity: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Hold.ID
	seen, err := s.ledger.HoldByID(ctx, id) // held: as the losing confirm read it
	if err != nil {
		t.Fatal(err)
	}
	won, err := s.Confirm(ctx, id, Ask{Buyer: hal, Key: keys.MustID("c1")})
	if err != nil {
		t.Fatal(err)
	}
	r := newRequest(hal, keys.MustID("c2"), ledger.OpConfirm, id.String())
	a := s.lateConfirm(ctx, seen, 0, r)
	if a.err != nil || a.order.ID != won.Order.ID || a.replayed {
		t.Fatalf("the losing confirm = order %v, replayed %v, err %v; want order %v, no replay", a.order.ID, a.replayed, a.err, won.Order.ID)
	}
	again, err := s.Confirm(ctx, id, Ask{Buyer: hal, Key: keys.MustID("c2")})
	if err != nil || again.Order.ID != won.Order.ID || !again.Replayed {
		t.Fatalf("its retry = %+v, %v; want order %v, replayed", again, err, won.Order.ID)
	}
}

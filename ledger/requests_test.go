package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

func req(scope, key, fp, op string) ledger.Request {
	return ledger.Request{Scope: keys.MustID(scope), Key: keys.MustID(key), Fingerprint: fp, Op: op}
}

// A request is its key within its scope, bound to its fingerprint: the
// same request replays its answer, another request with the key gets
// ErrKeyReused, and neither moves anything.
func TestRequestReplayAndReuse(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		o, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("g1"), SKU: sku, Buyer: keys.MustID("ann"), Quantity: 2, Req: req("ann", "k", "fp1", ledger.OpPurchase)})
		if err != nil {
			t.Fatal(err)
		}
		again, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("g2"), SKU: sku, Buyer: keys.MustID("ann"), Quantity: 2, Req: req("ann", "k", "fp1", ledger.OpPurchase)})
		if !errors.Is(err, ledger.ErrDuplicate) || again.ID != o.ID || again.Quantity != 2 {
			t.Errorf("same request again = %+v, %v; want ErrDuplicate with order %s", again, err, o.ID)
		}
		if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("g3"), SKU: sku, Buyer: keys.MustID("ann"), Quantity: 1, Req: req("ann", "k", "fp2", ledger.OpPurchase)}); !errors.Is(err, ledger.ErrKeyReused) {
			t.Errorf("the key with another fingerprint = %v, want ErrKeyReused", err)
		}
		if _, err := l.Hold(ctx, ledger.Hold{IdempotencyKey: keys.MustID("g4"), SKU: sku, Buyer: keys.MustID("ann"), Quantity: 1, ExpiresAt: time.Now().Add(time.Hour),
			Req: req("ann", "k", "fp1", ledger.OpHold)}, -1); !errors.Is(err, ledger.ErrKeyReused) {
			t.Errorf("the key for a hold = %v, want ErrKeyReused", err)
		}
		// Another scope (buyer) has its own keys.
		if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("g5"), SKU: sku, Buyer: keys.MustID("bob"), Quantity: 1, Req: req("bob", "k", "fp2", ledger.OpPurchase)}); err != nil {
			t.Errorf("another buyer's key k = %v", err)
		}
		expectSKU(t, l, 3, 0)
		rec, err := l.RequestByKey(ctx, keys.MustID("ann"), keys.MustID("k"))
		if err != nil || rec.Order == nil || rec.Order.ID != o.ID || rec.Fingerprint != "fp1" {
			t.Errorf("RequestByKey = %+v, %v", rec, err)
		}
		if _, err := l.RequestByKey(ctx, keys.MustID("cat"), keys.MustID("k")); !errors.Is(err, ledger.ErrNotFound) {
			t.Errorf("RequestByKey of an unknown key = %v, want ErrNotFound", err)
		}
		// RequestSettled: the committed key is settled, an unknown one is
		// not, and its probe leaves no row behind (asked twice, and the
		// key then commits as new).
		if err := l.RequestSettled(ctx, keys.MustID("ann"), keys.MustID("k")); err != nil {
			t.Errorf("RequestSettled of a committed key = %v, want nil", err)
		}
		for range 2 {
			if err := l.RequestSettled(ctx, keys.MustID("cat"), keys.MustID("k")); !errors.Is(err, ledger.ErrNotFound) {
				t.Errorf("RequestSettled of an unknown key = %v, want ErrNotFound", err)
			}
		}
		if _, err := l.RequestByKey(ctx, keys.MustID("cat"), keys.MustID("k")); !errors.Is(err, ledger.ErrNotFound) {
			t.Errorf("after the probes, RequestByKey = %v, want ErrNotFound", err)
		}
		if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("g6"), SKU: sku, Buyer: keys.MustID("cat"), Quantity: 1, Req: req("cat", "k", "fp3", ledger.OpPurchase)}); err != nil {
			t.Errorf("cat's key k after the probes = %v", err)
		}
	})
}

// A take admitted under a gate epoch commits only while the ledger is at
// that epoch: AdvanceGate (a rebuild) closes it, and the facts it returns
// are final.
func TestStaleGateRefused(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		st, err := l.AdvanceGate(ctx, sku)
		if err != nil || st.GateEpoch != 1 {
			t.Fatalf("AdvanceGate = %+v, %v; want epoch 1", st, err)
		}
		if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("g1"), SKU: sku, Buyer: keys.MustID("ann"), Quantity: 1, GateEpoch: 1,
			Req: req("ann", "k1", "f", ledger.OpPurchase)}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.AdvanceGate(ctx, sku); err != nil {
			t.Fatal(err)
		}
		_, err = l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("g2"), SKU: sku, Buyer: keys.MustID("ann"), Quantity: 1, GateEpoch: 1,
			Req: req("ann", "k2", "f", ledger.OpPurchase)})
		if !errors.Is(err, ledger.ErrStaleGate) {
			t.Errorf("a take admitted under epoch 1 after the rebuild = %v, want ErrStaleGate", err)
		}
		res := l.Commit(ctx, []ledger.Take{
			ledger.PurchaseTake(ledger.Order{IdempotencyKey: keys.MustID("g3"), SKU: sku, Buyer: keys.MustID("ann"), Quantity: 1, GateEpoch: 1, Req: req("ann", "k3", "f", ledger.OpPurchase)}),
			ledger.PurchaseTake(ledger.Order{IdempotencyKey: keys.MustID("g4"), SKU: sku, Buyer: keys.MustID("bob"), Quantity: 1, GateEpoch: 2, Req: req("bob", "k4", "f", ledger.OpPurchase)}),
		}, false)
		// Only the stale epoch's take is refused; the current epoch's
		// commits in the batch.
		if !errors.Is(res[0].Err, ledger.ErrStaleGate) || res[1].Err != nil {
			t.Errorf("batch across epochs = %+v; want the stale one refused for its epoch, the other committed", res)
		}
		if o, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("g4"), SKU: sku, Buyer: keys.MustID("bob"), Quantity: 1, GateEpoch: 2,
			Req: req("bob", "k4", "f", ledger.OpPurchase)}); !errors.Is(err, ledger.ErrDuplicate) || o.ID != res[1].Order().ID {
			t.Errorf("the current epoch's take again = %+v, %v; want ErrDuplicate with %s", o, err, res[1].Order().ID)
		}
		expectSKU(t, l, 2, 0)
		if _, err := l.AdvanceGate(ctx, stock.SKU{Program: keys.MustID("no"), Ticket: keys.MustID("such")}); !errors.Is(err, stock.ErrUnknownSKU) {
			t.Errorf("AdvanceGate of an unknown SKU = %v", err)
		}
	})
}

// What a return owes Redis is decided by ledger facts: units taken through
// the gate are owed to the gate of the return's epoch; units taken around
// the gate in the same epoch are owed nothing; an ended sale is owed
// nothing.
func TestReturnOwedByEpoch(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 10, Shards: 2, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.AdvanceGate(ctx, sku); err != nil { // epoch 1
			t.Fatal(err)
		}
		hold := func(key string, direct bool) ledger.Hold {
			t.Helper()
			st, _ := l.SKU(ctx, sku)
			h := ledger.Hold{IdempotencyKey: keys.MustID(key), SKU: sku, Buyer: keys.MustID("ann"), Quantity: 2, ExpiresAt: time.Now().Add(time.Hour), Gate: "[]",
				GateEpoch: st.GateEpoch}
			version := int64(-1)
			if direct {
				h.Gate, version = "", st.Version
			}
			got, err := l.Hold(ctx, h, version)
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		gated, direct, directLater := hold("a", false), hold("b", true), hold("c", true)
		if _, _, err := l.Cancel(ctx, gated.ID, keys.MustID("ann"), ledger.Request{}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := l.Cancel(ctx, direct.ID, keys.MustID("ann"), ledger.Request{}); err != nil {
			t.Fatal(err)
		}
		r, ok, err := l.RestoreOwed(ctx, "hold", gated.ID)
		if err != nil || !ok || r.Epoch != 1 || r.Quantity != 2 || r.Shards != 2 {
			t.Errorf("gate-taken hold returned at epoch 1: owed %+v %v %v; want 2 units to epoch 1's 2 shards", r, ok, err)
		}
		if r, ok, _ := l.RestoreOwed(ctx, "hold", direct.ID); !ok || !r.CountsOnly {
			// Its counts are owed: an attempt the gate admitted may have
			// made them (TestReturnAroundTheGateOwesCounts).
			t.Errorf("a hold taken around the gate and returned in the same epoch: owed %+v %v; want its counts only, not units it never took", r, ok)
		}
		if _, err := l.AdvanceGate(ctx, sku); err != nil { // epoch 2: counts directLater as held
			t.Fatal(err)
		}
		if _, _, err := l.Cancel(ctx, directLater.ID, keys.MustID("ann"), ledger.Request{}); err != nil {
			t.Fatal(err)
		}
		if r, ok, _ := l.RestoreOwed(ctx, "hold", directLater.ID); !ok || r.Epoch != 2 {
			t.Errorf("a hold taken around epoch 1's gate, returned at epoch 2: owed %+v %v, want owed to epoch 2", r, ok)
		}
		ended := hold("d", false)
		if _, err := l.EndSale(ctx, sku); err != nil {
			t.Fatal(err)
		}
		if _, _, err := l.Cancel(ctx, ended.ID, keys.MustID("ann"), ledger.Request{}); err != nil {
			t.Fatal(err)
		}
		if r, ok, _ := l.RestoreOwed(ctx, "hold", ended.ID); !ok || !r.CountsOnly {
			t.Errorf("a return to an ended sale: owed %+v %v; want the gate's counts only, no units", r, ok)
		}
	})
}

// CommittedSince lists the stock-taking requests after a version, with
// the row in the same snapshot; sealed once nothing is left.
func TestCommittedSince(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 3, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		c, err := l.CommittedSince(ctx, sku, 0)
		if err != nil || len(c.Keys) != 0 || c.Sealed() {
			t.Fatalf("CommittedSince before any sale = %+v, %v", c, err)
		}
		if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("g1"), SKU: sku, Buyer: keys.MustID("ann"), Quantity: 2, Req: req("ann", "k1", "f", ledger.OpPurchase)}); err != nil {
			t.Fatal(err)
		}
		c1, err := l.CommittedSince(ctx, sku, c.Version)
		if err != nil || len(c1.Keys) != 1 || c1.Keys[0] != (ledger.ScopedKey{Scope: keys.MustID("ann"), Key: keys.MustID("k1")}) || c1.Sealed() {
			t.Fatalf("after one sale = %+v, %v", c1, err)
		}
		if _, err := l.Hold(ctx, ledger.Hold{IdempotencyKey: keys.MustID("g2"), SKU: sku, Buyer: keys.MustID("bob"), Quantity: 1, ExpiresAt: time.Now().Add(time.Hour),
			Req: req("bob", "k2", "f", ledger.OpHold)}, -1); err != nil {
			t.Fatal(err)
		}
		c2, err := l.CommittedSince(ctx, sku, c1.Version)
		if err != nil || len(c2.Keys) != 1 || c2.Keys[0].Key != keys.MustID("k2") || !c2.Sealed() {
			t.Errorf("after the hold that sold it out = %+v, %v; want k2 only, sealed", c2, err)
		}
		if _, err := l.CommittedSince(ctx, stock.SKU{Program: keys.MustID("no"), Ticket: keys.MustID("such")}, 0); !errors.Is(err, stock.ErrUnknownSKU) {
			t.Errorf("CommittedSince of an unknown SKU = %v", err)
		}
	})
}

// A transfer or a listing of an order that is no longer the sender's,
// under a key of the sender's that names another request, is ErrNotOwner
// (403), as a confirm of another's hold is, not ErrKeyReused (helper-75
// #2); the former owner's retry of its own transfer still replays.
func TestNotOwnerBeforeAReusedKey(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		ann, bob, cat := keys.MustID("ann"), keys.MustID("bob"), keys.MustID("cat")
		o, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("g1"), SKU: sku, Buyer: ann, Quantity: 2, Req: req("ann", "p1", "buy", ledger.OpPurchase)})
		if err != nil {
			t.Fatal(err)
		}
		moved, err := l.Transfer(ctx, o.ID, ann, bob, 0, req("ann", "t1", "to-bob", ledger.OpTransfer))
		if err != nil {
			t.Fatal(err)
		}
		if again, err := l.Transfer(ctx, o.ID, ann, bob, 0, req("ann", "t1", "to-bob", ledger.OpTransfer)); !errors.Is(err, ledger.ErrDuplicate) || again.ID != moved.ID {
			t.Errorf("the same transfer again = %+v, %v; want its replay", again, err)
		}
		if _, err := l.Transfer(ctx, o.ID, ann, cat, 0, req("ann", "t1", "to-cat", ledger.OpTransfer)); !errors.Is(err, ledger.ErrNotOwner) {
			t.Errorf("ann's transfer of bob's order under her used key = %v, want ErrNotOwner", err)
		}
		if _, err := l.List(ctx, o.ID, ann, 1, req("ann", "p1", "list-1", ledger.OpResale)); !errors.Is(err, ledger.ErrNotOwner) {
			t.Errorf("ann's listing of bob's order under her purchase's key = %v, want ErrNotOwner", err)
		}
		// The owner reusing a key is told so.
		if _, err := l.List(ctx, o.ID, bob, 1, req("bob", "l1", "list-1", ledger.OpResale)); err != nil {
			t.Fatal(err)
		}
		if _, err := l.List(ctx, o.ID, bob, 1, req("bob", "l1", "list-2", ledger.OpResale)); !errors.Is(err, ledger.ErrKeyReused) {
			t.Errorf("bob's listing under his used key = %v, want ErrKeyReused", err)
		}
		if st, err := l.SKU(ctx, sku); err != nil || st.Listed != 1 {
			t.Errorf("after the refusals: %+v, %v; want bob's one listed", st, err)
		}
	})
}

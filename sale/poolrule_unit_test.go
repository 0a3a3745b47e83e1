package sale_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// A pool made code-only on replica b is not sold without a code on
// replica a, whose settings still show it open: a's take reaches the
// pool's rebuilt gate, whose epoch is not the one its settings admitted
// it under, and takes again under the settings as they are. It sold,
// because the ledger checks no access rule (helper-70 #1; in a running
// fleet, the takes waiting at the fence while b changed the pool).
func TestPoolRuleChangedOnAnotherReplica(t *testing.T) {
	a, b := sale.TwoReplicas(t, shardmem.New(), func(o *sale.Options) { o.SettingsTTL = 10 * time.Minute })
	ctx := context.Background()
	sku := stock.SKU{Program: keys.MustID("rules"), Ticket: keys.MustID("t")}
	fans := keys.MustID("fans")
	if _, err := a.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 50, Shards: 1, MaxPerOrder: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PutPool(ctx, sale.PoolSpec{SKU: sku, Pool: fans, Allotment: 10, Access: sale.AccessOpen}); err != nil {
		t.Fatal(err)
	}
	buy := func(s *sale.Service, key, buyer string) error {
		_, err := s.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID(buyer), Key: keys.MustID(key)},
			SKU: sku, Quantity: 1, Access: sale.Access{Pool: fans}})
		return err
	}
	if err := buy(a, "k1", "ann"); err != nil { // a reads the pool: open
		t.Fatalf("purchase in the open pool: %v", err)
	}
	if _, err := b.PutPool(ctx, sale.PoolSpec{SKU: sku, Pool: fans, Allotment: 10, Access: sale.AccessCode}); err != nil {
		t.Fatal(err)
	}
	err := buy(a, "k2", "bob")
	if err == nil {
		t.Fatal("a sold in a code-only pool without a code")
	}
	if !errors.Is(err, sale.ErrCodeInvalid) && !errors.Is(err, sale.ErrPoolDenied) {
		t.Errorf("purchase without a code after the change = %v, want a code refusal", err)
	}
}

// A pool made code-only on one replica while another sells the pool
// around its gate (Redis out of its reach: the gate's fence and the
// change's notice both need Redis) refuses buyers with no code there
// too, whether or not it sold around the gate before the change (then
// the row is read afresh, else its cached settings are used): the take
// checked the pool's rule as its cached settings had it, and the ledger
// checks no rule (helper-77 #1).
func TestPoolRuleChangedWhileAReplicaSellsAroundTheGate(t *testing.T) {
	for _, soldAround := range []bool{false, true} {
		t.Run(fmt.Sprintf("sold-around-before-%v", soldAround), func(t *testing.T) {
			ctx := context.Background()
			a, b, cut, sku, fans := poolBesideACutReplica(t, "aroundrule", sale.AccessOpen)
			buy := func(key, buyer string) error {
				_, err := a.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID(buyer), Key: keys.MustID(key)},
					SKU: sku, Quantity: 1, Access: sale.Access{Pool: fans}})
				return err
			}
			if err := buy("k1", "ann"); err != nil { // a reads the pool: open
				t.Fatalf("purchase in the open pool: %v", err)
			}
			cut.down.Store(true)
			if soldAround {
				if err := buy("k2", "cat"); err != nil {
					t.Fatalf("purchase in the open pool around the gate: %v", err)
				}
			}
			if _, err := b.PutPool(ctx, sale.PoolSpec{SKU: sku, Pool: fans, Allotment: 10, Access: sale.AccessCode}); err != nil {
				t.Fatal(err)
			}
			err := buy("k3", "bob")
			if err == nil {
				t.Fatal("a sold in a code-only pool without a code, around its gate")
			}
			if !errors.Is(err, sale.ErrCodeInvalid) && !errors.Is(err, sale.ErrPoolDenied) {
				t.Errorf("purchase without a code after the change = %v, want a code refusal", err)
			}
		})
	}
}

// A pool opened to all on one replica while another sells it around its
// gate with the code-only rule cached: a buyer's used-up code is not
// spent again, nor refused, on a pool that no longer asks for one
// (helper-78).
func TestPoolOpenedWhileAReplicaSellsAroundTheGate(t *testing.T) {
	ctx := context.Background()
	a, b, cut, sku, fans := poolBesideACutReplica(t, "opened", sale.AccessCode)
	if _, _, err := a.PutCodes(ctx, sku, fans, []sale.CodeSpec{{Code: "FANCODE1", MaxUses: 1}}, 0, 0); err != nil {
		t.Fatal(err)
	}
	buy := func(key, buyer string) error {
		_, err := a.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID(buyer), Key: keys.MustID(key)},
			SKU: sku, Quantity: 1, Access: sale.Access{Pool: fans, Code: "FANCODE1"}})
		return err
	}
	if err := buy("k1", "ann"); err != nil { // the code's one use; a caches the code-only rule
		t.Fatalf("purchase with the code: %v", err)
	}
	cut.down.Store(true)
	if _, err := b.PutPool(ctx, sale.PoolSpec{SKU: sku, Pool: fans, Allotment: 10, Access: sale.AccessOpen}); err != nil {
		t.Fatal(err)
	}
	if err := buy("k2", "bob"); err != nil {
		t.Errorf("purchase in the pool opened to all, around the gate, carrying a used code = %v, want it sold", err)
	}
}

// poolBesideACutReplica is two replicas on one ledger and one in-memory
// Redis, a seeing Redis through cut (set cut.down: a sells around its
// gate, b does not), and a ticket of program with a pool "fans" of 10
// under access.
func poolBesideACutReplica(t *testing.T, program, access string) (a, b *sale.Service, cut *quotaFaults, sku stock.SKU, fans keys.ID) {
	t.Helper()
	ctx := context.Background()
	mem := shardmem.New()
	cut = &quotaFaults{Scripter: mem}
	var led sale.Ledger
	a, _ = sale.TestService(t, cut, nil, func(o *sale.Options) { led = o.Ledger })
	b, _ = sale.TestService(t, mem, nil, func(o *sale.Options) { o.Ledger = led })
	sku, fans = stock.SKU{Program: keys.MustID(program), Ticket: keys.MustID("t")}, keys.MustID("fans")
	if _, err := a.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 50, Shards: 1, MaxPerOrder: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PutPool(ctx, sale.PoolSpec{SKU: sku, Pool: fans, Allotment: 10, Access: access}); err != nil {
		t.Fatal(err)
	}
	return a, b, cut, sku, fans
}

// A pool of a ticket whose sale has ended keeps its leftover at its
// close: it sells nowhere, and moved it was a pool.moved after the
// sale.ended and a rebuild of an ended gate (helper-90 #3).
func TestPoolClosingAfterTheSaleEndedMovesNothing(t *testing.T) {
	var led sale.Ledger
	svc, _ := sale.TestService(t, shardmem.New(), nil, func(o *sale.Options) { led = o.Ledger })
	ctx := context.Background()
	sku := stock.SKU{Program: keys.MustID("poolended"), Ticket: keys.MustID("t")}
	fans := keys.MustID("fans")
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 20, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.PutPool(ctx, sale.PoolSpec{SKU: sku, Pool: fans, Allotment: 5}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.EndSale(ctx, sku); err != nil {
		t.Fatal(err)
	}
	p, err := svc.ClosePool(ctx, sku, fans)
	if err != nil {
		t.Fatal(err)
	}
	if p.ClosedAt.IsZero() || p.Total != 5 || p.Remain != 5 {
		t.Errorf("the ended ticket's pool after its close = %+v; want it closed, keeping its 5", p)
	}
	pools, err := svc.Pools(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	if pools[0].Total != 15 {
		t.Errorf("the ended public stock's total = %d after the pool's close, want 15 (nothing moved)", pools[0].Total)
	}
	evs, err := svc.Events(ctx, sku.Program, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Type == "pool.moved" {
			t.Errorf("a pool.moved after the sale ended: %+v", e)
		}
	}
	// Closed, keeping its 5, it is not due again: it was closed again at
	// every sweep, and a hundred such filled the sweeper's list
	// (helper-93 #1).
	due, err := led.PoolsDue(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range due {
		if d == sale.PoolSKU(sku, fans) {
			t.Errorf("the ended ticket's closed pool is due again: %v", due)
		}
	}
}

// A code added on one replica admits its buyer on another that was asked
// for it a moment before, when it was unknown: that replica had cached
// the miss, and refused the new code as invalid (a wrong guess counted
// against the buyer's network) until its cache refreshed (helper-94 #2).
func TestCodeAddedOnAnotherReplicaAdmitsAtOnce(t *testing.T) {
	ctx := context.Background()
	a, b, _, sku, fans := poolBesideACutReplica(t, "codeadded", sale.AccessCode)
	buy := func(key string) error {
		_, err := b.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID(key)},
			SKU: sku, Quantity: 1, Access: sale.Access{Pool: fans, Code: "NEWCODE1"}})
		return err
	}
	if err := buy("k1"); !errors.Is(err, sale.ErrCodeInvalid) {
		t.Fatalf("a purchase with a code not added yet = %v, want ErrCodeInvalid", err)
	}
	if _, _, err := a.PutCodes(ctx, sku, fans, []sale.CodeSpec{{Code: "NEWCODE1", MaxUses: 1}}, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := buy("k2"); err != nil {
		t.Fatalf("a purchase with the code just added on the other replica = %v, want it sold", err)
	}
}

package sale_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// replyLost is a ledger whose next PutSKU commits and then fails, as one
// whose COMMIT's reply was lost.
type replyLost struct {
	sale.Ledger
	lose atomic.Bool
}

func (l *replyLost) PutSKU(ctx context.Context, c ledger.SKUConfig) (ledger.SKUState, error) {
	st, err := l.Ledger.PutSKU(ctx, c)
	if err == nil && l.lose.Swap(false) {
		return ledger.SKUState{}, errors.New("ledger: put sku: commit: read tcp: connection reset by peer")
	}
	return st, err
}

// A change of a SKU whose COMMIT's reply is lost may have landed: its
// gate is not reopened as it was, but rebuilt from the ledger by the next
// purchase. Reopened, it served the old total (10 where the ledger had 4)
// until the settings' notice, TTL or drift check caught up (helper-91 S1).
// Refused, the change leaves the gate open as it was.
func TestPutWhoseReplyIsLostDoesNotReopenTheOldGate(t *testing.T) {
	led := &replyLost{}
	svc, gate := sale.TestService(t, shardmem.New(), nil, func(o *sale.Options) { led.Ledger = o.Ledger; o.Ledger = led })
	ctx := context.Background()
	sku := stock.SKU{Program: keys.MustID("putlost"), Ticket: keys.MustID("t")}
	buy := func(n int, q int64) error {
		_, err := svc.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID(fmt.Sprintf("k%d", n))}, SKU: sku, Quantity: q})
		return err
	}
	agree := func(when string) {
		t.Helper()
		st, err := svc.SKU(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		left, seeded, err := gate.Remaining(ctx, sku, 1)
		if err != nil || !seeded || left != st.Remain {
			t.Fatalf("%s: the gate has %d left (seeded %v, %v), the ledger %d", when, left, seeded, err, st.Remain)
		}
	}
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	if err := buy(1, 1); err != nil {
		t.Fatal(err)
	}
	led.lose.Store(true)
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 4, Shards: 1, MaxPerOrder: 4}); !errors.Is(err, sale.ErrUnavailable) {
		t.Fatalf("a PUT whose reply was lost = %v, want unavailable (the change may have been made)", err)
	}
	// Closed, not serving the old count (9 where the ledger has 3).
	if sh, err := gate.Read(ctx, sku, 1); err != nil || !sh[0].Fenced {
		t.Fatalf("after a PUT whose reply was lost the gate is %+v (%v); want it closed for a rebuild, the ledger has 3 left", sh, err)
	}
	// A refused PUT in between does not reopen it as it was (helper-92 #2).
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 0, Shards: 1, MaxPerOrder: 4}); err == nil {
		t.Fatal("a PUT below what is sold was not refused")
	}
	if sh, err := gate.Read(ctx, sku, 1); err != nil || !sh[0].Fenced {
		t.Fatalf("after a refused PUT the gate a lost reply closed is %+v (%v); want it still closed", sh, err)
	}
	if err := buy(2, 1); err != nil {
		t.Fatalf("a purchase after it: %v", err)
	}
	agree("after a PUT whose reply was lost")
	// A PUT the ledger refuses (below what is sold) changes nothing, and
	// the gate serves on as it was.
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 1, Shards: 1, MaxPerOrder: 4}); !errors.Is(err, sale.ErrBelowCommitted) {
		t.Fatalf("a PUT below what is sold = %v, want ErrBelowCommitted", err)
	}
	agree("after a refused PUT")
	if err := buy(3, 2); err != nil {
		t.Fatalf("a purchase of the last two: %v", err)
	}
	agree("at the end")
}

// A pool's PUT the ledger refuses (the pool closed) changes nothing, and
// the ticket's public gate serves on as it was, not closed for a rebuild.
func TestRefusedPoolPutLeavesTheGateOpen(t *testing.T) {
	svc, gate := sale.TestService(t, shardmem.New(), nil)
	ctx := context.Background()
	sku := stock.SKU{Program: keys.MustID("poolrefused"), Ticket: keys.MustID("t")}
	fans := keys.MustID("fans")
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 20, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.PutPool(ctx, sale.PoolSpec{SKU: sku, Pool: fans, Allotment: 5}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.ClosePool(ctx, sku, fans); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID("k1")}, SKU: sku, Quantity: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.PutPool(ctx, sale.PoolSpec{SKU: sku, Pool: fans, Allotment: 3}); err == nil {
		t.Fatal("a closed pool's PUT was not refused")
	}
	if sh, err := gate.Read(ctx, sku, 1); err != nil || sh[0].Fenced {
		t.Fatalf("after a refused pool PUT the public gate is %+v (%v); want it serving", sh, err)
	}
}

// unknownOnce is a ledger whose next SKU read says the SKU is unknown, as
// a PUT's read does when another PUT creates the SKU just after it.
type unknownOnce struct {
	sale.Ledger
	unknown atomic.Bool
}

func (l *unknownOnce) SKU(ctx context.Context, sku stock.SKU) (ledger.SKUState, error) {
	if l.unknown.Swap(false) {
		return ledger.SKUState{}, stock.ErrUnknownSKU
	}
	return l.Ledger.SKU(ctx, sku)
}

// Two first PUTs of a SKU at once: the first creates it with one shard
// and seeds that gate; the second, whose read came before, changes it to
// two. The second is a change of a live SKU, made under its lock: the
// one-shard layout is retired, not left serving its 10 units at the old
// epoch beside the new layout, a zombie (helper-91 S2).
func TestSecondFirstPutRetiresTheFirstLayout(t *testing.T) {
	led := &unknownOnce{}
	svc, gate := sale.TestService(t, shardmem.New(), nil, func(o *sale.Options) { led.Ledger = o.Ledger; o.Ledger = led })
	ctx := context.Background()
	sku := stock.SKU{Program: keys.MustID("firstputs"), Ticket: keys.MustID("t")}
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	if sh, err := gate.Read(ctx, sku, 1); err != nil || !sh[0].Seeded || sh[0].Fenced || sh[0].Avail != 10 {
		t.Fatalf("the first PUT's gate is %+v (%v); want it serving 10", sh, err)
	}
	led.unknown.Store(true)
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 10, Shards: 2, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	if sh, err := gate.Read(ctx, sku, 1); err != nil || sh[0].Avail != 0 || !sh[0].Fenced {
		t.Fatalf("after the second first PUT the one-shard layout is %+v (%v); want it retired, empty and closed", sh, err)
	}
	left, seeded, err := gate.Remaining(ctx, sku, 2)
	if err != nil || !seeded || left != 10 {
		t.Fatalf("the two-shard gate has %d (seeded %v, %v), want 10", left, seeded, err)
	}
	if _, err := svc.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID("k1")}, SKU: sku, Quantity: 2}); err != nil {
		t.Fatal(err)
	}
}

// The same race with the gate out of reach while its lock answers (a
// shard's master out, the lock's master up): the second PUT finds the SKU
// made under the lock and cannot close its gate, so it changes nothing
// and says so. It went on to change the SKU unlocked, past its open
// one-shard gate, a zombie again (helper-93 #2).
func TestSecondFirstPutWithTheGateOutChangesNothing(t *testing.T) {
	led := &unknownOnce{}
	mem := &quotaFaults{Scripter: shardmem.New()}
	svc, _ := sale.TestService(t, mem, nil, func(o *sale.Options) { led.Ledger = o.Ledger; o.Ledger = led })
	ctx := context.Background()
	sku := stock.SKU{Program: keys.MustID("firstputsout"), Ticket: keys.MustID("t")}
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	led.unknown.Store(true)
	mem.down.Store(true)
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 4, Shards: 2, MaxPerOrder: 4}); !errors.Is(err, sale.ErrGateNotClosed) {
		t.Fatalf("the second first PUT with the gate out = %v, want ErrGateNotClosed", err)
	}
	mem.down.Store(false)
	if st, err := svc.SKU(ctx, sku); err != nil || st.Total != 10 || st.Shards != 1 {
		t.Fatalf("after the refused PUT the SKU is %+v (%v); want it as the first PUT made it", st, err)
	}
}

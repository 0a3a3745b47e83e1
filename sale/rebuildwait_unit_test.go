package sale_test

import (
	"context"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// A purchase of a SKU whose gate is stale (sold around while Redis was
// out of a replica's reach) and whose rebuild cannot start (its lock held
// elsewhere: a master out, another replica's rebuild) does not wait for
// the lock: it goes around the gate while the rebuild waits on its own,
// and the rebuild completes once the lock is free. Waiting for the lock's
// ReseedWait held every purchase of the SKU for a second each breaker
// period, and with all of Redis down that filled the in-flight bound:
// 9.5 % answered 503 in stockbench faults' "all of Redis" row (72d9bc7).
// Here ReseedWait is an hour, so a purchase that waited for the lock
// would end at its work timeout, refused.
func TestPurchaseDoesNotWaitForABusyRebuild(t *testing.T) {
	ctx := context.Background()
	mem := shardmem.New()
	cut := &quotaFaults{Scripter: mem}
	var led sale.Ledger
	a, _ := sale.TestService(t, cut, nil, func(o *sale.Options) { led = o.Ledger })
	b, _ := sale.TestService(t, mem, nil, func(o *sale.Options) {
		o.Ledger = led
		o.ReseedWait = time.Hour
		o.WorkTimeout = 3 * time.Second
	})
	sku := stock.SKU{Program: keys.MustID("busyrebuild"), Ticket: keys.MustID("t")}
	if _, err := a.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 50, Shards: 2, MaxPerOrder: 2}); err != nil {
		t.Fatal(err)
	}
	buy := func(s *sale.Service, key string) error {
		_, err := s.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID("buyer" + key), Key: keys.MustID(key)},
			SKU: sku, Quantity: 1})
		return err
	}
	cut.down.Store(true)
	if err := buy(a, "around"); err != nil {
		t.Fatalf("purchase around the gate: %v", err)
	}
	if st, err := led.SKU(ctx, sku); err != nil || !st.GateStale() {
		t.Fatalf("after a sale around the gate: stale %v, err %v; want a stale gate", st.GateStale(), err)
	}

	// Another holder of the SKU's rebuild lock, as a replica rebuilding
	// it, or a lock whose master is out, would be.
	locker, err := lock.New(lock.Options{Redis: mem})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := locker.Acquire(ctx, keys.Lock(sku.Program, sku.Ticket, keys.MustID("reseed")), 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := buy(b, "held"+string(rune('a'+i))); err != nil {
			t.Fatalf("purchase %d while the rebuild lock is held: %v, want it sold around the gate", i, err)
		}
	}
	if st, err := led.SKU(ctx, sku); err != nil || !st.GateStale() {
		t.Fatalf("while the lock is held: stale %v, err %v; want the gate still stale (not rebuilt)", st.GateStale(), err)
	}

	// The rebuild b started waits for the lock on its own and completes
	// once it is free.
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		st, err := led.SKU(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		if !st.GateStale() {
			if got := st.Remaining(); got != 50-4 {
				t.Fatalf("ledger remaining after the rebuild = %d, want 46", got)
			}
			break
		}
		time.Sleep(5 * time.Millisecond) // polling the ledger for the rebuild b left waiting for the lock
	}
	if err := buy(b, "after"); err != nil {
		t.Fatalf("purchase through the rebuilt gate: %v", err)
	}
}

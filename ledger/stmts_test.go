package ledger_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// The repeated queries are prepared once per ledger on SQLite: two ledgers
// share one file's connection, each with its own statements; closing one
// leaves the other's working, and a prepared read sees every later write.
func TestRepeatedQueriesOnASharedFile(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.SQLitePath(t)
	open := func() *ledger.Ledger {
		l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.SQLite, DSN: dsn})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b := open(), open()
	defer b.Close()
	if _, err := a.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	// Many first uses at once: one statement kept, the others' closed.
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if st, err := b.SKU(ctx, sku); err != nil || st.Total != 10 {
				t.Errorf("concurrent first SKU = %+v, %v", st, err)
			}
		})
	}
	wg.Wait()
	for _, l := range []*ledger.Ledger{a, b} {
		if st, err := l.SKU(ctx, sku); err != nil || st.Sold != 0 {
			t.Fatalf("SKU = %+v, %v", st, err)
		}
		if _, err := l.ExpireDue(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if _, err := b.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("k1"), SKU: sku, Buyer: keys.MustID("b"), Quantity: 3}); err != nil {
		t.Fatal(err)
	}
	if st, err := b.SKU(ctx, sku); err != nil || st.Sold != 3 {
		t.Fatalf("after a purchase, with the other ledger closed: SKU = %+v, %v; want sold 3", st, err)
	}
	if _, err := b.ExpireDue(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := b.PendingRestores(ctx, 0, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := b.PoolsDue(ctx, 10); err != nil {
		t.Fatal(err)
	}
}

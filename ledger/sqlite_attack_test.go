package ledger_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// waitGoroutines waits for the goroutine count to come back to at most n.
func waitGoroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, want at most %d (before the test):\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAttackSQLiteCheckpointerLifecycle: ledgers opening and closing one
// file concurrently, a ledger that fails to open (its directory is
// missing), and a file re-opened after its last ledger closed. Every
// checkpointer stops with its file's last ledger (no goroutine outlives
// them), and the re-opened file's checkpointer works again.
func TestAttackSQLiteCheckpointerLifecycle(t *testing.T) {
	ctx := context.Background()
	before := runtime.NumGoroutine()
	path := testenv.SQLitePath(t)
	first, err := ledger.Open(ctx, ledger.Options{Driver: ledger.SQLite, DSN: path})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 5 {
				l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.SQLite, DSN: path})
				if err != nil {
					t.Error(err)
					return
				}
				if err := l.Close(); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if _, err := ledger.Open(ctx, ledger.Options{Driver: ledger.SQLite, DSN: filepath.Join(t.TempDir(), "missing", "l.db")}); err == nil {
		t.Fatal("a ledger in a missing directory opened")
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	waitGoroutines(t, before)

	// Re-opened: the new checkpointer moves the WAL into the file again.
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.SQLite, DSN: path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 1000, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID(fmt.Sprintf("re-%d", i)), SKU: sku, Buyer: keys.MustID("b"), Quantity: 1}); err != nil {
			t.Fatal(err)
		}
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	var size int64
	err = db.QueryRowContext(ctx, "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()").Scan(&size)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() >= size {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the re-opened file has %d bytes of the ledger's %d: its checkpointer never ran", fi.Size(), size)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	waitGoroutines(t, before)
}

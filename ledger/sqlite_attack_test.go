package ledger_test

import (
	"context"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/internal/wait"
	"github.com/stockgate/stockgate/ledger"
)

// waitGoroutines waits for the goroutine count to come back to at most n.
func waitGoroutines(t *testing.T, n int) {
	t.Helper()
	if !wait.Until(20*time.Second, func() bool { return runtime.NumGoroutine() <= n }) {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines, want at most %d (before the test):\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
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
	awaitCheckpoint(t, l, path, "re", 100)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	waitGoroutines(t, before)
}

package ledger_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/internal/wait"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// A SQLite ledger's committed pages reach the database file by its
// checkpointer, not by the commit that crosses SQLite's default threshold
// of 1,000 WAL pages (which stalled the one writer). A few hundred
// purchases leave far fewer pages than that in the WAL; the file must
// still receive them, which only a checkpoint besides the writer's does.
func TestSQLiteCheckpointsBesideTheWriter(t *testing.T) {
	ctx := context.Background()
	path := testenv.SQLitePath(t)
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.SQLite, DSN: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	awaitCheckpoint(t, l, path, "ck", 300)
}

// awaitCheckpoint sells n units of a new SKU through l (keys prefix-i) and
// waits until the file at path holds every page of the ledger: until a
// checkpoint besides the writer's moved the WAL into it (the writes stay
// under SQLite's own threshold of 1,000 pages, which the test checks).
func awaitCheckpoint(t *testing.T, l *ledger.Ledger, path, prefix string, n int) {
	t.Helper()
	ctx := context.Background()
	if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 1000, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID(fmt.Sprintf("%s-%d", prefix, i)), SKU: sku, Buyer: keys.MustID("b"), Quantity: 1}); err != nil {
			t.Fatal(err)
		}
	}
	// Read the ledger's size as SQLite sees it (WAL included) from a
	// connection of the test's own.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	var pages, size int64
	err = db.QueryRowContext(ctx, "SELECT page_count * page_size, page_count FROM pragma_page_count(), pragma_page_size()").Scan(&size, &pages)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if pages >= 1000 {
		t.Fatalf("the ledger has %d pages: the test's writes must stay under SQLite's own threshold", pages)
	}
	var file int64
	if !wait.Until(20*time.Second, func() bool {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		file = fi.Size()
		return file >= size
	}) {
		t.Fatalf("the database file has %d bytes of the ledger's %d after 20 s: nothing checkpointed the WAL", file, size)
	}
}

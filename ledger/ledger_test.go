package ledger_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/internal/testenv/ledgerenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// eachDriver runs f against a fresh SQLite file and a fresh PostgreSQL
// database: the same behaviour is required of both.
func eachDriver(t *testing.T, f func(t *testing.T, l *ledger.Ledger)) { ledgerenv.Each(t, f) }

var sku = stock.SKU{Program: keys.MustID("show-1"), Ticket: keys.MustID("ga")}

func TestPutSKU(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		st, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 10, Shards: 2, MaxPerOrder: 4})
		if err != nil || st.Total != 10 || st.Remaining() != 10 || st.Shards != 2 {
			t.Fatalf("PutSKU = %+v, %v", st, err)
		}
		if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("k1"), SKU: sku, Buyer: keys.MustID("b"), Quantity: 3}); err != nil {
			t.Fatal(err)
		}
		// Lowering the total below what is sold is refused and changes nothing.
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 2, Shards: 2, MaxPerOrder: 4}); !errors.Is(err, stock.ErrInvalid) {
			t.Errorf("PutSKU(total 2 < sold 3) = %v, want ErrInvalid", err)
		}
		st, err = l.SKU(ctx, sku)
		if err != nil || st.Total != 10 || st.Sold != 3 {
			t.Errorf("SKU = %+v, %v, want total 10 sold 3", st, err)
		}
		st, err = l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 3, Shards: 1, MaxPerOrder: 2})
		if err != nil || st.Remaining() != 0 || st.MaxPerOrder != 2 {
			t.Errorf("PutSKU(total 3) = %+v, %v", st, err)
		}
		if _, err := l.SKU(ctx, stock.SKU{Program: keys.MustID("nope"), Ticket: keys.MustID("x")}); !errors.Is(err, stock.ErrUnknownSKU) {
			t.Errorf("SKU(unknown) = %v, want ErrUnknownSKU", err)
		}
		for _, bad := range []ledger.SKUConfig{
			{SKU: sku, Total: -1, Shards: 1, MaxPerOrder: 1},
			{SKU: sku, Total: 1, Shards: 0, MaxPerOrder: 1},
			{SKU: sku, Total: 1, Shards: stock.MaxShards + 1, MaxPerOrder: 1},
			{SKU: sku, Total: 1, Shards: 1, MaxPerOrder: 0},
			{SKU: stock.SKU{Ticket: keys.MustID("x")}, Total: 1, Shards: 1, MaxPerOrder: 1},
		} {
			if _, err := l.PutSKU(ctx, bad); !errors.Is(err, stock.ErrInvalid) {
				t.Errorf("PutSKU(%+v) = %v, want ErrInvalid", bad, err)
			}
		}
	})
}

func TestPurchaseNeverOversells(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 50, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var units int64
		soldOut := 0
		for i := range 200 {
			wg.Go(func() {
				q := int64(i%4 + 1)
				o, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID(fmt.Sprintf("key-%d", i)), SKU: sku, Buyer: keys.MustID("b"), Quantity: q})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.Is(err, stock.ErrSoldOut):
					soldOut++
				case err != nil:
					t.Error(err)
				default:
					units += o.Quantity
				}
			})
		}
		wg.Wait()
		st, err := l.SKU(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		_, orderUnits, err := l.OrderTotals(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		if st.Sold > st.Total || st.Sold != units || orderUnits != units {
			t.Errorf("sold %d, order rows %d, acknowledged %d, total %d", st.Sold, orderUnits, units, st.Total)
		}
		if soldOut == 0 {
			t.Errorf("no purchase was refused for 200 buyers of 50 units")
		}
	})
}

func TestPurchaseOncePerKey(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		ids := make(chan string, 20)
		for range 20 {
			wg.Go(func() {
				o, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("same"), RequestHash: "h", SKU: sku, Buyer: keys.MustID("b"), Quantity: 2})
				if err != nil && !errors.Is(err, ledger.ErrDuplicate) {
					t.Error(err)
					return
				}
				ids <- o.ID.String()
			})
		}
		wg.Wait()
		close(ids)
		first := ""
		for id := range ids {
			if first == "" {
				first = id
			}
			if id != first || id == "" {
				t.Errorf("order id %q, want every answer %q", id, first)
			}
		}
		st, _ := l.SKU(ctx, sku)
		if st.Sold != 2 {
			t.Errorf("sold = %d after 20 purchases with one key, want 2", st.Sold)
		}
		o, err := l.OrderByKey(ctx, keys.MustID("same"))
		if err != nil || o.ID.String() != first || o.RequestHash != "h" {
			t.Errorf("OrderByKey = %+v, %v", o, err)
		}
		if _, err := l.OrderByKey(ctx, keys.MustID("missing")); !errors.Is(err, ledger.ErrNotFound) {
			t.Errorf("OrderByKey(missing) = %v, want ErrNotFound", err)
		}
	})
}

func TestOpenValidates(t *testing.T) {
	ctx := context.Background()
	for _, o := range []ledger.Options{{Driver: "mysql", DSN: "x"}, {Driver: ledger.SQLite}, {Driver: ledger.Postgres, DSN: "x", MaxConns: -1}} {
		if l, err := ledger.Open(ctx, o); err == nil {
			l.Close()
			t.Errorf("Open(%+v) succeeded", o)
		}
	}
}

func TestPurchaseDirect(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		st, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 5, Shards: 2, MaxPerOrder: 4})
		if err != nil {
			t.Fatal(err)
		}
		if !st.GateStale() {
			t.Fatal("a new SKU is not gate-stale: Redis would serve it unseeded")
		}
		if err := l.MarkGateSeeded(ctx, sku, st.BypassSeq); err != nil {
			t.Fatal(err)
		}
		if st, _ = l.SKU(ctx, sku); st.GateStale() {
			t.Fatal("gate-stale after MarkGateSeeded")
		}
		order := func(key string, q int64) ledger.Order {
			return ledger.Order{IdempotencyKey: keys.MustID(key), SKU: sku, Buyer: keys.MustID("b"), Quantity: q}
		}
		if _, err := l.PurchaseDirect(ctx, order("d1", 1), st.Version); err != nil {
			t.Fatal(err)
		}
		// The same version again: someone moved the row; nothing is written.
		if _, err := l.PurchaseDirect(ctx, order("d2", 1), st.Version); !errors.Is(err, ledger.ErrConflict) {
			t.Fatalf("PurchaseDirect(stale version) = %v, want ErrConflict", err)
		}
		if _, err := l.OrderByKey(ctx, keys.MustID("d2")); !errors.Is(err, ledger.ErrNotFound) {
			t.Errorf("conflicting purchase left an order: %v", err)
		}
		st, _ = l.SKU(ctx, sku)
		if st.Sold != 1 || !st.GateStale() || st.BypassSeq != 2 {
			t.Fatalf("after one direct sale: %+v, want sold 1, bypass_seq 2 (put, sale), gate stale", st)
		}
		// Not enough left is sold out, not a conflict, even at the right version.
		if _, err := l.PurchaseDirect(ctx, order("d3", 5), st.Version); !errors.Is(err, stock.ErrSoldOut) {
			t.Errorf("PurchaseDirect(5 of 4 left) = %v, want ErrSoldOut", err)
		}
		if _, err := l.PurchaseDirect(ctx, order("d1", 1), st.Version); !errors.Is(err, ledger.ErrDuplicate) {
			t.Errorf("PurchaseDirect(used key) = %v, want ErrDuplicate", err)
		}
		if err := l.MarkGateSeeded(ctx, sku, st.BypassSeq); err != nil {
			t.Fatal(err)
		}
		if err := l.MarkGateSeeded(ctx, sku, 0); err != nil {
			t.Fatal(err)
		}
		st, _ = l.SKU(ctx, sku)
		if st.GateStale() || st.GateSeq != 2 || st.Sold != 1 {
			t.Errorf("after MarkGateSeeded(2), (0): %+v, want gate_seq 2, not stale", st)
		}
	})
}

func TestPurchaseDirectRacing(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 30, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var units, conflicts int64
		for i := range 100 {
			wg.Go(func() {
				for {
					st, err := l.SKU(ctx, sku)
					if err != nil {
						t.Error(err)
						return
					}
					o, err := l.PurchaseDirect(ctx, ledger.Order{IdempotencyKey: keys.MustID(fmt.Sprintf("r-%d", i)), SKU: sku, Buyer: keys.MustID("b"), Quantity: 1}, st.Version)
					mu.Lock()
					switch {
					case errors.Is(err, ledger.ErrConflict):
						conflicts++
						mu.Unlock()
						continue
					case errors.Is(err, stock.ErrSoldOut):
					case err != nil:
						t.Error(err)
					default:
						units += o.Quantity
					}
					mu.Unlock()
					return
				}
			})
		}
		wg.Wait()
		st, _ := l.SKU(ctx, sku)
		_, orderUnits, _ := l.OrderTotals(ctx, sku)
		if st.Sold != 30 || units != 30 || orderUnits != 30 || st.BypassSeq != 31 {
			t.Errorf("sold %d, acknowledged %d, order rows %d, bypass_seq %d; want 30, 30, 30, 31 (put + 30 sales)", st.Sold, units, orderUnits, st.BypassSeq)
		}
		t.Logf("%d version conflicts retried", conflicts)
	})
}

func TestSKUsPages(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		for _, p := range []string{"a", "b", "c"} {
			for _, tk := range []string{"x", "y"} {
				if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: stock.SKU{Program: keys.MustID(p), Ticket: keys.MustID(tk)}, Total: 1, Shards: 1, MaxPerOrder: 1}); err != nil {
					t.Fatal(err)
				}
			}
		}
		var got []string
		after := stock.SKU{}
		for {
			page, err := l.SKUs(ctx, after, 4)
			if err != nil {
				t.Fatal(err)
			}
			for _, st := range page {
				got = append(got, st.SKU.String())
			}
			if len(page) < 4 {
				break
			}
			after = page[len(page)-1].SKU
		}
		if want := "a/x a/y b/x b/y c/x c/y"; fmt.Sprint(got) != "["+want+"]" {
			t.Errorf("SKUs pages = %v, want [%s]", got, want)
		}
	})
}

func TestWriteFailureBeforeCommitIsNotCommitted(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 1, Shards: 1, MaxPerOrder: 1}); err != nil {
			t.Fatal(err)
		}
		l.Close()
		_, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("k"), SKU: sku, Buyer: keys.MustID("b"), Quantity: 1})
		if !errors.Is(err, ledger.ErrNotCommitted) {
			t.Errorf("Purchase on a closed ledger = %v, want ErrNotCommitted", err)
		}
	})
}

// A ledger created by the first release (no bypass_seq, gate_seq) is
// migrated in place on Open, keeping its rows.
func TestOpenMigratesFirstReleaseSchema(t *testing.T) {
	for _, driver := range []string{ledger.SQLite, ledger.Postgres} {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			dsn, sqlDriver, open := testenv.SQLitePath(t), "sqlite", ""
			if driver == ledger.Postgres {
				dsn, sqlDriver = testenv.PostgresURL(t), "pgx"
				open = dsn
			} else {
				open = "file:" + dsn
			}
			db, err := sql.Open(sqlDriver, open)
			if err != nil {
				t.Fatal(err)
			}
			_, err = db.ExecContext(ctx, `CREATE TABLE skus (
				program TEXT NOT NULL, ticket TEXT NOT NULL, total BIGINT NOT NULL, sold BIGINT NOT NULL DEFAULT 0,
				held BIGINT NOT NULL DEFAULT 0, version BIGINT NOT NULL DEFAULT 0, shards INTEGER NOT NULL,
				max_per_order BIGINT NOT NULL, updated_at BIGINT NOT NULL, PRIMARY KEY (program, ticket))`)
			if err == nil {
				_, err = db.ExecContext(ctx, `INSERT INTO skus (program, ticket, total, sold, shards, max_per_order, updated_at)
					VALUES ('show-1', 'ga', 10, 3, 1, 4, 0)`)
			}
			db.Close()
			if err != nil {
				t.Fatal(err)
			}
			l, err := ledger.Open(ctx, ledger.Options{Driver: driver, DSN: dsn})
			if err != nil {
				t.Fatalf("Open on a first-release ledger: %v", err)
			}
			defer l.Close()
			st, err := l.SKU(ctx, sku)
			if err != nil || st.Sold != 3 || st.GateStale() {
				t.Fatalf("migrated row = %+v, %v; want sold 3, gate not stale", st, err)
			}
			if _, err := l.PurchaseDirect(ctx, ledger.Order{IdempotencyKey: keys.MustID("m1"), SKU: sku, Buyer: keys.MustID("b"), Quantity: 1}, st.Version); err != nil {
				t.Errorf("PurchaseDirect after migration: %v", err)
			}
		})
	}
}

// A gateway starting beside others that are selling must not take a lock
// their transactions hold: CREATE INDEX IF NOT EXISTS locks its table even
// when the index exists, and CI saw a new gateway's start-up deadlock with
// running purchases (SQLSTATE 40P01). Open on a current ledger runs no DDL.
func TestOpenBesideATransactionTakesNoTableLock(t *testing.T) {
	ls, _, dsn := openLedgers(t, ledger.Postgres, 1)
	if _, err := ls[0].PutSKU(context.Background(), ledger.SKUConfig{SKU: sku, Total: 5, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	// Row-exclusive locks on the tables a purchase writes, as a running
	// batch holds them.
	for _, q := range []string{
		`UPDATE skus SET updated_at = updated_at WHERE program = 'show-1'`,
		`INSERT INTO requests (scope, idem_key, fingerprint, op, program, ticket, created_at) VALUES ('t', 'k', 'f', 'o', 'p', 't', 0)`,
		`DELETE FROM orders WHERE id = 'none'`,
		`DELETE FROM holds WHERE id = 'none'`,
	} {
		if _, err := tx.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	// The old Open waited here for the transaction; the bound only turns
	// that wait into a failure.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: dsn})
	if err != nil {
		t.Fatalf("Open beside a running transaction: %v", err)
	}
	l.Close()
}

// `stockgate migrate` applies the schema; serve may then run as a role with
// no DDL rights, and with NoMigrate it refuses a ledger whose schema is not
// this build's instead of touching it.
func TestServeWithoutDDLRights(t *testing.T) {
	ctx := context.Background()
	admin := testenv.PostgresURL(t)
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: admin}) // what migrate does
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	db, err := sql.Open("pgx", admin)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	role := fmt.Sprintf("serving_%d", time.Now().UnixNano()%1_000_000_000)
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
		"GRANT USAGE ON SCHEMA public TO " + role,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO " + role,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		_, _ = db.Exec("REASSIGN OWNED BY " + role + " TO postgres")
		_, _ = db.Exec("DROP OWNED BY " + role)
		_, _ = db.Exec("DROP ROLE " + role)
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	serving := u.String()
	open := func(noMigrate bool) (*ledger.Ledger, error) {
		return ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: serving, NoMigrate: noMigrate})
	}
	for _, noMigrate := range []bool{true, false} {
		l, err := open(noMigrate)
		if err != nil {
			t.Fatalf("serving role on a migrated ledger (NoMigrate %v): %v", noMigrate, err)
		}
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 5, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatalf("serving role cannot write: %v", err)
		}
		l.Close()
	}
	// A ledger at a schema older than this build's minimum.
	if _, err := db.ExecContext(ctx, `DELETE FROM ledger_migrations WHERE version_id > 0`); err != nil {
		t.Fatal(err)
	}
	if l, err := open(true); !errors.Is(err, ledger.ErrSchema) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("NoMigrate on an older schema = %v, want ErrSchema", err)
	}
	if l, err := open(false); err == nil {
		l.Close()
		t.Fatal("the serving role migrated the ledger: it has DDL rights, so this test shows nothing")
	}
	if l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: admin}); err != nil {
		t.Fatalf("migrate: %v", err)
	} else {
		l.Close()
	}
	if l, err := open(true); err != nil {
		t.Fatalf("after migrate, NoMigrate = %v", err)
	} else {
		l.Close()
	}
	// A new SQLite file has no schema at all.
	if l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.SQLite, DSN: testenv.SQLitePath(t), NoMigrate: true}); !errors.Is(err, ledger.ErrSchema) {
		if l != nil {
			l.Close()
		}
		t.Errorf("NoMigrate on a new SQLite file = %v, want ErrSchema", err)
	}
}

// A ledger made before the references to skus were dropped loses them on
// migrate: with them, PostgreSQL failed concurrent batches with "new
// multixact has more than one updating member" (TestMixedBatchesRacing).
func TestMigrateDropsSKUReferences(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, table := range []string{"orders", "holds", "seats"} {
		if _, err := db.ExecContext(ctx, `ALTER TABLE `+table+` ADD CONSTRAINT `+table+`_program_ticket_fkey
			FOREIGN KEY (program, ticket) REFERENCES skus (program, ticket)`); err != nil {
			t.Fatal(err)
		}
	}
	// As a build from before versioned migrations left it.
	for _, q := range []string{`UPDATE ledger_schema SET digest = 'before'`, `DROP TABLE ledger_migrations`, `DROP TABLE ledger_compat`} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if l, err = ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: dsn}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.table_constraints
		WHERE constraint_type = 'FOREIGN KEY' AND table_schema = current_schema()`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d foreign keys after migrate (%v), want 0", n, err)
	}
}

// A ledger whose tables predate the columns added since (carts, pools,
// access codes) migrates on both drivers, indexes on those columns
// included, and keeps its rows.
func TestMigrateFromTablesWithoutAddedColumns(t *testing.T) {
	for _, driver := range []string{ledger.SQLite, ledger.Postgres} {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			dsn, sqlDriver := testenv.SQLitePath(t), "sqlite"
			if driver == ledger.Postgres {
				dsn, sqlDriver = testenv.PostgresURL(t), "pgx"
			}
			db, err := sql.Open(sqlDriver, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			// The orders and holds tables as they were before carts.
			for _, q := range []string{
				`CREATE TABLE orders (id TEXT PRIMARY KEY, idem_key TEXT NOT NULL UNIQUE, request_hash TEXT NOT NULL,
					program TEXT NOT NULL, ticket TEXT NOT NULL, buyer TEXT NOT NULL, quantity BIGINT NOT NULL, gate TEXT NOT NULL DEFAULT '',
					created_at BIGINT NOT NULL)`,
				`CREATE TABLE holds (id TEXT PRIMARY KEY, idem_key TEXT NOT NULL UNIQUE, request_hash TEXT NOT NULL,
					program TEXT NOT NULL, ticket TEXT NOT NULL, buyer TEXT NOT NULL, quantity BIGINT NOT NULL, gate TEXT NOT NULL DEFAULT '',
					state TEXT NOT NULL, expires_at BIGINT NOT NULL, order_id TEXT NOT NULL DEFAULT '', restore_pending INTEGER NOT NULL DEFAULT 0,
					created_at BIGINT NOT NULL, ended_at BIGINT NOT NULL DEFAULT 0)`,
				`INSERT INTO orders (id, idem_key, request_hash, program, ticket, buyer, quantity, created_at) VALUES ('o1', 'k1', 'h', 'p', 't', 'b', 2, 1)`,
			} {
				if _, err := db.ExecContext(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			l, err := ledger.Open(ctx, ledger.Options{Driver: driver, DSN: dsn})
			if err != nil {
				t.Fatalf("migrate from old tables: %v", err)
			}
			defer l.Close()
			if o, err := l.OrderByID(ctx, keys.MustID("o1")); err != nil || o.Quantity != 2 || o.CodeHash != "" || !o.CartID.IsZero() {
				t.Errorf("old order after migrate = %+v, %v", o, err)
			}
		})
	}
}

// Package ledgerenv gives tests fresh ledgers at this build's schema, on
// both drivers. It is apart from testenv so the tests of the Redis side
// (shard, lock, seats, waitroom) link no SQLite and no migrations.
package ledgerenv

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/ledger"
)

// Drivers are the ledger's drivers: every behaviour is required of both.
var Drivers = []string{ledger.SQLite, ledger.Postgres}

// EachDriver runs f as a subtest per ledger driver.
func EachDriver(t *testing.T, f func(t *testing.T, driver string)) {
	for _, d := range Drivers {
		t.Run(d, func(t *testing.T) { f(t, d) })
	}
}

// DSN is a fresh ledger of the driver at this build's schema, with no rows
// but its own identity, removed when the test ends: a SQLite file, or a
// PostgreSQL database on the package's server. (testenv.PostgresURL and
// testenv.SQLitePath are empty ones, for tests of the migrations.)
func DSN(tb testing.TB, driver string) string {
	if driver == ledger.Postgres {
		return PostgresURLs(tb, 1)[0]
	}
	return SQLitePath(tb)
}

// Each runs f as a subtest per ledger driver, on a fresh ledger of that
// driver, closed when the subtest ends.
func Each(t *testing.T, f func(t *testing.T, l *ledger.Ledger)) {
	EachDriver(t, func(t *testing.T, driver string) {
		l, err := ledger.Open(context.Background(), ledger.Options{Driver: driver, DSN: DSN(t, driver)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		f(t, l)
	})
}

// PostgresURLs is testenv.PostgresURLs at this build's schema: the
// databases of a ledger opened without migrating. Each is a copy of its
// server's migrated template (migrating costs more than most tests that
// use a ledger), given an identity of its own.
func PostgresURLs(tb testing.TB, n int) []string {
	tb.Helper()
	urls := testenv.TemplatePostgresURLs(tb, n, migrate)
	for _, u := range urls {
		if err := newIdentity(context.Background(), "pgx", u); err != nil {
			tb.Fatal(err)
		}
	}
	return urls
}

func migrate(ctx context.Context, url string) error {
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: url})
	if err != nil {
		return err
	}
	return l.Close()
}

// sqliteTemplate is the process's migrated SQLite ledger file.
var sqliteTemplate struct {
	once sync.Once
	path string
	err  error
}

// SQLitePath is testenv.SQLitePath at this build's schema: a copy of a
// file the process migrated once (80 ms of the test's CPU per file).
func SQLitePath(tb testing.TB) string {
	tb.Helper()
	t := &sqliteTemplate
	t.once.Do(func() {
		dir, err := os.MkdirTemp("", "stockgate-template-")
		if err != nil {
			t.err = err
			return
		}
		t.path = filepath.Join(dir, "ledger.db")
		l, err := ledger.Open(context.Background(), ledger.Options{Driver: ledger.SQLite, DSN: t.path})
		if err != nil {
			t.err = fmt.Errorf("migrate the template: %w", err)
			return
		}
		t.err = l.Close() // checkpoints the WAL into the file
	})
	if t.err != nil {
		tb.Fatalf("sqlite template: %v", t.err)
	}
	path := testenv.SQLitePath(tb)
	if err := copyFile(t.path, path); err != nil {
		tb.Fatalf("sqlite template: %v", err)
	}
	if err := newIdentity(context.Background(), "sqlite", "file:"+path); err != nil {
		tb.Fatal(err)
	}
	return path
}

// newIdentity gives a copied ledger an identity of its own: replicas name
// their Redis locks by it, and tests share one Redis.
func newIdentity(ctx context.Context, driver, dsn string) error {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `UPDATE ledger_identity SET id = $1`, ledger.NewID().String()); err != nil {
		return fmt.Errorf("ledger identity: %w", err)
	}
	return nil
}

func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

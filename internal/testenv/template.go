package testenv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stockgate/stockgate/ledger"
)

// Migrating a fresh ledger costs more than most tests that use one: the
// schema's tables and indexes took about 385 ms of PostgreSQL's CPU per
// database, and 80 ms of the test's per SQLite file (-race, 2 cores),
// times some hundreds of ledgers in make test. So a ledger a test asks
// for is a copy of one migrated once per server (or per process for
// SQLite), given its own identity, as a fresh ledger would have. Tests
// of the migrations themselves take the empty ones (PostgresURL,
// SQLitePath).

// NewLedgerDatabase is NewDatabase at this build's schema.
func (p *Postgres) NewLedgerDatabase(ctx context.Context) (string, func(), error) {
	tmpl, err := p.ledgerTemplate(ctx)
	if err != nil {
		return "", nil, err
	}
	u, drop, err := p.newDatabase(ctx, tmpl)
	if err != nil {
		return "", nil, err
	}
	if err := newIdentity(ctx, "pgx", u); err != nil {
		drop()
		return "", nil, err
	}
	return u, drop, nil
}

// ledgerTemplate is the server's migrated template database, made on
// first use; Stop drops it from a server the tests were given.
func (p *Postgres) ledgerTemplate(ctx context.Context) (string, error) {
	p.tmplMu.Lock()
	defer p.tmplMu.Unlock()
	if p.tmpl != "" {
		return p.tmpl, nil
	}
	u, drop, err := p.newDatabase(ctx, "")
	if err != nil {
		return "", err
	}
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: u})
	if err != nil {
		drop()
		return "", fmt.Errorf("migrate the template: %w", err)
	}
	_ = l.Close()
	pu, _ := url.Parse(u)
	p.tmpl, p.dropTmpl = strings.TrimPrefix(pu.Path, "/"), drop
	return p.tmpl, nil
}

// copyFromTemplate runs CREATE DATABASE name TEMPLATE tmpl, again while
// the template's last session (the migration's, just closed) is still
// on its way out, or another process's copy holds it (a shared server).
func copyFromTemplate(ctx context.Context, admin *sql.DB, name, tmpl string) error {
	for {
		_, err := admin.ExecContext(ctx, "CREATE DATABASE "+name+" TEMPLATE "+tmpl)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "55006" { // object_in_use
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
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

// sqliteTemplate is the process's migrated SQLite ledger file.
var sqliteTemplate struct {
	once sync.Once
	path string
	err  error
}

// LedgerSQLitePath is SQLitePath at this build's schema.
func LedgerSQLitePath(tb testing.TB) string {
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
	path := SQLitePath(tb)
	if err := copyFile(t.path, path); err != nil {
		tb.Fatalf("sqlite template: %v", err)
	}
	if err := newIdentity(context.Background(), "sqlite", "file:"+path); err != nil {
		tb.Fatal(err)
	}
	return path
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

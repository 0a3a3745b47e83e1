package testenv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Migrating a fresh ledger costs more than most tests that use one: the
// schema's tables and indexes took about 385 ms of PostgreSQL's CPU per
// database (-race, 2 cores), times some hundreds of ledgers in make test.
// So a database can be a copy of a template the server migrates once, on
// first use. What migrates it is the caller's (ledgerenv's), so this
// package, which every test of the Redis side links, links no ledger.

// NewDatabaseFrom is NewDatabase as a copy of the server's template, which
// migrate makes on first use from an empty database's URL. A server has
// one template: every caller in a process passes the same migrate.
func (p *Postgres) NewDatabaseFrom(ctx context.Context, migrate func(ctx context.Context, url string) error) (string, func(), error) {
	tmpl, err := p.template(ctx, migrate)
	if err != nil {
		return "", nil, err
	}
	return p.newDatabase(ctx, tmpl)
}

// template is the server's template database, made on first use; Stop
// drops it from a server the tests were given.
func (p *Postgres) template(ctx context.Context, migrate func(ctx context.Context, url string) error) (string, error) {
	p.tmplMu.Lock()
	defer p.tmplMu.Unlock()
	if p.tmpl != "" {
		return p.tmpl, nil
	}
	u, drop, err := p.newDatabase(ctx, "")
	if err != nil {
		return "", err
	}
	if err := migrate(ctx, u); err != nil {
		drop()
		return "", fmt.Errorf("migrate the template: %w", err)
	}
	pu, _ := url.Parse(u)
	p.tmpl, p.dropTmpl = strings.TrimPrefix(pu.Path, "/"), drop
	return p.tmpl, nil
}

// TemplatePostgresURLs is PostgresURLs with each database a copy of its
// server's template (NewDatabaseFrom).
func TemplatePostgresURLs(tb testing.TB, n int, migrate func(ctx context.Context, url string) error) []string {
	tb.Helper()
	return postgresURLs(tb, n, func(p *Postgres, ctx context.Context) (string, func(), error) {
		return p.NewDatabaseFrom(ctx, migrate)
	})
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

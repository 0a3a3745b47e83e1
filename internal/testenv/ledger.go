package testenv

import (
	"context"
	"testing"

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

// LedgerDSN is a fresh ledger of the driver at this build's schema, with
// no rows but its own identity, removed when the test ends: a SQLite
// file, or a PostgreSQL database on the package's server. (PostgresURL
// and SQLitePath are empty ones, for tests of the migrations.)
func LedgerDSN(tb testing.TB, driver string) string {
	if driver == ledger.Postgres {
		return LedgerPostgresURLs(tb, 1)[0]
	}
	return LedgerSQLitePath(tb)
}

// EachLedger runs f as a subtest per ledger driver, on a fresh ledger of
// that driver, closed when the subtest ends.
func EachLedger(t *testing.T, f func(t *testing.T, l *ledger.Ledger)) {
	EachDriver(t, func(t *testing.T, driver string) {
		l, err := ledger.Open(context.Background(), ledger.Options{Driver: driver, DSN: LedgerDSN(t, driver)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		f(t, l)
	})
}

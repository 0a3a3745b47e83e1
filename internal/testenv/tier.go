package testenv

import (
	"os"
	"testing"
)

// TierVar names the test tier. make test-unit sets it to "unit": that run
// starts no server, so a test that needs Redis, PostgreSQL, PgBouncer or a
// proxy in front of one is skipped there and runs in make test, which never
// sets it (nothing is skipped in CI).
const TierVar = "STOCKGATE_TEST_TIER"

// Unit reports whether this run is the unit tier.
func Unit() bool { return os.Getenv(TierVar) == "unit" }

// needsServer skips tb in the unit tier; every starter of a server that
// tests reach through a testing.TB calls it first.
func needsServer(tb testing.TB, what string) {
	tb.Helper()
	if Unit() {
		tb.Skipf("unit tier: needs %s (make test runs it)", what)
	}
}

// SkipInUnit skips tb in the unit tier for a reason other than a server:
// a test that builds or downloads modules, say, which is too slow for it.
func SkipInUnit(tb testing.TB, why string) {
	tb.Helper()
	if Unit() {
		tb.Skipf("unit tier: %s (make test runs it)", why)
	}
}

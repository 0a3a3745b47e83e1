package systest

import (
	"fmt"
	"testing"

	"github.com/stockgate/stockgate/fleet"
	"github.com/stockgate/stockgate/internal/testenv/ledgerenv"
	"github.com/stockgate/stockgate/ledger"
)

// TwoPrimaries is the shape of a PostgreSQL ledger split over two
// primaries (package fleet), each on a server of its own: "main", which
// keeps the directory, and "p1".
const TwoPrimaries = "two-primaries"

// Shapes are the ledgers the model and fault tests run on: each driver,
// then PostgreSQL over two primaries.
var Shapes = append(append([]string{}, ledgerenv.Drivers...), TwoPrimaries)

// EachShape runs f as a subtest per ledger shape.
func EachShape(t *testing.T, f func(t *testing.T, shape string)) {
	for _, s := range Shapes {
		t.Run(s, func(t *testing.T) { f(t, s) })
	}
}

// NewLedger is a fresh, empty ledger of the shape, as the Options of the
// replicas that share it (Driver, DSN and Primaries set).
func NewLedger(t *testing.T, shape string) Options {
	if shape != TwoPrimaries {
		return Options{Driver: shape, DSN: LedgerDSN(t, shape)}
	}
	urls := ledgerenv.PostgresURLs(t, 2)
	return Options{Driver: ledger.Postgres, DSN: urls[0], Primaries: urls[1:]}
}

// PrimaryName is the name Start gives the i-th of Options.Primaries.
func PrimaryName(i int) string { return fmt.Sprintf("p%d", i+1) }

func primaries(dsns []string) []fleet.Primary {
	var out []fleet.Primary
	for i, dsn := range dsns {
		out = append(out, fleet.Primary{Name: PrimaryName(i), Ledger: ledger.Options{Driver: ledger.Postgres, DSN: dsn}})
	}
	return out
}

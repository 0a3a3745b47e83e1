package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stockgate/stockgate/ledger"
)

// TestCommitRefused: a COMMIT the server refused with an ERROR is
// certainly rolled back; a lost link, a timeout and a FATAL (the server
// may have committed before it ended) are not.
func TestCommitRefused(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"serialization failure", &pgconn.PgError{Severity: "ERROR", Code: "40001"}, true},
		{"disk full, wrapped", fmt.Errorf("commit: %w", &pgconn.PgError{Severity: "ERROR", Code: "53100"}), true},
		{"localized", &pgconn.PgError{Severity: "FEHLER", SeverityUnlocalized: "ERROR", Code: "40001"}, true},
		{"terminated", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}, false},
		{"an old PgBouncer's disconnect", &pgconn.PgError{Severity: "ERROR", Code: "08P01"}, false},
		{"a query cancelled", &pgconn.PgError{Severity: "ERROR", Code: "57014"}, false},
		{"link reset", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, false},
		{"deadline", context.DeadlineExceeded, false},
	}
	for _, c := range cases {
		if got := ledger.CommitRefused(c.err); got != c.want {
			t.Errorf("%s: refused = %v; want %v", c.name, got, c.want)
		}
	}
}

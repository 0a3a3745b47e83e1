package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/stockgate/stockgate/keys"
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

// TestNoPrimary: a write that found no server taking writes before it
// wrote anything (a connection refused, a session ended by a shutdown, a
// read-only one) is one to send again once a primary takes writes; a
// COMMIT whose reply was lost, a refusal, and a connect that ran out of
// time are not.
func TestNoPrimary(t *testing.T) {
	notCommitted := func(err error) error { return fmt.Errorf("ledger: take: %w: %w", ledger.ErrNotCommitted, err) }
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: refused
	_, refused := pgconn.Connect(t.Context(), "postgres://u@"+addr+"/db?sslmode=disable")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, canceled := pgconn.Connect(ctx, "postgres://u@"+addr+"/db?sslmode=disable")
	tooMany := refusedAtStartup(t, "53300")  // an overloaded server: answered, not waited out
	shutdown := refusedAtStartup(t, "57P03") // a server starting or shutting down in a failover
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", notCommitted(refused), true},
		{"admin shutdown at begin", notCommitted(&pgconn.PgError{Severity: "FATAL", Code: "57P01"}), true},
		{"cannot connect now", notCommitted(&pgconn.PgError{Severity: "FATAL", Code: "57P03"}), true},
		{"read-only transaction", notCommitted(&pgconn.PgError{Severity: "ERROR", Code: "25006"}), true},
		{"admin shutdown at COMMIT", fmt.Errorf("ledger: take: commit: %w", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}), false},
		{"unique violation", notCommitted(&pgconn.PgError{Severity: "ERROR", Code: "23505"}), false},
		{"connect canceled", notCommitted(canceled), false},
		{"too many clients at connect", notCommitted(tooMany), false},
		{"cannot connect now, at connect", notCommitted(shutdown), true},
		{"not committed, no cause", ledger.ErrNotCommitted, false},
		{"nil", nil, false},
	} {
		if got := ledger.NoPrimary(tc.err); got != tc.want {
			t.Errorf("%s: NoPrimary(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// refusedAtStartup is the error pgconn.Connect returns from a server that
// answers its startup with a FATAL error of code: a listener on loopback
// that reads the startup message and writes that ErrorResponse.
func refusedAtStartup(t *testing.T, code string) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan struct{})
	go func() { // owned by this call: one connection, then it ends
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 1024)
		if _, err := c.Read(buf); err != nil {
			return
		}
		msg, _ := (&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: code, Message: "refused"}).Encode(nil)
		_, _ = c.Write(msg)
	}()
	_, err = pgconn.Connect(t.Context(), "postgres://u@"+ln.Addr().String()+"/db?sslmode=disable")
	<-served
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != code {
		t.Fatalf("connecting to a server that refuses with %s = %v, want that error", code, err)
	}
	return err
}

// TestReadOnlySessionIsThrownAway: a pooled connection whose session
// takes no writes (behind a PgBouncer whose server became a standby in a
// failover) fails its write with 25006, a NoPrimary the caller sends
// again; the connection is then thrown away, so the write sent again
// commits on a fresh session instead of failing on the same one for as
// long as the pool keeps it (TestFaultLedgerFailover in CI: a replica
// behind PgBouncer answered 503 for 30 s after a planned failover).
func TestReadOnlySessionIsThrownAway(t *testing.T) {
	ls, _, _ := openLedgers(t, ledger.Postgres, 1)
	l, ctx := ls[0], t.Context()
	if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	db := l.DB()
	db.SetMaxOpenConns(1) // the one pooled session is the one every write gets
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecContext(ctx, "SET SESSION default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	c.Close() // back to the pool, read-only
	buy := func(key string) error {
		o := ledger.Order{IdempotencyKey: keys.MustID(key), SKU: sku, Buyer: keys.MustID("ann"), Quantity: 1,
			Req: req("ann", key, "f", ledger.OpPurchase)}
		return l.Commit(ctx, []ledger.Take{ledger.PurchaseTake(o)}, true)[0].Err
	}
	if err := buy("ro-1"); !ledger.NoPrimary(err) {
		t.Fatalf("a write on the read-only session = %v, want a NoPrimary error", err)
	}
	if err := buy("ro-1"); err != nil {
		t.Fatalf("the same write sent again = %v, want it committed on a fresh session", err)
	}
}

package ledger

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// A write path that runs many statements per transaction pays for each
// round trip to PostgreSQL twice: a wait on the network, and a system call
// on both sides. The take engine (take.go) therefore sends a transaction's
// statements together: on PostgreSQL as one pipeline (pgx's batch, one
// write and one read), on SQLite one after another on its one connection,
// where a statement costs no round trip. Each statement reads its rows
// from one input relation of fixed text, so the statement's text does not
// change with the batch's size: pgx caches its description, SQLite
// prepares it once.

// resultRows is what a statement's rows are read through: pgx's and
// database/sql's rows both are.
type resultRows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// step is one statement of a transaction: its text, arguments and what
// reads its rows (nil: none are read).
type step struct {
	sql  string
	args []any
	read func(resultRows) error
}

// txRunner runs a transaction's steps together, then commits or rolls back
// as its caller decides.
type txRunner interface {
	// run runs steps in order in the runner's transaction, beginning it
	// on the first call. An error rolls it back.
	run(ctx context.Context, steps []step) error
	// end commits (or with commit false rolls back) the transaction run
	// began. A failed COMMIT wraps ErrNotCommitted when the failure
	// proves nothing landed (commitRefused); otherwise the outcome is
	// unknown.
	end(ctx context.Context, commit bool) error
	// close gives the connection back.
	close()
}

// runner opens a txRunner on a connection of the ledger's.
func (l *Ledger) runner(ctx context.Context) (txRunner, error) {
	if l.driver == Postgres {
		c, err := l.db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		return &pgRunner{conn: c, trips: l.trips}, nil
	}
	return &sqliteRunner{l: l}, nil
}

// pgRunner sends BEGIN and every step in one pipeline on one pgx
// connection, then COMMIT or ROLLBACK: two round trips for any number of
// statements.
type pgRunner struct {
	conn  *sql.Conn
	trips interface{ Inc() }
	open  bool // a transaction is open on conn
	bad   bool // conn's state is unknown: it is thrown away, not reused
}

func (r *pgRunner) raw(f func(c *pgx.Conn) error) error {
	return r.conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("ledger: not a pgx connection: %T", dc)
		}
		return f(sc.Conn())
	})
}

func (r *pgRunner) run(ctx context.Context, steps []step) error {
	return r.raw(func(c *pgx.Conn) error {
		b := &pgx.Batch{}
		begin := !r.open
		if begin {
			b.Queue("BEGIN")
		}
		for _, s := range steps {
			b.Queue(s.sql, s.args...)
		}
		br := c.SendBatch(ctx, b)
		r.trips.Inc()
		r.open = true
		err := func() error {
			if begin {
				if _, err := br.Exec(); err != nil {
					return fmt.Errorf("begin: %w", err)
				}
			}
			for i, s := range steps {
				rows, err := br.Query()
				if err != nil {
					return fmt.Errorf("statement %d: %w", i+1, err)
				}
				for s.read != nil && rows.Next() {
					if err := s.read(rows); err != nil {
						rows.Close()
						return fmt.Errorf("statement %d: %w", i+1, err)
					}
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					return fmt.Errorf("statement %d: %w", i+1, err)
				}
			}
			return nil
		}()
		if cerr := br.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			r.rollback(ctx, c)
			if readOnly(err) {
				// The session takes no writes: behind a PgBouncer whose
				// server became a standby in a failover, every
				// transaction on this client connection would. Thrown
				// away, the pool dials again, and target_session_attrs=
				// read-write finds the primary.
				r.bad = true
			}
		}
		return err
	})
}

// readOnly reports a write refused because the session is read-only
// (25006): a standby, or a server or session set read-only.
func readOnly(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "25006"
}

func (r *pgRunner) rollback(ctx context.Context, c *pgx.Conn) {
	r.trips.Inc()
	if _, err := c.Exec(context.WithoutCancel(ctx), "ROLLBACK"); err != nil {
		r.bad = true
	}
	r.open = false
}

func (r *pgRunner) end(ctx context.Context, commit bool) error {
	if !r.open {
		return nil
	}
	return r.raw(func(c *pgx.Conn) error {
		if !commit {
			r.rollback(ctx, c)
			return nil
		}
		r.open = false
		if err := ctx.Err(); err != nil {
			// Out of time before COMMIT was sent (a batch's deadline):
			// certainly not committed. The connection, its transaction
			// open, is thrown away, which rolls it back.
			r.bad = true
			return notCommitted("commit", err)
		}
		r.trips.Inc()
		if _, err := c.Exec(ctx, "COMMIT"); err != nil {
			r.bad = true
			if commitRefused(err) {
				return notCommitted("commit", err)
			}
			return err
		}
		return nil
	})
}

func (r *pgRunner) close() {
	if r.open || r.bad {
		// A connection whose transaction state is unknown never goes back
		// to the pool.
		_ = r.conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	r.conn.Close()
}

// sqliteRunner runs the steps one by one in a database/sql transaction,
// each statement prepared once for the ledger's life.
type sqliteRunner struct {
	l  *Ledger
	tx *sql.Tx
}

func (r *sqliteRunner) run(ctx context.Context, steps []step) error {
	if r.tx == nil {
		// Prepare before BEGIN: preparing needs the one connection, which
		// the transaction then holds.
		for i, s := range steps {
			if _, err := r.l.stmts.get(ctx, s.sql); err != nil {
				return fmt.Errorf("prepare statement %d: %w", i+1, err)
			}
		}
		tx, err := r.l.db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		r.tx = tx
	}
	for i, s := range steps {
		var st *sql.Stmt
		if p, ok := r.l.stmts.cached(s.sql); ok {
			st = r.tx.StmtContext(ctx, p)
		} else {
			// Inside the transaction: prepared on its connection, for it.
			p, err := r.tx.PrepareContext(ctx, s.sql)
			if err != nil {
				_ = r.end(ctx, false) // the failure returned says more than the rollback's
				return fmt.Errorf("prepare statement %d: %w", i+1, err)
			}
			st = p
		}
		rows, err := st.QueryContext(ctx, s.args...)
		if err == nil {
			for s.read != nil && rows.Next() {
				if err = s.read(rows); err != nil {
					break
				}
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if err != nil {
			_ = r.end(ctx, false) // the failure returned says more than the rollback's
			return fmt.Errorf("statement %d: %w", i+1, err)
		}
	}
	return nil
}

func (r *sqliteRunner) end(_ context.Context, commit bool) error {
	if r.tx == nil {
		return nil
	}
	tx := r.tx
	r.tx = nil
	if !commit {
		return tx.Rollback()
	}
	if err := tx.Commit(); err != nil {
		// SQLite runs in this process: a COMMIT that returns an error
		// (the disk full, the file read-only, the context done before it
		// began) rolled back. Nothing is in flight elsewhere.
		return notCommitted("commit", err)
	}
	return nil
}

func (r *sqliteRunner) close() {
	if r.tx != nil {
		r.tx.Rollback()
	}
}

// A rowset is the input of one statement: rows of text and bigint
// columns. On PostgreSQL it travels as one array per column, unpacked by
// unnest; on SQLite as one JSON array of rows, unpacked by json_each.
type rowset struct {
	kinds []byte // 't' text, 'i' bigint, per column
	texts [][]string
	ints  [][]int64
	n     int
}

func newRowset(kinds string) *rowset {
	r := &rowset{kinds: []byte(kinds), texts: make([][]string, len(kinds)), ints: make([][]int64, len(kinds))}
	return r
}

// add appends a row; each value is a string or an int64, in column order.
func (r *rowset) add(vals ...any) {
	if len(vals) != len(r.kinds) {
		panic(fmt.Sprintf("ledger: a row of %d values for %d columns", len(vals), len(r.kinds)))
	}
	for i, v := range vals {
		switch r.kinds[i] {
		case 't':
			r.texts[i] = append(r.texts[i], v.(string))
		default:
			r.ints[i] = append(r.ints[i], v.(int64))
		}
	}
	r.n++
}

// args are the statement arguments that carry the rows, after the
// statement's own: one per column on PostgreSQL, one JSON text on SQLite.
func (r *rowset) args(d string) []any {
	if d == Postgres {
		out := make([]any, len(r.kinds))
		for i, k := range r.kinds {
			if k == 't' {
				out[i] = r.texts[i]
			} else {
				out[i] = r.ints[i]
			}
		}
		return out
	}
	var b []byte
	b = append(b, '[')
	for row := range r.n {
		if row > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		for i, k := range r.kinds {
			if i > 0 {
				b = append(b, ',')
			}
			if k == 't' {
				b = appendJSONString(b, r.texts[i][row])
			} else {
				b = strconv.AppendInt(b, r.ints[i][row], 10)
			}
		}
		b = append(b, ']')
	}
	b = append(b, ']')
	return []any{string(b)}
}

// appendJSONString appends s as a JSON string. Ids need no escaping;
// stored answers (JSON themselves) go through encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// rowsFrom is the FROM item of a statement's input rows, named alias, with
// columns "name text" or "name bigint"; first is the number of the first
// parameter that carries them (after the statement's own).
func rowsFrom(d, alias string, first int, cols ...string) string {
	var b strings.Builder
	if d == Postgres {
		b.WriteString("unnest(")
		names := make([]string, len(cols))
		for i, c := range cols {
			name, typ, _ := strings.Cut(c, " ")
			names[i] = name
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "$%d::%s[]", first+i, typ)
		}
		fmt.Fprintf(&b, ") AS %s(%s)", alias, strings.Join(names, ", "))
		return b.String()
	}
	b.WriteString("(SELECT ")
	for i, c := range cols {
		name, _, _ := strings.Cut(c, " ")
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "value->>%d AS %s", i, name)
	}
	fmt.Fprintf(&b, " FROM json_each($%d)) AS %s", first, alias)
	return b.String()
}

// commitRefused reports a PostgreSQL COMMIT failure that proves the
// transaction did not commit: the server refused it with an ERROR (a
// serialization failure, a deferred constraint, no space left), which it
// sends only before the commit record is written. A lost link, a timeout
// or a FATAL leaves it unknown: the server may have committed, and a
// COMMIT still waiting for a synchronous standby lands after its client
// gave up. pgconn.SafeToRetry is no proof here: with the COMMIT's reply
// lost, pgx v5.12 answered "conn closed", safe to retry, for COMMITs
// that had landed (TestFaultLedgerCommitReplyLost).
//
// PgBouncer before 1.16 sends its own disconnects ("server conn
// crashed?") as ERROR: connection exceptions (class 08), operator
// intervention (57), system (58) and internal (XX) errors stay unknown.
func commitRefused(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code[:min(2, len(pe.Code))] {
	case "08", "57", "58", "XX":
		return false
	}
	return cmp.Or(pe.SeverityUnlocalized, pe.Severity) == "ERROR"
}

// isRetryable reports a PostgreSQL failure that rolled the transaction
// back and that running it again may not meet: a deadlock or a
// serialization failure.
func isRetryable(err error) bool {
	var pe interface{ SQLState() string }
	if errors.As(err, &pe) {
		switch pe.SQLState() {
		case "40P01", "40001":
			return true
		}
	}
	return false
}

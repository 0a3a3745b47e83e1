package ledger

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"reflect"
	"strings"
)

// SQLite parses a statement's text on every call unless the statement
// stays prepared, and database/sql, given a query and its arguments,
// prepares it, runs it and throws it away. The take path and the loops
// keep theirs prepared (stmts, sqliteRunner); the rest, a hold's confirm,
// a refund, the sweeper's transactions, parsed each statement every time:
// 14 % of the CPU of a SQLite model run (TestModelConcurrent/sqlite,
// 1,000 operations, -race). So each SQLite connection keeps the
// statements it ran prepared, by text, as pgx does on PostgreSQL.

// stmtCacheSize bounds a connection's prepared statements. The ledger's
// texts are constants (a batch's statements read fixed-text relations),
// a few hundred at most; past the bound the idle ones are dropped.
const stmtCacheSize = 512

// stmtCacheConnector opens SQLite connections that keep their statements
// prepared.
type stmtCacheConnector struct {
	dsn string
	drv driver.Driver
}

// newSQLiteDB is sql.Open("sqlite", dsn) with connections that keep their
// statements prepared.
func newSQLiteDB(dsn string) *sql.DB {
	return sql.OpenDB(stmtCacheConnector{dsn: dsn, drv: sqliteDriver})
}

// sqliteDriver is modernc's registered driver (sql.Open connects to
// nothing).
var sqliteDriver = func() driver.Driver {
	db, _ := sql.Open("sqlite", "")
	defer db.Close()
	return db.Driver()
}()

func (c stmtCacheConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &stmtCacheConn{conn: conn.(sqliteConn), stmts: map[string]*cachedStmt{}}, nil
}

func (c stmtCacheConnector) Driver() driver.Driver { return c.drv }

// sqliteConn is what database/sql uses of modernc's connection.
type sqliteConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
}

// stmtCacheConn is a SQLite connection whose queries and executions run
// through statements it keeps prepared. database/sql never uses one
// connection from two goroutines at once (a Rows' Close included), so
// it needs no lock.
type stmtCacheConn struct {
	conn  sqliteConn
	stmts map[string]*cachedStmt
}

type cachedStmt struct {
	st   driver.Stmt
	busy bool // its rows are open: a nested query of the same text prepares its own
}

// stmt is query's statement and whether it is the cache's; a text whose
// statement is busy, or a script of several, gets one of its own, which
// the caller closes.
func (c *stmtCacheConn) stmt(ctx context.Context, query string) (*cachedStmt, bool, error) {
	if cs, ok := c.stmts[query]; ok && !cs.busy {
		return cs, true, nil
	}
	st, err := c.conn.PrepareContext(ctx, query)
	if err != nil {
		return nil, false, err
	}
	cs := &cachedStmt{st: st}
	if _, taken := c.stmts[query]; taken || strings.Contains(strings.TrimRight(query, "; \n\t"), ";") {
		return cs, false, nil
	}
	if len(c.stmts) >= stmtCacheSize {
		// A statement SQLite fails to finalize is gone from the cache
		// all the same; the query at hand does not depend on it.
		_ = c.drop(false)
	}
	c.stmts[query] = cs
	return cs, true, nil
}

// drop closes the cached statements (only the idle ones unless all).
func (c *stmtCacheConn) drop(all bool) error {
	var first error
	for q, cs := range c.stmts {
		if cs.busy && !all {
			continue
		}
		if err := cs.st.Close(); err != nil && first == nil {
			first = err
		}
		delete(c.stmts, q)
	}
	return first
}

func (c *stmtCacheConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	cs, cached, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	rows, err := cs.st.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		if !cached {
			cs.st.Close()
		}
		return nil, err
	}
	cs.busy = true
	return &cachedRows{Rows: rows, cs: cs, own: !cached}, nil
}

func (c *stmtCacheConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	cs, cached, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if !cached {
		defer cs.st.Close()
	}
	return cs.st.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (c *stmtCacheConn) Prepare(query string) (driver.Stmt, error) { return c.conn.Prepare(query) }
func (c *stmtCacheConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.conn.PrepareContext(ctx, query)
}
func (c *stmtCacheConn) Begin() (driver.Tx, error) { return c.conn.Begin() } //nolint:staticcheck // driver.Conn requires it
func (c *stmtCacheConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.conn.BeginTx(ctx, opts)
}
func (c *stmtCacheConn) Ping(ctx context.Context) error         { return c.conn.Ping(ctx) }
func (c *stmtCacheConn) ResetSession(ctx context.Context) error { return c.conn.ResetSession(ctx) }
func (c *stmtCacheConn) IsValid() bool                          { return c.conn.IsValid() }

// Close finalizes the statements, then closes the connection: SQLite
// refuses to close one with statements left.
func (c *stmtCacheConn) Close() error {
	err := c.drop(true)
	if cerr := c.conn.Close(); cerr != nil {
		err = cerr
	}
	return err
}

// cachedRows frees its statement for the next call when closed (modernc
// resets a prepared statement's rows on Close).
type cachedRows struct {
	driver.Rows
	cs     *cachedStmt
	own    bool // the statement is this query's alone: closed with it
	closed bool
}

func (r *cachedRows) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	err := r.Rows.Close()
	r.cs.busy = false
	if r.own {
		if cerr := r.cs.st.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// The column type reports of modernc's rows, kept for sql.Rows.ColumnTypes.
func (r *cachedRows) ColumnTypeDatabaseTypeName(i int) string {
	if t, ok := r.Rows.(driver.RowsColumnTypeDatabaseTypeName); ok {
		return t.ColumnTypeDatabaseTypeName(i)
	}
	return ""
}

func (r *cachedRows) ColumnTypeScanType(i int) reflect.Type {
	if t, ok := r.Rows.(driver.RowsColumnTypeScanType); ok {
		return t.ColumnTypeScanType(i)
	}
	return reflect.TypeFor[any]()
}

func (r *cachedRows) ColumnTypeNullable(i int) (nullable, ok bool) {
	if t, ok := r.Rows.(driver.RowsColumnTypeNullable); ok {
		return t.ColumnTypeNullable(i)
	}
	return false, false
}

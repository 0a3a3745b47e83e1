package ledger

import (
	"context"
	"database/sql"
	"errors"
	"sync"
)

// stmts keeps the queries repeated with only their arguments changing (the
// sweeper's, every SweepEvery on every replica; the pacer's and the
// waiting room's reads of a program; the relay's polls; the read of a
// SKU) prepared, on SQLite only. SQLite parses a
// query's text on every call, and that parsing was half the CPU of a test
// that sweeps every 50 ms on two replicas (TestModel on SQLite, under the
// race detector). PostgreSQL needs none of it: pgx caches each statement's
// description itself, and a named prepared statement would not survive
// PgBouncer's transaction pooling.
type stmts struct {
	mu sync.Mutex
	db *sql.DB
	m  map[string]*sql.Stmt
}

func newStmts(db *sql.DB) *stmts { return &stmts{db: db, m: map[string]*sql.Stmt{}} }

// get is q prepared, preparing it on first use. It prepares outside the
// lock: preparing waits for SQLite's one connection, which a long
// transaction may hold, and the other queries must not wait behind it.
func (s *stmts) get(ctx context.Context, q string) (*sql.Stmt, error) {
	s.mu.Lock()
	st, ok := s.m[q]
	s.mu.Unlock()
	if ok {
		return st, nil
	}
	st, err := s.db.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if first, ok := s.m[q]; ok { // prepared meanwhile by another caller
		st.Close()
		return first, nil
	}
	s.m[q] = st
	return st, nil
}

// cached is q if it was prepared already.
func (s *stmts) cached(q string) (*sql.Stmt, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.m[q]
	return st, ok
}

// close closes every prepared statement; get must not be called after.
func (s *stmts) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for q, st := range s.m {
		errs = append(errs, st.Close())
		delete(s.m, q)
	}
	return errors.Join(errs...)
}

// queryRepeated runs q, a query a loop repeats with only its arguments
// changing: prepared once on SQLite, as it is on PostgreSQL.
func (l *Ledger) queryRepeated(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if l.stmts == nil {
		return l.db.QueryContext(ctx, q, args...)
	}
	st, err := l.stmts.get(ctx, q)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// queryRowRepeated is queryRepeated for one row.
func (l *Ledger) queryRowRepeated(ctx context.Context, q string, args ...any) rowScanner {
	if l.stmts == nil {
		return l.db.QueryRowContext(ctx, q, args...)
	}
	st, err := l.stmts.get(ctx, q)
	if err != nil {
		return errRow{err}
	}
	return st.QueryRowContext(ctx, args...)
}

// errRow is a row whose query could not run.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

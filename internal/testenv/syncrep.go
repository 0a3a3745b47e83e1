package testenv

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"testing"
	"time"
)

// SyncPostgres is a PostgreSQL server of the test's own, a fresh database
// on it whose sessions commit as a production primary's do
// (synchronous_commit on; the shared test servers commit without
// waiting), and Raw, a superuser's connection to that database.
type SyncPostgres struct {
	DSN string
	Raw *sql.DB
}

// NewSyncPostgres starts a SyncPostgres and stops it when t ends.
func NewSyncPostgres(t testing.TB) *SyncPostgres {
	t.Helper()
	needsServer(t, "PostgreSQL with a synchronous standby")
	ctx := context.Background()
	pg, err := StartOwnPostgres(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Stop)
	dsn, drop, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	dsn = withParam(dsn, "synchronous_commit", "on")
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	return &SyncPostgres{DSN: dsn, Raw: raw}
}

// Standby sets the server's synchronous standby names (SetSyncStandby):
// "nobody" names one that never answers, "" none.
func (p *SyncPostgres) Standby(t testing.TB, names string) {
	t.Helper()
	if err := SetSyncStandby(context.Background(), p.Raw, names); err != nil {
		t.Fatal(err)
	}
}

// SetSyncStandby sets the server's synchronous_standby_names to names
// through db (a superuser's connection to a server of the test's own)
// and returns once commits follow it: with names set, a probe write's
// COMMIT waits for the standby (its backend is then ended); with none,
// a probe commits. A reload reaches the process that decides whether
// commits wait (the checkpointer) in its own time, later on a busy
// machine, so a test that acted straight after pg_reload_conf raced it.
func SetSyncStandby(ctx context.Context, db *sql.DB, names string) error {
	// The probe's table first: created once the setting is in force, its
	// own COMMIT would wait for the standby for ever.
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS sync_probe (at bigint)`); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `ALTER SYSTEM SET synchronous_standby_names = '`+names+`'`); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `SELECT pg_reload_conf()`); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		waits, err := probeWaits(ctx, db)
		if err != nil {
			return err
		}
		if waits == (names != "") {
			return nil
		}
		time.Sleep(50 * time.Millisecond) // poll interval: the reload still on its way
	}
	return fmt.Errorf("synchronous_standby_names = %q not in force within 30 s", names)
}

// probeWaits writes a row and reports whether its COMMIT waited for a
// synchronous standby (seen in pg_stat_activity; the waiting backend is
// ended, its row committed locally) or committed within 2 s.
//
// The probe writes on a connection of its own, ended by its pid and then
// thrown away. Found by its query text on any of db's connections, as
// before, a reload that released the wait between the look and the end
// had the end strike the connection idle: the probe answered no error,
// and the next statement on that pooled connection (a test's clean-up)
// failed with 57P01 (a make test beside a busy loop,
// TestRequestDurableWaitsForTheStandby).
func probeWaits(ctx context.Context, db *sql.DB) (waited bool, err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return false, err
	}
	var pid int
	if err := conn.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		_ = conn.Close()
		return false, err
	}
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	var insertErr error // the INSERT's, once done is closed
	done := make(chan struct{})
	go func() { // owned by probeWaits: it waits for it before returning
		defer close(done)
		_, insertErr = conn.ExecContext(pctx, `INSERT INTO sync_probe VALUES ($1)`, time.Now().UnixNano())
	}()
	ended := false
	defer func() {
		cancel()
		<-done     // closed: a second receive returns at once
		if ended { // a backend ended: never hand its connection to the pool
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		_ = conn.Close()
	}()
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		select {
		case <-done:
			return false, insertErr
		case <-time.After(20 * time.Millisecond):
		}
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE wait_event = 'SyncRep' AND pid = $1`, pid).Scan(&n); err != nil {
			return false, err
		}
		if n > 0 {
			// Ended in its wait, or (no error) released by a reload as it
			// was ended: either way it waited, so the standby setting was
			// in force when it began.
			ended = true
			return true, nil
		}
	}
	return false, nil // a commit slower than 2 s without a standby's wait: ask again
}

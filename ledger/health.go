package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"
)

// ErrReadOnly is Health's answer for a ledger that takes no writes: a
// PostgreSQL standby (the old primary after a failover, or a DSN naming a
// replica) or server set read-only, or a SQLite file that may not be
// written (immutable, on a read-only mount, or on a disk about full).
var ErrReadOnly = errors.New("ledger: the server takes no writes")

// sqliteMinFree is the free space below which a SQLite ledger's disk is
// called full: a commit then fails with SQLITE_FULL (503, nothing
// written) when the WAL can grow no more, so the replica says so before
// a buyer finds out. A sale's commit writes a few pages; a MiB is a few
// seconds of the fastest sale, and well under what any volume runs with.
const sqliteMinFree = 1 << 20

// NoPrimary reports a write that failed before anything was written
// because no server it reached takes writes: what a PostgreSQL failover
// looks like from the client. The old primary ends its sessions
// (57P01-57P03) and refuses connections, the standby accepts none with
// target_session_attrs=read-write (or runs no write: 25006), until the
// standby is promoted, about a second and a half in a planned failover of
// pg_auto_failover (stockbench faults). The same write may then commit on
// the new primary: a caller with time left waits and sends it again. A
// COMMIT whose reply was lost is not one (its outcome is unknown), nor a
// write that timed out (a slow or cut link), nor anything on SQLite.
func NoPrimary(err error) bool {
	if !errors.Is(err, ErrNotCommitted) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// A server's own refusal, connecting or not, is a failover's only
		// when it says so: too many clients (53300), a password refused
		// or a TLS error is not waited out, it is answered (an overloaded
		// server's refusals taken for a failover made the commit lanes
		// patient, and its overload waited out instead of shed).
		return failoverCode(pe.Code)
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) { // refused, or a standby under target_session_attrs=read-write
		return !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
	}
	return false
}

// failoverCode reports a PostgreSQL error code a failover answers with:
// admin or crash shutdown, cannot connect now, read-only transaction.
func failoverCode(code string) bool {
	switch code {
	case "57P01", "57P02", "57P03", "25006":
		return true
	}
	return false
}

// Durability is what a COMMIT the ledger acknowledges survives.
type Durability struct {
	// Synchronous: PostgreSQL waits for a standby to have each commit
	// (synchronous_standby_names set, synchronous_commit on, remote_write
	// or remote_apply), so a failover to that standby loses none. False
	// on SQLite and on a primary without a synchronous standby: a
	// failover may lose acknowledged commits.
	Synchronous bool
	Standbys    string // synchronous_standby_names
	Commit      string // synchronous_commit
}

// healthDB is the one connection Health asks through, apart from the
// pool: a check queued behind a busy pool's writers (or a slow link's)
// said "no answer" of a ledger that was selling, and took every replica
// out of the load balancer at the peak.
type healthDB struct {
	once sync.Once
	db   *sql.DB
	err  error
}

// Health reports whether the ledger can take writes now (nil, or why
// not: the server unreachable, or ErrReadOnly) and what its commits
// survive, in one round trip on a connection of its own; it writes
// nothing. SQLite is a file in this process: Health asks the kernel
// whether the file, its WAL and their directory may be written (an
// immutable file, a read-only mount), never the one connection, behind
// whose writers a check would queue.
func (l *Ledger) Health(ctx context.Context) (Durability, error) {
	if l.driver != Postgres {
		return Durability{}, sqliteWritable(l.dsn)
	}
	l.health.once.Do(func() {
		l.health.db, l.health.err = openPostgres(l.dsn)
		if l.health.err == nil {
			l.health.db.SetMaxOpenConns(1)
			l.health.db.SetMaxIdleConns(1)
			l.health.db.SetConnMaxLifetime(time.Hour)
		}
	})
	if l.health.err != nil {
		return Durability{}, fmt.Errorf("ledger: health: %w", l.health.err)
	}
	var d Durability
	var standby bool
	var readOnly string
	if err := l.health.db.QueryRowContext(ctx, `SELECT pg_is_in_recovery(), current_setting('transaction_read_only'),
		current_setting('synchronous_standby_names'), current_setting('synchronous_commit')`).
		Scan(&standby, &readOnly, &d.Standbys, &d.Commit); err != nil {
		return d, fmt.Errorf("ledger: health: %w", err)
	}
	switch {
	case standby:
		return d, fmt.Errorf("%w: a standby (in recovery)", ErrReadOnly)
	case readOnly == "on":
		return d, fmt.Errorf("%w: transaction_read_only is on", ErrReadOnly)
	}
	switch d.Commit {
	case "on", "remote_write", "remote_apply":
		d.Synchronous = d.Standbys != ""
	}
	return d, nil
}

func (h *healthDB) close() error {
	if h.db == nil {
		return nil
	}
	return h.db.Close()
}

// sqliteWritable is nil when the SQLite ledger at path may be written: the
// file and its WAL (when there is one) and the directory that holds them
// (SQLite creates its journal and shared-memory files there). access(2)
// refuses writes to an immutable file or on a read-only mount even to
// root, as SQLite's own writes are refused. A disk with under
// sqliteMinFree free is refused too: access(2) does not see it full. An
// in-memory database is always writable.
func sqliteWritable(path string) error {
	if path == ":memory:" || strings.Contains(path, "mode=memory") {
		return nil
	}
	path, _, _ = strings.Cut(strings.TrimPrefix(path, "file:"), "?")
	for _, p := range []string{path, path + "-wal", filepath.Dir(path)} {
		err := unix.Access(p, unix.W_OK)
		if p == path+"-wal" && errors.Is(err, os.ErrNotExist) {
			continue // no WAL yet (or checkpointed away)
		}
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrReadOnly, p, err)
		}
	}
	// The error names no byte count: the health loop logs each change of
	// it.
	if free, ok := diskFree(filepath.Dir(path)); ok && free < sqliteMinFree {
		return fmt.Errorf("%w: the disk holding %s has under %d bytes free", ErrReadOnly, path, sqliteMinFree)
	}
	return nil
}

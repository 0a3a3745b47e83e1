// Package ledger is the truth about stock: SKU rows with total, sold, held
// and a version, and orders with a unique idempotency key. Every sale the
// Redis gate admits is committed here with a conditional update, and that
// update, not Redis, is what keeps sold + held <= total.
//
// The same SQL runs on PostgreSQL (pgx, production) and on an embedded
// SQLite file (modernc.org/sqlite, pure Go, the zero-setup default). The
// package knows nothing of Redis or HTTP.
package ledger

import (
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// Errors of this package; stock outcomes use package stock's errors.
var (
	ErrNotFound  = errors.New("ledger: not found")
	ErrDuplicate = errors.New("ledger: idempotency key already used")
	// ErrConflict: an optimistic purchase found the SKU row's version moved
	// since it was read. Nothing was written; read again and retry.
	ErrConflict = errors.New("ledger: version conflict")
	// ErrNotCommitted wraps a write failure that happened before COMMIT was
	// sent, or a COMMIT the database refused (SQLite's any failure,
	// PostgreSQL's ERROR): the transaction is certainly rolled back. A
	// failure without it (a COMMIT whose reply was lost) leaves the
	// outcome unknown until it is looked up, and a lookup that finds
	// nothing proves nothing while the COMMIT may still be running.
	ErrNotCommitted = errors.New("ledger: not committed")
	// ErrStaleGate: a request the Redis gate admitted under an epoch that
	// a rebuild has since closed. Nothing was written: the rebuild counted
	// the ledger without it, and its Redis stock went with the old gate.
	// Take again through the new gate.
	ErrStaleGate = errors.New("ledger: admitted by a gate since rebuilt")
)

// Drivers.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
)

// ErrSchema is Open on a ledger whose schema this build cannot run on:
// older than its minimum (with NoMigrate), or past a contract step that
// builds as old as this one predate. The wrapping error says which.
var ErrSchema = errors.New("ledger: schema")

// Ledger is an open ledger database.
type Ledger struct {
	db      *sql.DB
	release func() error
	driver  string
	now     func() time.Time
	commits *prometheus.CounterVec
	latency *prometheus.HistogramVec
	batch   prometheus.Histogram
	trips   prometheus.Counter // round trips of the take and confirm batches (PostgreSQL)
	horizon horizon            // the relay's notes toward SettledSeq
	stmts   *stmts             // SQLite: the loops' repeated queries, prepared; nil on PostgreSQL
	sql     takeSQL            // the take engine's statements in this driver's dialect
	id      keys.ID            // see ID
	schema  Schema             // see Schema
	build   schemaSteps        // the migrations this build knows: thisBuild but in tests
	dsn     string             // PostgreSQL: what migrations connect to, apart from the pool; SQLite: the file
	health  healthDB           // PostgreSQL: Health's own connection
	settled settleCursor       // where SettleDue's round of listed SKUs goes on from
}

// forUpdate is " FOR UPDATE" on PostgreSQL: a read that locks its rows
// (SQLite's one writer needs none).
func (l *Ledger) forUpdate() string {
	if l.driver == Postgres {
		return " FOR UPDATE"
	}
	return ""
}

// ID is the ledger's own id: the same for every replica of one ledger,
// another for any other ledger.
func (l *Ledger) ID() keys.ID { return l.id }

// observe counts one write and its time; deferred with the named error.
func (l *Ledger) observe(op string, start time.Time, err *error) {
	result := "ok"
	switch e := *err; {
	case e == nil:
	case errors.Is(e, ErrDuplicate):
		result = "duplicate"
	case errors.Is(e, stock.ErrSoldOut), errors.Is(e, stock.ErrLimit), errors.Is(e, stock.ErrSaleEnded),
		errors.Is(e, ErrConflict), errors.Is(e, ErrHoldEnded), errors.Is(e, ErrNotOwner), errors.Is(e, ErrNotFound),
		errors.Is(e, stock.ErrUnknownSKU), errors.Is(e, stock.ErrInvalid), errors.Is(e, ErrKeyReused),
		errors.Is(e, ErrStaleGate), errors.Is(e, ErrHoldConfirmed), errors.Is(e, ErrCodeInvalid), errors.Is(e, ErrCodeUsedUp),
		errors.Is(e, ErrInCart), errors.Is(e, ErrPoolClosed):
		result = "refused"
	default:
		result = "error"
	}
	l.commits.WithLabelValues(op, result).Inc()
	l.latency.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

// ErrSeatedTake refuses counted units of a seated ticket: it sells its
// seats only. It is a sold-out (the ticket has no counted stock) for the
// paths that do not tell it apart; a replica whose settings predate the
// seat map meets it for as long as they are cached.
var ErrSeatedTake = fmt.Errorf("%w: a seated ticket sells seats, not counted units", stock.ErrSoldOut)

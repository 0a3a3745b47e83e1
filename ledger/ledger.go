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
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/stockgate/stockgate/internal/opt"
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
	// sent: the transaction is certainly rolled back. A failure without it
	// (at COMMIT itself) leaves the outcome unknown until it is looked up.
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

// Options configures Open.
type Options struct {
	// Driver is SQLite or Postgres. Required.
	Driver string
	// DSN is the SQLite file path, or the PostgreSQL URL. Required.
	DSN string
	// MaxConns caps open connections on PostgreSQL. Default 32. SQLite
	// always uses one: it has a single writer, and one connection queues
	// writers in Go instead of failing them with SQLITE_BUSY.
	MaxConns int
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Metrics receives commit counts and durations by operation. Optional.
	Metrics prometheus.Registerer
	// NoMigrate runs no DDL, so the serving role needs no DDL rights:
	// `stockgate migrate` applies the schema first. It opens a ledger whose
	// schema this build runs on (see Schema.Serves), ErrSchema otherwise.
	NoMigrate bool
}

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
	dsn     string             // PostgreSQL: what migrations connect to, apart from the pool
}

// DefaultOptions are the settings a zero field takes.
func DefaultOptions() Options { return Options{Driver: SQLite, MaxConns: 32} }

// Validate reports the first field that cannot work (an *opt.Error).
func (o Options) Validate() error {
	switch {
	case o.Driver != "" && o.Driver != SQLite && o.Driver != Postgres:
		return opt.Bad("Driver", "must be sqlite or postgres")
	case o.DSN == "":
		return opt.Bad("DSN", "is required")
	case o.MaxConns < 0:
		return opt.Bad("MaxConns", "must be at least 1")
	}
	return nil
}

// Open connects, creates the schema when missing, and returns the ledger.
func Open(ctx context.Context, opts Options) (*Ledger, error) {
	return open(ctx, opts, thisBuild)
}

func open(ctx context.Context, opts Options, build schemaSteps) (*Ledger, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	opt.Fill(&opts.MaxConns, DefaultOptions().MaxConns)
	opt.Fill(&opts.Driver, DefaultOptions().Driver)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	var db *sql.DB
	var err error
	var release func() error // closes db, or gives back a shared SQLite file
	switch opts.Driver {
	case SQLite:
		db, release, err = openSQLite(opts.DSN)
	case Postgres:
		db, err = openPostgres(opts.DSN)
		if err == nil {
			db.SetMaxOpenConns(opts.MaxConns)
			db.SetMaxIdleConns(opts.MaxConns)
			release = db.Close
		}
	default:
		return nil, fmt.Errorf("ledger: unknown driver %q (want %q or %q)", opts.Driver, SQLite, Postgres)
	}
	if err != nil {
		return nil, fmt.Errorf("ledger: open: %w", err)
	}
	l := &Ledger{db: db, release: release, driver: opts.Driver, now: opts.Now, dsn: opts.DSN,
		commits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockgate_ledger_writes_total",
			Help: "Ledger write transactions by operation and result (ok, duplicate, refused, error). A group-committed batch counts once.",
		}, []string{"op", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stockgate_ledger_write_duration_seconds",
			Help:    "Ledger write transaction time by operation.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"op"}),
		trips: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockgate_ledger_batch_round_trips_total",
			Help: "Round trips to PostgreSQL of the batches of takes and confirms (each pipeline and each COMMIT or ROLLBACK); over stockgate_ledger_batch_size_count, round trips per batch.",
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "stockgate_ledger_batch_size",
			Help:    "Orders and holds committed per ledger transaction (more than 1 when winners are group-committed).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}),
	}
	l.sql = newTakeSQL(opts.Driver)
	if opts.Driver == SQLite {
		l.stmts = newStmts(db)
	}
	if opts.Metrics != nil {
		for _, c := range []prometheus.Collector{l.commits, l.latency, l.batch, l.trips} {
			if err := opts.Metrics.Register(c); err != nil {
				release()
				return nil, fmt.Errorf("ledger: metrics: %w", err)
			}
		}
	}
	if err := l.migrate(ctx, build, !opts.NoMigrate); err != nil {
		release()
		return nil, err
	}
	if err := l.db.QueryRowContext(ctx, `SELECT id FROM ledger_identity`).Scan(&l.id); err != nil {
		release()
		return nil, fmt.Errorf("ledger: identity: %w", err)
	}
	return l, nil
}

// openPostgres opens the DSN so that the ledger keeps no state on a server
// session between transactions, and so runs unchanged behind PgBouncer in
// transaction pooling mode (how many gateway pods share a few server
// connections). pgx's default prepares named statements on the session, which
// the next transaction may not find (or find twice) once the pooler hands it
// another session; cache_describe sends each statement unnamed in the same
// round trip and caches only its description. A DSN that names its own
// default_query_exec_mode keeps it.
func openPostgres(dsn string) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(dsn, "default_query_exec_mode") {
		cfg.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	return stdlib.OpenDB(*cfg), nil
}

// Close closes the database (a shared SQLite file once its last ledger
// closes).
func (l *Ledger) Close() error {
	var err error
	if l.stmts != nil {
		err = l.stmts.close()
	}
	return errors.Join(err, l.release())
}

// sqliteFiles shares one connection per SQLite file among the ledgers one
// process opens on it. SQLite has one writer at a time: two connections in
// one process contend through its busy handler, which polls, and a
// connection that commits and begins again at once starves the other past
// any busy timeout (seen: SQLITE_BUSY after 10 s in a test running two
// ledgers on one file). On one connection the writers queue in Go instead.
var sqliteFiles = struct {
	sync.Mutex
	open map[string]*sharedFile
}{open: map[string]*sharedFile{}}

type sharedFile struct {
	db   *sql.DB
	refs int
}

func openSQLite(path string) (*sql.DB, func() error, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, nil, err
	}
	sqliteFiles.Lock()
	defer sqliteFiles.Unlock()
	f := sqliteFiles.open[abs]
	if f == nil {
		// WAL with synchronous=FULL: a committed sale survives a power cut.
		db, err := sql.Open("sqlite", "file:"+path+
			"?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)&_txlock=immediate")
		if err != nil {
			return nil, nil, err
		}
		db.SetMaxOpenConns(1)
		f = &sharedFile{db: db}
		sqliteFiles.open[abs] = f
	}
	f.refs++
	var once sync.Once
	release := func() (err error) {
		once.Do(func() {
			sqliteFiles.Lock()
			defer sqliteFiles.Unlock()
			if f.refs--; f.refs == 0 {
				delete(sqliteFiles.open, abs)
				err = f.db.Close()
			}
		})
		return err
	}
	return f.db, release, nil
}

const schema = `
CREATE TABLE IF NOT EXISTS skus (
	program       TEXT    NOT NULL,
	ticket        TEXT    NOT NULL,
	total         BIGINT  NOT NULL CHECK (total >= 0),
	sold          BIGINT  NOT NULL DEFAULT 0 CHECK (sold >= 0),
	held          BIGINT  NOT NULL DEFAULT 0 CHECK (held >= 0),
	version       BIGINT  NOT NULL DEFAULT 0,
	shards        INTEGER NOT NULL CHECK (shards >= 1),
	max_per_order BIGINT  NOT NULL CHECK (max_per_order >= 1),
	-- bypass_seq counts sales that went around the Redis gate (breaker
	-- fallback); gate_seq is the bypass_seq the gate was last rebuilt from.
	-- bypass_seq > gate_seq means Redis must be re-seeded before it serves
	-- the SKU again.
	bypass_seq    BIGINT  NOT NULL DEFAULT 0,
	gate_seq      BIGINT  NOT NULL DEFAULT 0,
	-- gate_epoch is the Redis gate's generation: every rebuild moves it on
	-- (under the row lock) before reading the facts it rebuilds from, and a
	-- request the gate admitted commits only at the epoch it was admitted
	-- under. So once a rebuild has moved the epoch, nothing admitted by the
	-- old gate can still commit, and the facts it read are final.
	gate_epoch    BIGINT  NOT NULL DEFAULT 0,
	-- per_buyer caps what one buyer holds + owns (0: no cap); ended_at > 0
	-- once an admin ended the sale; holds last hold_ttl_ms unless asked
	-- otherwise, at most hold_ttl_max_ms.
	per_buyer       BIGINT NOT NULL DEFAULT 0,
	ended_at        BIGINT NOT NULL DEFAULT 0,
	hold_ttl_ms     BIGINT NOT NULL DEFAULT 900000,
	hold_ttl_max_ms BIGINT NOT NULL DEFAULT 3600000,
	updated_at    BIGINT  NOT NULL,
	-- A pool's row (its ticket made by keys.Pooled): the stock allotted to
	-- it, sold in its window (0: no bound) to those its access rule lets in
	-- (pool_access '' open, 'code', 'channel' with pool_secret the SHA-256
	-- of the channel's credential); at its close its unsold stock moves
	-- into pool_into ('' the public stock), and pool_closed_at is set.
	pool_opens_at  BIGINT NOT NULL DEFAULT 0,
	pool_closes_at BIGINT NOT NULL DEFAULT 0,
	pool_access    TEXT   NOT NULL DEFAULT '',
	pool_secret    TEXT   NOT NULL DEFAULT '',
	pool_into      TEXT   NOT NULL DEFAULT '',
	pool_closed_at BIGINT NOT NULL DEFAULT 0,
	PRIMARY KEY (program, ticket),
	CHECK (sold + held <= total)
);
CREATE TABLE IF NOT EXISTS orders (
	id           TEXT   PRIMARY KEY,
	idem_key     TEXT   NOT NULL UNIQUE,
	request_hash TEXT   NOT NULL,
	program      TEXT   NOT NULL,
	ticket       TEXT   NOT NULL,
	buyer        TEXT   NOT NULL,
	quantity     BIGINT NOT NULL CHECK (quantity > 0),
	gate         TEXT   NOT NULL DEFAULT '',
	-- the request id whose Redis deduction records hold the stock: the
	-- order's own key, or the key of the hold it confirmed
	gate_key     TEXT   NOT NULL DEFAULT '',
	hold_id      TEXT   NOT NULL DEFAULT '',
	refunded_at  BIGINT NOT NULL DEFAULT 0,
	restore_pending INTEGER NOT NULL DEFAULT 0,
	-- the gate epoch the stock was taken under, and the one it came back
	-- under (see skus.gate_epoch): they decide whether Redis gets it back
	take_epoch    BIGINT NOT NULL DEFAULT 0,
	restore_epoch BIGINT NOT NULL DEFAULT 0,
	restore_shards INTEGER NOT NULL DEFAULT 1,
	-- the cart the order is a line of ('' for a single purchase)
	cart_id      TEXT   NOT NULL DEFAULT '',
	-- the access code it used (its hash; '' for none): one use while it stands
	code_hash    TEXT   NOT NULL DEFAULT '',
	created_at   BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS orders_sku ON orders (program, ticket);
CREATE TABLE IF NOT EXISTS holds (
	id              TEXT    PRIMARY KEY,
	idem_key        TEXT    NOT NULL UNIQUE,
	request_hash    TEXT    NOT NULL,
	program         TEXT    NOT NULL,
	ticket          TEXT    NOT NULL,
	buyer           TEXT    NOT NULL,
	quantity        BIGINT  NOT NULL CHECK (quantity > 0),
	gate            TEXT    NOT NULL DEFAULT '',
	state           TEXT    NOT NULL,
	expires_at      BIGINT  NOT NULL,
	order_id        TEXT    NOT NULL DEFAULT '',
	-- 1 from the moment the hold's stock came back in the ledger (cancel,
	-- expiry) until it is given back in Redis too: a sweeper that dies in
	-- between leaves the work here for the next one.
	restore_pending INTEGER NOT NULL DEFAULT 0,
	take_epoch      BIGINT  NOT NULL DEFAULT 0,
	restore_epoch   BIGINT  NOT NULL DEFAULT 0,
	restore_shards  INTEGER NOT NULL DEFAULT 1,
	-- the cart the hold is a line of ('' for a single hold)
	cart_id         TEXT    NOT NULL DEFAULT '',
	-- the access code it used (its hash; '' for none): one use while held
	code_hash       TEXT    NOT NULL DEFAULT '',
	created_at      BIGINT  NOT NULL,
	ended_at        BIGINT  NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS holds_expiry ON holds (state, expires_at);
-- Access codes of a pool (ticket is the pool's stock), stored hashed: each
-- with a use limit and, optionally, the one buyer who may use it. Uses are
-- not counted here but in the orders and holds that stand on the code, so
-- a refund, a cancel or an expiry gives its use back with its stock.
CREATE TABLE IF NOT EXISTS access_codes (
	program    TEXT    NOT NULL,
	ticket     TEXT    NOT NULL,
	code_hash  TEXT    NOT NULL,
	max_uses   BIGINT  NOT NULL CHECK (max_uses >= 1),
	buyer      TEXT    NOT NULL DEFAULT '',
	created_at BIGINT  NOT NULL,
	PRIMARY KEY (program, ticket, code_hash)
);
-- Reserved seating: a SKU's seat map, each seat free, held by one hold, or
-- sold through one.
CREATE TABLE IF NOT EXISTS seats (
	program   TEXT    NOT NULL,
	ticket    TEXT    NOT NULL,
	seat_id   TEXT    NOT NULL,
	section   TEXT    NOT NULL,
	row_label TEXT    NOT NULL,
	number    INTEGER NOT NULL,
	state     TEXT    NOT NULL DEFAULT 'free',
	hold_id   TEXT    NOT NULL DEFAULT '',
	PRIMARY KEY (program, ticket, seat_id)
);
CREATE INDEX IF NOT EXISTS seats_hold ON seats (hold_id);
-- A cap on what one buyer may hold + own of all of a program's tickets.
CREATE TABLE IF NOT EXISTS programs (
	program   TEXT   PRIMARY KEY,
	per_buyer BIGINT NOT NULL CHECK (per_buyer >= 0)
);
-- Every client request that changed something, by its Idempotency-Key
-- within its scope (the buyer), with the fingerprint of what it asked and
-- the answer it got, written in the transaction of the change itself.
-- sku_version is the SKU row version that transaction produced, in commit
-- order per SKU, so a replica can read "what committed since".
CREATE TABLE IF NOT EXISTS requests (
	scope       TEXT   NOT NULL,
	idem_key    TEXT   NOT NULL,
	fingerprint TEXT   NOT NULL,
	op          TEXT   NOT NULL,
	program     TEXT   NOT NULL,
	ticket      TEXT   NOT NULL,
	result      TEXT   NOT NULL DEFAULT '',
	sku_version BIGINT NOT NULL DEFAULT 0,
	created_at  BIGINT NOT NULL,
	PRIMARY KEY (scope, idem_key)
);
CREATE INDEX IF NOT EXISTS requests_sku ON requests (program, ticket, sku_version);
-- What each buyer holds + owns of each SKU, for the per-buyer caps; the
-- row with ticket '' counts the whole program.
CREATE TABLE IF NOT EXISTS buyer_units (
	program TEXT   NOT NULL,
	ticket  TEXT   NOT NULL,
	buyer   TEXT   NOT NULL,
	units   BIGINT NOT NULL CHECK (units >= 0),
	PRIMARY KEY (program, ticket, buyer)
);
`

// added lists the columns added after the first release, for ledgers
// created before.
var added = []struct{ table, name, def string }{
	{"skus", "bypass_seq", "BIGINT NOT NULL DEFAULT 0"},
	{"skus", "gate_seq", "BIGINT NOT NULL DEFAULT 0"},
	{"skus", "per_buyer", "BIGINT NOT NULL DEFAULT 0"},
	{"skus", "ended_at", "BIGINT NOT NULL DEFAULT 0"},
	{"skus", "hold_ttl_ms", "BIGINT NOT NULL DEFAULT 900000"},
	{"skus", "hold_ttl_max_ms", "BIGINT NOT NULL DEFAULT 3600000"},
	{"holds", "seat_ids", "TEXT NOT NULL DEFAULT ''"},
	{"skus", "seated", "INTEGER NOT NULL DEFAULT 0"},
	{"orders", "gate_key", "TEXT NOT NULL DEFAULT ''"},
	{"orders", "hold_id", "TEXT NOT NULL DEFAULT ''"},
	{"orders", "refunded_at", "BIGINT NOT NULL DEFAULT 0"},
	{"orders", "restore_pending", "INTEGER NOT NULL DEFAULT 0"},
	{"skus", "gate_epoch", "BIGINT NOT NULL DEFAULT 0"},
	{"orders", "take_epoch", "BIGINT NOT NULL DEFAULT 0"},
	{"orders", "restore_epoch", "BIGINT NOT NULL DEFAULT 0"},
	{"orders", "restore_shards", "INTEGER NOT NULL DEFAULT 1"},
	{"holds", "take_epoch", "BIGINT NOT NULL DEFAULT 0"},
	{"holds", "restore_epoch", "BIGINT NOT NULL DEFAULT 0"},
	{"holds", "restore_shards", "INTEGER NOT NULL DEFAULT 1"},
	{"orders", "cart_id", "TEXT NOT NULL DEFAULT ''"},
	{"holds", "cart_id", "TEXT NOT NULL DEFAULT ''"},
	{"skus", "pool_opens_at", "BIGINT NOT NULL DEFAULT 0"},
	{"skus", "pool_closes_at", "BIGINT NOT NULL DEFAULT 0"},
	{"skus", "pool_access", "TEXT NOT NULL DEFAULT ''"},
	{"skus", "pool_secret", "TEXT NOT NULL DEFAULT ''"},
	{"skus", "pool_into", "TEXT NOT NULL DEFAULT ''"},
	{"skus", "pool_closed_at", "BIGINT NOT NULL DEFAULT 0"},
	{"orders", "code_hash", "TEXT NOT NULL DEFAULT ''"},
	{"holds", "code_hash", "TEXT NOT NULL DEFAULT ''"},
	{"orders", "seat_ids", "TEXT NOT NULL DEFAULT ''"},
	{"skus", "wait_seq", "BIGINT NOT NULL DEFAULT 0"},
	{"holds", "offered", "BIGINT NOT NULL DEFAULT 0"},
	{"orders", "offered", "BIGINT NOT NULL DEFAULT 0"},
}

// laterTables are the tables added after the first release, each with its
// own indexes: the outbox, the relay's partitions, the waitlist.
func laterTables(driver string) string {
	return eventsTable(driver) + relayTables(driver) + waitlistTables(driver) + queueTables(driver) + `
-- The ledger's own random id, made when it was first migrated: what the
-- replicas of one ledger name their shared Redis locks by, apart from
-- another ledger's on the same Redis.
CREATE TABLE IF NOT EXISTS ledger_identity (id TEXT NOT NULL);
`
}

// addedIndexes index columns of added: they run after the columns are
// added, so a ledger whose tables predate the columns migrates (CREATE
// INDEX on a column not there yet fails the whole migration).
//
// The cart and code indexes hold only the rows that have one: most
// orders and holds are neither a cart's line nor on a code, and an entry
// each would be written for nothing (the queries test for a non-empty
// value, so both databases use them). The owed indexes hold only the returns Redis is
// still owed, which the sweepers look for every second: without one on
// orders, each look read every order (94 ms a look after 60,000 orders).
const addedIndexes = `
DROP INDEX IF EXISTS orders_cart;
DROP INDEX IF EXISTS holds_cart;
DROP INDEX IF EXISTS holds_code;
DROP INDEX IF EXISTS orders_code;
CREATE INDEX IF NOT EXISTS orders_in_cart ON orders (cart_id) WHERE cart_id <> '';
CREATE INDEX IF NOT EXISTS holds_in_cart ON holds (cart_id) WHERE cart_id <> '';
CREATE INDEX IF NOT EXISTS holds_on_code ON holds (code_hash) WHERE code_hash <> '';
CREATE INDEX IF NOT EXISTS orders_on_code ON orders (code_hash) WHERE code_hash <> '';
DROP INDEX IF EXISTS holds_pending;
CREATE INDEX IF NOT EXISTS holds_owed ON holds (ended_at) WHERE restore_pending > 0;
CREATE INDEX IF NOT EXISTS orders_owed ON orders (refunded_at) WHERE restore_pending > 0;
`

// schemaDigest names the schema of the baseline step. The builds from
// before versioned migrations start only on a ledger that carries it, so the
// baseline keeps writing it (see baseline).
var schemaDigest = func() string {
	h := sha256.New()
	h.Write([]byte(schema))
	h.Write([]byte(addedIndexes))
	h.Write([]byte(laterTables(SQLite) + laterTables(Postgres)))
	for _, c := range added {
		fmt.Fprintf(h, "\x00%s.%s %s", c.table, c.name, c.def)
	}
	return hex.EncodeToString(h.Sum(nil))
}()

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

// addColumn adds a column unless the table has it. SQLite has no ADD
// COLUMN IF NOT EXISTS, so both drivers look first.
func (l *Ledger) addColumn(ctx context.Context, tx *sql.Tx, table, name, def string) error {
	q := `SELECT COUNT(*) FROM information_schema.columns WHERE table_name = $1 AND column_name = $2`
	if l.driver == SQLite {
		q = `SELECT COUNT(*) FROM pragma_table_info($1) WHERE name = $2`
	}
	var n int
	if err := tx.QueryRowContext(ctx, q, table, name).Scan(&n); err != nil {
		return fmt.Errorf("look for column %s.%s: %w", table, name, err)
	}
	if n > 0 {
		return nil
	}
	_, err := tx.ExecContext(ctx, "ALTER TABLE "+table+" ADD COLUMN "+name+" "+def)
	return err
}

// SKUConfig is what an admin sets on a SKU.
type SKUConfig struct {
	stock.SKU
	Total       int64 `json:"total"`
	Shards      int   `json:"shards"`
	MaxPerOrder int64 `json:"max_per_order"`
	// PerBuyer caps what one buyer may hold + own of the SKU; 0 is no cap.
	PerBuyer int64 `json:"per_buyer"`
	// HoldTTL is a hold's life unless the buyer asks for another, which
	// may not exceed HoldTTLMax. Defaults 15m and 1h.
	HoldTTL    time.Duration `json:"-"`
	HoldTTLMax time.Duration `json:"-"`
}

// Hold lifetimes a SKU may be configured with.
const (
	MinHoldTTL = time.Second
	MaxHoldTTL = 24 * time.Hour
)

// Validate reports stock.ErrInvalid for a config no SKU may have.
func (c SKUConfig) Validate() error {
	if c.SKU.Program.IsZero() || c.SKU.Ticket.IsZero() {
		return fmt.Errorf("%w: missing sku", stock.ErrInvalid)
	}
	switch {
	case c.Total < 0 || c.Total > stock.MaxTotal:
		return fmt.Errorf("%w: total %d not in 0..%d", stock.ErrInvalid, c.Total, stock.MaxTotal)
	case c.Shards < 1 || c.Shards > stock.MaxShards:
		return fmt.Errorf("%w: shards %d not in 1..%d", stock.ErrInvalid, c.Shards, stock.MaxShards)
	case c.MaxPerOrder < 1 || c.MaxPerOrder > stock.MaxPerOrderCap:
		return fmt.Errorf("%w: max_per_order %d not in 1..%d", stock.ErrInvalid, c.MaxPerOrder, stock.MaxPerOrderCap)
	case c.PerBuyer < 0 || c.PerBuyer > stock.MaxTotal:
		return fmt.Errorf("%w: per_buyer %d not in 0..%d", stock.ErrInvalid, c.PerBuyer, stock.MaxTotal)
	case c.HoldTTL != 0 && (c.HoldTTL < MinHoldTTL || c.HoldTTL > MaxHoldTTL):
		return fmt.Errorf("%w: hold ttl %v not in %v..%v", stock.ErrInvalid, c.HoldTTL, MinHoldTTL, MaxHoldTTL)
	case c.HoldTTLMax != 0 && (c.HoldTTLMax < max(c.withDefaults().HoldTTL, MinHoldTTL) || c.HoldTTLMax > MaxHoldTTL):
		// Against the default lifetime too: a maximum below it would let
		// holds without a lifetime of their own outlive the maximum.
		return fmt.Errorf("%w: hold ttl max %v not in %v..%v", stock.ErrInvalid, c.HoldTTLMax, max(c.withDefaults().HoldTTL, MinHoldTTL), MaxHoldTTL)
	}
	return nil
}

// withDefaults fills in the hold lifetimes.
func (c SKUConfig) withDefaults() SKUConfig {
	if c.HoldTTL == 0 {
		c.HoldTTL = 15 * time.Minute
	}
	if c.HoldTTLMax == 0 {
		c.HoldTTLMax = max(time.Hour, c.HoldTTL)
	}
	return c
}

// SKUState is a SKU row.
type SKUState struct {
	SKUConfig
	Sold      int64 `json:"sold"`
	Held      int64 `json:"held"`
	Version   int64 `json:"version"`
	BypassSeq int64 `json:"-"`
	GateSeq   int64 `json:"-"`
	// GateEpoch is the Redis gate's generation (see AdvanceGate).
	GateEpoch int64 `json:"-"`
	// EndedAt is when an admin ended the sale; zero while it runs.
	EndedAt time.Time `json:"-"`
	// Seated: the SKU sells specific seats (a seat map), not counted stock.
	Seated    bool      `json:"-"`
	UpdatedAt time.Time `json:"updated_at"`
	// Rule is a pool's window and access rule (zero for a ticket's public
	// stock).
	Rule PoolRule `json:"-"`
}

// Remaining is what may still be held or sold.
func (s SKUState) Remaining() int64 { return s.Total - s.Sold - s.Held }

// GateStale reports whether the ledger sold around the Redis gate since it
// was last rebuilt, so Redis must be re-seeded before it serves the SKU.
func (s SKUState) GateStale() bool { return s.BypassSeq > s.GateSeq }

// PutSKU creates a SKU or changes its settings. A total below what is sold
// and held is refused with stock.ErrInvalid and changes nothing. A seated
// SKU's total is its seat map's size and is left alone. Like a sale
// around the gate, it marks the gate stale: Redis must be rebuilt from the
// new row before it serves the SKU.
func (l *Ledger) PutSKU(ctx context.Context, c SKUConfig) (SKUState, error) {
	if err := c.Validate(); err != nil {
		return SKUState{}, err
	}
	c = c.withDefaults()
	now := l.now().UnixMilli()
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: %w", err)
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, `
		INSERT INTO skus (program, ticket, total, shards, max_per_order, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (program, ticket) DO NOTHING`,
		c.Program, c.Ticket, c.Total, c.Shards, c.MaxPerOrder, now)
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: %w", err)
	}
	var wasCapped int64
	if err := tx.QueryRowContext(ctx, `SELECT per_buyer FROM skus WHERE program = $1 AND ticket = $2`+l.forUpdate(),
		c.Program, c.Ticket).Scan(&wasCapped); err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: %w", err)
	}
	_, err = tx.ExecContext(ctx, `
		UPDATE skus SET per_buyer = $3, hold_ttl_ms = $4, hold_ttl_max_ms = $5 WHERE program = $1 AND ticket = $2`,
		c.Program, c.Ticket, c.PerBuyer, c.HoldTTL.Milliseconds(), c.HoldTTLMax.Milliseconds())
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: %w", err)
	}
	// The total is the ticket's whole stock: the public row has what its
	// pools were not allotted.
	pooled, err := pooledTotal(ctx, tx, c.SKU)
	if err != nil {
		return SKUState{}, err
	}
	res, err := tx.ExecContext(ctx, `
		UPDATE skus SET total = CASE WHEN seated = 1 THEN total ELSE $3 END, shards = $4, max_per_order = $5,
			updated_at = $6, version = version + 1, bypass_seq = bypass_seq + 1
		WHERE program = $1 AND ticket = $2 AND (seated = 1 OR sold + held <= $3)`,
		c.Program, c.Ticket, c.Total-pooled, c.Shards, c.MaxPerOrder, now)
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return SKUState{}, fmt.Errorf("%w: total %d below sold + held (and %d allotted to pools)", stock.ErrInvalid, c.Total, pooled)
	}
	// A ticket's pools sell under its settings.
	if _, err := tx.ExecContext(ctx, `UPDATE skus SET max_per_order = $3, per_buyer = $4, hold_ttl_ms = $5, hold_ttl_max_ms = $6,
		version = version + 1 WHERE program = $1 AND `+pooledRange, c.Program, c.Ticket, c.MaxPerOrder, c.PerBuyer,
		c.HoldTTL.Milliseconds(), c.HoldTTLMax.Milliseconds()); err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: pools: %w", err)
	}
	// A cap switched on counts from the holds and orders standing now: the
	// ticket's row and its pools' are held by this transaction.
	if c.PerBuyer > 0 && wasCapped == 0 {
		if err := recountBuyers(ctx, tx, c.SKU); err != nil {
			return SKUState{}, err
		}
	}
	st, err := scanSKU(tx.QueryRowContext(ctx, selectSKU, c.Program, c.Ticket))
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: commit: %w", err)
	}
	return st, nil
}

const skuColumns = `program, ticket, total, sold, held, version, shards, max_per_order, bypass_seq, gate_seq,
	per_buyer, ended_at, hold_ttl_ms, hold_ttl_max_ms, seated, updated_at, gate_epoch,
	pool_opens_at, pool_closes_at, pool_access, pool_secret, pool_into, pool_closed_at`

const selectSKU = `SELECT ` + skuColumns + ` FROM skus WHERE program = $1 AND ticket = $2`

type rowScanner interface{ Scan(dest ...any) error }

func scanSKU(r rowScanner) (SKUState, error) {
	var s SKUState
	var updated, ended, ttl, ttlMax, seated, opens, closes, closed int64
	err := r.Scan(&s.Program, &s.Ticket, &s.Total, &s.Sold, &s.Held, &s.Version, &s.Shards, &s.MaxPerOrder,
		&s.BypassSeq, &s.GateSeq, &s.PerBuyer, &ended, &ttl, &ttlMax, &seated, &updated, &s.GateEpoch,
		&opens, &closes, &s.Rule.Access, &s.Rule.Secret, &s.Rule.Into, &closed)
	s.Seated = seated == 1
	s.Rule.OpensAt, s.Rule.ClosesAt, s.Rule.ClosedAt = fromMS(opens), fromMS(closes), fromMS(closed)
	if errors.Is(err, sql.ErrNoRows) {
		return s, stock.ErrUnknownSKU
	}
	s.UpdatedAt = time.UnixMilli(updated).UTC()
	s.HoldTTL, s.HoldTTLMax = time.Duration(ttl)*time.Millisecond, time.Duration(ttlMax)*time.Millisecond
	if ended > 0 {
		s.EndedAt = time.UnixMilli(ended).UTC()
	}
	return s, err
}

// SKU reads one SKU row; stock.ErrUnknownSKU when there is none.
func (l *Ledger) SKU(ctx context.Context, sku stock.SKU) (SKUState, error) {
	st, err := scanSKU(l.queryRowRepeated(ctx, selectSKU, sku.Program, sku.Ticket))
	if err != nil && !errors.Is(err, stock.ErrUnknownSKU) {
		return st, fmt.Errorf("ledger: sku: %w", err)
	}
	return st, err
}

// Order is a confirmed sale.
type Order struct {
	ID keys.ID `json:"order_id"`
	// IdempotencyKey is the order row's own unique key, derived by the
	// service (a purchase's gate request id, or "confirm-" and the hold id):
	// never a client's key, so no client can take it.
	IdempotencyKey keys.ID   `json:"-"`
	RequestHash    string    `json:"-"`
	SKU            stock.SKU `json:"sku"`
	Buyer          keys.ID   `json:"buyer"`
	Quantity       int64     `json:"quantity"`
	// Gate is the gate's own record of where the stock came from (which
	// Redis shards), kept so a later refund can give it back there. The
	// ledger stores it as it is; empty for a sale around the gate.
	Gate string `json:"-"`
	// GateKey is the request id of the Redis records behind Gate: the
	// order's own, or the one of the hold it confirmed. Empty means
	// IdempotencyKey.
	GateKey keys.ID `json:"-"`
	HoldID  keys.ID `json:"hold_id,omitzero"`
	CartID  keys.ID `json:"cart_id,omitzero"` // the cart it is a line of
	// SeatIDs are the seats sold (reserved seating): through its hold, or
	// for a cart's seat line bought at once, held in the seats table under
	// the order's own id.
	SeatIDs    []keys.ID `json:"seats,omitempty"`
	RefundedAt time.Time `json:"refunded_at,omitzero"`
	// CodeHash is the access code the order used (see CodeHash); "" for
	// none. The order is one use of it while it stands.
	CodeHash  string    `json:"-"`
	CreatedAt time.Time `json:"created_at"`
	// Req is the client request that creates the order (zero for an
	// internal write): its row in the requests table is written in the
	// same transaction.
	Req Request `json:"-"`
	// GateEpoch is the gate epoch a gate-admitted order was admitted
	// under; it commits only while the ledger is still at that epoch.
	GateEpoch int64 `json:"-"`
	// TakeEpoch is the epoch its stock was taken under, as stored.
	TakeEpoch int64 `json:"-"`
}

// ConfirmKey is the row key of the order a confirm of hold makes: derived
// by the service, never a client's key.
func ConfirmKey(hold keys.ID) keys.ID { return keys.MustID("confirm-" + hold.String()) }

// GateRequest is the request id the order's Redis stock was deducted under.
func (o Order) GateRequest() keys.ID {
	if !o.GateKey.IsZero() {
		return o.GateKey
	}
	return o.IdempotencyKey
}

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

// orderReplay answers a purchase whose request was committed before.
func (l *Ledger) orderReplay(ctx context.Context, r Request) (Order, error) {
	rec, err := l.replayOf(ctx, r)
	if errors.Is(err, ErrDuplicate) && rec.Order == nil {
		return Order{}, fmt.Errorf("%w: key was used for a %s", ErrKeyReused, rec.Op)
	}
	if rec.Order == nil {
		return Order{}, err
	}
	return *rec.Order, err
}

func notCommitted(step string, err error) error {
	return fmt.Errorf("ledger: %s: %w: %w", step, ErrNotCommitted, err)
}

func insertOrder(ctx context.Context, tx *sql.Tx, o Order) (bool, error) {
	res, err := tx.ExecContext(ctx, `
		INSERT INTO orders (id, idem_key, request_hash, program, ticket, buyer, quantity, gate, gate_key, hold_id, created_at, take_epoch, cart_id, code_hash, seat_ids)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
		ON CONFLICT (idem_key) DO NOTHING`,
		o.ID, o.IdempotencyKey, o.RequestHash, o.SKU.Program, o.SKU.Ticket, o.Buyer, o.Quantity, o.Gate, o.GateKey,
		o.HoldID, o.CreatedAt.UnixMilli(), o.TakeEpoch, o.CartID, o.CodeHash, keys.Join(o.SeatIDs, ","))
	if err != nil {
		return false, notCommitted("insert order", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// ErrSeatedTake refuses counted units of a seated ticket: it sells its
// seats only. It is a sold-out (the ticket has no counted stock) for the
// paths that do not tell it apart; a replica whose settings predate the
// seat map meets it for as long as they are cached.
var ErrSeatedTake = fmt.Errorf("%w: a seated ticket sells seats, not counted units", stock.ErrSoldOut)

// buyerRow is one buyer_units row to count units into: a SKU's, or its
// program's when sku.Ticket is zero.
type buyerRow struct {
	sku   stock.SKU
	buyer keys.ID
	units int64
}

// capOf is the cap on the buyer_units row named by table t (0: none): its
// SKU's per_buyer, or its program's for a program row (empty ticket). A SKU
// that does not exist gives NULL, which no comparison passes.
func capOf(t string) string {
	return `(CASE WHEN ` + t + `.ticket = '' THEN COALESCE((SELECT per_buyer FROM programs p WHERE p.program = ` + t + `.program), 0)
		ELSE (SELECT per_buyer FROM skus s WHERE s.program = ` + t + `.program AND s.ticket = ` + t + `.ticket) END)`
}

// countBuyersSQL adds units to buyer rows under their caps; a row its cap
// refuses is left as it was and not returned. The rows are taken in the
// order of the VALUES list, so callers that sort them lock them in one
// global order.
var countBuyersSQL = `INSERT INTO buyer_units (program, ticket, buyer, units)
	SELECT w.program, w.ticket, w.buyer, w.units
	FROM (SELECT column1 AS program, column2 AS ticket, column3 AS buyer, column4 AS units FROM (VALUES %s) AS v) AS w
	WHERE w.units <= ` + capOf("w") + `
	ON CONFLICT (program, ticket, buyer) DO UPDATE SET units = buyer_units.units + excluded.units
	WHERE buyer_units.units + excluded.units <= ` + capOf("buyer_units") + `
	RETURNING program, ticket, buyer`

// capSQL reads the cap on one buyer_units row (0: none).
var capSQL = `SELECT COALESCE(` + capOf("w") + `, 0) FROM (SELECT CAST($1 AS TEXT) AS program, CAST($2 AS TEXT) AS ticket) AS w`

// countBuyers adds each row's units to its buyer_units row, inside tx,
// taking the rows in the order given (no row twice): only the rows under
// a cap, as a take counts them (a cap switched on later counts its scope
// from the holds and orders first). It returns the first row whose cap
// refused it (the transaction must then be rolled back: the other rows
// were counted), or nil.
func countBuyers(ctx context.Context, tx *sql.Tx, rows []buyerRow) (*buyerRow, error) {
	type name struct{ program, ticket, buyer keys.ID }
	var capped []buyerRow
	for _, r := range rows {
		var limit int64
		if err := tx.QueryRowContext(ctx, capSQL, r.sku.Program, r.sku.Ticket).Scan(&limit); err != nil {
			return nil, notCommitted("buyer cap", err)
		}
		if limit > 0 {
			capped = append(capped, r)
		}
	}
	counted := make(map[name]bool, len(capped))
	for chunk := range slices.Chunk(capped, rowsPerStatement) {
		vals := make([]string, len(chunk))
		args := make([]any, 0, 4*len(chunk))
		for i, r := range chunk {
			k := len(args)
			vals[i] = fmt.Sprintf("($%d, $%d, $%d, CAST($%d AS BIGINT))", k+1, k+2, k+3, k+4)
			args = append(args, r.sku.Program, r.sku.Ticket, r.buyer, r.units)
		}
		got, err := tx.QueryContext(ctx, fmt.Sprintf(countBuyersSQL, strings.Join(vals, ", ")), args...)
		if err := collectRows(got, err, counted, func(n *name) []any { return []any{&n.program, &n.ticket, &n.buyer} }); err != nil {
			return nil, notCommitted("buyer units", err)
		}
	}
	for i, r := range capped {
		if !counted[name{r.sku.Program, r.sku.Ticket, r.buyer}] {
			return &capped[i], nil
		}
	}
	return nil, nil
}

// recountBuyers rewrites the buyer_units rows of scope (a ticket, with its
// pools; or with a zero Ticket, a whole program) from the holds held and
// the orders that stand: what a cap switched on counts from. Takes count
// units into a scope only while it has a cap, so a cap switched on finds
// its rows missing or stale. The caller holds the scope's SKU rows, so no
// take of it commits meanwhile.
func recountBuyers(ctx context.Context, tx *sql.Tx, scope stock.SKU) error {
	in := `program = $1 AND (ticket = $2 OR ` + pooledRange + `)`
	if scope.Ticket.IsZero() {
		in = `program = $1 AND $2 = ''`
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM buyer_units WHERE program = $1 AND ticket = $2`, scope.Program, scope.Ticket); err != nil {
		return fmt.Errorf("ledger: recount buyers: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO buyer_units (program, ticket, buyer, units)
		SELECT $1, $2, buyer, SUM(quantity) FROM (
			SELECT buyer, quantity FROM holds WHERE `+in+` AND state = 'held'
			UNION ALL SELECT buyer, quantity FROM orders WHERE `+in+` AND refunded_at = 0) AS live
		GROUP BY buyer`, scope.Program, scope.Ticket); err != nil {
		return fmt.Errorf("ledger: recount buyers: %w", err)
	}
	return nil
}

// returned is what a return of stock found: the row's new version, and
// the gate epoch and shard count at that instant, which decide whether and
// where Redis gets the units back.
type returned struct {
	version, epoch int64
	shards         int
	ended          bool // the sale has ended: its gate admits no one, and is owed nothing
}

// returnStock gives q units of column back and uncounts them from the
// buyer, inside tx.
func returnStock(ctx context.Context, tx *sql.Tx, sku stock.SKU, buyer keys.ID, q int64, column string, now int64) (returned, error) {
	r, err := returnSKU(ctx, tx, sku, q, column, now)
	if err != nil {
		return r, err
	}
	return r, uncountBuyer(ctx, tx, sku, buyer, q)
}

// returnSKU is returnStock's first half: the SKU row.
func returnSKU(ctx context.Context, tx *sql.Tx, sku stock.SKU, q int64, column string, now int64) (returned, error) {
	var r returned
	var ended int64
	err := tx.QueryRowContext(ctx, `UPDATE skus SET `+column+` = `+column+` - $3, version = version + 1, updated_at = $4
		WHERE program = $1 AND ticket = $2 AND `+column+` >= $3
		RETURNING version, gate_epoch, shards, ended_at`, sku.Program, sku.Ticket, q, now).Scan(&r.version, &r.epoch, &r.shards, &ended)
	r.ended = ended > 0
	if errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("ledger: return %d %s units of %s: the row has fewer", q, column, sku)
	}
	if err != nil {
		return r, notCommitted("return stock", err)
	}
	return r, nil
}

// uncountBuyer is returnStock's second half: the buyer's SKU and program
// rows.
func uncountBuyer(ctx context.Context, tx *sql.Tx, sku stock.SKU, buyer keys.ID, q int64) error {
	if _, err := tx.ExecContext(ctx, `UPDATE buyer_units SET units = units - $4
		WHERE program = $1 AND ticket IN ($2, '') AND buyer = $3 AND units >= $4`, sku.Program, sku.Base().Ticket, buyer, q); err != nil {
		return notCommitted("buyer units", err)
	}
	return nil
}

// AdvanceGate moves a SKU's gate epoch on and returns the row as of that
// instant, in one transaction: the fence of a rebuild. The update waits for
// every transaction holding the row, and from its commit on, no request
// admitted under an older epoch can commit (ErrStaleGate), so the facts
// returned are everything the old gate admitted. The caller seeds Redis at
// the returned GateEpoch.
func (l *Ledger) AdvanceGate(ctx context.Context, sku stock.SKU) (SKUState, error) {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: advance gate: %w", err)
	}
	defer tx.Rollback()
	// The version moves too, so a sale around the gate that read the row
	// before cannot commit at the old epoch.
	res, err := tx.ExecContext(ctx, `UPDATE skus SET gate_epoch = gate_epoch + 1, version = version + 1
		WHERE program = $1 AND ticket = $2`,
		sku.Program, sku.Ticket)
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: advance gate: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return SKUState{}, stock.ErrUnknownSKU
	}
	st, err := scanSKU(tx.QueryRowContext(ctx, selectSKU, sku.Program, sku.Ticket))
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: advance gate: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return SKUState{}, fmt.Errorf("ledger: advance gate: commit: %w", err)
	}
	return st, nil
}

// MarkGateSeeded records that the Redis gate was rebuilt from ledger facts
// that included every bypass sale up to seq. It never moves gate_seq back.
func (l *Ledger) MarkGateSeeded(ctx context.Context, sku stock.SKU, seq int64) error {
	_, err := l.db.ExecContext(ctx, `
		UPDATE skus SET gate_seq = $3 WHERE program = $1 AND ticket = $2 AND gate_seq < $3`,
		sku.Program, sku.Ticket, seq)
	if err != nil {
		return fmt.Errorf("ledger: mark gate seeded: %w", err)
	}
	return nil
}

// SKUs lists SKU rows in (program, ticket) order, starting after the given
// SKU (the zero SKU starts at the beginning), at most limit of them.
func (l *Ledger) SKUs(ctx context.Context, after stock.SKU, limit int) ([]SKUState, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%w: limit %d", stock.ErrInvalid, limit)
	}
	rows, err := l.db.QueryContext(ctx, `SELECT `+skuColumns+` FROM skus
		WHERE program > $1 OR (program = $1 AND ticket > $2)
		ORDER BY program, ticket LIMIT $3`, after.Program, after.Ticket, limit)
	if err != nil {
		return nil, fmt.Errorf("ledger: skus: %w", err)
	}
	defer rows.Close()
	var out []SKUState
	for rows.Next() {
		st, err := scanSKU(rows)
		if err != nil {
			return nil, fmt.Errorf("ledger: skus: %w", err)
		}
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: skus: %w", err)
	}
	return out, nil
}

// OrderByKey returns the order stored under an idempotency key, or
// ErrNotFound.
func (l *Ledger) OrderByKey(ctx context.Context, key keys.ID) (Order, error) {
	return scanOrder(l.db.QueryRowContext(ctx, selectOrder+` WHERE idem_key = $1`, key))
}

// OrderByID returns an order by its id, or ErrNotFound.
func (l *Ledger) OrderByID(ctx context.Context, id keys.ID) (Order, error) {
	return scanOrder(l.db.QueryRowContext(ctx, selectOrder+` WHERE id = $1`, id))
}

const selectOrder = `SELECT id, idem_key, request_hash, program, ticket, buyer, quantity, gate, gate_key, hold_id,
	refunded_at, created_at, take_epoch, cart_id, code_hash, seat_ids FROM orders`

// selectOrderFrom is selectOrder with the table named alias, to join.
func selectOrderFrom(alias string) string {
	return `SELECT ` + qualify(alias, `id, idem_key, request_hash, program, ticket, buyer, quantity, gate, gate_key, hold_id,
	refunded_at, created_at, take_epoch, cart_id, code_hash, seat_ids`) + ` FROM orders ` + alias
}

func scanOrder(r rowScanner) (Order, error) {
	var o Order
	var created, refunded int64
	var seatIDs string
	err := r.Scan(&o.ID, &o.IdempotencyKey, &o.RequestHash, &o.SKU.Program, &o.SKU.Ticket, &o.Buyer, &o.Quantity,
		&o.Gate, &o.GateKey, &o.HoldID, &refunded, &created, &o.TakeEpoch, &o.CartID, &o.CodeHash, &seatIDs)
	if errors.Is(err, sql.ErrNoRows) {
		return o, ErrNotFound
	}
	if err == nil {
		o.SeatIDs, err = splitIDs(seatIDs)
	}
	if err != nil {
		return o, fmt.Errorf("ledger: order: %w", err)
	}
	o.CreatedAt = time.UnixMilli(created).UTC()
	if refunded > 0 {
		o.RefundedAt = time.UnixMilli(refunded).UTC()
	}
	return o, nil
}

// OrderTotals counts a SKU's orders that stand (not refunded) and their
// units, straight from the order rows (not from the SKU row), for audits.
func (l *Ledger) OrderTotals(ctx context.Context, sku stock.SKU) (orders, units int64, err error) {
	err = l.db.QueryRowContext(ctx, `
		SELECT COUNT(*), COALESCE(SUM(quantity), 0) FROM orders WHERE program = $1 AND ticket = $2 AND refunded_at = 0`,
		sku.Program, sku.Ticket).Scan(&orders, &units)
	if err != nil {
		return 0, 0, fmt.Errorf("ledger: order totals: %w", err)
	}
	return orders, units, nil
}

// NewID returns a random 128-bit id in hex.
func NewID() keys.ID {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return keys.MustID(hex.EncodeToString(b[:]))
}

// NewIDOf returns a random id for a row of sku's (an order, a hold): 32
// bits naming the SKU (Lane), then 96 random ones, in hex. Any replica
// can tell from the id alone which lane the row's SKU commits in, so
// confirms, cancels and refunds of one SKU queue on one lane without
// reading the row first.
func NewIDOf(sku stock.SKU) keys.ID {
	var b [16]byte
	_, _ = rand.Read(b[4:])
	binary.BigEndian.PutUint32(b[:4], SKULane(sku))
	return keys.MustID(hex.EncodeToString(b[:]))
}

// SKULane is the 32-bit name of a SKU that its rows' ids begin with.
func SKULane(sku stock.SKU) uint32 {
	h := fnv.New32a()
	h.Write([]byte(sku.Program.String()))
	h.Write([]byte{0})
	h.Write([]byte(sku.Ticket.String()))
	return h.Sum32()
}

// LaneOf is the lane an order or hold id names (NewIDOf), or for an id
// made otherwise, a hash of it: the same for every replica either way.
func LaneOf(id keys.ID) uint32 {
	s := id.String()
	if len(s) == 32 {
		if b, err := hex.DecodeString(s[:8]); err == nil {
			return binary.BigEndian.Uint32(b)
		}
	}
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}

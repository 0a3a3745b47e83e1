package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel"

	"github.com/stockgate/stockgate/internal/opt"
	"github.com/stockgate/stockgate/tracing"
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
	// IdleTimeout closes a PostgreSQL connection idle this long, so the
	// pool a burst or a slow ledger grew shrinks back. Default 1m.
	IdleTimeout time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Metrics receives commit counts and durations by operation. Optional.
	Metrics prometheus.Registerer
	// NoMigrate runs no DDL, so the serving role needs no DDL rights:
	// `stockgate migrate` applies the schema first. It opens a ledger whose
	// schema this build runs on (see Schema.Serves), ErrSchema otherwise.
	NoMigrate bool
}

// DefaultOptions are the settings a zero field takes.
func DefaultOptions() Options { return Options{Driver: SQLite, MaxConns: 32, IdleTimeout: time.Minute} }

// Validate reports the first field that cannot work (an *opt.Error).
func (o Options) Validate() error {
	switch {
	case o.Driver != "" && o.Driver != SQLite && o.Driver != Postgres:
		return opt.Bad("Driver", "must be sqlite or postgres")
	case o.DSN == "":
		return opt.Bad("DSN", "is required")
	case o.MaxConns < 0:
		return opt.Bad("MaxConns", "must be at least 1")
	case o.IdleTimeout < 0:
		return opt.Bad("IdleTimeout", "must not be negative")
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
	opt.Fill(&opts.IdleTimeout, DefaultOptions().IdleTimeout)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	var db *sql.DB
	var err error
	var release func() error // closes db, or gives back a shared SQLite file
	switch opts.Driver {
	case SQLite:
		db, release, err = openSQLite(opts.DSN)
		if err == nil {
			if err = connectSQLite(ctx, db); err != nil {
				_ = release() // the connect error is the one to report
			}
		}
	case Postgres:
		db, err = openPostgres(opts.DSN)
		if err == nil {
			db.SetMaxOpenConns(opts.MaxConns)
			db.SetMaxIdleConns(opts.MaxConns)
			db.SetConnMaxIdleTime(opts.IdleTimeout)
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
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}),
	}
	l.sql = newTakeSQL(opts.Driver)
	if opts.Driver == SQLite {
		l.stmts = newStmts(db)
	}
	if opts.Metrics != nil {
		cs := []prometheus.Collector{l.commits, l.latency, l.batch, l.trips}
		if opts.Driver == Postgres {
			// go_sql_open_connections, go_sql_idle_connections, waits and
			// closes by cause: the pool's size after a fault is visible.
			cs = append(cs, collectors.NewDBStatsCollector(db, "ledger"))
		}
		for _, c := range cs {
			if err := opts.Metrics.Register(c); err != nil {
				_ = release() // the registration error is the one to report
				return nil, fmt.Errorf("ledger: metrics: %w", err)
			}
		}
	}
	if err := l.migrateRetrying(ctx, build, !opts.NoMigrate); err != nil {
		_ = release() // the migration error is the one to report
		return nil, err
	}
	if err := l.db.QueryRowContext(ctx, `SELECT id FROM ledger_identity`).Scan(&l.id); err != nil {
		_ = release() // the identity error is the one to report
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
	if tracing.Enabled() {
		// A span per statement, batch and COMMIT, the child of the span
		// of the request or ledger batch that runs it (otelpgx, through
		// the provider otelenv.Setup made global). Off, pgx runs no
		// tracer at all.
		// A statement of a background loop (a sweeper's) with no span
		// around it starts no trace (tracing.ChildrenOnly).
		cfg.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(tracing.ChildrenOnly(otel.GetTracerProvider()))) // span names: the statement's first word
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
	// Health's connection: once has run, so nothing opens it after this.
	l.health.once.Do(func() {})
	return errors.Join(err, l.health.close(), l.release())
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
	stop func() // stops the file's checkpointer
}

// SQLite moves committed pages from the WAL into the database file in
// checkpoints. By default the connection whose commit crosses 1,000 WAL
// pages runs one before its commit returns: on the one writer, a stall of
// the whole ledger (9 % of its time in the steady run). A goroutine per
// file runs them instead, on a connection of its own, in PASSIVE mode
// (never waiting on the writer, which goes on appending meanwhile). The
// writer still checkpoints by itself past walSafetyPages, should the
// goroutine fall behind.
const (
	checkpointEvery = 250 * time.Millisecond
	walSafetyPages  = 16_000 // 64 MiB of 4 KiB pages
)

// checkpointer runs PASSIVE checkpoints of the file at path until stop.
func checkpointer(path string) (stop func(), err error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(1000)")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(checkpointEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			// BUSY (another process checkpointing) or a closed file: the
			// next tick tries again, and the writer's own threshold stands.
			_, _ = db.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)")
		}
	}()
	return func() { cancel(); <-done; db.Close() }, nil
}

// OpenSQLite opens the SQLite file at path as the ledger does (its pragmas,
// one connection shared by the process's ledgers on the file, and the
// file's checkpointer); release closes it with its last user. The load
// tool's floor writes through it, so the floor and the ledger differ only
// in what they write.
func OpenSQLite(path string) (db *sql.DB, release func() error, err error) {
	return openSQLite(path)
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
		// (The driver sets the busy timeout before the other pragmas.)
		// temp_store MEMORY keeps statement journals (a batch's multi-row
		// statements each keep one, to undo themselves alone) in memory:
		// on files they cost an open, writes and a close per statement,
		// 10 % of the writer's time in the steady run.
		db := newSQLiteDB("file:" + path +
			"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=foreign_keys(1)" +
			"&_pragma=temp_store(MEMORY)&_pragma=wal_autocheckpoint(" + strconv.Itoa(walSafetyPages) + ")&_txlock=immediate")
		db.SetMaxOpenConns(1)
		stop := func() {} // an in-memory database has no WAL to checkpoint
		if path != ":memory:" && !strings.Contains(path, "mode=memory") {
			// The absolute path: the process may change directory later.
			if stop, err = checkpointer(abs); err != nil {
				db.Close()
				return nil, nil, err
			}
		}
		f = &sharedFile{db: db, stop: stop}
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
				f.stop()
				err = f.db.Close()
			}
		})
		return err
	}
	return f.db, release, nil
}

// connectSQLite makes db's connection, again while SQLite answers BUSY.
// Its pragmas switch a file to WAL, which takes the file's exclusive lock:
// two processes opening one new file at once deadlock on it, and SQLite
// then answers one of them SQLITE_BUSY at once, without waiting out the
// busy timeout (TestSQLiteProcessesMigrateTogether, in CI). A second try
// finds the file in WAL already. It tries for up to 10 s, as long as the
// busy timeout would have waited.
func connectSQLite(ctx context.Context, db *sql.DB) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		err := db.PingContext(ctx)
		if !sqliteBusy(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// sqliteBusy reports SQLITE_BUSY (any of its extended codes).
func sqliteBusy(err error) bool {
	var se interface{ Code() int }
	return errors.As(err, &se) && se.Code()&0xff == 5
}

// migrateRetrying is migrate, run again while a SQLite file answers BUSY
// at once (processes opening one new file together: see connectSQLite),
// for up to 10 s. Every step of it is safe to run again.
func (l *Ledger) migrateRetrying(ctx context.Context, build schemaSteps, apply bool) error {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		err := l.migrate(ctx, build, apply)
		if l.driver != SQLite || !sqliteBusy(err) {
			return err
		}
		select {
		case <-rctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

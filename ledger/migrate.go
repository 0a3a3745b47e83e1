package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"
)

// The schema moves by versioned steps (goose keeps which ran, in
// ledger_migrations) in the expand/contract discipline, so a rollout and its
// rollback never need the schema and the build to change together:
//
//   - An expand step only adds (a table, a column with a default, an index):
//     a build that predates it runs on the ledger unchanged. This is what
//     lets `helm rollback` or `kubectl rollout undo` put an older build back
//     on a ledger a newer one migrated.
//   - A contract step removes or changes what older builds use. It ships in
//     a release after the one whose code stopped using it, and it names the
//     oldest build that may serve afterwards (oldestBuild: a build whose
//     newest step is below it refuses to start, with ErrSchema, instead of
//     failing at its first sale).
//
// A build serves a ledger whose version is at least its minSchema (the
// oldest schema its code runs on) and whose oldest allowed build it meets;
// a newer version is fine. docs/RUNBOOK.md says how to roll back.

// migration is one migration of the ledger's schema.
type migration struct {
	version int64
	name    string
	// oldestBuild > 0 makes the step a contract: after it, only builds whose
	// newest step is at least oldestBuild may serve the ledger.
	oldestBuild int64
	up          func(l *Ledger, ctx context.Context, tx *sql.Tx) error
	down        func(l *Ledger, ctx context.Context, tx *sql.Tx) error // nil: cannot be undone
}

// schemaSteps are a build's migrations (in version order) and the oldest
// schema its code runs on.
type schemaSteps struct {
	steps   []migration
	minimum int64
}

// thisBuild is this build's schema. Add a step at the end; raise minimum
// only when the code starts to use what a step added (and never past a step
// released in the build before, or a rollout would stop on its own ledger).
var thisBuild = schemaSteps{
	steps: []migration{
		{version: 1, name: "baseline", up: (*Ledger).baseline},
		{version: 2, name: "hold budgets", up: (*Ledger).holdBudgetsUp, down: (*Ledger).holdBudgetsDown},
		{version: 3, name: "resale", up: (*Ledger).resaleUp, down: (*Ledger).resaleDown},
		{version: 4, name: "organizer channels", up: (*Ledger).channelsUp, down: (*Ledger).channelsDown},
		{version: 5, name: "program directory", up: (*Ledger).directoryUp, down: (*Ledger).directoryDown},
		{version: 6, name: "order units", up: (*Ledger).orderUnitsUp, down: (*Ledger).orderUnitsDown},
		{version: 7, name: "proof of work", up: (*Ledger).powUp, down: (*Ledger).powDown},
		{version: 8, name: "room sold-out share", up: (*Ledger).soldOutShareUp, down: (*Ledger).soldOutShareDown},
		{version: 9, name: "event trace context", up: (*Ledger).eventTraceUp, down: (*Ledger).eventTraceDown},
		{version: 10, name: "admission spends of committed requests", up: (*Ledger).spendBeforeUp, down: (*Ledger).spendBeforeDown},
		{version: 11, name: "listing since", up: (*Ledger).listingSinceUp, down: (*Ledger).listingSinceDown},
		{version: 12, name: "listing holds", up: (*Ledger).listingHoldsUp, down: (*Ledger).listingHoldsDown},
	},
	// Resale's tables are read by every refund and transfer, the channels'
	// by the report, an order's units (step 6) by every order read, resale
	// settle and refund, a room's proof of work (step 7) and sold-out share
	// (step 8) by every read of a waiting room, an event's trace context
	// (step 9) by every event written, an admission spend's mark of a
	// request committed before it (step 10) by every spend, a listing's
	// since (step 11) and the holds held when it began (step 12) by every
	// list and settle: this build needs step 12.
	// The chart's
	// pre-install/pre-upgrade Job (or serve with migrate on) runs them
	// before this build serves; see docs/RUNBOOK.md.
	minimum: 12,
}

func (s schemaSteps) latest() int64 { return s.steps[len(s.steps)-1].version }

// Schema is where a ledger's schema stands against the running build.
type Schema struct {
	Version     int64 // the newest step the ledger has run (0: none)
	OldestBuild int64 // builds whose newest step is below this may not serve it
	Latest      int64 // this build's newest step
	Minimum     int64 // the oldest schema this build runs on
}

// Serves reports why this build may not serve a ledger at s (ErrSchema), or nil.
func (s Schema) Serves() error {
	switch {
	case s.Version < s.Minimum:
		return fmt.Errorf("%w: the ledger is at schema %d, this build needs at least %d: run `stockgate migrate` with this build",
			ErrSchema, s.Version, s.Minimum)
	case s.OldestBuild > s.Latest:
		return fmt.Errorf("%w: the ledger is at schema %d, past a contract step that builds older than schema %d cannot run on (this build knows %d): deploy a newer build (docs/RUNBOOK.md, rolling back across a schema change)",
			ErrSchema, s.Version, s.OldestBuild, s.Latest)
	}
	return nil
}

// Schema is where the ledger's schema stood when it was opened.
func (l *Ledger) Schema() Schema { return l.schema }

const (
	migrationsTable = "ledger_migrations"
	migrateLockID   = 7301
)

func (l *Ledger) dialect() goose.Dialect {
	if l.driver == Postgres {
		return goose.DialectPostgres
	}
	return goose.DialectSQLite3
}

// schemaAt reads where the ledger stands, without DDL or locks: a serving
// replica without DDL rights reads it, and so does every start on a ledger
// that is already migrated (DDL such as CREATE INDEX IF NOT EXISTS locks its
// table even when there is nothing to create, and a gateway starting beside
// others that are selling then deadlocked with them: SQLSTATE 40P01 in CI).
func (l *Ledger) schemaAt(ctx context.Context, build schemaSteps) (Schema, error) {
	s := Schema{Latest: build.latest(), Minimum: build.minimum}
	store, err := database.NewStore(l.dialect(), migrationsTable)
	if err != nil {
		return s, err
	}
	// goose's own look-up has no SQLite query; and a failed SELECT of a
	// missing table would abort a PostgreSQL transaction.
	q := `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = $1`
	if l.driver == Postgres {
		q = `SELECT COUNT(*) FROM pg_catalog.pg_tables WHERE tablename = $1 AND schemaname = current_schema()`
	}
	var n int
	if err := l.db.QueryRowContext(ctx, q, migrationsTable).Scan(&n); err != nil || n == 0 {
		return s, err
	}
	if s.Version, err = store.GetLatestVersion(ctx, l.db); err != nil {
		if errors.Is(err, database.ErrVersionNotFound) {
			return s, nil
		}
		return s, err
	}
	if s.Version > 0 {
		err = l.db.QueryRowContext(ctx, `SELECT oldest_build FROM ledger_compat`).Scan(&s.OldestBuild)
	}
	return s, err
}

// migrate brings the schema up to build's newest step (with apply false it
// only checks), then checks that build may serve it.
func (l *Ledger) migrate(ctx context.Context, build schemaSteps, apply bool) error {
	s, err := l.schemaAt(ctx, build)
	if err != nil {
		return fmt.Errorf("ledger: schema: %w", err)
	}
	if apply && s.Version < s.Latest {
		if err := l.up(ctx, build); err != nil {
			return fmt.Errorf("ledger: migrate: %w", err)
		}
		if s, err = l.schemaAt(ctx, build); err != nil {
			return fmt.Errorf("ledger: schema: %w", err)
		}
	}
	l.schema, l.build = s, build
	return s.Serves()
}

// up runs the steps the ledger has not run, each in its own transaction
// with its version, under goose's lock. On PostgreSQL that lock is a row of
// a table with a lease (goose's table locker), not a session advisory lock,
// so it holds behind PgBouncer in transaction pooling; and replicas starting
// together take turns instead of racing on CREATE TABLE.
func (l *Ledger) up(ctx context.Context, build schemaSteps) error {
	p, done, err := l.provider(build)
	if err != nil {
		return err
	}
	defer done()
	// Each time another process ran a step first, goose lists again.
	for range build.steps {
		if _, err = p.Up(ctx); !errors.Is(err, errRanMeanwhile) {
			return err
		}
	}
	return err
}

// errRanMeanwhile is a step another process ran after goose listed the
// steps to run: Up rolls its transaction back and lists again.
var errRanMeanwhile = errors.New("the step ran in another process meanwhile")

// notRunYet checks, in the step's transaction, that no other process ran
// the step since goose listed it. goose has no lock for SQLite; there the
// transactions, begun IMMEDIATE, serialize this check. (On PostgreSQL
// goose's lock does.)
func (l *Ledger) notRunYet(ctx context.Context, tx *sql.Tx, version int64) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+migrationsTable+` WHERE version_id = $1 AND is_applied`, version).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return errRanMeanwhile
	}
	return nil
}

// DownTo undoes the steps above version, newest first; a step that cannot
// be undone stops it (ErrSchema). The ledger must not be serving a build
// that needs what it removes.
func (l *Ledger) DownTo(ctx context.Context, version int64) error {
	build := l.build
	if version < 1 {
		return fmt.Errorf("%w: the baseline (schema 1) cannot be undone", ErrSchema)
	}
	if s := l.schema; s.Version > s.Latest && version < s.Version {
		return fmt.Errorf("%w: the ledger is at schema %d, past this build's newest step (%d): undo the steps above %d with the build that shipped them",
			ErrSchema, s.Version, s.Latest, s.Latest)
	}
	for _, st := range build.steps {
		if st.version > version && st.down == nil {
			return fmt.Errorf("%w: step %d (%s) cannot be undone", ErrSchema, st.version, st.name)
		}
	}
	p, done, err := l.provider(build)
	if err != nil {
		return err
	}
	defer done()
	if _, err := p.DownTo(ctx, version); err != nil {
		return fmt.Errorf("ledger: migrate down: %w", err)
	}
	l.schema, err = l.schemaAt(ctx, build)
	return err
}

// provider runs build's steps. On PostgreSQL it has connections of its own,
// closed by done: goose holds one for the run and its lock takes another,
// which a ledger opened with MaxConns 1 would wait for for ever.
func (l *Ledger) provider(build schemaSteps) (_ *goose.Provider, done func(), err error) {
	db, done := l.db, func() {}
	if l.driver == Postgres {
		if db, err = openPostgres(l.dsn); err != nil {
			return nil, nil, err
		}
		db.SetMaxOpenConns(2)
		done = func() { db.Close() }
	}
	defer func() {
		if err != nil {
			done()
		}
	}()
	var ms []*goose.Migration
	for _, st := range build.steps {
		up := &goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
			if err := l.notRunYet(ctx, tx, st.version); err != nil {
				return err
			}
			if err := st.up(l, ctx, tx); err != nil {
				return fmt.Errorf("step %d (%s): %w", st.version, st.name, err)
			}
			if st.oldestBuild == 0 {
				return nil
			}
			return setOldestBuild(ctx, tx, st.oldestBuild, true)
		}}
		down := &goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
			if st.down == nil {
				return fmt.Errorf("step %d (%s) cannot be undone", st.version, st.name)
			}
			if err := st.down(l, ctx, tx); err != nil {
				return err
			}
			// The oldest build allowed is the newest of the contract steps left.
			old := int64(1)
			for _, o := range build.steps {
				if o.version < st.version && o.oldestBuild > old {
					old = o.oldestBuild
				}
			}
			return setOldestBuild(ctx, tx, old, false)
		}}
		ms = append(ms, goose.NewGoMigration(st.version, up, down))
	}
	opts := []goose.ProviderOption{
		goose.WithGoMigrations(ms...),
		goose.WithDisableGlobalRegistry(true),
		goose.WithTableName(migrationsTable),
		goose.WithLogger(goose.NopLogger()),
	}
	if l.driver == Postgres {
		// SQLite has none across processes: see notRunYet.
		locker, err := lock.NewPostgresTableLocker(
			lock.WithTableName("ledger_migrate_lock"),
			lock.WithTableLockID(migrateLockID),
			// A replica waiting for another's migration looks again often
			// (goose's default is every 5 s), for up to 5 minutes.
			lock.WithTableLockTimeout(100*time.Millisecond, 3000),
			// A replica killed mid-migration holds the others up until its
			// lease runs out: goose's 30 s was all of serve's time to open
			// the ledger (and the chart's startup probe), so the next start
			// failed too. A heartbeat renews it every 2 s meanwhile.
			lock.WithTableLeaseDuration(10*time.Second),
			lock.WithTableHeartbeatInterval(2*time.Second),
			// Only a lock another replica holds is worth waiting for: a
			// refusal (no rights on the lock table: class 42) is not
			// going away, and retrying it hid it behind a timeout.
			lock.WithTableRetryPolicy(func(err error) bool {
				var pe interface{ SQLState() string }
				return !errors.As(err, &pe) || !strings.HasPrefix(pe.SQLState(), "42")
			}),
		)
		if err != nil {
			return nil, nil, err
		}
		opts = append(opts, goose.WithLocker(locker))
	}
	p, err := goose.NewProvider(l.dialect(), db, nil, opts...)
	return p, done, err
}

// setOldestBuild records the oldest build that may serve the ledger (only
// raising it with raise). The builds from before versioned steps look only
// at ledger_schema's digest: past a contract step it no longer matches
// theirs, so they refuse to serve with -migrate=false.
func setOldestBuild(ctx context.Context, tx *sql.Tx, oldest int64, raise bool) error {
	q := `UPDATE ledger_compat SET oldest_build = $1`
	if raise {
		q += ` WHERE oldest_build < $1`
	}
	if _, err := tx.ExecContext(ctx, q, oldest); err != nil {
		return err
	}
	digest := schemaDigest
	if oldest > 1 {
		digest = fmt.Sprintf("contract-%d", oldest)
	}
	_, err := tx.ExecContext(ctx, `UPDATE ledger_schema SET digest = $1`, digest)
	return err
}

// holdBudgetsUp (an expand step) adds the programs' hold budgets: what one
// buyer, and one device or payment fingerprint, may hold at once. Builds
// before it never read them; this build reads them only on a ledger that
// ran it (schemaHas), so it still runs on schema 1.
func (l *Ledger) holdBudgetsUp(ctx context.Context, tx *sql.Tx) error {
	for _, col := range []string{"hold_budget", "device_hold_budget"} {
		if err := l.addColumn(ctx, tx, "programs", col, "BIGINT NOT NULL DEFAULT 0"); err != nil {
			return err
		}
	}
	return nil
}

func (l *Ledger) holdBudgetsDown(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `ALTER TABLE programs DROP COLUMN hold_budget; ALTER TABLE programs DROP COLUMN device_hold_budget`)
	return err
}

// resaleUp (an expand step) adds resale: the listings, what each SKU and
// order has listed, each SKU's resale mode and settle mark. An order's
// listed units are a table of their own, not a column: ALTER TABLE orders
// would wait behind every long read of orders (a report) with the sales
// queued behind it.
func (l *Ledger) resaleUp(ctx context.Context, tx *sql.Tx) error {
	for _, c := range []struct{ table, name, def string }{
		{"skus", "listed", "BIGINT NOT NULL DEFAULT 0"},
		{"skus", "resale_seq", "BIGINT NOT NULL DEFAULT 0"},
		{"skus", "resale", "TEXT NOT NULL DEFAULT 'first'"},
		{"skus", "resale_carry", "BIGINT NOT NULL DEFAULT 0"},
	} {
		if err := l.addColumn(ctx, tx, c.table, c.name, c.def); err != nil {
			return err
		}
	}
	_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS listings (
	id              TEXT    PRIMARY KEY,
	program         TEXT    NOT NULL,
	ticket          TEXT    NOT NULL,
	order_id        TEXT    NOT NULL,
	seller          TEXT    NOT NULL,
	quantity        BIGINT  NOT NULL CHECK (quantity > 0),
	sold            BIGINT  NOT NULL DEFAULT 0 CHECK (sold >= 0 AND sold <= quantity),
	withdrawn       BIGINT  NOT NULL DEFAULT 0,
	state           TEXT    NOT NULL,
	created_at      BIGINT  NOT NULL,
	ended_at        BIGINT  NOT NULL DEFAULT 0,
	restore_pending INTEGER NOT NULL DEFAULT 0,
	restore_epoch   BIGINT  NOT NULL DEFAULT 0,
	restore_shards  INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS order_listings (
	order_id TEXT   PRIMARY KEY,
	listed   BIGINT NOT NULL CHECK (listed >= 0)
);
-- the holds a SKU had live when its listings began: their confirms are
-- no resales
CREATE TABLE IF NOT EXISTS resale_prior_holds (
	hold_id TEXT PRIMARY KEY,
	program TEXT NOT NULL,
	ticket  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS resale_prior_sku ON resale_prior_holds (program, ticket);
CREATE INDEX IF NOT EXISTS listings_open ON listings (program, ticket, created_at) WHERE state = 'listed';
CREATE INDEX IF NOT EXISTS listings_order ON listings (order_id);
CREATE INDEX IF NOT EXISTS listings_owed ON listings (created_at) WHERE restore_pending > 0;
CREATE INDEX IF NOT EXISTS skus_listed ON skus (updated_at) WHERE listed > 0;`)
	return err
}

func (l *Ledger) resaleDown(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `DROP INDEX IF EXISTS skus_listed; DROP TABLE IF EXISTS listings;
		DROP TABLE IF EXISTS order_listings; DROP TABLE IF EXISTS resale_prior_holds;
		ALTER TABLE skus DROP COLUMN listed; ALTER TABLE skus DROP COLUMN resale_seq; ALTER TABLE skus DROP COLUMN resale;
		ALTER TABLE skus DROP COLUMN resale_carry`)
	return err
}

// orderUnitsUp (an expand step) keeps, beside what an order has listed,
// where the rest of its units went, so each unit's money is told once:
// resold (to other buyers through its listings), transferred (split off
// to other buyers' orders) and resold_out (1: every unit was resold; the
// order's refunded_at is then when the last one went, and no refund took
// place). Orders from before are filled in from their listings and
// events: an order given up with no order.refunded event was resold out.
func (l *Ledger) orderUnitsUp(ctx context.Context, tx *sql.Tx) error {
	for _, c := range []string{"resold", "transferred", "resold_out"} {
		if err := l.addColumn(ctx, tx, "order_listings", c, "BIGINT NOT NULL DEFAULT 0"); err != nil {
			return err
		}
	}
	_, err := tx.ExecContext(ctx, `
UPDATE order_listings SET resold = COALESCE((SELECT SUM(x.sold) FROM listings x WHERE x.order_id = order_listings.order_id), 0);
INSERT INTO order_listings (order_id, listed, transferred)
	SELECT subject, 0, SUM(quantity) FROM events WHERE type = 'order.transferred' AND order_id <> subject GROUP BY subject
	ON CONFLICT (order_id) DO UPDATE SET transferred = excluded.transferred;
UPDATE order_listings SET resold_out = 1 WHERE resold > 0
	AND order_id IN (SELECT id FROM orders WHERE refunded_at > 0)
	AND NOT EXISTS (SELECT 1 FROM events e WHERE e.type = 'order.refunded' AND e.subject = order_listings.order_id);`)
	return err
}

func (l *Ledger) orderUnitsDown(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `ALTER TABLE order_listings DROP COLUMN resold; ALTER TABLE order_listings DROP COLUMN transferred;
		ALTER TABLE order_listings DROP COLUMN resold_out`)
	return err
}

// powUp adds a waiting room's proof of work (0: none asked; an expand step:
// older builds never read it).
func (l *Ledger) powUp(ctx context.Context, tx *sql.Tx) error {
	return l.addColumn(ctx, tx, "queues", "pow_bits", "BIGINT NOT NULL DEFAULT 0")
}

func (l *Ledger) powDown(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `ALTER TABLE queues DROP COLUMN pow_bits`)
	return err
}

// soldOutShareUp adds the share of a room's admitted buyers the pacer may
// let meet sold out, in thousandths; rooms made before get the default,
// 5 % (an expand step: older builds never read it, and keep admitting
// no more than the tickets left).
func (l *Ledger) soldOutShareUp(ctx context.Context, tx *sql.Tx) error {
	return l.addColumn(ctx, tx, "queues", "sold_out_share", "BIGINT NOT NULL DEFAULT 50")
}

func (l *Ledger) soldOutShareDown(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `ALTER TABLE queues DROP COLUMN sold_out_share`)
	return err
}

// spendBeforeUp adds whether an admission's spend was recorded for a
// request that had committed already (1): its retry replays it and gives
// the admission back (waitroom's door). Spends recorded before have 0
// and stay spent on such a retry, as builds before did (an expand step:
// older builds never read it).
func (l *Ledger) spendBeforeUp(ctx context.Context, tx *sql.Tx) error {
	return l.addColumn(ctx, tx, "queue_spends", "request_before", "BIGINT NOT NULL DEFAULT 0")
}

func (l *Ledger) spendBeforeDown(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `ALTER TABLE queue_spends DROP COLUMN request_before`)
	return err
}

// listingSinceUp adds where in the event sequence each listing began
// (the newest seq when it was made: the sales above it could take its
// units). A settle gave a listing the sales made before it (helper-102).
// Listings from before have 0; a settle gives each the seq of its
// listing.created event (openListings). An expand step: older builds
// never read it. (A build of a day, de60336, also added since_seq to
// resale_prior_holds here; no build reads that column.)
func (l *Ledger) listingSinceUp(ctx context.Context, tx *sql.Tx) error {
	return l.addColumn(ctx, tx, "listings", "since_seq", "BIGINT NOT NULL DEFAULT 0")
}

func (l *Ledger) listingSinceDown(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `ALTER TABLE listings DROP COLUMN since_seq`)
	return err
}

// listingHoldsUp adds resale_listing_holds: a hold held when a listing
// other than the first of its SKU began, with that listing's since (its
// confirm took none of that listing's units, nor a later one's). A table
// of its own, not a column of resale_prior_holds: a build before it takes
// every row there for a hold from before all the listings, and would
// count none of these holds' confirms (helper-103). An expand step:
// older builds never read it.
func (l *Ledger) listingHoldsUp(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS resale_listing_holds (
	hold_id   TEXT   PRIMARY KEY,
	program   TEXT   NOT NULL,
	ticket    TEXT   NOT NULL,
	since_seq BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS resale_listing_holds_sku ON resale_listing_holds (program, ticket);`)
	return err
}

func (l *Ledger) listingHoldsDown(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `DROP TABLE IF EXISTS resale_listing_holds`)
	return err
}

// baseline is the schema as it stood when the ledger's schema became
// versioned. It is written to run on every ledger made before (CREATE ... IF
// NOT EXISTS, columns added when missing), so those upgrade in place, and it
// keeps ledger_schema's digest, which the builds before versioning check:
// one of them put back by a rollback still starts.
func (l *Ledger) baseline(ctx context.Context, tx *sql.Tx) error {
	if l.driver == Postgres {
		// A build from before versioning, starting now, would race on CREATE TABLE.
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(7301)"); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
	}
	// A ledger the release before versioned steps left at this schema (its
	// digest) has every table, column and index: it gets none of the DDL,
	// as it did then. That release's gateways are still selling on it while
	// the migration runs, and DDL locks their tables even when there is
	// nothing to do: ALTER TABLE queued behind one long read of orders
	// stopped every sale queued behind it until the migration timed out.
	current, err := l.digestAt(ctx, tx)
	if err != nil {
		return err
	}
	if current != schemaDigest {
		if err := l.baselineDDL(ctx, tx); err != nil {
			return err
		}
	}
	for _, q := range []string{
		`CREATE TABLE IF NOT EXISTS ledger_schema (digest TEXT NOT NULL)`,
		`DELETE FROM ledger_schema`,
		`CREATE TABLE IF NOT EXISTS ledger_compat (oldest_build BIGINT NOT NULL)`,
		`DELETE FROM ledger_compat`,
		`INSERT INTO ledger_compat (oldest_build) VALUES (1)`,
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO ledger_schema (digest) VALUES ($1)`, schemaDigest); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO ledger_identity (id) SELECT $1 WHERE NOT EXISTS (SELECT 1 FROM ledger_identity)`, NewID())
	return err
}

// digestAt reads ledger_schema's digest, "" for a new ledger. It looks the
// table up first: on PostgreSQL a failed SELECT would abort the transaction.
func (l *Ledger) digestAt(ctx context.Context, tx *sql.Tx) (string, error) {
	q := `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'ledger_schema'`
	if l.driver == Postgres {
		q = `SELECT COUNT(*) FROM pg_catalog.pg_tables WHERE tablename = 'ledger_schema' AND schemaname = current_schema()`
	}
	var n int
	if err := tx.QueryRowContext(ctx, q).Scan(&n); err != nil || n == 0 {
		return "", err
	}
	var digest string
	err := tx.QueryRowContext(ctx, `SELECT digest FROM ledger_schema`).Scan(&digest)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return digest, err
}

// baselineDDL creates what the baseline's schema has and the ledger lacks.
func (l *Ledger) baselineDDL(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, schema); err != nil {
		return err
	}
	for _, col := range added {
		if err := l.addColumn(ctx, tx, col.table, col.name, col.def); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, addedIndexes); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, laterTables(l.driver)); err != nil {
		return err
	}
	if l.driver == Postgres {
		// Orders, holds and seats once referenced their SKU row. Each
		// insert's key-share lock on that row, mixed with the batches'
		// updates of it, made PostgreSQL 15 fail writes with "new multixact
		// has more than one updating member" (SQLSTATE XX000) under
		// concurrent batches. Every write reaches the SKU row by its own
		// conditional update anyway, so the references go. (SQLite keeps
		// the ones a file has: it has no such locks.)
		for _, table := range []string{"orders", "holds", "seats"} {
			if _, err := tx.ExecContext(ctx, `ALTER TABLE `+table+` DROP CONSTRAINT IF EXISTS `+table+`_program_ticket_fkey`); err != nil {
				return err
			}
		}
	}
	return nil
}

// eventTraceUp adds the W3C traceparent of the request an event is of, so
// its webhook deliveries join that request's trace (empty for events written
// before, or untraced; an expand step: older builds never read it and
// write the default).
func (l *Ledger) eventTraceUp(ctx context.Context, tx *sql.Tx) error {
	return l.addColumn(ctx, tx, "events", "traceparent", "TEXT NOT NULL DEFAULT ''")
}

func (l *Ledger) eventTraceDown(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `ALTER TABLE events DROP COLUMN traceparent`)
	return err
}

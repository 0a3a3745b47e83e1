package ledger_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// The steps of two later builds: an expand (a table and a column with a
// default: older code never notices) and a contract after it that only
// builds knowing the expand may serve. this is this build's newest step.
var (
	this   = ledger.LatestStep
	expand = ledger.FutureStep{Version: this + 1,
		Up:   `CREATE TABLE later_things (id TEXT PRIMARY KEY); ALTER TABLE skus ADD COLUMN later_note TEXT NOT NULL DEFAULT ''`,
		Down: `DROP TABLE later_things; ALTER TABLE skus DROP COLUMN later_note`}
	contract = ledger.FutureStep{Version: this + 2, OldestBuild: this + 1,
		Up:   `DROP TABLE later_things`,
		Down: `CREATE TABLE later_things (id TEXT PRIMARY KEY)`}
)

// A build serves every schema from its minimum to the newest as long as no
// contract step shut it out: an older build put back by a rollback sells on
// a ledger a newer build expanded, refuses one a contract step moved past it
// with a message that says so, and is let back in when that step is undone.
func TestBuildRunsOnEverySchemaFromItsMinimum(t *testing.T) {
	for _, driver := range []string{ledger.SQLite, ledger.Postgres} {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			o := ledger.Options{Driver: driver, DSN: testenv.SQLitePath(t)}
			if driver == ledger.Postgres {
				o.DSN = testenv.PostgresURL(t)
			}
			serving := o
			serving.NoMigrate = true
			sells := func(l *ledger.Ledger, key string) {
				t.Helper()
				if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 100, Shards: 1, MaxPerOrder: 4}); err != nil {
					t.Fatalf("put SKU at schema %+v: %v", l.Schema(), err)
				}
				if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID(key), SKU: sku, Buyer: keys.MustID("b-" + key), Quantity: 1}); err != nil {
					t.Fatalf("purchase at schema %+v: %v", l.Schema(), err)
				}
			}
			at := func(version int64) func(*ledger.Ledger, error) *ledger.Ledger {
				return func(l *ledger.Ledger, err error) *ledger.Ledger {
					t.Helper()
					if err != nil {
						t.Fatalf("open, want schema %d: %v", version, err)
					}
					t.Cleanup(func() { l.Close() })
					if s := l.Schema(); s.Version != version {
						t.Fatalf("schema %+v, want version %d", s, version)
					}
					return l
				}
			}

			// This build makes the ledger; the next one expands it.
			sells(at(this)(ledger.Open(ctx, o)), "k1")
			at(this + 1)(ledger.OpenBuild(ctx, o, 1, expand))
			// This build again (a rollback): serving without DDL, and its
			// migrate Job too, which leaves the newer schema as it is.
			sells(at(this+1)(ledger.Open(ctx, serving)), "k2")
			sells(at(this+1)(ledger.Open(ctx, o)), "k3")

			// The contract step shuts builds older than the expand out.
			at(this + 2)(ledger.OpenBuild(ctx, o, 1, expand, contract))
			for _, opts := range []ledger.Options{serving, o} {
				l, err := ledger.Open(ctx, opts)
				if err == nil {
					l.Close()
					t.Fatalf("this build (schema %d) opened a ledger past a contract step for builds from %d (NoMigrate %v)", this, this+1, opts.NoMigrate)
				}
				if !errors.Is(err, ledger.ErrSchema) || !strings.Contains(err.Error(), "deploy a newer build") {
					t.Fatalf("open past a contract step = %v, want ErrSchema saying to deploy a newer build", err)
				}
			}
			if got := digest(t, driver, o.DSN); got == ledger.SchemaDigest {
				t.Errorf("past a contract step ledger_schema still says %q: a build from before versioned steps would serve", got)
			}
			newer := at(this + 2)(ledger.OpenBuild(ctx, serving, this+1, expand))
			sells(newer, "k4")

			// A build that needs the contract refuses a ledger left below it.
			down := at(this + 2)(ledger.OpenBuild(ctx, o, this+2, expand, contract))
			if err := down.DownTo(ctx, this+1); err != nil {
				t.Fatal(err)
			}
			if l, err := ledger.OpenBuild(ctx, serving, this+2, expand, contract); !errors.Is(err, ledger.ErrSchema) || !strings.Contains(err.Error(), fmt.Sprintf("needs at least %d", this+2)) {
				if l != nil {
					l.Close()
				}
				t.Fatalf("a build needing schema %d on schema %d = %v, want ErrSchema", this+2, this+1, err)
			}
			// With the contract undone, this build serves again, and so
			// would one from before versioned steps.
			sells(at(this+1)(ledger.Open(ctx, serving)), "k5")
			if got := digest(t, driver, o.DSN); got != ledger.SchemaDigest {
				t.Errorf("with the contract undone ledger_schema says %q, want the baseline's", got)
			}
			if err := down.DownTo(ctx, 0); !errors.Is(err, ledger.ErrSchema) {
				t.Errorf("down past the baseline = %v, want ErrSchema", err)
			}
			if _, units, err := newer.OrderTotals(ctx, sku); err != nil || units != 5 {
				t.Errorf("%d units sold across the schemas (%v), want 5", units, err)
			}
		})
	}
}

// Replicas starting together on an empty PostgreSQL ledger take turns: each
// opens it, the baseline runs once, and it leaves the digest the builds from
// before versioned migrations look for, so one put back by a rollback starts.
func TestReplicasMigrateTogether(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() {
			l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: dsn})
			if err == nil {
				err = l.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var runs int
	var digest string
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM ledger_migrations WHERE version_id = 1`).Scan(&runs); err != nil || runs != 1 {
		t.Errorf("the baseline ran %d times (%v), want 1", runs, err)
	}
	if err := db.QueryRowContext(ctx, `SELECT digest FROM ledger_schema`).Scan(&digest); err != nil || digest != ledger.SchemaDigest {
		t.Errorf("ledger_schema digest %q (%v), want %q", digest, err, ledger.SchemaDigest)
	}
}

// digest reads ledger_schema, what builds from before versioned steps check.
func digest(t *testing.T, driver, dsn string) string {
	t.Helper()
	name := "sqlite"
	if driver == ledger.Postgres {
		name = "pgx"
	}
	db, err := sql.Open(name, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var d string
	if err := db.QueryRowContext(context.Background(), `SELECT digest FROM ledger_schema`).Scan(&d); err != nil {
		t.Fatal(err)
	}
	return d
}

// Upgrading a ledger the release before versioned steps left at this
// schema, while that release's gateways sell on it, takes no table lock:
// the baseline used to run all its DDL again, and its ALTER TABLE, queued
// behind one long read of orders (a report), stopped every sale queued
// behind it until the migration gave up.
func TestUpgradeFromBeforeVersionsLocksNoTable(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	old, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, err := old.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 100, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// As the release before versioned steps left it: its digest, no steps.
	for _, q := range []string{`DROP TABLE ledger_migrations`, `DROP TABLE ledger_compat`} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	report, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer report.Rollback()
	var n int
	if err := report.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err := ledger.Open(octx, ledger.Options{Driver: ledger.Postgres, DSN: dsn})
	if err != nil {
		t.Fatalf("migrate beside a report on a live ledger: %v", err)
	}
	defer l.Close()
	if s := l.Schema(); s.Version != this || s.OldestBuild != 1 {
		t.Errorf("schema %+v after the upgrade, want version %d, oldest build 1", s, this)
	}
	if got := digest(t, ledger.Postgres, dsn); got != ledger.SchemaDigest {
		t.Errorf("ledger_schema says %q after the upgrade, want the baseline's", got)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := old.Purchase(pctx, ledger.Order{IdempotencyKey: keys.MustID("k1"), SKU: sku, Buyer: keys.MustID("b1"), Quantity: 1}); err != nil {
		t.Errorf("a sale beside the upgrade: %v", err)
	}
}

// A replica killed in the middle of a migration (SIGKILL, an evicted pod)
// leaves goose's lock held until its lease runs out. The next start must
// get it well within serve's 30 s to open the ledger (and the chart's 30 s
// startup probe): with goose's default lease of 30 s it waited all of that
// and failed, and so did every replica starting beside it.
func TestMigrationKilledMidwayHoldsOthersBriefly(t *testing.T) {
	slow := ledger.FutureStep{Version: this + 1, Up: `SELECT pg_sleep(60)`}
	if dsn := os.Getenv("LEDGER_TEST_MIGRATE_SLOWLY"); dsn != "" {
		// The replica to kill.
		_, err := ledger.OpenBuild(context.Background(), ledger.Options{Driver: ledger.Postgres, DSN: dsn}, 1, slow)
		t.Fatalf("the slow migration returned: %v", err)
	}
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	replica := exec.Command(os.Args[0], "-test.run=^TestMigrationKilledMidwayHoldsOthersBriefly$")
	replica.Env = append(os.Environ(), "LEDGER_TEST_MIGRATE_SLOWLY="+dsn)
	if err := replica.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- replica.Wait() }() // ends with the kill below
	t.Cleanup(func() { replica.Process.Kill() })
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Killed once it runs the slow step (this build's done) under the lock.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) { // poll interval
		select {
		case err := <-exited:
			t.Fatalf("the migrating replica exited before it was killed: %v", err)
		default:
		}
		var locked bool
		var version, sleeping int64
		if db.QueryRowContext(ctx, `SELECT locked FROM ledger_migrate_lock`).Scan(&locked) == nil && locked &&
			db.QueryRowContext(ctx, `SELECT MAX(version_id) FROM ledger_migrations`).Scan(&version) == nil && version == this &&
			// Inside the slow step: its pg_sleep is running.
			db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'`).Scan(&sleeping) == nil && sleeping > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica did not start the slow step within 60 s")
		}
	}
	replica.Process.Kill()
	<-exited //nolint:errcheck // the Wait of a killed process: "signal: killed"

	start := time.Now()
	octx, cancel := context.WithTimeout(ctx, 30*time.Second) // serve's
	defer cancel()
	l, err := ledger.OpenBuild(octx, ledger.Options{Driver: ledger.Postgres, DSN: dsn}, 1, expand)
	if err != nil {
		t.Fatalf("start after a replica was killed mid-migration: %v (after %v)", err, time.Since(start))
	}
	defer l.Close()
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("start after a replica was killed mid-migration took %v, want well within serve's 30 s", took)
	}
	if s := l.Schema(); s.Version != this+1 {
		t.Errorf("schema %+v, want version %d", s, this+1)
	}
}

// A role that may not take the migration lock (a serving role left with
// migrate on, when a new build's step is due) fails at once and says why.
// goose retried the refused lock every 100 ms: serve gave up after its 30 s
// with only "context deadline exceeded", `stockgate migrate` after 5 minutes.
func TestMigrateWithoutLockRightsFailsAtOnce(t *testing.T) {
	ctx := context.Background()
	admin := testenv.PostgresURL(t)
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: admin})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	db, err := sql.Open("pgx", admin)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	role := fmt.Sprintf("serving_%d", time.Now().UnixNano()%1_000_000_000)
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO " + role,
		"REVOKE ALL ON ledger_migrate_lock FROM " + role,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		_, _ = db.Exec("DROP OWNED BY " + role)
		_, _ = db.Exec("DROP ROLE " + role)
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	start := time.Now()
	octx, cancel := context.WithTimeout(ctx, 30*time.Second) // serve's
	defer cancel()
	if l, err := ledger.OpenBuild(octx, ledger.Options{Driver: ledger.Postgres, DSN: u.String()}, 1, expand); err == nil {
		l.Close()
		t.Fatal("a role without rights on the lock migrated the ledger")
	} else if !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("migrate without rights on the lock = %v (after %v), want the refusal", err, time.Since(start))
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("migrate without rights on the lock took %v to fail", took)
	}
}

// Processes opening one new SQLite file together (`stockgate migrate` and
// serve beside it, or replicas on a shared volume) run each step once. goose
// has no lock for SQLite and lists the steps to run before it begins each
// one: every process ran the baseline and recorded it, and a step that is
// not idempotent (ADD COLUMN) failed in all but one.
func TestSQLiteProcessesMigrateTogether(t *testing.T) {
	if path := os.Getenv("LEDGER_TEST_OPEN_SQLITE"); path != "" {
		l, err := ledger.OpenBuild(context.Background(), ledger.Options{DSN: path}, 1, expand)
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
		return
	}
	path := testenv.SQLitePath(t)
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() {
			p := exec.Command(os.Args[0], "-test.run=^TestSQLiteProcessesMigrateTogether$")
			p.Env = append(os.Environ(), "LEDGER_TEST_OPEN_SQLITE="+path)
			if out, err := p.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("%w: %s", err, out)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var rows, versions int
	if err := db.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT version_id) FROM ledger_migrations WHERE version_id > 0`).Scan(&rows, &versions); err != nil {
		t.Fatal(err)
	}
	if rows != int(this+1) || versions != int(this+1) {
		t.Errorf("ledger_migrations records %d runs of %d steps, want each of %d once", rows, versions, this+1)
	}
}

// Undoing steps with a build older than them (the build being rolled back
// to, not the one that shipped them) is refused saying what to run, not
// with goose's "version not found".
func TestDownToWithABuildOlderThanTheSteps(t *testing.T) {
	ctx := context.Background()
	o := ledger.Options{Driver: ledger.SQLite, DSN: testenv.SQLitePath(t)}
	l, err := ledger.OpenBuild(ctx, o, 1, expand)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	o.NoMigrate = true
	if l, err = ledger.Open(ctx, o); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.DownTo(ctx, this); !errors.Is(err, ledger.ErrSchema) || !strings.Contains(err.Error(), "with the build that shipped them") {
		t.Errorf("down from schema %d with a build knowing %d = %v, want ErrSchema naming the build to use", this+1, this, err)
	}
	if err := l.DownTo(ctx, this+1); err != nil {
		t.Errorf("down to where the ledger is = %v, want nothing to do", err)
	}
	if s := l.Schema(); s.Version != this+1 {
		t.Errorf("schema %+v, want %d still", s, this+1)
	}
}

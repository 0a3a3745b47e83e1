// Package systest starts whole stockgate replicas (app.Open on a real
// Redis Cluster and a real ledger, served over HTTP) for the black-box
// tests under e2e/, one package per capability, and holds what they share:
// the replica (Env), its requests (Do and the helpers built on it, each
// answer checked against the OpenAPI document), the ledger and gate reads
// the tests judge by, and the faults they inject.
//
// An e2e package starts with
//
//	func TestMain(m *testing.M) { os.Exit(systest.Main(m)) }
//
// and its tests call Start or New.
package systest

import (
	"cmp"
	"context"
	"hash/fnv"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/cluster"
	"github.com/stockgate/stockgate/fleet"
	"github.com/stockgate/stockgate/gateway"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/internal/testenv/ledgerenv"
	"github.com/stockgate/stockgate/internal/wait"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// Main runs the package's tests with testenv.Main (which stops the shared
// servers after them), or, in a helper process a test started (see
// KillHolderMidway), that helper's work. Call it from TestMain.
func Main(m *testing.M) int {
	if os.Getenv(helperVar) == reseedHolderName {
		return reseedHolder()
	}
	return testenv.Main(m)
}

// Env is one replica on a real Redis Cluster (the package's shared one
// unless the test brings its own) and a real ledger, served by an
// httptest server.
type Env struct {
	URL    string          // the replica's base URL
	Client *http.Client    // the client Do sends with
	Sale   *sale.Service   // the flows, for tests that reach past HTTP
	Server *gateway.Server // the HTTP face
	Ledger *fleet.Fleet
	// Gate and Seats read and poke Redis through Redis, not through the
	// replica.
	Gate  *shard.Store
	Seats *seats.Store
	// Redis is the test's own client: it goes through none of the
	// replica's breakers (nor trips them) and drops no replies.
	Redis *redis.ClusterClient
	// Guarded is the replica's client: every command through its master's
	// breaker.
	Guarded  *redis.ClusterClient
	Registry *prometheus.Registry
	// Kill stops the replica at once: its server, its loops (a relay with
	// KeepLeases leaves its leases to lapse, as a crash does), its
	// connections.
	Kill func()
	// drift: the replica runs the drift check, which repairs a gate a
	// Redis fault left apart from the ledger.
	drift bool
}

// Options say how to start an Env. The zero value (but for Driver) is a
// replica on the shared cluster and a fresh ledger, running only the
// restock notices.
type Options struct {
	Driver string // ledger.SQLite or ledger.Postgres
	DSN    string // an existing ledger (replicas share it); default a fresh one
	// Primaries are further PostgreSQL primaries beside DSN, named p1,
	// p2, ... (package fleet); none: one ledger.
	Primaries []string
	Cluster   *testenv.Cluster // default the package's shared cluster
	Dialer    func(ctx context.Context, network, addr string) (net.Conn, error)
	Drift     bool // run the drift check
	// RateScope names the shared rate budgets (app.Options.RateScope):
	// replicas of one test that share them pass the same. Default: the
	// replica's own.
	RateScope string
	Sweep     bool // run the hold sweeper
	Relay     bool // run the outbox relay (configure its sinks with Tune)
	Pacer     bool // run the waiting rooms' pacer
	// Tune changes the app's options after the test defaults are set.
	Tune func(*app.Options)
}

// New is Start with only the driver set.
func New(t *testing.T, driver string) *Env { return Start(t, Options{Driver: driver}) }

// Start opens a replica as o says and stops it when the test ends.
//
// The test defaults: a lock TTL of 1s (call timeout 300ms), a drift check
// every 200ms (when it runs), a ledger wait budget of 2s, and the log
// discarded (see Logger).
func Start(t *testing.T, o Options) *Env {
	t.Helper()
	if o.Cluster == nil {
		o.Cluster = testenv.SharedCluster(t)
	}
	if o.DSN == "" {
		o.DSN = LedgerDSN(t, o.Driver)
	}
	opts := app.Options{
		Redis:     cluster.Options{Addrs: o.Cluster.Addrs(), Dialer: o.Dialer},
		Ledger:    ledger.Options{Driver: o.Driver, DSN: o.DSN},
		Primaries: primaries(o.Primaries),
		Lock:      lock.Options{TTL: time.Second, CallTimeout: 300 * time.Millisecond},
		// A wait budget of 2 s, not production's 250 ms: a ledger commit
		// on 2 cores running three test packages takes hundreds of ms, and
		// the tests of what is shed set the production value themselves.
		Sale:   sale.Options{DriftEvery: 200 * time.Millisecond, LedgerWaitBudget: 2 * time.Second},
		Logger: Logger(t),
		// The shared rate budgets are the test's own: its replicas share
		// them, other tests on the cluster (one client address) do not.
		RateScope: cmp.Or(o.RateScope, testenv.ID(t, "rate")),
	}
	if o.Tune != nil {
		o.Tune(&opts)
	}
	a, err := app.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	a.Start(app.Loops{Drift: o.Drift, Sweep: o.Sweep, Notices: true, Relay: o.Relay, Pacer: o.Pacer, Health: true})
	a.Server.SetReady(true)
	hs := httptest.NewServer(a.Server.Handler())
	t.Cleanup(hs.Close)
	tr := &http.Transport{MaxIdleConnsPerHost: 256}
	t.Cleanup(tr.CloseIdleConnections)
	probe, err := cluster.New(cluster.Options{Addrs: opts.Redis.Addrs, TLS: opts.Redis.TLS, Username: opts.Redis.Username, Password: opts.Redis.Password})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = probe.Close() })
	gate, err := shard.New(shard.Options{Redis: probe})
	if err != nil {
		t.Fatal(err)
	}
	seatStore, err := seats.New(probe)
	if err != nil {
		t.Fatal(err)
	}
	// The client's timeout is a hang's guard, not a bound under test: a
	// request the gateway never answers fails the test that sent it, by
	// name, instead of the whole package at go test's timeout.
	return &Env{URL: hs.URL, Client: &http.Client{Transport: tr, Timeout: 3 * time.Minute}, Sale: a.Sale, Server: a.Server, Ledger: a.Ledger,
		Gate: gate, Seats: seatStore, Redis: probe, Guarded: a.Redis, Registry: a.Registry,
		Kill: func() { hs.CloseClientConnections(); hs.Close(); a.Close() }, drift: o.Drift}
}

// EachDriver runs f as a subtest on a ledger driver: in make test on one
// per test, SQLite or PostgreSQL by a hash of the test's name (so the
// family of a package's tests covers both, and a test always gets the
// same one), and on each (ledgerenv.EachDriver) when
// STOCKGATE_TEST_EVERY_LEDGER is set. Every whole-system test on both
// ledgers was a third of make test's CPU, past its 20 minutes on 2 cores;
// what each ledger does itself is still run on both: the ledger's own
// tests (package ledger) and the model runs, which drive every operation
// on each ledger shape (EachShape).
func EachDriver(t *testing.T, f func(t *testing.T, driver string)) {
	if os.Getenv("STOCKGATE_TEST_EVERY_LEDGER") != "" {
		ledgerenv.EachDriver(t, f)
		return
	}
	h := fnv.New32a()
	h.Write([]byte(t.Name()))
	d := ledgerenv.Drivers[h.Sum32()%uint32(len(ledgerenv.Drivers))]
	t.Run(d, func(t *testing.T) { f(t, d) })
}

// OnDriver runs f as a subtest on the one ledger driver named, or on each
// when STOCKGATE_TEST_EVERY_LEDGER is set. It is for the long runs whose
// subject is Redis (a node killed, frozen, resharded mid-sale): each
// takes one ledger and the family of them covers both, which halves
// their share of make test on 2 cores.
func OnDriver(t *testing.T, driver string, f func(t *testing.T, driver string)) {
	if os.Getenv("STOCKGATE_TEST_EVERY_LEDGER") != "" {
		EachDriver(t, f)
		return
	}
	t.Run(driver, func(t *testing.T) { f(t, driver) })
}

// LedgerDSN is a fresh, empty ledger of the driver (ledgerenv.DSN),
// for replicas to share.
func LedgerDSN(t *testing.T, driver string) string { return ledgerenv.DSN(t, driver) }

// Logger shows a replica's log in the test's log when STOCKGATE_TEST_LOG
// is set. Otherwise it keeps the replica's last warnings and errors and
// shows them only if the test fails: a fault test that fails once in CI
// then says what the replica saw (a 503 alone does not).
func Logger(t *testing.T) *slog.Logger {
	if os.Getenv("STOCKGATE_TEST_LOG") == "" {
		r := &logRing{}
		t.Cleanup(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if t.Failed() && r.seen > 0 {
				t.Logf("a replica's last %d warnings and errors (of %d):\n%s", len(r.lines), r.seen, strings.Join(r.lines, ""))
			}
		})
		return slog.New(slog.NewTextHandler(r, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// logRing keeps the last ringLines lines written to it.
type logRing struct {
	mu    sync.Mutex
	lines []string
	seen  int
}

const ringLines = 60

func (r *logRing) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen++
	if len(r.lines) == ringLines {
		r.lines = append(r.lines[:0], r.lines[1:]...)
	}
	r.lines = append(r.lines, string(p))
	return len(p), nil
}

type tlogWriter struct{ t *testing.T }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// NewSKU is a SKU (ticket "ga") of a program no other test uses.
func NewSKU(t *testing.T) stock.SKU {
	return stock.SKU{Program: keys.MustID(testenv.ID(t, "p")), Ticket: keys.MustID("ga")}
}

// WaitFor polls ok every 10ms until it holds, and fails the test if it
// does not within the bound: tests wait for conditions, never for time.
func WaitFor(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	wait.For(t, within, what, ok)
}

// WaitUntil checks ok until it holds or the time is up, and reports
// whether it held (wait.Until): for a test that fails with more than
// WaitFor says, or goes on either way.
func WaitUntil(within time.Duration, ok func() bool) bool { return wait.Until(within, ok) }

// FullTier marks a test of the full tier only (a model run, an attack, a
// fault run): -short, the fast tier (make test-short), skips it.
func FullTier(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("full tier only (model, attack and fault runs): skipped with -short")
	}
}

// Pair starts two replicas on one fresh ledger of driver: the whole-system
// tests' usual "several replicas, one ledger".
func Pair(t *testing.T, driver string) (a, b *Env) {
	t.Helper()
	return PairTuned(t, driver, nil)
}

// PairTuned is Pair with tune applied to both replicas' options.
func PairTuned(t *testing.T, driver string, tune func(*app.Options)) (a, b *Env) {
	t.Helper()
	dsn := LedgerDSN(t, driver)
	return Start(t, Options{Driver: driver, DSN: dsn, Tune: tune}), Start(t, Options{Driver: driver, DSN: dsn, Tune: tune})
}

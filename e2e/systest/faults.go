package systest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/cluster"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// TripBreakers pings every Redis master through the replica's client
// (each command goes through its master's breaker) until masters of them
// are open: with the nodes down or frozen, every master's breaker opens,
// as a sale's calls would open it.
func TripBreakers(t *testing.T, e *Env, masters int) {
	t.Helper()
	WaitFor(t, 60*time.Second, "every master's breaker open", func() bool {
		_ = e.Guarded.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
			ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			return c.Ping(ctx).Err()
		})
		open := 0
		for _, st := range e.Sale.Breakers().States() {
			if st == breaker.Open {
				open++
			}
		}
		return open >= masters
	})
}

// The helper process Main runs instead of the tests when helperVar names
// it.
const (
	helperVar        = "STOCKGATE_TEST_HELPER"
	reseedHolderName = "reseed-holder"
)

// KillHolderMidway starts a replica in another process (the test binary
// again, see Main) that takes the SKU's re-seed lock, closes its gate for
// a rebuild (mode "reconcile") or a collapse onto one shard ("collapse"),
// and then waits; once the fence is visible it is killed with SIGKILL. It
// returns when it died. dsn is the PostgreSQL ledger the replica opens;
// it uses the package's shared cluster.
func KillHolderMidway(t *testing.T, e *Env, mode, dsn string, sku stock.SKU, shards int) time.Time {
	t.Helper()
	holder := exec.Command(os.Args[0], "-test.run=^$")
	holder.Env = append(os.Environ(), helperVar+"="+reseedHolderName, "HELPER_MODE="+mode,
		"HELPER_REDIS="+strings.Join(testenv.SharedCluster(t).Addrs(), ","), "HELPER_DSN="+dsn,
		"HELPER_PROGRAM="+sku.Program.String(), "HELPER_TICKET="+sku.Ticket.String())
	var stderr bytes.Buffer
	holder.Stderr = &stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- holder.Wait() }() // ends when the holder does; the kill below makes sure it does
	t.Cleanup(func() { _ = holder.Process.Kill() })
	// A bound, not a pause: a race-built helper process opening its own
	// ledger and Redis client on a busy 2-core machine can take seconds. A
	// holder that stops before fencing fails the test at once, saying why.
	// Its stderr is read only once Wait has returned (exec copies into the
	// buffer until then).
	for deadline := time.Now().Add(60 * time.Second); ; {
		select {
		case err := <-exited:
			t.Fatalf("the reseed holder exited before fencing (%v): %s", err, stderr.String())
		default:
		}
		if st, err := e.Gate.Read(context.Background(), sku, shards); err == nil && st[0].Fenced {
			break
		}
		if time.Now().After(deadline) {
			_ = holder.Process.Kill()
			err := <-exited
			t.Fatalf("no fence from the reseed holder within 60s (%v): %s", err, stderr.String())
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	killed := time.Now()
	_ = holder.Process.Kill()
	<-exited //nolint:errcheck // the Wait of a killed process: "signal: killed"
	return killed
}

// stuckLedger never finishes AdvanceGate: a rebuild that calls it stops
// there, fenced, holding its lock.
type stuckLedger struct{ sale.Ledger }

func (stuckLedger) AdvanceGate(ctx context.Context, _ stock.SKU) (ledger.SKUState, error) {
	<-ctx.Done()
	return ledger.SKUState{}, ctx.Err()
}

// reseedHolder is the helper process of KillHolderMidway: it starts a
// re-seed that fences the gate and then waits an hour to read the ledger,
// so the test can kill it mid-way.
func reseedHolder() int {
	ctx := context.Background()
	// The holder stops inside the rebuild, with the gate fenced, until it
	// is killed: its ledger never returns from AdvanceGate.
	a, err := app.Open(ctx, app.Options{
		Redis:      cluster.Options{Addrs: strings.Split(os.Getenv("HELPER_REDIS"), ",")},
		Ledger:     ledger.Options{Driver: ledger.Postgres, DSN: os.Getenv("HELPER_DSN")},
		Lock:       lock.Options{TTL: time.Second, CallTimeout: 500 * time.Millisecond},
		Sale:       sale.Options{WorkTimeout: time.Hour},
		WrapLedger: func(l sale.Ledger) sale.Ledger { return stuckLedger{l} },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "reseed holder: open:", err)
		return 1
	}
	srv := a.Sale
	sku := stock.SKU{Program: keys.MustID(os.Getenv("HELPER_PROGRAM")), Ticket: keys.MustID(os.Getenv("HELPER_TICKET"))}
	// The replicas take the lock now and then for a moment (a drift check
	// that finds nothing to do): try until this one holds it. On a loaded
	// machine a lock call may outlast its timeout too (CI, 2026-11-30):
	// that try is lost, not the test; a lock it took anyway answers busy
	// to the next try until its TTL ends.
	tries := 0
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); tries++ {
		if os.Getenv("HELPER_MODE") == "collapse" {
			_, err = srv.Collapse(ctx, sku)
		} else {
			_, err = srv.Reconcile(ctx, sku)
		}
		if !errors.Is(err, lock.ErrBusy) && !errors.Is(err, sale.ErrRebuildBusy) && !errors.Is(err, context.DeadlineExceeded) {
			break
		}
		time.Sleep(10 * time.Millisecond) // poll interval: the next try for the lock
	}
	fmt.Fprintf(os.Stderr, "reseed holder: returned after %d busy tries (it should have been killed): %v\n", tries, err)
	return 1
}

// FaultEnv is a replica on a 3-master + 3-replica cluster of the test's
// own (the test will damage it), a PostgreSQL ledger, and the drift check
// and the sweeper running; tune, if not nil, changes the app's options.
func FaultEnv(t *testing.T, tune func(*app.Options)) (*Env, *testenv.Cluster) {
	return FaultEnvOn(t, ledger.Postgres, tune)
}

// FaultEnvOn is FaultEnv on a ledger of the shape (EachShape's, but
// SQLite): on TwoPrimaries, programs the test places with PlaceOnSecond
// live on the primary that does not keep the directory.
func FaultEnvOn(t *testing.T, shape string, tune func(*app.Options)) (*Env, *testenv.Cluster) {
	c := testenv.NewCluster(t, testenv.ClusterOptions{ReplicasPerMaster: 1})
	o := NewLedger(t, shape)
	o.Cluster, o.Drift, o.Sweep, o.Tune = c, true, true, tune
	return Start(t, o), c
}

// PlaceOnSecond puts program on the second primary (p1) of e's ledger, if
// it has one; on one primary it does nothing.
func PlaceOnSecond(t *testing.T, e *Env, program keys.ID) {
	t.Helper()
	if len(e.Ledger.Primaries()) < 2 {
		return
	}
	if err := e.Ledger.Place(context.Background(), program, PrimaryName(0)); err != nil {
		t.Fatal(err)
	}
}

// SeatCheck runs the admin seat check of sku (it repairs what differs)
// and returns what it found. A check needs Redis: answered 503 while a
// breaker is open (a busy machine's Redis timeout in a race), it is asked
// again until the breaker lets it through.
func (e *Env) SeatCheck(t *testing.T, sku stock.SKU) sale.SeatCheck {
	t.Helper()
	var r Reply
	WaitFor(t, 30*time.Second, "a seat check past an open breaker", func() bool {
		r = e.Do(t, http.MethodPost, AdminPath(sku)+"/seats/check", nil, "")
		return r.Status != http.StatusServiceUnavailable
	})
	var check sale.SeatCheck
	if err := json.Unmarshal(r.Body, &check); err != nil || r.Status != http.StatusOK {
		t.Fatalf("seat check = %d %s", r.Status, r.Body)
	}
	return check
}

// SlowDirect is a WrapLedger that slows the takes around the Redis gate
// (the breaker-open fallback) by per each: a narrow, slow fallback whose
// excess outlasts a take's wait for a place there.
func SlowDirect(per time.Duration) func(sale.Ledger) sale.Ledger {
	return func(l sale.Ledger) sale.Ledger { return slowDirect{Ledger: l, per: per} }
}

type slowDirect struct {
	sale.Ledger
	per time.Duration
}

func (l slowDirect) Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult {
	if direct {
		time.Sleep(time.Duration(len(takes)) * l.per) // time under test: the slowness injected
	}
	return l.Ledger.Commit(ctx, takes, direct)
}

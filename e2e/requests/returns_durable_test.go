package requests_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/ledger"
)

// A cancel or a refund whose COMMIT applied on the primary alone (its
// backend ended while it waited for the synchronous standby: the client
// got 503) gives its units back to Redis only once the standby has it. A
// failover to the standby takes such a row back, and units Redis got for
// it are units the ledger does not have: sold at the gate, refused by the
// ledger. The replay's answer waited for the standby already
// (TestReplaysWaitForTheStandby), but its give-back ran first, and so did
// the sweeper's (helper-111). With the standby silent, neither the retries
// (503) nor the sweeps give the units back; once the server waits for no
// standby, the retries answer their replays and Redis has the units.
func TestReturnsWaitForTheStandby(t *testing.T) {
	systest.FullTier(t)
	pg := testenv.NewSyncPostgres(t)
	var counted *systest.CountingLedger
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: pg.DSN, Sweep: true, Tune: func(o *app.Options) {
		o.Sale.WorkTimeout = 2 * time.Second
		o.Sale.SweepEvery = 50 * time.Millisecond
		o.Sale.RestoreGrace = 50 * time.Millisecond
		counted = systest.CountLedger(o)
	}})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 10, 1, 4)
	_, h := e.Hold(t, sku, "h1", "ann", 2, 0)
	order := systest.OrderID(e.MustBuy(t, sku, "p1", "bob", 3))
	ctx := context.Background()
	left := func() int64 {
		t.Helper()
		n, _, err := e.Gate.Remaining(ctx, sku, 1)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := left(); n != 5 {
		t.Fatalf("Redis has %d left after a hold of 2 and a purchase of 3 of 10", n)
	}

	pg.Standby(t, "nobody") // a synchronous standby that never answers
	t.Cleanup(func() { pg.Standby(t, "") })
	cancel := "/v1/holds/" + h.HoldID + "/cancel"
	refund := "/v1/orders/" + order + "/refund"
	for _, s := range []struct{ path, key, buyer string }{{cancel, "x1", "ann"}, {refund, "r1", "bob"}} {
		if r := e.Act(t, s.path, s.key, s.buyer); r.Status != http.StatusServiceUnavailable {
			t.Fatalf("%s with the standby silent = %d %s, want 503 (its COMMIT waits)", s.path, r.Status, r.Body)
		}
	}
	// Both committed on the primary alone: a plain read sees them.
	systest.WaitFor(t, 30*time.Second, "the cancel and the refund seen by a plain read", func() bool {
		var n int
		err := pg.Raw.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM holds WHERE state = 'cancelled')
			+ (SELECT count(*) FROM orders WHERE refunded_at > 0)`).Scan(&n)
		return err == nil && n == 2
	})
	for _, s := range []struct{ path, key, buyer string }{{cancel, "x1", "ann"}, {refund, "r1", "bob"}} {
		if r := e.Act(t, s.path, s.key, s.buyer); r.Status != http.StatusServiceUnavailable {
			t.Errorf("%s sent again with the standby silent = %d %s, want 503", s.path, r.Status, r.Body)
		}
	}
	if n := left(); n != 5 {
		t.Fatalf("Redis has %d left after the retries, while the cancel and the refund are on the primary alone; want 5 (a failover takes them back)", n)
	}
	// The sweeper has asked for both restores at least twice since (each
	// ask runs out of time): it had every chance to give them back.
	asked := counted.ByMethod()["RestoreDurable"]
	systest.WaitFor(t, time.Minute, "two more sweeps asking for the restores", func() bool {
		return counted.ByMethod()["RestoreDurable"] >= asked+2
	})
	if n := left(); n != 5 {
		t.Errorf("Redis has %d left after the sweeps, while the cancel and the refund are on the primary alone; want 5", n)
	}

	pg.Standby(t, "") // no synchronous standby: a local commit is the promise
	for _, s := range []struct{ path, key, buyer string }{{cancel, "x1", "ann"}, {refund, "r1", "bob"}} {
		if r, _ := e.Retried(t, http.MethodPost, s.path, s.key, `{"buyer":"`+s.buyer+`"}`); r.Status != http.StatusOK ||
			r.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("%s sent again with no standby named = %d (replayed %q) %s, want its replay", s.path, r.Status,
				r.Header.Get("Idempotent-Replayed"), r.Body)
		}
	}
	systest.WaitFor(t, 30*time.Second, "the 5 units back in Redis", func() bool { return left() == 10 })
}

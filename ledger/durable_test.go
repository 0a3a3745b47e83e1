package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/internal/wait"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// A request row that a reader sees on the primary while its COMMIT still
// waits for the synchronous standby is no answer to replay: a failover to
// the standby takes it back (TestFaultLedgerFailover saw one 201 of 2,401
// lost so). RequestDurable confirms it only once the standby has it: on a
// server of the test's own whose synchronous standby never answers, the
// row is visible to a plain read (and to RequestByKey) but RequestDurable,
// which the sale asks before it replays an answer, runs out of time; once
// the server stops waiting for a standby, it confirms.
func TestRequestDurableWaitsForTheStandby(t *testing.T) {
	ctx := context.Background()
	pg := testenv.NewSyncPostgres(t)
	dsn, raw := pg.DSN, pg.Raw
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	pg.Standby(t, "nobody") // a synchronous standby that never answers
	t.Cleanup(func() { pg.Standby(t, "") })

	// The purchase commits locally, then waits for the standby for ever.
	// Its backend is ended in that wait (as a killed primary's are): the
	// transaction stays committed locally and shows to a plain read.
	waiting, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := l.Purchase(waiting, ledger.Order{IdempotencyKey: keys.MustID("g1"), SKU: sku, Buyer: keys.MustID("ann"), Quantity: 1,
			Req: req("ann", "k", "fp1", ledger.OpPurchase)})
		done <- err
	}()
	ended := 0
	wait.Until(30*time.Second, func() bool {
		if err := raw.QueryRowContext(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&ended); err != nil {
			t.Fatal(err)
		}
		return ended > 0
	})
	if ended == 0 {
		t.Fatal("no COMMIT waited for the synchronous standby within 30 s")
	}
	if err := <-done; err == nil {
		t.Fatal("the purchase whose backend was ended in its COMMIT's wait answered no error")
	}
	n := 0
	wait.Until(30*time.Second, func() bool {
		if err := raw.QueryRowContext(ctx, `SELECT count(*) FROM requests`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if n != 1 {
		t.Fatalf("the purchase's row was never seen by a plain read (%d rows): the case is not shown", n)
	}
	if rec, err := l.RequestByKey(ctx, keys.MustID("ann"), keys.MustID("k")); err != nil || rec.Order == nil {
		t.Fatalf("RequestByKey = %+v, %v; want the row a replay would answer from", rec, err)
	}
	short, cancel2 := context.WithTimeout(ctx, time.Second)
	defer cancel2()
	if err := l.RequestDurable(short, keys.MustID("ann"), keys.MustID("k")); err == nil || errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("RequestDurable of a row not on the standby = %v; want it unconfirmed (the deadline)", err)
	}

	pg.Standby(t, "") // no synchronous standby: a local commit is the promise
	if err := l.RequestDurable(ctx, keys.MustID("ann"), keys.MustID("k")); err != nil {
		t.Errorf("RequestDurable once the server waits for no standby = %v", err)
	}
	if err := l.RequestDurable(ctx, keys.MustID("ann"), keys.MustID("nokey")); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("RequestDurable of no row = %v, want ErrNotFound", err)
	}
}

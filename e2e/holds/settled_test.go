package holds_test

// helper-41's first finding (issue 39's second break, PostgreSQL): a
// confirm begun before a hold's expiry was still committing when a
// second confirm (another key) or an extension arrived just after the
// expiry. Their READ COMMITTED read showed the hold held and past its
// expiry, and they answered 410 hold-expired, "nothing was sold",
// beside the order the first one made: a platform refunds a payment for
// an order that stands. They now answer "expired" only once the ledger
// has expired the hold (its conditional update waits for the confirm's
// row lock, and then finds the hold confirmed).

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
)

// A confirm (quantity 1 of a hold of 2) is held mid-commit, its hold's
// row locked: the test locks the SKU's row first, which the confirm
// updates after it claims the hold. The hold's expiry passes; then a
// second confirm of the same quantity under another key, or an
// extension, is sent. Both wait for the first confirm and answer from
// its outcome: the second confirm 201 with the same order, the
// extension 409 hold-confirmed; never 410. (Without the fix both
// answered 410 at once.)
func TestSecondRequestWaitsForAConfirmInFlight(t *testing.T) {
	systest.FullTier(t)
	ctx := context.Background()
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	// The first confirm waits on the test's lock past the expiry: no
	// shedding, no work deadline in the way (the longer TTLs' tries).
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn,
		Tune: func(o *app.Options) { o.Sale.LedgerWaitBudget, o.Sale.WorkTimeout = time.Minute, 2*time.Minute }})
	db := openDB(t, dsn)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 20, 1, 4)
	waiters := func(table string) int {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%`+table+`%'`).Scan(&n); err != nil {
			return -1
		}
		return n
	}
	for i, second := range []struct{ path, body string }{
		{"confirm", `{"buyer":"ann","quantity":1}`},
		{"extend", `{"buyer":"ann","ttl_seconds":60}`},
	} {
		name := second.path
		// The first confirm must begin before the expiry: a TTL the
		// set-up below fits in, longer on each try a busy machine spoils.
		var first, got systest.Reply
		var holdID string
		for try, ttl := range []int{3, 8, 20} {
			r, h := e.Hold(t, sku, fmt.Sprintf("h%d-%d", i, try), "ann", 2, ttl)
			if r.Status != http.StatusCreated {
				t.Fatalf("%s: hold = %d %s", name, r.Status, r.Body)
			}
			holdID = h.HoldID
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, `SELECT 1 FROM skus WHERE program = $1 AND ticket = $2 FOR UPDATE`,
				sku.Program.String(), sku.Ticket.String()); err != nil {
				t.Fatal(err)
			}
			firstOut := make(chan systest.Reply, 1)
			go func() {
				firstOut <- e.Do(t, http.MethodPost, "/v1/holds/"+holdID+"/confirm",
					map[string]string{"Idempotency-Key": fmt.Sprintf("c%d-%d", i, try)}, `{"buyer":"ann","quantity":1}`)
			}()
			var early *systest.Reply
			answered := func() bool {
				select {
				case c := <-firstOut:
					early = &c
					return true
				default:
					return false
				}
			}
			systest.WaitFor(t, 30*time.Second, "the first confirm to wait on the SKU's row", func() bool {
				return answered() || waiters("skus") >= 1
			})
			if early == nil {
				systest.WaitFor(t, 30*time.Second, "the hold's expiry to pass", func() bool {
					return answered() || time.Now().After(h.ExpiresAt.Add(50*time.Millisecond))
				})
			}
			if early != nil {
				// It began after the expiry (or never waited): try again
				// with a longer TTL.
				_ = tx.Rollback()
				t.Logf("%s: try %d: the first confirm answered %d before the expiry passed under it", name, try, early.Status)
				continue
			}
			secondOut := make(chan systest.Reply, 1)
			go func() {
				secondOut <- e.Do(t, http.MethodPost, "/v1/holds/"+holdID+"/"+second.path,
					map[string]string{"Idempotency-Key": fmt.Sprintf("s%d-%d", i, try)}, second.body)
			}()
			var secondEarly *systest.Reply
			systest.WaitFor(t, 30*time.Second, "the second request to answer or wait on the hold's row", func() bool {
				select {
				case c := <-secondOut:
					secondEarly = &c
					return true
				default:
				}
				return waiters("holds") >= 1
			})
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			first = <-firstOut
			if secondEarly != nil {
				got = *secondEarly
			} else {
				got = <-secondOut
			}
			break
		}
		if first.Status == 0 {
			t.Fatalf("%s: the first confirm never began before the expiry in three tries", name)
		}
		if first.Status != http.StatusCreated {
			t.Fatalf("%s: the first confirm, begun before the expiry = %d %s, want 201", name, first.Status, first.Body)
		}
		t.Logf("%s: first confirm 201 %s; second answered %d %s", name, systest.OrderID(first), got.Status, got.Body)
		switch second.path {
		case "confirm":
			if got.Status != http.StatusCreated || systest.OrderID(got) != systest.OrderID(first) {
				t.Errorf("a confirm of the same quantity after the expiry, while the first committed = %d %s, want 201 with order %s",
					got.Status, got.Body, systest.OrderID(first))
			}
		case "extend":
			if got.Status != http.StatusConflict {
				t.Errorf("an extension after the expiry, while a confirm committed = %d %s, want 409 hold-confirmed",
					got.Status, got.Body)
			}
		}
		if s := e.HoldState(t, holdID); s != "confirmed" {
			t.Errorf("%s: the hold reads %q, want confirmed", name, s)
		}
	}
	systest.WaitSettled(t, e, sku)
}

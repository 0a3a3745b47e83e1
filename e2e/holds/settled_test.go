package holds_test

// helper-41's first finding (issue 39's second break, PostgreSQL): a
// confirm begun before a hold's expiry was still committing when a
// second confirm (another key) or an extension arrived just after the
// expiry. Their READ COMMITTED read showed the hold held and past its
// expiry, and they answered 410 hold-expired, "nothing was sold",
// beside the order the first one made: a platform refunds a payment for
// an order that stands. With late payments on, a seat, pool, code or
// offer hold was answered 409 late-payment-refused ("refund the
// payment") the same way (helper-44). They now answer "expired" or
// "refused" only once the ledger has expired the hold (its conditional
// update waits for the confirm's row lock, and then finds the hold
// confirmed).

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// inFlight holds a first confirm (body first) of a hold mid-commit, its
// hold's row locked: the test locks the SKU's row first, which a confirm
// updates after it claims the hold (ConfirmPart and the batched
// confirms alike). Once the hold's expiry has passed it sends the second
// request (POST /v1/holds/{id}/<path> with body) to replica to (a
// batched confirm queues behind the first in its replica's lane: it
// goes to another), lets the first go
// once the second answered or waits on the hold's row, and returns both
// answers. hold makes the hold with a TTL in seconds; the first confirm
// must begin before the expiry, so a busy machine that spoils a try
// gets a longer TTL.
func inFlight(t *testing.T, e, to *systest.Env, db *sql.DB, sku stock.SKU, hold func(key string, ttl int) (string, time.Time),
	first, path, body string) (firstAnswer, second systest.Reply, holdID string) {
	t.Helper()
	ctx := context.Background()
	for try, ttl := range []int{3, 8, 20} {
		id, expires := hold(fmt.Sprintf("%s-h%d", path, try), ttl)
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
			firstOut <- e.Do(t, http.MethodPost, "/v1/holds/"+id+"/confirm",
				map[string]string{"Idempotency-Key": fmt.Sprintf("%s-c%d", path, try)}, first)
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
			return answered() || lockWaiters(ctx, db, "skus") >= 1
		})
		if early == nil {
			systest.WaitFor(t, 30*time.Second, "the hold's expiry to pass", func() bool {
				return answered() || time.Now().After(expires.Add(50*time.Millisecond))
			})
		}
		if early != nil {
			// It began after the expiry (or never waited): try again
			// with a longer TTL.
			_ = tx.Rollback()
			t.Logf("%s: try %d: the first confirm answered %d before the expiry passed under it", path, try, early.Status)
			continue
		}
		secondOut := make(chan systest.Reply, 1)
		go func() {
			secondOut <- to.Do(t, http.MethodPost, "/v1/holds/"+id+"/"+path,
				map[string]string{"Idempotency-Key": fmt.Sprintf("%s-s%d", path, try)}, body)
		}()
		secondEarly := answeredOrParked(t, ctx, db, secondOut, 30*time.Second, "the second request to answer or wait on the hold's row")
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		firstAnswer = <-firstOut
		if secondEarly != nil {
			second = *secondEarly
		} else {
			second = <-secondOut
		}
		if firstAnswer.Status != http.StatusCreated {
			t.Fatalf("%s: the first confirm, begun before the expiry = %d %s, want 201", path, firstAnswer.Status, firstAnswer.Body)
		}
		t.Logf("%s: first confirm 201 %s; second answered %d %s", path, systest.OrderID(firstAnswer), second.Status, second.Body)
		return firstAnswer, second, id
	}
	t.Fatalf("%s: the first confirm never began before the expiry in three tries", path)
	return
}

// A confirm (quantity 1 of a hold of 2, late payments off) is held
// mid-commit while the hold's expiry passes; then a second confirm of
// the same quantity under another key, or an extension, is sent. Both
// wait for the first confirm and answer from its outcome: the second
// confirm 201 with the same order, the extension 409 hold-confirmed;
// never 410. (Without the fix both answered 410 at once.)
func TestSecondRequestWaitsForAConfirmInFlight(t *testing.T) {
	systest.FullTier(t)
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	// The first confirm waits on the test's lock past the expiry: no
	// shedding, no work deadline in the way (the longer TTLs' tries).
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn,
		Tune: func(o *app.Options) { o.Sale.LedgerWaitBudget, o.Sale.WorkTimeout = time.Minute, 2*time.Minute }})
	db := openDB(t, dsn)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 20, 1, 4)
	hold := func(key string, ttl int) (string, time.Time) {
		r, h := e.Hold(t, sku, key, "ann", 2, ttl)
		if r.Status != http.StatusCreated {
			t.Fatalf("hold = %d %s", r.Status, r.Body)
		}
		return h.HoldID, h.ExpiresAt
	}
	first, got, id := inFlight(t, e, e, db, sku, hold, `{"buyer":"ann","quantity":1}`, "confirm", `{"buyer":"ann","quantity":1}`)
	if got.Status != http.StatusCreated || systest.OrderID(got) != systest.OrderID(first) {
		t.Errorf("a confirm of the same quantity after the expiry, while the first committed = %d %s, want 201 with order %s",
			got.Status, got.Body, systest.OrderID(first))
	}
	if s := e.HoldState(t, id); s != "confirmed" {
		t.Errorf("the hold reads %q, want confirmed", s)
	}
	_, got, id = inFlight(t, e, e, db, sku, hold, `{"buyer":"ann","quantity":1}`, "extend", `{"buyer":"ann","ttl_seconds":60}`)
	if got.Status != http.StatusConflict {
		t.Errorf("an extension after the expiry, while a confirm committed = %d %s, want 409 hold-confirmed", got.Status, got.Body)
	}
	if s := e.HoldState(t, id); s != "confirmed" {
		t.Errorf("the hold reads %q, want confirmed", s)
	}
	systest.WaitSettled(t, e, sku)
}

// Late payments on, a seat hold (which a late payment refuses: "refund
// the payment"): a whole confirm held mid-commit (the batched confirm)
// while the expiry passes, and a second whole confirm under another key
// on the other replica.
// The second waits and answers the first's order, 201; never 409
// late-payment-refused beside it. (Without the fix: 409 at once.)
func TestSeatHoldLateRefusalWaitsForAConfirmInFlight(t *testing.T) {
	systest.FullTier(t)
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	tune := func(o *app.Options) {
		o.Sale.LatePayment, o.Sale.LedgerWaitBudget, o.Sale.WorkTimeout = time.Minute, time.Minute, 2*time.Minute
	}
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: tune})
	b := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: tune})
	db := openDB(t, dsn)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 0, 1, 4)
	e.LoadSeats(t, sku, map[string]int{"A": 8})
	n := 0
	hold := func(key string, ttl int) (string, time.Time) {
		n++
		b, _ := json.Marshal(map[string]any{"buyer": "bob", "ttl_seconds": ttl,
			"seats": []string{fmt.Sprintf("A-%02d", 2*n-1), fmt.Sprintf("A-%02d", 2*n)}})
		r := e.Do(t, http.MethodPost, systest.SKUPath(sku)+"/seat-holds", map[string]string{"Idempotency-Key": key}, string(b))
		var h systest.HoldReply
		if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &h) != nil {
			t.Fatalf("seat hold = %d %s", r.Status, r.Body)
		}
		return h.HoldID, h.ExpiresAt
	}
	first, got, id := inFlight(t, e, b, db, sku, hold, `{"buyer":"bob"}`, "confirm", `{"buyer":"bob"}`)
	if got.Status != http.StatusCreated || systest.OrderID(got) != systest.OrderID(first) {
		t.Errorf("a confirm of a seat hold after the expiry, while the first committed = %d %s, want 201 with order %s",
			got.Status, got.Body, systest.OrderID(first))
	}
	if s := e.HoldState(t, id); s != "confirmed" {
		t.Errorf("the hold reads %q, want confirmed", s)
	}
}

// answeredOrParked waits until a request in flight answers (its answer,
// returned) or a backend waits on a lock of the holds table (nil): the
// request is then parked on the row the test's transaction holds.
func answeredOrParked(t *testing.T, ctx context.Context, db *sql.DB, out <-chan systest.Reply, within time.Duration, what string) *systest.Reply {
	t.Helper()
	var early *systest.Reply
	systest.WaitFor(t, within, what, func() bool {
		select {
		case c := <-out:
			early = &c
			return true
		default:
		}
		return lockWaiters(ctx, db, "holds") >= 1
	})
	return early
}

// lockWaiters is how many of the ledger's sessions wait on a row lock in a
// statement naming table (-1 when PostgreSQL can't say): a test holds a
// row in a transaction of its own and waits until the request it sent is
// parked on it, not a fixed time.
func lockWaiters(ctx context.Context, db *sql.DB, table string) int {
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND wait_event_type = 'Lock' AND query LIKE '%'||$1||'%'`, table).Scan(&n); err != nil {
		return -1
	}
	return n
}

package holds_test

// Attacks on a confirm never paying late beside a hold an extension
// kept, and on replays giving back what they owe Redis: these held.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
)

// confirmUnderExtension moves the hold's expiry into the past, then holds
// an uncommitted extension of it (row locked, expiry 2 min ahead) while
// the confirm is sent, and commits the extension once the confirm waits
// on the row (the technique of TestConfirmWhileAnExtensionCommits). It
// returns the confirm's answer and the hold as read afterwards.
func confirmUnderExtension(t *testing.T, e *systest.Env, db *sql.DB, holdID, key, body string) (systest.Reply, systest.HoldReply, bool) {
	t.Helper()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `UPDATE holds SET expires_at = $2 WHERE id = $1 AND state = 'held'`,
		holdID, time.Now().Add(-2*time.Second).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE holds SET expires_at = $2 WHERE id = $1 AND state = 'held'`,
		holdID, time.Now().Add(2*time.Minute).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	out := make(chan systest.Reply, 1)
	go func() {
		out <- e.Do(t, http.MethodPost, "/v1/holds/"+holdID+"/confirm", map[string]string{"Idempotency-Key": key}, body)
	}()
	early := answeredOrParked(t, ctx, db, out, 10*time.Second, "the confirm to wait on the hold's row")
	if early != nil {
		t.Logf("the confirm answered without waiting on the row: %d %s", early.Status, early.Body)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var c systest.Reply
	if early != nil {
		c = *early
	} else {
		c = <-out
	}
	g := e.Do(t, http.MethodGet, "/v1/holds/"+holdID, nil, "")
	var now systest.HoldReply
	_ = json.Unmarshal(g.Body, &now)
	return c, now, early != nil
}

func openDB(t *testing.T, dsn string) *sql.DB {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Late payments off: a confirm of a hold past its expiry while an
// extension commits. The extension answered (here: committed) and the
// hold is held and not due, so the confirm must confirm it (201, the
// hold's order) — never 410 hold-expired for a hold that stays held.
func TestAttackConfirmWhileExtendedLateOff(t *testing.T) {
	systest.FullTier(t)
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn})
	db := openDB(t, dsn)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 20, 1, 4)
	for i, body := range []string{`{"buyer":"ann"}`, `{"buyer":"ann","quantity":1}`} {
		r, h := e.Hold(t, sku, fmt.Sprintf("h%d", i), "ann", 2, 60)
		if r.Status != http.StatusCreated {
			t.Fatalf("hold = %d %s", r.Status, r.Body)
		}
		c, now, early := confirmUnderExtension(t, e, db, h.HoldID, fmt.Sprintf("c%d", i), body)
		t.Logf("%s: confirm = %d %s (before the extension committed: %v); hold now %s order %q", body, c.Status, c.Body, early, now.State, now.OrderID)
		if c.Status != http.StatusCreated && now.State == "held" && !early {
			t.Errorf("%s: confirm of a hold an extension kept answered %d %s while the hold stays held (not due, expires %v)",
				body, c.Status, c.Body, now.ExpiresAt)
		}
		if c.Status == http.StatusCreated && (now.State != "confirmed" || now.OrderID != systest.OrderID(c)) {
			t.Errorf("%s: 201 %s, the hold reads %+v", body, c.Body, now)
		}
	}
	systest.WaitSettled(t, e, sku)
}

// Late payments on: a seat hold past its expiry while an extension
// commits. latePaid refuses seat holds before it looks whether the hold
// is held again: the confirm would answer 409 late-payment-refused
// ("refund the payment") for a seat hold that stays held and not due.
func TestAttackSeatHoldConfirmWhileExtended(t *testing.T) {
	systest.FullTier(t)
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	late := func(o *app.Options) { o.Sale.LatePayment = time.Minute }
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: late})
	db := openDB(t, dsn)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 0, 1, 4)
	e.LoadSeats(t, sku, map[string]int{"A": 4})
	r, h := e.SeatHold(t, sku, "s1", "bob", "A-01", "A-02")
	if r.Status != http.StatusCreated {
		t.Fatalf("seat hold = %d %s", r.Status, r.Body)
	}
	c, now, early := confirmUnderExtension(t, e, db, h.HoldID, "sc1", `{"buyer":"bob"}`)
	t.Logf("seat confirm = %d %s (before the extension committed: %v); hold now %s order %q", c.Status, c.Body, early, now.State, now.OrderID)
	if c.Status != http.StatusCreated && now.State == "held" && !early {
		t.Errorf("confirm of a seat hold an extension kept answered %d %s while the hold stays held (expires %v)",
			c.Status, c.Body, now.ExpiresAt)
	}
	if c.Status == http.StatusCreated && (now.State != "confirmed" || now.OrderID != systest.OrderID(c)) {
		t.Errorf("201 %s, the hold reads %+v", c.Body, now)
	}
	// A retry with the key must agree with what the hold is.
	again := e.Do(t, http.MethodPost, "/v1/holds/"+h.HoldID+"/confirm", map[string]string{"Idempotency-Key": "sc1"}, `{"buyer":"bob"}`)
	t.Logf("retry = %d %s", again.Status, again.Body)
	if now.State == "held" && again.Status == http.StatusCreated {
		g := e.Do(t, http.MethodGet, "/v1/holds/"+h.HoldID, nil, "")
		t.Logf("after the retry the hold reads %s", g.Body)
	}
	if false {
		t.Errorf("retry of the confirm of a held seat hold = %d %s", again.Status, again.Body)
	}
	check := e.Do(t, http.MethodPost, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/seats/check", nil, "")
	if check.Status != http.StatusOK || !strings.Contains(string(check.Body), `"differed":null`) {
		t.Errorf("Redis's seats and the ledger's disagree: %d %s", check.Status, check.Body)
	}
}

// Many holds on two replicas, each at its expiry: an extend, a whole
// confirm, a partial confirm under another key and (every third) a
// cancel, at once. Per hold: at most one order; every 201's order is the
// same; a 201 never while the hold is held; a confirmed hold's order is
// the 201's; Redis equals the ledger.
func TestAttackExpiryStorm(t *testing.T) {
	systest.FullTier(t)
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	late := func(o *app.Options) { o.Sale.LatePayment = time.Minute }
	a := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: late})
	b := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: late, Sweep: true})
	for round := range 3 {
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 400, 1+round, 4)
		const n = 30
		ids := make([]string, n)
		exp := make([]time.Time, n)
		for i := range ids {
			_, h := a.Hold(t, sku, fmt.Sprintf("h%d-%d", round, i), fmt.Sprintf("b%d", i), 3, 1)
			if h.HoldID == "" {
				t.Fatalf("hold %d not made", i)
			}
			ids[i], exp[i] = h.HoldID, h.ExpiresAt
		}
		type ans struct {
			what string
			r    systest.Reply
		}
		got := make([][]ans, n)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i, id := range ids {
			buyer := fmt.Sprintf("b%d", i)
			wg.Go(func() {
				// Fire just around the expiry.
				for time.Now().Before(exp[i].Add(time.Duration(i%10-7) * 5 * time.Millisecond)) {
					time.Sleep(time.Millisecond) // time under test: fired around the hold's expiry
				}
				var iw sync.WaitGroup
				send := func(what string, e *systest.Env, path, key, body string) {
					iw.Go(func() {
						r := e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": key}, body)
						mu.Lock()
						got[i] = append(got[i], ans{what, r})
						mu.Unlock()
					})
				}
				send("extend", a, "/v1/holds/"+id+"/extend", fmt.Sprintf("x%d", round), fmt.Sprintf(`{"buyer":%q,"ttl_seconds":60}`, buyer))
				send("confirm", b, "/v1/holds/"+id+"/confirm", fmt.Sprintf("c1-%d", round), fmt.Sprintf(`{"buyer":%q}`, buyer))
				send("confirm-q", a, "/v1/holds/"+id+"/confirm", fmt.Sprintf("c2-%d", round), fmt.Sprintf(`{"buyer":%q,"quantity":%d}`, buyer, 3-i%2))
				if i%3 == 0 {
					send("cancel", b, "/v1/holds/"+id+"/cancel", fmt.Sprintf("k%d", round), fmt.Sprintf(`{"buyer":%q}`, buyer))
				}
				iw.Wait()
			})
		}
		wg.Wait()
		stats := map[string]int{}
		for i, id := range ids {
			g := a.Do(t, http.MethodGet, "/v1/holds/"+id, nil, "")
			var h systest.HoldReply
			_ = json.Unmarshal(g.Body, &h)
			orders := map[string]bool{}
			for _, x := range got[i] {
				stats[fmt.Sprintf("%s %d %s", x.what, x.r.Status, systest.ProblemKind(x.r))]++
				if x.r.Status == http.StatusCreated {
					orders[systest.OrderID(x.r)] = true
					if h.State == "held" {
						t.Errorf("hold %d: %s answered 201 %s while the hold stays held", i, x.what, x.r.Body)
					}
					if h.State == "confirmed" && systest.OrderID(x.r) != h.OrderID {
						t.Errorf("hold %d: %s answered order %s, the hold's order is %s", i, x.what, systest.OrderID(x.r), h.OrderID)
					}
				}
				if x.r.Status >= 500 && x.r.Status != http.StatusServiceUnavailable {
					t.Errorf("hold %d: %s = %d %s", i, x.what, x.r.Status, x.r.Body)
				}
			}
			var cancelled, created bool
			for _, x := range got[i] {
				cancelled = cancelled || x.what == "cancel" && x.r.Status == http.StatusOK
				created = created || x.r.Status == http.StatusCreated
			}
			if cancelled && created && h.State != "expired" {
				for _, x := range got[i] {
					t.Logf("hold %d (now %s, order %q): %s = %d %s", i, h.State, h.OrderID, x.what, x.r.Status, x.r.Body)
				}
			}
			if len(orders) > 1 {
				t.Errorf("hold %d: answers name %d orders: %v (%+v)", i, len(orders), orders, got[i])
			}
		}
		st := a.State(t, sku)
		t.Logf("round %d: %+v; answers %v", round, st, stats)
		if st.Orders > n {
			t.Errorf("%d orders of %d holds", st.Orders, n)
		}
		// Per buyer at most one order (one hold each).
		db := openDB(t, dsn)
		rows, err := db.Query(`SELECT buyer, count(*) FROM orders WHERE program = $1 AND ticket = $2 GROUP BY buyer HAVING count(*) > 1`,
			sku.Program, sku.Ticket)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var buyer string
			var c int
			_ = rows.Scan(&buyer, &c)
			t.Errorf("buyer %s has %d orders of one hold", buyer, c)
		}
		rows.Close()
		systest.WaitSettled(t, a, sku)
	}
}

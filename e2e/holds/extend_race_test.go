package holds_test

// Found by TestModelConcurrent/two-primaries (seed 1795975272622020820):
// an extend and a confirm of one hold, sent together just as it expired,
// answered 200 and 201, yet the hold stayed held; a later confirm made
// it a second order. The confirm's transaction had read the expiry the
// extension replaced, and its late payment bought the hold's units again
// beside it.

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
)

// A confirm of a hold past its expiry while an extension of it commits
// (held here by the test: the extension's row lock is taken before the
// confirm reads the row, and let go once the confirm waits on it):
// whole, or naming the hold's quantity, the confirm makes the hold its
// order (the hold reads confirmed, with the order answered), and the SKU
// has one order per hold; never a late payment beside a held hold.
func TestConfirmWhileAnExtensionCommits(t *testing.T) {
	systest.FullTier(t)
	ctx := context.Background()
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	late := func(o *app.Options) { o.Sale.LatePayment = time.Minute }
	a := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: late})
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	sku := systest.NewSKU(t)
	a.PutSKU(t, sku, 20, 1, 4)
	for i, body := range []string{`{"buyer":"ann"}`, `{"buyer":"ann","quantity":2}`} {
		r, h := a.Hold(t, sku, fmt.Sprintf("h%d", i), "ann", 2, 1)
		if r.Status != http.StatusCreated {
			t.Fatalf("hold %d = %d %s", i, r.Status, r.Body)
		}
		systest.WaitFor(t, 10*time.Second, "the hold's expiry to pass", func() bool { return time.Now().After(h.ExpiresAt) })

		// The extension, uncommitted: the row is locked with a new expiry.
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE holds SET expires_at = $2 WHERE id = $1 AND state = 'held'`,
			h.HoldID, time.Now().Add(2*time.Minute).UnixMilli()); err != nil {
			t.Fatal(err)
		}
		out := make(chan systest.Reply, 1)
		go func() {
			out <- a.Do(t, http.MethodPost, "/v1/holds/"+h.HoldID+"/confirm", map[string]string{"Idempotency-Key": fmt.Sprintf("c%d", i)}, body)
		}()
		systest.WaitFor(t, 10*time.Second, "the confirm to wait on the hold's row", func() bool {
			return lockWaiters(ctx, db, "holds") >= 1
		})
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		c := <-out
		var o struct {
			OrderID  string `json:"order_id"`
			Quantity int64  `json:"quantity"`
		}
		if c.Status != http.StatusCreated || json.Unmarshal(c.Body, &o) != nil || o.OrderID == "" {
			t.Fatalf("confirm %s of a hold being extended = %d %s, want 201 with its order", body, c.Status, c.Body)
		}
		g := a.Do(t, http.MethodGet, "/v1/holds/"+h.HoldID, nil, "")
		var now systest.HoldReply
		if err := json.Unmarshal(g.Body, &now); err != nil || now.State != "confirmed" || now.OrderID != o.OrderID {
			t.Errorf("%s: answered order %s, the hold reads %s: %+v (a late payment beside a held hold)", body, o.OrderID, g.Body, now)
		}
		if st := a.State(t, sku); st.Orders != int64(i+1) {
			t.Errorf("%s: %d orders of %d holds: %+v", body, st.Orders, i+1, st)
		}
	}
	systest.WaitSettled(t, a, sku)
}

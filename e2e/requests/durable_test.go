package requests_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/ledger"
)

// A retry is answered from its request's row only once that row is known
// to be on the synchronous standby: PostgreSQL marks a COMMIT done on the
// primary before the standby has it, and a failover takes such a row back
// (sale.Service.durable, ledger.RequestDurable). On a PostgreSQL of the
// test's own whose synchronous standby stops answering, retries of a
// purchase, a confirm, a cancel and a refund, each committed before,
// answer 503 with the outcome unknown, not their replays; once the server
// waits for no standby, the same retries answer their replays.
func TestReplaysWaitForTheStandby(t *testing.T) {
	systest.FullTier(t)
	pg := testenv.NewSyncPostgres(t)
	dsn := pg.DSN
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: func(o *app.Options) {
		o.Sale.WorkTimeout = 2 * time.Second
	}})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 20, 1, 4)

	type sent struct {
		name, path, key string
		status          int
	}
	var all []sent
	must := func(name, path, key string, r systest.Reply, status int) {
		t.Helper()
		if r.Status != status {
			t.Fatalf("%s = %d %s, want %d", name, r.Status, r.Body, status)
		}
		all = append(all, sent{name, path, key, status})
	}
	p := e.Buy(t, sku, "p1", "ann", 1)
	must("purchase", systest.SKUPath(sku)+"/purchases", "p1", p, http.StatusCreated)
	order := systest.OrderID(p)
	_, h1 := e.Hold(t, sku, "h1", "ann", 1, 0)
	confirm := "/v1/holds/" + h1.HoldID + "/confirm"
	must("confirm", confirm, "c1", e.Act(t, confirm, "c1", "ann"), http.StatusCreated)
	_, h2 := e.Hold(t, sku, "h2", "ann", 1, 0)
	cancel := "/v1/holds/" + h2.HoldID + "/cancel"
	must("cancel", cancel, "x1", e.Act(t, cancel, "x1", "ann"), http.StatusOK)
	refund := "/v1/orders/" + order + "/refund"
	must("refund", refund, "r1", e.Act(t, refund, "r1", "ann"), http.StatusOK)
	body := func(s sent) string {
		if s.name == "purchase" {
			return `{"buyer":"ann","quantity":1}`
		}
		return `{"buyer":"ann"}`
	}

	pg.Standby(t, "nobody") // a synchronous standby that never answers
	t.Cleanup(func() { pg.Standby(t, "") })
	for _, s := range all {
		r := e.Do(t, http.MethodPost, s.path, map[string]string{"Idempotency-Key": s.key}, body(s))
		if r.Status != http.StatusServiceUnavailable {
			t.Errorf("%s sent again with the standby silent = %d %s; want 503, not a replay of a row a failover can take back",
				s.name, r.Status, r.Body)
		}
	}

	pg.Standby(t, "") // no synchronous standby: a local commit is the promise
	for _, s := range all {
		r, _ := e.Retried(t, http.MethodPost, s.path, s.key, body(s))
		if r.Status != s.status || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("%s sent again with no standby named = %d (replayed %q) %s; want its replay, %d",
				s.name, r.Status, r.Header.Get("Idempotent-Replayed"), r.Body, s.status)
		}
	}
}

package faults_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
)

// An answer never contradicts the ledger (issue 39): an admin PUT of a
// SKU while Redis is down commits in the ledger, so it answers 200 (the
// gate is rebuilt from the ledger before it serves the SKU), never a 503
// for a change that stands. The SKU then sells around the gate, and again
// through it once Redis is back, nothing sold twice.
func TestAdminPutWhileRedisIsDownAnswersWhatStands(t *testing.T) {
	e, c := systest.FaultEnv(t, func(o *app.Options) { o.Sale.Breaker.OpenFor = 300 * time.Millisecond })
	ctx := context.Background()
	for _, n := range c.Nodes {
		n.Kill()
	}
	systest.TripBreakers(t, e, c.Masters)
	sku := systest.NewSKU(t)
	r := e.Do(t, http.MethodPut, systest.AdminPath(sku), nil, `{"total":5,"shards":2,"max_per_order":4}`)
	st, err := e.Ledger.SKU(ctx, sku)
	switch {
	case r.Status == http.StatusOK && err == nil && st.Total == 5:
	default:
		t.Fatalf("PUT of a new SKU with Redis down = %d %s; in the ledger: %+v, %v", r.Status, r.Body, st, err)
	}
	// A change of the SKU needs its gate closed first (a fence in Redis):
	// with Redis down it is refused, and the 503 says nothing changed,
	// which the ledger confirms.
	r = e.Do(t, http.MethodPut, systest.AdminPath(sku), nil, `{"total":6,"shards":2,"max_per_order":4}`)
	st, err = e.Ledger.SKU(ctx, sku)
	switch {
	case err != nil:
		t.Fatal(err)
	case r.Status == http.StatusOK && st.Total == 6:
	case r.Status == http.StatusServiceUnavailable && st.Total == 5 && systest.ProblemKind(r) == "unavailable" &&
		strings.Contains(string(r.Body), "nothing changed"):
	default:
		t.Fatalf("PUT of a change with Redis down = %d %s; the ledger's total %d", r.Status, r.Body, st.Total)
	}
	total := st.Total
	e.MustBuy(t, sku, "down-1", "ann", 2)
	for _, n := range c.Nodes {
		if err := n.Restart(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitHealthy(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	systest.WaitFor(t, 30*time.Second, "a purchase through the gate again", func() bool {
		return e.Buy(t, sku, "up-1", "bob", total-2).Status == http.StatusCreated
	})
	if r := e.Buy(t, sku, "up-2", "cat", 1); r.Status != http.StatusConflict {
		t.Errorf("a purchase past the total = %d %s, want sold out", r.Status, r.Body)
	}
	systest.RedisConsistent(t, e, sku)
}

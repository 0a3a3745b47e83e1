package faults_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/e2e/systest"
)

// Redis goes away (every node killed) while holds are confirmed in part,
// cancelled and extended: the ledger decides them alone; when Redis comes
// back empty and is rebuilt, every returned unit is counted once (by the
// rebuild or the restore, never both), and the gate agrees with the
// ledger at once, before any drift check would repair it.
func TestFaultConfirmPartRedisRestart(t *testing.T) {
	systest.FullTier(t)
	e, c := systest.FaultEnv(t, func(o *app.Options) {
		o.Sale.Breaker = breaker.Options{OpenFor: 500 * time.Millisecond}
	})
	ctx := context.Background()
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 40, 2, 4)
	var ids []string
	for i := range 6 {
		r, h := e.Hold(t, sku, fmt.Sprintf("h%d", i), fmt.Sprintf("b%d", i), 4, 0)
		if r.Status != http.StatusCreated {
			t.Fatalf("hold %d = %d %s", i, r.Status, r.Body)
		}
		ids = append(ids, h.HoldID)
	}
	// One confirmed in part before the fault, so its restore is done.
	part := func(i int, keep int64) {
		t.Helper()
		r := e.Do(t, http.MethodPost, "/v1/holds/"+ids[i]+"/confirm", map[string]string{"Idempotency-Key": fmt.Sprintf("c%d", i)},
			fmt.Sprintf(`{"buyer":"b%d","quantity":%d}`, i, keep))
		if r.Status != http.StatusCreated {
			t.Fatalf("confirm %d of hold %d = %d %s", keep, i, r.Status, r.Body)
		}
	}
	part(0, 1)
	for _, n := range c.Nodes {
		n.Kill()
	}
	systest.TripBreakers(t, e, 3)
	part(1, 1)
	part(2, 3)
	if r := e.Act(t, "/v1/holds/"+ids[3]+"/cancel", "x3", "b3"); r.Status != http.StatusOK {
		t.Fatalf("cancel = %d %s", r.Status, r.Body)
	}
	if r := e.Do(t, http.MethodPost, "/v1/holds/"+ids[4]+"/extend", map[string]string{"Idempotency-Key": "x4"}, `{"buyer":"b4","ttl_seconds":120}`); r.Status != http.StatusOK {
		t.Fatalf("extend = %d %s", r.Status, r.Body)
	}
	for _, n := range c.Nodes {
		if err := n.Restart(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitHealthy(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// A purchase after Redis is back: it goes through the rebuilt gate.
	systest.WaitFor(t, 30*time.Second, "a sale through the rebuilt gate", func() bool {
		r := e.Buy(t, sku, "p1", "pa", 1)
		return r.Status == http.StatusCreated
	})
	systest.WaitFor(t, 30*time.Second, "pending restores to finish", func() bool {
		p, err := e.Ledger.PendingRestores(ctx, 0, 1)
		return err == nil && len(p) == 0
	})
	st, err := e.Ledger.SKU(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	left, seeded, err := e.Gate.Remaining(ctx, sku, st.Shards)
	// sold 1 + 1 + 3 + 1, held 4 + 4: 40 - 6 - 8 = 26.
	if err != nil || !seeded || left != st.Remaining() || st.Remaining() != 26 {
		t.Errorf("Redis has %d (seeded %v, %v), the ledger %d left (sold %d, held %d), want 26 both", left, seeded, err, st.Remaining(), st.Sold, st.Held)
	}
}

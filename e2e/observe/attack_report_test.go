package observe_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stockgate/stockgate/e2e/systest"
)

// An ended sale's gate is emptied on purpose (it admits no one), so its
// Redis count is not the SKU's open stock: the report leaves it unread
// (gate_remaining null, gate_difference 0) rather than report the open
// units as drift, on either replica.
func TestAttackReportEndedSale(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 10, 2, 4)
		a.MustBuy(t, sku, "p1", "ann", 2)
		if r := a.Do(t, http.MethodPost, systest.AdminPath(sku)+"/end", nil, ""); r.Status != http.StatusOK {
			t.Fatalf("end = %d %s", r.Status, r.Body)
		}
		for _, e := range []*systest.Env{a, b} {
			r := e.Do(t, http.MethodGet, "/v1/admin/programs/"+sku.Program.String()+"/report", nil, "")
			var got struct {
				Balanced bool
				SKUs     []reportLine
			}
			if err := json.Unmarshal(r.Body, &got); r.Status != http.StatusOK || err != nil || !got.Balanced || len(got.SKUs) != 1 {
				t.Fatalf("report = %d %s (%v)", r.Status, r.Body, err)
			}
			if l := got.SKUs[0]; l.Open != 8 || l.GateRemaining != nil || l.GateDifference != 0 {
				t.Errorf("the ended SKU's line %s, want open 8, gate_remaining null, gate_difference 0", r.Body)
			}
		}
	})
}

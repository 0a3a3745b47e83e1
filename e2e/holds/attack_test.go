package holds_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stockgate/stockgate/internal/systest"
)

// A seat hold confirmed by a quantity naming all its seats is sold in
// Redis's seat map as a whole confirm's seats are: the consistency check
// finds nothing to repair.
func TestAttackConfirmPartSeatHoldSold(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 0, 1, 4)
		e.LoadSeats(t, sku, map[string]int{"A": 4})
		_, sh := e.SeatHold(t, sku, "s1", "bob", "A-01", "A-02")
		if r, got := confirmPart(t, e, sh.HoldID, "sc1", "bob", 2); r.Status != http.StatusCreated || got != 2 {
			t.Fatalf("confirm both seats by quantity = %d %s", r.Status, r.Body)
		}
		check := e.Do(t, http.MethodPost, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/seats/check", nil, "")
		if check.Status != http.StatusOK || !strings.Contains(string(check.Body), `"differed":null`) {
			t.Errorf("Redis's seats and the ledger's disagree after the confirm: %d %s", check.Status, check.Body)
		}
	})
}

package resale_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/e2e/systest"
)

// Issue 39's last unaudited corner: an order with some units resold is
// transferred whole, then refunded by its new owner. The transfer answers
// the units it moved (the 2 standing, not the 4 the order began with),
// the receiver's refund gives back those 2, and the events tell each
// unit's money once: 2 by listing.sold, 2 by order.refunded, never more
// than the 4 sold.
func TestTransferOfAPartlyResoldOrderMovesItsStandingUnits(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := start(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 4, 1, 4)
		ann := systest.OrderID(a.MustBuy(t, sku, "p1", "ann", 4))
		x := mustList(t, a, ann, "l1", "ann", 2)
		systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return a.State(t, sku).RedisRemaining == 2 })
		a.MustBuy(t, sku, "rbob", "bob", 1)
		b.MustBuy(t, sku, "rcat", "cat", 1)
		systest.WaitFor(t, 15*time.Second, "the listing settled", func() bool { return getListing(t, a, x.ListingID).State == "sold" })

		r := b.Do(t, http.MethodPost, "/v1/orders/"+ann+"/transfer", map[string]string{"Idempotency-Key": "t1"}, `{"buyer":"ann","to":"fay"}`)
		if r.Status != http.StatusOK && r.Status != http.StatusCreated {
			t.Fatalf("transfer of the partly resold order = %d %s", r.Status, r.Body)
		}
		var moved orderBody
		if err := json.Unmarshal(r.Body, &moved); err != nil {
			t.Fatal(err)
		}
		if moved.Quantity != 2 {
			t.Errorf("the transfer answered quantity %d (%s), want the 2 standing units", moved.Quantity, r.Body)
		}
		if o := getOrder(t, a, ann); o.Quantity != 2 || o.Units.Standing != 2 || o.Units.Resold != 2 || o.Units.Began != 4 {
			t.Errorf("ann's order after the transfer: %+v, want 2 standing of 4 begun, 2 resold", o)
		}
		if r := a.Act(t, "/v1/orders/"+ann+"/refund", "rf1", "fay"); r.Status != http.StatusOK {
			t.Fatalf("fay's refund = %d %s", r.Status, r.Body)
		}
		if o := getOrder(t, b, ann); o.Units.Refunded != 2 || o.Units.Resold != 2 || o.Units.Standing != 0 {
			t.Errorf("the order after fay's refund: %+v, want 2 refunded, 2 resold", o)
		}
		if l := reportLine(t, a, sku); l.RefundedUnits != 2 || l.ResoldUnits != 2 || l.Total != 4 {
			t.Errorf("report: %+v, want 2 refunded and 2 resold units of 4", l)
		}
		checkMoney(t, a, sku)
	})
}

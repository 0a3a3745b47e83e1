package holds_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
)

// keyTaken runs take once, just before the client key of a late payment
// is recorded beside its order: another request under that key commits
// in between.
type keyTaken struct {
	sale.Ledger
	key  string
	take func()
	done atomic.Bool
}

func (l *keyTaken) AnswerWith(ctx context.Context, req ledger.Request, o ledger.Order) (ledger.Order, error) {
	if req.Key.String() == l.key && l.done.CompareAndSwap(false, true) {
		l.take()
	}
	return l.Ledger.AnswerWith(ctx, req, o)
}

// A late payment sells the hold's units under the key derived from the
// hold, then records the client's key beside the order. A client that
// sent another request under the same key at the same moment had that
// one commit in between, and the payment answered 422
// idempotency-key-reused ("nothing moved") beside the order it made: a
// platform refunding on it gave the tickets away (helper-49). It answers
// the order, and so does its retry under that key (helper-50).
func TestLatePaymentWhoseKeyAnotherRequestTookAnswersItsOrder(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		const window = 10 * time.Second // room for a loaded machine's steps inside it
		late := func(o *app.Options) { o.Sale.LatePayment = window }
		taken := &keyTaken{key: "pay"}
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: func(o *app.Options) {
			late(o)
			o.WrapLedger = func(l sale.Ledger) sale.Ledger { taken.Ledger = l; return taken }
		}})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: late})
		sku, other := systest.NewSKU(t), systest.NewSKU(t)
		a.PutSKU(t, sku, 10, 1, 4)
		a.PutSKU(t, other, 10, 1, 4)
		early := a.MustBuy(t, other, "early", "ann", 1) // a key of ann's, used before the hold
		var otherAnswer systest.Reply
		taken.take = func() { otherAnswer = b.Buy(t, other, "pay", "ann", 1) }
		_, h := a.Hold(t, sku, "h", "ann", 2, 1)
		systest.WaitFor(t, 10*time.Second, "the hold's expiry to pass", func() bool { return time.Now().After(h.ExpiresAt) })
		r := a.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "pay", "ann")
		if time.Now().After(h.ExpiresAt.Add(window)) {
			t.Fatalf("the machine took the whole window before the late payment")
		}
		if !taken.done.Load() || otherAnswer.Status != http.StatusCreated {
			t.Fatalf("the other request under the key: ran %v, %d %s", taken.done.Load(), otherAnswer.Status, otherAnswer.Body)
		}
		if r.Status != http.StatusCreated {
			t.Fatalf("a late payment that sold, its key taken meanwhile = %d %s, want 201 with the order", r.Status, r.Body)
		}
		var o struct {
			OrderID  string `json:"order_id"`
			Quantity int64  `json:"quantity"`
		}
		if err := json.Unmarshal(r.Body, &o); err != nil || o.Quantity != 2 {
			t.Errorf("the late payment's order = %s (%v), want 2 tickets", r.Body, err)
		}
		if st := a.State(t, sku); st.Sold != 2 {
			t.Errorf("sold %d, want the 2 paid late", st.Sold)
		}
		// The payment's retry (its answer lost) hears the order again on
		// either replica, not 422 beside it (helper-50); so would a late
		// payment of the hold under any other key.
		for _, e := range []*systest.Env{a, b} {
			if again := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "pay", "ann"); again.Status != http.StatusCreated || systest.OrderID(again) != o.OrderID {
				t.Errorf("the late payment's retry = %d %s, want 201 with order %s", again.Status, again.Body, o.OrderID)
			}
		}
		// A payment under a key of its own now (a platform paying again)
		// is told the same order, and recorded under that key; the first
		// payment's retry still hears the order (helper-76).
		if r := b.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "pay2", "ann"); r.Status != http.StatusCreated || systest.OrderID(r) != o.OrderID {
			t.Errorf("a late payment under another key = %d %s, want 201 with order %s", r.Status, r.Body, o.OrderID)
		}
		if again := a.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "pay", "ann"); again.Status != http.StatusCreated || systest.OrderID(again) != o.OrderID {
			t.Errorf("the first payment's retry after another key paid = %d %s, want 201 with order %s", again.Status, again.Body, o.OrderID)
		}
		// A purchase ann makes now, seconds after the order, under a key
		// of its own: that key on the hold is a reuse, not the payment
		// (it was told the order while it fell within seconds of it,
		// helper-75).
		mid := b.MustBuy(t, other, "mid", "ann", 1)
		if r := a.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "mid", "ann"); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("a confirm of the paid-late hold under the key of a purchase just made = %d %s, want 422", r.Status, r.Body)
		}
		if again := b.Buy(t, other, "mid", "ann", 1); systest.OrderID(again) != systest.OrderID(mid) {
			t.Errorf("that purchase's retry = %d %s, want its order", again.Status, again.Body)
		}
		// A key ann used for another request before is a reuse on the
		// hold, paid late or not (helper-52, helper-53).
		if r := a.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "early", "ann"); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("a confirm of the paid-late hold under the key of an earlier purchase = %d %s, want 422", r.Status, r.Body)
		}
		if again := a.Buy(t, other, "early", "ann", 1); systest.OrderID(again) != systest.OrderID(early) {
			t.Errorf("the earlier purchase's retry = %d %s, want its order", again.Status, again.Body)
		}
		// The key is the other request's: its retry replays it.
		if again := b.Buy(t, other, "pay", "ann", 1); again.Status != http.StatusCreated || systest.OrderID(again) != systest.OrderID(otherAnswer) {
			t.Errorf("the other request's retry = %d %s, want its order", again.Status, again.Body)
		}
	})
}

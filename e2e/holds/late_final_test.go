package holds_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
)

// A late payment of a seat hold or a pool's hold is refused inside the
// window ("refund the payment"), and that refusal is the answer for good:
// its retry past the window, and a payment under another key, on either
// replica, are refused again, not told 410 "nothing was sold" (helper-46:
// the same request answered 409, then 410). A hold of the same kind that
// nobody paid inside the window is still 410 past it.
func TestLateRefusalOfASeatOrPoolHoldOutlivesTheWindow(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		const window = 10 * time.Second // room for a loaded machine's steps inside it
		late := func(o *app.Options) { o.Sale.LatePayment = window; o.Sale.SweepEvery = 20 * time.Millisecond }
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: late})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: late})
		seated := systest.NewSKU(t)
		a.PutSKU(t, seated, 0, 1, 4)
		a.LoadSeats(t, seated, map[string]int{"A": 4})
		pooled := systest.NewSKU(t)
		a.PutSKU(t, pooled, 10, 1, 4)
		a.PutPool(t, pooled, "fans", `{"allotment":4,"shards":1}`)

		hold := func(path, key, body string) systest.HoldReply {
			r := a.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": key}, body)
			var h systest.HoldReply
			if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &h) != nil {
				t.Fatalf("hold %s = %d %s", key, r.Status, r.Body)
			}
			return h
		}
		holds := map[string][2]systest.HoldReply{
			"seat": {
				hold(systest.SKUPath(seated)+"/seat-holds", "s1", `{"buyer":"ann","seats":["A-01"],"ttl_seconds":1}`),
				hold(systest.SKUPath(seated)+"/seat-holds", "s2", `{"buyer":"ann","seats":["A-02"],"ttl_seconds":1}`),
			},
			"pool": {
				hold(systest.SKUPath(pooled)+"/holds?pool=fans", "p1", `{"buyer":"ann","quantity":1,"ttl_seconds":1}`),
				hold(systest.SKUPath(pooled)+"/holds?pool=fans", "p2", `{"buyer":"ann","quantity":1,"ttl_seconds":1}`),
			},
		}
		refused := func(r systest.Reply) bool {
			return r.Status == http.StatusConflict && systest.ProblemKind(r) == "late-payment-refused"
		}
		for kind, hs := range holds {
			paid := hs[0]
			systest.WaitFor(t, 10*time.Second, "the hold's expiry to pass", func() bool { return time.Now().After(paid.ExpiresAt) })
			if time.Now().After(paid.ExpiresAt.Add(window)) {
				t.Fatalf("the machine took the whole window before the late payment")
			}
			if r := b.Act(t, "/v1/holds/"+paid.HoldID+"/confirm", "pay-"+kind, "ann"); !refused(r) {
				t.Fatalf("%s hold: a late payment inside the window = %d %s, want 409 late-payment-refused", kind, r.Status, r.Body)
			}
		}
		for kind, hs := range holds {
			paid, unpaid := hs[0], hs[1]
			systest.WaitFor(t, 2*window, "the late-payment window to pass", func() bool {
				return time.Now().After(paid.ExpiresAt.Add(window+100*time.Millisecond)) &&
					time.Now().After(unpaid.ExpiresAt.Add(window+100*time.Millisecond))
			})
			for _, e := range []*systest.Env{a, b} {
				for _, key := range []string{"pay-" + kind, "other-" + kind} {
					if r := e.Act(t, "/v1/holds/"+paid.HoldID+"/confirm", key, "ann"); !refused(r) {
						t.Errorf("%s hold: key %s past the window, after a refusal inside it = %d %s, want the refusal again", kind, key, r.Status, r.Body)
					}
				}
			}
			if r := b.Act(t, "/v1/holds/"+unpaid.HoldID+"/confirm", "late-"+kind, "ann"); r.Status != http.StatusGone {
				t.Errorf("%s hold: first paid past the window = %d %s, want 410", kind, r.Status, r.Body)
			}
		}
		if st := a.State(t, seated); st.Sold != 0 || st.Held != 0 {
			t.Errorf("the seated ticket after the refusals: %+v, want nothing sold or held", st)
		}
		if st := a.State(t, pooled); st.Sold != 0 || st.Held != 0 {
			t.Errorf("the pooled ticket after the refusals: %+v, want nothing sold or held", st)
		}
	})
}

// A late payment of a hold whose ticket's settings changed after it was
// made (a seat map loaded once its units were back; a maximum per order
// lowered below its quantity) is refused as a late payment, for good: the
// buyer did nothing wrong, so not 409 seated or 422 quantity-over-limit
// inside the window and 410 past it (helper-47).
func TestLatePaymentAfterTheSettingsChangedIsRefusedForGood(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		const window = 10 * time.Second // room for a sweep, a seat map and a PUT inside it
		late := func(o *app.Options) { o.Sale.LatePayment = window; o.Sale.SweepEvery = 20 * time.Millisecond }
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: late})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: late})
		seated, lowered := systest.NewSKU(t), systest.NewSKU(t)
		a.PutSKU(t, seated, 4, 1, 4)
		a.PutSKU(t, lowered, 10, 1, 4)
		_, hs := a.Hold(t, seated, "hs", "ann", 1, 1)
		_, hl := a.Hold(t, lowered, "hl", "ann", 3, 1)
		_, hp := a.Hold(t, lowered, "hp", "bob", 3, 1)
		systest.WaitFor(t, 10*time.Second, "the seated ticket's hold swept", func() bool {
			st := a.State(t, seated)
			return st.Held == 0 && st.RedisRemaining == 4
		})
		a.LoadSeats(t, seated, map[string]int{"A": 4})
		a.PutSKU(t, lowered, 10, 1, 2)
		refused := func(r systest.Reply) bool {
			return r.Status == http.StatusConflict && systest.ProblemKind(r) == "late-payment-refused"
		}
		for _, h := range []systest.HoldReply{hs, hl} {
			systest.WaitFor(t, 10*time.Second, "the hold's expiry to pass", func() bool { return time.Now().After(h.ExpiresAt) })
			if time.Now().After(h.ExpiresAt.Add(window)) {
				t.Fatalf("the machine took the whole window before the late payment")
			}
			if r := b.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "pay", "ann"); !refused(r) {
				t.Errorf("a late payment after the settings changed = %d %s, want 409 late-payment-refused", r.Status, r.Body)
			}
		}
		// Part of a hold, within the lowered maximum, is refused as the
		// whole is: it bought 2 when it came first, and was refused
		// after a whole payment had been (helper-106 #2).
		systest.WaitFor(t, 10*time.Second, "the hold's expiry to pass", func() bool { return time.Now().After(hp.ExpiresAt) })
		for _, p := range [][2]string{{"pay-part", `{"buyer":"bob","quantity":2}`}, {"pay-whole", `{"buyer":"bob"}`}} {
			key, body := p[0], p[1]
			if r := b.Do(t, http.MethodPost, "/v1/holds/"+hp.HoldID+"/confirm", map[string]string{"Idempotency-Key": key}, body); !refused(r) {
				t.Errorf("a late payment %s of a hold of 3, maximum lowered to 2 = %d %s, want 409 late-payment-refused", body, r.Status, r.Body)
			}
		}
		for _, h := range []systest.HoldReply{hs, hl} {
			systest.WaitFor(t, 2*window, "the late-payment window to pass", func() bool {
				return time.Now().After(h.ExpiresAt.Add(window + 100*time.Millisecond))
			})
			for _, key := range []string{"pay", "other"} {
				if r := a.Act(t, "/v1/holds/"+h.HoldID+"/confirm", key, "ann"); !refused(r) {
					t.Errorf("key %s past the window, after the refusal = %d %s, want the refusal again", key, r.Status, r.Body)
				}
			}
		}
		if st := a.State(t, lowered); st.Sold != 0 || st.Held != 0 {
			t.Errorf("after the refusals: %+v, want nothing sold or held", st)
		}
	})
}

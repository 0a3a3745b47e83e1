package holds_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// holdAs is a hold sent with a device fingerprint ("" for none).
func holdAs(t *testing.T, e *systest.Env, sku stock.SKU, key, buyer, device string, q int64) systest.Reply {
	h := map[string]string{"Idempotency-Key": key}
	if device != "" {
		h["Buyer-Fingerprint"] = device
	}
	return e.Do(t, http.MethodPost, systest.SKUPath(sku)+"/holds", h, fmt.Sprintf(`{"buyer":%q,"quantity":%d}`, buyer, q))
}

// putBudgets sets a program's hold budgets (no per-buyer cap).
func putBudgets(t *testing.T, e *systest.Env, program string, buyer, device int64) {
	t.Helper()
	r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+program, nil,
		fmt.Sprintf(`{"per_buyer":0,"hold_budget":%d,"device_hold_budget":%d}`, buyer, device))
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), fmt.Sprintf(`"hold_budget":%d`, buyer)) {
		t.Fatalf("put program budgets = %d %s", r.Status, r.Body)
	}
}

// A buyer at its program's hold budget is refused at the gate (409
// hold-budget-reached, no ledger call, no stock moved) across the
// program's tickets and replicas; a retry of a hold it made is still
// answered; a confirm, a cancel and an expiry each give the budget back;
// a device fingerprint has a budget of its own across buyers.
func TestHoldBudget(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		var counted *systest.CountingLedger
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: func(o *app.Options) {
			counted = systest.CountLedger(o)
		}})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: func(o *app.Options) {
			o.Sale.SweepEvery = 20 * time.Millisecond
		}})
		one := systest.NewSKU(t)
		two := stock.SKU{Program: one.Program, Ticket: keys.MustID(one.Ticket.String() + "-two")}
		a.PutSKU(t, one, 100, 2, 10)
		a.PutSKU(t, two, 100, 2, 10)
		putBudgets(t, a, one.Program.String(), 3, 4)

		mustHold := func(e *systest.Env, sku stock.SKU, key, buyer, device string, q int64) string {
			t.Helper()
			r := holdAs(t, e, sku, key, buyer, device, q)
			if r.Status != http.StatusCreated {
				t.Fatalf("hold %s = %d %s", key, r.Status, r.Body)
			}
			return systest.ReplyID(r)
		}
		// A refusal reads its own key in the ledger once (so a retry of a
		// committed hold is answered, whenever and on whichever replica it
		// committed) and makes no other ledger call: a flood of 20 makes
		// 20 primary-key reads and nothing else.
		refused := func(e *systest.Env, sku stock.SKU, key, buyer, device string, q int64) {
			t.Helper()
			before := a.State(t, sku)
			r := holdAs(t, e, sku, key, buyer, device, q)
			if r.Status != http.StatusConflict || systest.ProblemKind(r) != "hold-budget-reached" {
				t.Fatalf("hold %s over the budget = %d %s, want 409 hold-budget-reached", key, r.Status, r.Body)
			}
			if e == a {
				methods := counted.ByMethod()
				for i := range 20 {
					if r := holdAs(t, e, sku, fmt.Sprintf("%s-flood-%d", key, i), buyer, device, q); r.Status != http.StatusConflict {
						t.Fatalf("flood hold %d over the budget = %d %s", i, r.Status, r.Body)
					}
				}
				// Besides the key reads, only the settings' reads a cache
				// refresh makes on a slow run (Program, SKU): nothing else.
				after := counted.ByMethod()
				for m, n := range after {
					if d := n - methods[m]; d != 0 && (m == "RequestByKey" && d != 20 || m != "RequestByKey" && m != "Program" && m != "SKU") {
						t.Errorf("20 holds over the budget made %d %s calls (%v, before %v), want 20 key reads and no other call but a settings read", d, m, after, methods)
					}
				}
			}
			if after := a.State(t, sku); after.Held != before.Held || after.RedisRemaining != before.RedisRemaining {
				t.Errorf("hold %s over the budget moved stock: %+v -> %+v", key, before, after)
			}
		}

		// Across the program's tickets and replicas.
		h1 := mustHold(a, one, "h1", "ann", "", 2)
		refused(a, two, "h2", "ann", "", 2)
		refused(b, two, "h2", "ann", "", 2)
		h3 := mustHold(b, two, "h3", "ann", "", 1)
		refused(a, one, "h4", "ann", "", 1)
		// A retry of a hold made is answered, on either replica.
		for _, e := range []*systest.Env{a, b} {
			if r := holdAs(t, e, one, "h1", "ann", "", 2); r.Status != http.StatusCreated || systest.ReplyID(r) != h1 {
				t.Errorf("retry of h1 at the budget = %d %s, want its hold", r.Status, r.Body)
			}
		}
		// Buying is not holding.
		a.MustBuy(t, one, "p1", "ann", 5)
		// A confirm gives its units back to the budget; so does a cancel.
		if r := b.Act(t, "/v1/holds/"+h1+"/confirm", "c1", "ann"); r.Status != http.StatusCreated {
			t.Fatalf("confirm h1 = %d %s", r.Status, r.Body)
		}
		h5 := mustHold(a, two, "h5", "ann", "", 2)
		refused(a, one, "h6", "ann", "", 1)
		if r := a.Act(t, "/v1/holds/"+h3+"/cancel", "x3", "ann"); r.Status != http.StatusOK {
			t.Fatalf("cancel h3 = %d %s", r.Status, r.Body)
		}
		mustHold(b, one, "h7", "ann", "", 1)
		refused(b, one, "h8", "ann", "", 1)
		// An expiry gives its units back (b's sweeper ends the hold).
		r, _ := a.Hold(t, one, "short", "bob", 3, 1)
		if r.Status != http.StatusCreated {
			t.Fatalf("short hold = %d %s", r.Status, r.Body)
		}
		refused(a, one, "bob-2", "bob", "", 1)
		systest.WaitFor(t, 20*time.Second, "bob's short hold to expire and its budget to come back", func() bool {
			return holdAs(t, a, one, "bob-3", "bob", "", 3).Status == http.StatusCreated
		})
		_ = h5

		// A device's budget spans buyers; a buyer without the header is
		// not counted under it.
		mustHold(a, one, "d1", "cat", "device-42", 2)
		mustHold(b, two, "d2", "dan", "device-42", 2)
		refused(a, one, "d3", "eve", "device-42", 1)
		mustHold(a, one, "d4", "eve", "", 1)
		mustHold(a, one, "d5", "eve", "device-43", 1)

		st := a.State(t, one)
		if st.Sold != 5+2 {
			t.Errorf("sold %d, want 7 (5 bought, 2 confirmed)", st.Sold)
		}
	})
}

// Many holds of one buyer at once, over two replicas, are held up to the
// budget and not one unit more; the refusals move nothing.
func TestHoldBudgetUnderConcurrency(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 1000, 4, 4)
		putBudgets(t, a, sku.Program.String(), 5, 0)
		var held atomic.Int64
		counts := systest.BuyAll(40, 16, func(i int) systest.Reply {
			e := a
			if i%2 == 1 {
				e = b
			}
			r := holdAs(t, e, sku, fmt.Sprintf("k%d", i), "ann", "", 1+int64(i%2))
			if r.Status == http.StatusCreated {
				held.Add(1 + int64(i%2))
			} else if r.Status != http.StatusConflict || systest.ProblemKind(r) != "hold-budget-reached" {
				t.Errorf("hold %d = %d %s", i, r.Status, r.Body)
			}
			return r
		})
		st := a.State(t, sku)
		if held.Load() > 5 || st.Held != held.Load() || st.RedisRemaining != 1000-st.Held {
			t.Errorf("held %d (answers %v), ledger %+v: want at most 5, ledger and gate agreeing", held.Load(), counts, st)
		}
		if held.Load() < 4 {
			t.Errorf("held %d of a budget of 5, want the budget used", held.Load())
		}
	})
}

// Bad budgets and a bad fingerprint are refused with 422 and change
// nothing.
func TestHoldBudgetBadInput(t *testing.T) {
	e := systest.New(t, "sqlite")
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 10, 1, 4)
	for _, body := range []string{
		`{"per_buyer":0,"hold_budget":-1}`,
		`{"per_buyer":0,"hold_budget":10001}`,
		`{"per_buyer":0,"device_hold_budget":"3"}`,
		`{"per_buyer":0,"hold_budget":1.5}`,
	} {
		r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String(), nil, body)
		if r.Status != http.StatusUnprocessableEntity && r.Status != http.StatusBadRequest {
			t.Errorf("put program %s = %d %s, want a 4xx problem", body, r.Status, r.Body)
		}
	}
	putBudgets(t, e, sku.Program.String(), 1, 1)
	for _, device := range []string{strings.Repeat("x", 257), "tab\there"} {
		r := holdAs(t, e, sku, "bad", "ann", device, 1)
		if r.Status != http.StatusUnprocessableEntity || systest.ProblemKind(r) != "invalid-field" {
			t.Errorf("a hold with fingerprint %q = %d %s, want 422 invalid-field", device[:min(len(device), 10)], r.Status, r.Body)
		}
	}
	if st := e.State(t, sku); st.Held != 0 || st.RedisRemaining != 10 {
		t.Errorf("after refusals: %+v, want nothing held", st)
	}
}

// A hold paid late (expired, not swept, bought again by its confirm)
// gives its budget back at once: the buyer may hold again right away.
func TestHoldBudgetLatePayment(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.Start(t, systest.Options{Driver: driver, Tune: func(o *app.Options) { o.Sale.LatePayment = time.Minute }})
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 10, 1, 4)
		putBudgets(t, e, sku.Program.String(), 2, 0)
		r, h := e.Hold(t, sku, "h1", "ann", 2, 1)
		if r.Status != http.StatusCreated {
			t.Fatalf("hold = %d %s", r.Status, r.Body)
		}
		systest.WaitFor(t, 10*time.Second, "the hold's expiry to pass", func() bool { return time.Now().After(h.ExpiresAt) })
		if r := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c1", "ann"); r.Status != http.StatusCreated {
			t.Fatalf("late confirm = %d %s", r.Status, r.Body)
		}
		if r := holdAs(t, e, sku, "h2", "ann", "", 2); r.Status != http.StatusCreated {
			t.Errorf("a hold right after a late payment = %d %s, want the budget back", r.Status, r.Body)
		}
	})
}

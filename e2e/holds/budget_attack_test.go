package holds_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// Attacks on the hold budgets: every way a hold ends gives its count back
// at once (the budget's self-expiry is the hold's, minutes away), no
// refusal for another reason leaves a count behind, and no budget change,
// retry or copy lets a buyer hold past the budget.

// budgetHold holds q of sku for buyer, or fails the test; it returns the
// hold's id.
func budgetHold(t *testing.T, e *systest.Env, sku stock.SKU, key, buyer, device string, q int64) string {
	t.Helper()
	r := holdAs(t, e, sku, key, buyer, device, q)
	if r.Status != http.StatusCreated {
		t.Fatalf("hold %s of %s = %d %s", key, buyer, r.Status, r.Body)
	}
	return systest.ReplyID(r)
}

// copiesGranted sends one request to replicas a and b at once (a client
// retrying on another replica before the first answered) and returns the
// copies answered 201; every other copy must be refused by a hold budget
// or be a 503.
func copiesGranted(t *testing.T, what string, a, b *systest.Env, send func(e *systest.Env) systest.Reply) []systest.Reply {
	t.Helper()
	var wg sync.WaitGroup
	var ra, rb systest.Reply
	wg.Go(func() { ra = send(a) })
	wg.Go(func() { rb = send(b) })
	wg.Wait()
	var granted []systest.Reply
	for _, r := range []systest.Reply{ra, rb} {
		switch {
		case r.Status == http.StatusCreated:
			granted = append(granted, r)
		case r.Status == http.StatusConflict && systest.ProblemKind(r) == "hold-budget-reached",
			r.Status == http.StatusServiceUnavailable:
		default:
			t.Fatalf("copy of %s = %d %s", what, r.Status, r.Body)
		}
	}
	return granted
}

// atBudget checks that buyer's next hold of one unit is refused with 409
// hold-budget-reached.
func atBudget(t *testing.T, e *systest.Env, sku stock.SKU, key, buyer, device string) {
	t.Helper()
	r := holdAs(t, e, sku, key, buyer, device, 1)
	if r.Status != http.StatusConflict || systest.ProblemKind(r) != "hold-budget-reached" {
		t.Fatalf("hold %s of %s at its budget = %d %s, want 409 hold-budget-reached", key, buyer, r.Status, r.Body)
	}
}

// act posts a buyer's action with a body, wanting status.
func act(t *testing.T, e *systest.Env, path, key, body string, status int) systest.Reply {
	t.Helper()
	r := e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": key}, body)
	if r.Status != status {
		t.Fatalf("POST %s = %d %s, want %d", path, r.Status, r.Body, status)
	}
	return r
}

// cartHold holds a cart of one unit of each ticket for buyer.
func cartHold(t *testing.T, e *systest.Env, program keys.ID, key, buyer, device string, tickets ...stock.SKU) systest.Reply {
	var lines []string
	for _, s := range tickets {
		lines = append(lines, fmt.Sprintf(`{"ticket":%q,"quantity":1}`, s.Ticket))
	}
	h := map[string]string{"Idempotency-Key": key}
	if device != "" {
		h["Buyer-Fingerprint"] = device
	}
	return e.Do(t, http.MethodPost, "/v1/programs/"+program.String()+"/cart-holds", h,
		fmt.Sprintf(`{"buyer":%q,"lines":[%s]}`, buyer, strings.Join(lines, ",")))
}

// Each way a hold ends gives its units back to the budget at once, on
// either replica: a partial confirm, an extension then a cancel, a held
// cart confirmed or cancelled, a seat hold confirmed or cancelled, a pool
// hold cancelled, a retry after the confirm on the other replica; and a
// device's count ends with its hold whichever buyer held under it.
func TestHoldBudgetAttackEnds(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		one := systest.NewSKU(t)
		two := stock.SKU{Program: one.Program, Ticket: keys.MustID(one.Ticket.String() + "-two")}
		seated := stock.SKU{Program: one.Program, Ticket: keys.MustID(one.Ticket.String() + "-seated")}
		a.PutSKU(t, one, 100, 2, 10)
		a.PutSKU(t, two, 100, 2, 10)
		a.PutSKU(t, seated, 0, 1, 4)
		a.LoadSeats(t, seated, map[string]int{"A": 12})
		a.PutPool(t, one, "fans", `{"allotment":10,"shards":1}`)
		putBudgets(t, a, one.Program.String(), 2, 2)

		// A partial confirm ends the hold: its kept unit is bought.
		id := budgetHold(t, a, one, "pc-1", "pc", "", 2)
		atBudget(t, b, two, "pc-2", "pc", "")
		act(t, b, "/v1/holds/"+id+"/confirm", "pc-pay", `{"buyer":"pc","quantity":1}`, http.StatusCreated)
		budgetHold(t, a, two, "pc-3", "pc", "", 2)

		// An extension moves the count; the cancel still ends it.
		id = budgetHold(t, a, one, "ex-1", "ex", "", 2)
		act(t, b, "/v1/holds/"+id+"/extend", "ex-ext", `{"buyer":"ex","ttl_seconds":1200}`, http.StatusOK)
		atBudget(t, a, one, "ex-2", "ex", "")
		act(t, a, "/v1/holds/"+id+"/cancel", "ex-x", `{"buyer":"ex"}`, http.StatusOK)
		budgetHold(t, b, one, "ex-3", "ex", "", 2)

		// A held cart counts each line; its confirm and its cancel end them.
		r := cartHold(t, a, one.Program, "ct-1", "ct", "", one, two)
		if r.Status != http.StatusCreated {
			t.Fatalf("cart hold = %d %s", r.Status, r.Body)
		}
		atBudget(t, b, one, "ct-2", "ct", "")
		act(t, b, "/v1/carts/"+systest.ReplyID(r)+"/confirm", "ct-pay", `{"buyer":"ct"}`, http.StatusCreated)
		budgetHold(t, a, one, "ct-3", "ct", "", 2)
		r = cartHold(t, b, one.Program, "cc-1", "cc", "", one, two)
		if r.Status != http.StatusCreated {
			t.Fatalf("cart hold = %d %s", r.Status, r.Body)
		}
		atBudget(t, a, two, "cc-2", "cc", "")
		act(t, a, "/v1/carts/"+systest.ReplyID(r)+"/cancel", "cc-x", `{"buyer":"cc"}`, http.StatusOK)
		budgetHold(t, b, two, "cc-3", "cc", "", 2)

		// Seat holds: confirmed, cancelled.
		r, h := a.SeatHold(t, seated, "sh-1", "sh", "A-01", "A-02")
		if r.Status != http.StatusCreated {
			t.Fatalf("seat hold = %d %s", r.Status, r.Body)
		}
		atBudget(t, b, one, "sh-2", "sh", "")
		act(t, b, "/v1/holds/"+h.HoldID+"/confirm", "sh-pay", `{"buyer":"sh"}`, http.StatusCreated)
		r, h = b.SeatHold(t, seated, "sh-3", "sh", "A-03", "A-04")
		if r.Status != http.StatusCreated {
			t.Fatalf("seat hold = %d %s", r.Status, r.Body)
		}
		atBudget(t, a, one, "sh-4", "sh", "")
		act(t, a, "/v1/holds/"+h.HoldID+"/cancel", "sh-x", `{"buyer":"sh"}`, http.StatusOK)
		budgetHold(t, a, one, "sh-5", "sh", "", 2)

		// A pool's hold counts under the ticket's program.
		r = a.Do(t, http.MethodPost, systest.SKUPath(one)+"/holds?pool=fans", map[string]string{"Idempotency-Key": "pl-1"}, `{"buyer":"pl","quantity":2}`)
		if r.Status != http.StatusCreated {
			t.Fatalf("pool hold = %d %s", r.Status, r.Body)
		}
		atBudget(t, b, two, "pl-2", "pl", "")
		act(t, b, "/v1/holds/"+systest.ReplyID(r)+"/cancel", "pl-x", `{"buyer":"pl"}`, http.StatusOK)
		budgetHold(t, a, two, "pl-3", "pl", "", 2)

		// A retry after the confirm, on the other replica, is its replay
		// and counts nothing.
		id = budgetHold(t, a, one, "rc-1", "rc", "", 2)
		act(t, a, "/v1/holds/"+id+"/confirm", "rc-pay", `{"buyer":"rc"}`, http.StatusCreated)
		if r := holdAs(t, b, one, "rc-1", "rc", "", 2); r.Status != http.StatusCreated || systest.ReplyID(r) != id {
			t.Fatalf("retry of a confirmed hold = %d %s, want its replay", r.Status, r.Body)
		}
		budgetHold(t, a, two, "rc-2", "rc", "", 2)

		// A device's count ends with its hold and its cart: whoever held.
		const dev = "fp-~!@#$%^&*()_+{}|:<>? `-=[]\\;',./\""
		id = budgetHold(t, a, one, "dv-1", "dv1", dev, 2)
		atBudget(t, b, two, "dv-2", "dv2", dev)
		act(t, b, "/v1/holds/"+id+"/cancel", "dv-x", `{"buyer":"dv1"}`, http.StatusOK)
		r = cartHold(t, b, one.Program, "dv-3", "dv2", dev, one, two)
		if r.Status != http.StatusCreated {
			t.Fatalf("cart hold under the device = %d %s", r.Status, r.Body)
		}
		atBudget(t, a, one, "dv-4", "dv3", dev)
		act(t, a, "/v1/carts/"+systest.ReplyID(r)+"/confirm", "dv-pay", `{"buyer":"dv2"}`, http.StatusCreated)
		budgetHold(t, a, one, "dv-5", "dv3", dev, 2)
		long := strings.Repeat("z", 256)
		budgetHold(t, b, one, "dv-6", "dv4", long, 2)
		atBudget(t, a, one, "dv-7", "dv5", long)
	})
}

// A hold refused for another reason than its budget (sold out, over the
// ticket's per-buyer cap, over the maximum per order, its key reused for
// another request) leaves no count behind.
func TestHoldBudgetAttackOtherRefusals(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		one := systest.NewSKU(t)
		few := stock.SKU{Program: one.Program, Ticket: keys.MustID(one.Ticket.String() + "-few")}
		capped := stock.SKU{Program: one.Program, Ticket: keys.MustID(one.Ticket.String() + "-capped")}
		e.PutSKU(t, one, 100, 2, 3)
		e.PutSKU(t, few, 1, 1, 4)
		e.PutCapped(t, capped, 1, 1)
		putBudgets(t, e, one.Program.String(), 2, 2)
		for i := range 3 {
			key := fmt.Sprintf("r%d", i)
			if r := holdAs(t, e, few, key+"-sold", "ann", "dev", 2); r.Status != http.StatusConflict {
				t.Fatalf("hold of 2 of 1 left = %d %s", r.Status, r.Body)
			}
			if r := holdAs(t, e, capped, key+"-cap", "ann", "dev", 2); r.Status != http.StatusConflict {
				t.Fatalf("hold over the ticket's cap = %d %s", r.Status, r.Body)
			}
			if r := holdAs(t, e, one, key+"-max", "ann", "dev", 4); r.Status != http.StatusUnprocessableEntity && r.Status != http.StatusConflict {
				t.Fatalf("hold over the maximum per order = %d %s", r.Status, r.Body)
			}
		}
		budgetHold(t, e, one, "k", "ann", "dev", 1)
		if r := holdAs(t, e, one, "k", "ann", "dev", 2); r.Status != http.StatusUnprocessableEntity {
			t.Fatalf("key reused for another hold = %d %s", r.Status, r.Body)
		}
		budgetHold(t, e, capped, "k2", "ann", "dev", 1)
		atBudget(t, e, one, "k3", "ann", "")
		atBudget(t, e, one, "k4", "bob", "dev")
		if st := e.State(t, one); st.Held != 1 || st.RedisRemaining != 99 {
			t.Errorf("after refusals: %+v, want 1 held", st)
		}
	})
}

// A budget lowered, removed and set again while holds are counted: the
// holds ended meanwhile (on either replica) are not counted when it is
// back, and the ones still held are.
func TestHoldBudgetAttackBudgetChanged(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 100_000, 2, 10)
		p := sku.Program.String()
		putBudgets(t, a, p, 3, 3)
		// probe is at every budget below but none: b answers its holds
		// when b sees no budget.
		budgetHold(t, b, sku, "probe", "probe", "", 3)
		h1 := budgetHold(t, a, sku, "h1", "ann", "dev", 1)
		h2 := budgetHold(t, a, sku, "h2", "ann", "dev", 1)
		h3 := budgetHold(t, b, sku, "h3", "ann", "dev", 1)
		// Lowered under what is held: refused until enough ended.
		putBudgets(t, a, p, 1, 1)
		atBudget(t, a, sku, "h4", "ann", "")
		act(t, a, "/v1/holds/"+h1+"/cancel", "x1", `{"buyer":"ann"}`, http.StatusOK)
		atBudget(t, a, sku, "h5", "ann", "")
		// Removed: holds go on uncounted, and ends meanwhile (on either
		// replica, whose cache may still show the budget) count.
		putBudgets(t, a, p, 0, 0)
		n := 0
		systest.WaitFor(t, 10*time.Second, "b to see the budget removed", func() bool {
			n++
			return holdAs(t, b, sku, fmt.Sprintf("probe-%d", n), "probe", "", 1).Status == http.StatusCreated
		})
		act(t, b, "/v1/holds/"+h2+"/cancel", "x2", `{"buyer":"ann"}`, http.StatusOK)
		act(t, a, "/v1/holds/"+h3+"/confirm", "c3", `{"buyer":"ann"}`, http.StatusCreated)
		budgetHold(t, b, sku, "h6", "ann", "dev", 1)
		// Back: nothing ann held before is counted any more (h6, held
		// while there was no budget, is not counted: the budget counts the
		// holds it saw).
		putBudgets(t, a, p, 2, 2)
		systest.WaitFor(t, 10*time.Second, "b to see the budget back", func() bool {
			n++
			r := holdAs(t, b, sku, fmt.Sprintf("probe-%d", n), "probe", "", 5)
			return systest.ProblemKind(r) == "hold-budget-reached"
		})
		budgetHold(t, a, sku, "h7", "ann", "dev", 2)
		atBudget(t, b, sku, "h8", "ann", "")
	})
}

// Copies of one hold sent to two replicas at once (a client retrying on
// another replica before the first answered) hold once and count once: the
// buyer never holds past its budget however many such pairs it sends.
func TestHoldBudgetAttackCopiesAcrossReplicas(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 1000, 2, 4)
		putBudgets(t, a, sku.Program.String(), 3, 0)
		held := map[string]bool{}
		for i := range 16 {
			key := fmt.Sprintf("copy-%d", i)
			for _, r := range copiesGranted(t, key, a, b, func(e *systest.Env) systest.Reply { return holdAs(t, e, sku, key, "ann", "", 1) }) {
				held[systest.ReplyID(r)] = true
			}
		}
		st := a.State(t, sku)
		if len(held) > 3 || st.Held > 3 {
			t.Errorf("ann holds %d holds (%d units) of a budget of 3", len(held), st.Held)
		}
		// Held carts of two lines, copies to both replicas: one fits.
		two := stock.SKU{Program: sku.Program, Ticket: keys.MustID(sku.Ticket.String() + "-two")}
		a.PutSKU(t, two, 1000, 2, 4)
		carts := map[string]bool{}
		for i := range 8 {
			key := fmt.Sprintf("cart-%d", i)
			for _, r := range copiesGranted(t, "cart "+key, a, b, func(e *systest.Env) systest.Reply {
				return cartHold(t, e, sku.Program, key, "cat", "", sku, two)
			}) {
				carts[systest.ReplyID(r)] = true
			}
		}
		if len(carts) > 1 {
			t.Errorf("cat holds %d carts of 2 units under a budget of 3", len(carts))
		}
	})
}

// Bad program bodies are refused with a 4xx and change nothing; none is
// a 5xx.
func TestHoldBudgetAttackBadBodies(t *testing.T) {
	e := systest.New(t, "sqlite")
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 10, 1, 4)
	putBudgets(t, e, sku.Program.String(), 1, 1)
	for _, body := range []string{
		`{"per_buyer":0,"hold_budget":9223372036854775807}`,
		`{"per_buyer":0,"hold_budget":99999999999999999999}`,
		`{"per_buyer":0,"device_hold_budget":-9223372036854775808}`,
		`{"per_buyer":0,"hold_budget":1e3}`,
		`{"per_buyer":0,"hold_budget":true}`,
		`{"per_buyer":0,"hold_budget":[1]}`,
		`{"per_buyer":0,"hold_budget":{"n":1}}`,
		`{"per_buyer":-1,"hold_budget":1}`,
		`{"hold_budget":1}`,
		`null`, `[]`, `"x"`, `{`, ``,
		`{"per_buyer":0,"hold_budget":1,"hold_budget":-5}`,
	} {
		r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String(), nil, body)
		if r.Status < 400 || r.Status >= 500 {
			t.Errorf("put program %s = %d %s, want a 4xx", body, r.Status, r.Body)
		}
	}
	// The budget of 1 stands.
	budgetHold(t, e, sku, "h1", "ann", "", 1)
	atBudget(t, e, sku, "h2", "ann", "")
}

// A retry of a hold naming another Buyer-Fingerprint is its replay and
// counts nothing under the other device: when the hold ends, that device
// has its whole budget.
func TestHoldBudgetAttackRetryOtherDevice(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 100, 2, 10)
		putBudgets(t, a, sku.Program.String(), 5, 2)
		id := budgetHold(t, a, sku, "k", "ann", "dev-1", 2)
		for _, e := range []*systest.Env{a, b} {
			if r := holdAs(t, e, sku, "k", "ann", "dev-2", 2); r.Status != http.StatusCreated || systest.ReplyID(r) != id {
				t.Fatalf("retry under another device = %d %s, want the replay", r.Status, r.Body)
			}
		}
		atBudget(t, b, sku, "k-1", "bob", "dev-1")
		act(t, b, "/v1/holds/"+id+"/cancel", "x", `{"buyer":"ann"}`, http.StatusOK)
		budgetHold(t, a, sku, "k-2", "bob", "dev-2", 2)
		budgetHold(t, b, sku, "k-3", "cat", "dev-1", 2)
	})
}

// Copies of one hold sent to two replicas at once, from a device at its
// own budget: every copy is refused. A copy that found the buyer's count
// made by the other copy skipped the device's, and held uncounted while
// the other, refused by the device, gave the buyer's count back: a hold
// under neither budget, again with every new key (helper-57).
func TestHoldBudgetAttackCopiesPastTheDeviceBudget(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 1000, 2, 4)
		putBudgets(t, a, sku.Program.String(), 4, 6)
		budgetHold(t, a, sku, "bob-1", "bob", "dev", 4)
		budgetHold(t, b, sku, "carl-1", "carl", "dev", 2)
		granted := 0
		for i := range 24 {
			key := fmt.Sprintf("ann-copy-%d", i)
			granted += len(copiesGranted(t, key, a, b, func(e *systest.Env) systest.Reply { return holdAs(t, e, sku, key, "ann", "dev", 1) }))
		}
		if st := a.State(t, sku); granted > 0 || st.Held != 6 {
			t.Errorf("ann's copies from a device at its budget: %d granted, %d units held, want 0 and bob's and carl's 6", granted, st.Held)
		}
	})
}

// A budget set on one replica reaches the other by its notice: b's copy of
// the program stood for its settings TTL, and every hold b took meanwhile
// was never counted against the budget, for that hold's whole life
// (helper-70 #2). Here the TTL is 10 minutes, so only the notice can
// bring the budget to b within the wait.
func TestHoldBudgetSetReachesOtherReplicaAtOnce(t *testing.T) {
	a, b := systest.PairTuned(t, ledger.SQLite, func(o *app.Options) { o.Sale.SettingsTTL = 10 * time.Minute })
	sku := systest.NewSKU(t)
	a.PutSKU(t, sku, 100_000, 2, 10)
	budgetHold(t, b, sku, "warm", "warm", "", 3) // b reads the program: no budget
	putBudgets(t, a, sku.Program.String(), 1, 0)
	n := 0
	systest.WaitFor(t, 60*time.Second, "b to refuse a second hold under the new budget", func() bool {
		n++
		buyer := fmt.Sprintf("b%d", n)
		budgetHold(t, b, sku, buyer+"-1", buyer, "", 1)
		return systest.ProblemKind(holdAs(t, b, sku, buyer+"-2", buyer, "", 1)) == "hold-budget-reached"
	})
}

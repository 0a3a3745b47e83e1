package failover_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
)

// TestFaultLedgerCommitReplyLost: PostgreSQL commits and its reply is
// lost on the way back (the connection closes after COMMIT was sent),
// once for each kind of request that changes the ledger. The replica
// cannot know what happened: it answers the request as it succeeded or
// 503 (never a 4xx, never a 500), and the same request sent again with
// its key answers what did happen, the same order, hold or listing, and
// moves nothing twice; afterwards the ledger, Redis and the report agree.
func TestFaultLedgerCommitReplyLost(t *testing.T) {
	systest.FullTier(t)
	link, dsn := systest.LedgerLink(t, systest.LedgerDSN(t, ledger.Postgres))
	// No sweeper: a return the lost reply left owed to Redis is finished
	// by the request's retry, not at the next sweep.
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 40, 2, 4)
	n, unknown := 0, 0
	// lose sends a request whose COMMIT reply is lost, then the same
	// again with its key, and returns the answer's id field.
	lose := func(what, path, body string, ok int, field string) string {
		t.Helper()
		n++
		key := fmt.Sprintf("k%d", n)
		lost := link.LoseCommitReplies(t, 0, 1)
		first := e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": key}, body)
		got := lost()
		link.Heal(t)
		if got != 1 {
			t.Fatalf("%s: %d COMMIT replies lost, want its own (answered %d %s)", what, got, first.Status, first.Body)
		}
		if first.Status != ok && first.Status != http.StatusServiceUnavailable {
			t.Errorf("%s, a COMMIT reply lost = %d %s; want %d or 503", what, first.Status, first.Body, ok)
		}
		if first.Status == http.StatusServiceUnavailable {
			unknown++
		}
		again, _ := e.Retried(t, http.MethodPost, path, key, body)
		if again.Status != ok {
			t.Fatalf("%s sent again with its key = %d %s, want %d (first %d %s)", what, again.Status, again.Body, ok, first.Status, first.Body)
		}
		id := func(r systest.Reply) string {
			var v map[string]any
			_ = json.Unmarshal(r.Body, &v)
			s, _ := v[field].(string)
			return s
		}
		if id(again) == "" || first.Status == ok && id(first) != id(again) {
			t.Errorf("%s: first answered %s %q, again %s %q", what, field, id(first), field, id(again))
		}
		t.Logf("%s, its COMMIT reply lost: %d, then %d", what, first.Status, again.Status)
		return id(again)
	}
	hold := func(key string, q int) string {
		r, h := e.Hold(t, sku, key, "ann", int64(q), 60)
		if r.Status != http.StatusCreated {
			t.Fatalf("hold %s = %d %s", key, r.Status, r.Body)
		}
		return h.HoldID
	}

	bought := lose("a purchase", systest.SKUPath(sku)+"/purchases", `{"buyer":"ann","quantity":2}`, http.StatusCreated, "order_id")
	held := lose("a hold", systest.SKUPath(sku)+"/holds", `{"buyer":"ann","quantity":2}`, http.StatusCreated, "hold_id")
	confirmed := lose("a confirm", "/v1/holds/"+held+"/confirm", `{"buyer":"ann"}`, http.StatusCreated, "order_id")
	part := lose("a confirm of 1 of 3", "/v1/holds/"+hold("h-part", 3)+"/confirm", `{"buyer":"ann","quantity":1}`, http.StatusCreated, "order_id")
	h := hold("h-end", 1)
	lose("an extend", "/v1/holds/"+h+"/extend", `{"buyer":"ann","ttl_seconds":120}`, http.StatusOK, "hold_id")
	lose("a cancel", "/v1/holds/"+h+"/cancel", `{"buyer":"ann"}`, http.StatusOK, "hold_id")
	lose("a refund", "/v1/orders/"+bought+"/refund", `{"buyer":"ann"}`, http.StatusOK, "order_id")
	lose("a transfer", "/v1/orders/"+confirmed+"/transfer", `{"buyer":"ann","to":"bob"}`, http.StatusOK, "order_id")
	lose("a listing", "/v1/orders/"+part+"/resale", `{"buyer":"ann","quantity":1}`, http.StatusCreated, "listing_id")
	carts := "/v1/programs/" + sku.Program.String()
	line := func(q int) string {
		return fmt.Sprintf(`{"buyer":"ann","lines":[{"ticket":%q,"quantity":%d}]}`, sku.Ticket.String(), q)
	}
	cancelled := lose("a held cart", carts+"/cart-holds", line(1), http.StatusCreated, "cart_id")
	lose("a cart's cancel", "/v1/carts/"+cancelled+"/cancel", `{"buyer":"ann"}`, http.StatusOK, "cart_id")
	refunded := lose("a cart bought", carts+"/carts", line(2), http.StatusCreated, "cart_id")
	lose("a cart's refund", "/v1/carts/"+refunded+"/refund", `{"buyer":"ann"}`, http.StatusOK, "cart_id")
	paid := lose("a held cart", carts+"/cart-holds", line(1), http.StatusCreated, "cart_id")
	lose("a cart's confirm", "/v1/carts/"+paid+"/confirm", `{"buyer":"ann"}`, http.StatusCreated, "cart_id")
	// Ann's purchase of 2 refunded, her confirm of 2 (now Bob's), 1 of 3
	// confirmed, a cart of 1 cancelled, one of 2 refunded, one of 1
	// paid: 4 units sold, in 3 standing orders.
	systest.WaitSettled(t, e, sku)
	if st := e.State(t, sku); st.Sold != 4 || st.Held != 0 || st.Orders != 3 {
		t.Errorf("ledger after the requests: %+v, want 3 standing orders, 4 sold and none held", st)
	}
	lose("a purchase", systest.SKUPath(sku)+"/purchases", `{"buyer":"cat","quantity":1}`, http.StatusCreated, "order_id")
	t.Logf("%d requests, each with its COMMIT reply lost: %d answered 503 (outcome unknown) before their retry", n, unknown)
	systest.WaitSettled(t, e, sku)
	if st := e.State(t, sku); st.Sold != 5 && st.Sold != 4 || st.Orders != 4 {
		t.Errorf("ledger after cat's purchase: %+v, want 4 standing orders (its unit from stock or the listing)", st)
	}
	r := e.Do(t, http.MethodGet, "/v1/admin/programs/"+sku.Program.String()+"/report", nil, "")
	var rep struct {
		Balanced bool `json:"balanced"`
	}
	if json.Unmarshal(r.Body, &rep) != nil || !rep.Balanced {
		t.Errorf("report after the lost replies: %d %s", r.Status, r.Body)
	}
}

// TestFaultTransferReplyLostFreesTheSendersCap: ann, at her cap of 2,
// transfers her order to bob and the transfer's COMMIT reply is lost;
// sent again with its key, it is answered from the ledger. Ann owns
// nothing now, so she may buy again: the replay lets go of her counts at
// the gate, which the lost first answer never did (409 limit-reached
// for a buyer who holds no ticket).
func TestFaultTransferReplyLostFreesTheSendersCap(t *testing.T) {
	systest.FullTier(t)
	link, dsn := systest.LedgerLink(t, systest.LedgerDSN(t, ledger.Postgres))
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 40, 2, 4)
	if r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String(), nil, `{"per_buyer":2}`); r.Status != http.StatusOK {
		t.Fatalf("program cap = %d %s", r.Status, r.Body)
	}
	order := systest.OrderID(e.MustBuy(t, sku, "ann-1", "ann", 2))
	if r := e.Buy(t, sku, "ann-over", "ann", 1); r.Status != http.StatusConflict || systest.ProblemKind(r) != "limit-reached" {
		t.Fatalf("ann's third ticket = %d %s; want 409 limit-reached", r.Status, r.Body)
	}
	path, body := "/v1/orders/"+order+"/transfer", `{"buyer":"ann","to":"bob"}`
	lost := link.LoseCommitReplies(t, 0, 1)
	first := e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "t1"}, body)
	if n := lost(); n != 1 {
		t.Fatalf("%d COMMIT replies lost, want the transfer's (answered %d %s)", n, first.Status, first.Body)
	}
	link.Heal(t)
	again, _ := e.Retried(t, http.MethodPost, path, "t1", body)
	t.Logf("transfer with its reply lost = %d, again = %d", first.Status, again.Status)
	if again.Status != http.StatusOK {
		t.Fatalf("transfer sent again = %d %s; want 200", again.Status, again.Body)
	}
	if r := e.Buy(t, sku, "ann-2", "ann", 2); r.Status != http.StatusCreated {
		t.Errorf("ann, who gave her 2 tickets away, buys 2 = %d %s; want 201", r.Status, r.Body)
	}
	systest.RedisConsistent(t, e, sku)
}

// Access codes generated while the COMMIT's reply is lost: the route takes
// no key and keeps no generated code in plain text, so its 503 cannot
// promise that a retry tells (helper-33: it said "unknown", as if one
// could). It says what a retry tells (given codes, by added) and that a
// generated code nobody was given is safe; the given code, sent again, is
// told as already there, once.
func TestCodesCommitReplyLostSaysWhatARetryTells(t *testing.T) {
	link, dsn := systest.LedgerLink(t, systest.LedgerDSN(t, ledger.Postgres))
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 40, 1, 4)
	e.PutPool(t, sku, "club", `{"allotment":20,"access":"code"}`)
	path := systest.AdminPath(sku) + "/pools/club/codes"
	body := `{"codes":[{"code":"GIVEN-CODE-1","max_uses":1}]}`
	lost := link.LoseCommitReplies(t, 0, 1)
	first := e.Do(t, http.MethodPost, path, nil, body)
	got := lost()
	link.Heal(t)
	if got != 1 {
		t.Fatalf("%d COMMIT replies lost, want the codes' (answered %d %s)", got, first.Status, first.Body)
	}
	if first.Status != http.StatusServiceUnavailable || !strings.Contains(string(first.Body), "generate new ones") ||
		!strings.Contains(string(first.Body), "added") {
		t.Errorf("codes with the COMMIT reply lost = %d %s, want 503 saying what a retry tells", first.Status, first.Body)
	}
	again := e.Do(t, http.MethodPost, path, nil, body)
	var v struct{ Added int }
	if again.Status != http.StatusOK || json.Unmarshal(again.Body, &v) != nil || v.Added != 0 {
		t.Errorf("the given code sent again = %d %s, want 200 with added 0 (the lost COMMIT committed)", again.Status, again.Body)
	}
}

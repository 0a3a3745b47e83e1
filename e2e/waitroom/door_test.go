package waitroom_test

// Retries at a waiting room's door: a request sent again without its
// Admission-Token (a client that kept its Idempotency-Key but not the
// token, or a request made before the room was turned on) is a retry, not
// a new purchase, and is answered as before, from any replica.

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/stock"
)

// A cart and a held cart bought with their admissions, and a cart bought
// before the room was turned on, each retried without a token on both
// replicas: each is answered its cart, replayed, as purchases and seat
// holds are. A new cart without a token is still refused, and the key of a
// committed cart sent with another body is 422; neither moves anything.
func TestQueueDoorReplaysCarts(t *testing.T) {
	t.Parallel() // its own env and programs: it overlaps the others' waits
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Pacer: true})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn})
		p, skus := systest.CartSKUs(t, a, [3]int64{20, 20, 20}, 0)
		body := func(buyer string) string {
			return systest.CartBody(buyer, map[string]int64{"adult": 1, "child": 2}, "adult", "child")
		}
		carts, holds := "/v1/programs/"+p.String()+"/carts", "/v1/programs/"+p.String()+"/cart-holds"
		post := func(e *systest.Env, path, key, token, body string) systest.Reply {
			h := map[string]string{"Idempotency-Key": key}
			if token != "" {
				h["Admission-Token"] = token
			}
			return e.Do(t, http.MethodPost, path, h, body)
		}
		early := post(a, carts, "eve-cart", "", body("eve"))
		if early.Status != http.StatusCreated {
			t.Fatalf("eve's cart before the room = %d %s", early.Status, early.Body)
		}
		putQueue(t, a, p, qaRoom(0, 100, 60, "5"))
		ann, bob := admitted(t, a, p, "ann"), admitted(t, a, p, "bob")
		bought := post(a, carts, "ann-cart", ann.Admission, body("ann"))
		held := post(a, holds, "bob-cart", bob.Admission, body("bob"))
		if bought.Status != http.StatusCreated || held.Status != http.StatusCreated {
			t.Fatalf("ann's cart = %d %s; bob's held cart = %d %s", bought.Status, bought.Body, held.Status, held.Body)
		}
		before := map[stock.SKU]systest.State{}
		for _, s := range skus {
			before[s] = a.State(t, s)
		}
		retries := []struct {
			what, path, key, body string
			first                 systest.Reply
		}{
			{"ann's cart", carts, "ann-cart", body("ann"), bought},
			{"bob's held cart", holds, "bob-cart", body("bob"), held},
			{"eve's cart from before the room", carts, "eve-cart", body("eve"), early},
		}
		for n, e := range []*systest.Env{a, b} {
			for _, c := range retries {
				r := post(e, c.path, c.key, "", c.body)
				if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" || systest.ReplyID(r) != systest.ReplyID(c.first) {
					t.Errorf("replica %d: %s retried without a token = %d %s, want 201 replaying cart %s", n, c.what, r.Status, r.Body, systest.ReplyID(c.first))
				}
			}
			if r := post(e, carts, fmt.Sprintf("new-%d", n), "", body("cal")); r.Status != http.StatusForbidden || systest.ProblemKind(r) != "admission-required" {
				t.Errorf("replica %d: a new cart without a token = %d %s, want 403 admission-required", n, r.Status, r.Body)
			}
			other := systest.CartBody("ann", map[string]int64{"parking": 1}, "parking")
			if r := post(e, carts, "ann-cart", "", other); r.Status != http.StatusUnprocessableEntity || systest.ProblemKind(r) != "idempotency-key-reused" {
				t.Errorf("replica %d: ann's key with another cart, without a token = %d %s, want 422", n, r.Status, r.Body)
			}
		}
		for _, s := range skus {
			if got := a.State(t, s); got != before[s] {
				t.Errorf("%s after the retries: %+v, want %+v", s, got, before[s])
			}
		}
	})
}

// A purchase and a hold retried without their tokens right after they
// commit are answered at once on the other replica, though it had just
// refused another buyer's tokenless purchase of the ticket (so it had read
// which keys committed, a moment before the sale) and its cached settings
// predate the sale (they are kept for a minute there, so a stale memory
// would show for a minute).
func TestQueueDoorReplaysAtOnce(t *testing.T) {
	t.Parallel() // its own env and programs: it overlaps the others' waits
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Pacer: true})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: func(o *app.Options) { o.Sale.SettingsTTL = time.Minute }})
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 10, 1, 2)
		putQueue(t, a, sku.Program, qaRoom(0, 100, 60, "5"))
		hold := func(e *systest.Env, key, buyer, token string) systest.Reply {
			h := map[string]string{"Idempotency-Key": key}
			if token != "" {
				h["Admission-Token"] = token
			}
			return e.Do(t, http.MethodPost, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/holds", h,
				fmt.Sprintf(`{"buyer":%q,"quantity":1}`, buyer))
		}
		for i := range 4 {
			buyer, key := fmt.Sprintf("u%d", i), fmt.Sprintf("k%d", i)
			adm := admitted(t, a, sku.Program, buyer)
			if r := b.Buy(t, sku, fmt.Sprintf("probe-%d", i), "mallory", 1); r.Status != http.StatusForbidden || systest.ProblemKind(r) != "admission-required" {
				t.Fatalf("mallory's purchase without a token = %d %s", r.Status, r.Body)
			}
			var first, retry systest.Reply
			if i%2 == 0 {
				first = buyWith(t, a, sku, key, buyer, 1, adm.Admission)
				retry = b.Buy(t, sku, key, buyer, 1)
			} else {
				first = hold(a, key, buyer, adm.Admission)
				retry = hold(b, key, buyer, "")
			}
			if first.Status != http.StatusCreated {
				t.Fatalf("%s with its admission = %d %s", buyer, first.Status, first.Body)
			}
			if retry.Status != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "true" || systest.ReplyID(retry) != systest.ReplyID(first) {
				t.Errorf("%s's request %d retried on the other replica without its token = %d %s, want 201 replaying %s",
					buyer, i, retry.Status, retry.Body, systest.ReplyID(first))
			}
		}
		if st := a.State(t, sku); st.Sold != 2 || st.Held != 2 {
			t.Errorf("%+v, want 2 sold and 2 held", st)
		}
	})
}

package gateway_test

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
	"github.com/stockgate/stockgate/stock"
)

// A cart and a held cart bought with their admissions, and a cart bought
// before the room was turned on, each retried without a token on both
// replicas: each is answered its cart, replayed, as purchases and seat
// holds are. A new cart without a token is still refused, and the key of a
// committed cart sent with another body is 422; neither moves anything.
func TestQueueDoorReplaysCarts(t *testing.T) {
	t.Parallel() // its own env and programs: it overlaps the others' waits
	eachDriver(t, func(t *testing.T, driver string) {
		dsn := ledgerDSN(t, driver)
		a := startEnv(t, envOptions{driver: driver, dsn: dsn, pacer: true})
		b := startEnv(t, envOptions{driver: driver, dsn: dsn})
		p, skus := cartSKUs(t, a, [3]int64{20, 20, 20}, 0)
		body := func(buyer string) string {
			return cartBody(buyer, map[string]int64{"adult": 1, "child": 2}, "adult", "child")
		}
		carts, holds := "/v1/programs/"+p.String()+"/carts", "/v1/programs/"+p.String()+"/cart-holds"
		post := func(e *env, path, key, token, body string) reply {
			h := map[string]string{"Idempotency-Key": key}
			if token != "" {
				h["Admission-Token"] = token
			}
			return e.do(t, http.MethodPost, path, h, body)
		}
		early := post(a, carts, "eve-cart", "", body("eve"))
		if early.status != http.StatusCreated {
			t.Fatalf("eve's cart before the room = %d %s", early.status, early.body)
		}
		a.putQueue(t, p, qaRoom(0, 100, 60, "5"))
		ann, bob := a.admitted(t, p, "ann"), a.admitted(t, p, "bob")
		bought := post(a, carts, "ann-cart", ann.Admission, body("ann"))
		held := post(a, holds, "bob-cart", bob.Admission, body("bob"))
		if bought.status != http.StatusCreated || held.status != http.StatusCreated {
			t.Fatalf("ann's cart = %d %s; bob's held cart = %d %s", bought.status, bought.body, held.status, held.body)
		}
		before := map[stock.SKU]state{}
		for _, s := range skus {
			before[s] = a.state(t, s)
		}
		retries := []struct {
			what, path, key, body string
			first                 reply
		}{
			{"ann's cart", carts, "ann-cart", body("ann"), bought},
			{"bob's held cart", holds, "bob-cart", body("bob"), held},
			{"eve's cart from before the room", carts, "eve-cart", body("eve"), early},
		}
		for n, e := range []*env{a, b} {
			for _, c := range retries {
				r := post(e, c.path, c.key, "", c.body)
				if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || replyID(r) != replyID(c.first) {
					t.Errorf("replica %d: %s retried without a token = %d %s, want 201 replaying cart %s", n, c.what, r.status, r.body, replyID(c.first))
				}
			}
			if r := post(e, carts, fmt.Sprintf("new-%d", n), "", body("cal")); r.status != http.StatusForbidden || problemKind(r) != "admission-required" {
				t.Errorf("replica %d: a new cart without a token = %d %s, want 403 admission-required", n, r.status, r.body)
			}
			other := cartBody("ann", map[string]int64{"parking": 1}, "parking")
			if r := post(e, carts, "ann-cart", "", other); r.status != http.StatusUnprocessableEntity || problemKind(r) != "idempotency-key-reused" {
				t.Errorf("replica %d: ann's key with another cart, without a token = %d %s, want 422", n, r.status, r.body)
			}
		}
		for _, s := range skus {
			if got := a.state(t, s); got != before[s] {
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
	eachDriver(t, func(t *testing.T, driver string) {
		dsn := ledgerDSN(t, driver)
		a := startEnv(t, envOptions{driver: driver, dsn: dsn, pacer: true})
		b := startEnv(t, envOptions{driver: driver, dsn: dsn, tune: func(o *app.Options) { o.Sale.SettingsTTL = time.Minute }})
		sku := newSKU(t)
		a.putSKU(t, sku, 10, 1, 2)
		a.putQueue(t, sku.Program, qaRoom(0, 100, 60, "5"))
		hold := func(e *env, key, buyer, token string) reply {
			h := map[string]string{"Idempotency-Key": key}
			if token != "" {
				h["Admission-Token"] = token
			}
			return e.do(t, http.MethodPost, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/holds", h,
				fmt.Sprintf(`{"buyer":%q,"quantity":1}`, buyer))
		}
		for i := range 4 {
			buyer, key := fmt.Sprintf("u%d", i), fmt.Sprintf("k%d", i)
			adm := a.admitted(t, sku.Program, buyer)
			if r := b.buy(t, sku, fmt.Sprintf("probe-%d", i), "mallory", 1); r.status != http.StatusForbidden || problemKind(r) != "admission-required" {
				t.Fatalf("mallory's purchase without a token = %d %s", r.status, r.body)
			}
			var first, retry reply
			if i%2 == 0 {
				first = a.buyWith(t, sku, key, buyer, 1, adm.Admission)
				retry = b.buy(t, sku, key, buyer, 1)
			} else {
				first = hold(a, key, buyer, adm.Admission)
				retry = hold(b, key, buyer, "")
			}
			if first.status != http.StatusCreated {
				t.Fatalf("%s with its admission = %d %s", buyer, first.status, first.body)
			}
			if retry.status != http.StatusCreated || retry.header.Get("Idempotent-Replayed") != "true" || replyID(retry) != replyID(first) {
				t.Errorf("%s's request %d retried on the other replica without its token = %d %s, want 201 replaying %s",
					buyer, i, retry.status, retry.body, replyID(first))
			}
		}
		if st := a.state(t, sku); st.Sold != 2 || st.Held != 2 {
			t.Errorf("%+v, want 2 sold and 2 held", st)
		}
	})
}

package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// seatCartReply is a cart answer with its lines' seats, or a refusal
// naming its line and seats.
type seatCartReply struct {
	CartID string `json:"cart_id"`
	Orders []struct {
		OrderID string   `json:"order_id"`
		Ticket  string   `json:"ticket"`
		Seats   []string `json:"seats"`
	} `json:"orders"`
	Holds []struct {
		HoldID string   `json:"hold_id"`
		Ticket string   `json:"ticket"`
		State  string   `json:"state"`
		Seats  []string `json:"seats"`
	} `json:"holds"`
	Type  string `json:"type"`
	Lines []struct {
		Ticket string `json:"ticket"`
		Code   string `json:"code"`
	} `json:"lines"`
	Seats []string `json:"seats"`
}

func (e *env) seatCart(t *testing.T, p keys.ID, route, key, body string) (reply, seatCartReply) {
	t.Helper()
	r := e.do(t, http.MethodPost, "/v1/programs/"+p.String()+"/"+route, map[string]string{"Idempotency-Key": key}, body)
	var c seatCartReply
	if len(r.body) > 0 {
		if err := json.Unmarshal(r.body, &c); err != nil {
			t.Errorf("cart answer %s: %v", r.body, err)
		}
	}
	return r, c
}

// seatStates is the ledger's state of every seat of sku, a letter each
// (f, h, s) in seat id order, and what a seat check found differing in
// Redis (it repairs them: a check that finds none shows the gate agreed).
func (e *env) seatStates(t *testing.T, sku stock.SKU) (string, string) {
	t.Helper()
	all, err := e.ledger.Seats(context.Background(), sku, keys.ID{})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, s := range all {
		b.WriteString(s.State[:1])
	}
	r := e.do(t, http.MethodPost, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/seats/check", nil, "")
	var check struct {
		Differed []string `json:"differed"`
	}
	if r.status != http.StatusOK || json.Unmarshal(r.body, &check) != nil {
		t.Fatalf("seat check = %d %s", r.status, r.body)
	}
	return b.String(), strings.Join(check.Differed, ",")
}

// A cart's seat lines: given seats or the best adjacent ones, held with a
// held cart or sold with a bought one, beside a counted line, through two
// replicas on one ledger. A taken seat refuses the cart naming the line
// and the seat, and moves neither the other seats nor the counted line;
// confirm sells the seats, cancel and refund free them, in the ledger and
// in the gate (a seat check finds nothing to repair). Bad seat lines are
// clear problems that move nothing.
func TestCartSeats(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		dsn := ledgerDSN(t, driver)
		a := startEnv(t, envOptions{driver: driver, dsn: dsn})
		b := startEnv(t, envOptions{driver: driver, dsn: dsn})
		p := keys.MustID(testenv.ID(t, "seatcart"))
		stalls, parking := stock.SKU{Program: p, Ticket: keys.MustID("stalls")}, stock.SKU{Program: p, Ticket: keys.MustID("zparking")}
		a.putSKU(t, stalls, 0, 1, 4)
		a.loadSeats(t, stalls, map[string]int{"A": 6, "B": 4})
		a.putSKU(t, parking, 5, 1, 4)
		parkingLeft := func(want int64) {
			t.Helper()
			if got := a.state(t, parking); got.Sold+got.Held != 5-want || got.RedisRemaining != want {
				t.Errorf("parking: %+v, want %d left in the ledger and in Redis", got, want)
			}
		}
		// Seats A-01..A-06 then B-01..B-04.
		expect := func(want string) {
			t.Helper()
			got, differed := a.seatStates(t, stalls)
			if got != want || differed != "" {
				t.Errorf("seats %s (gate differed on %q), want %s and none differing", got, differed, want)
			}
		}
		r, ann := a.seatCart(t, p, "cart-holds", "ann-1",
			`{"buyer":"ann","lines":[{"ticket":"zparking","quantity":1},{"ticket":"stalls","seats":["A-01","A-02"]}]}`)
		if r.status != http.StatusCreated || len(ann.Holds) != 2 || fmt.Sprint(ann.Holds[0].Seats) != "[A-01 A-02]" {
			t.Fatalf("held seat cart = %d %s", r.status, r.body)
		}
		expect("hhffffffff")
		parkingLeft(4)

		r, bob := b.seatCart(t, p, "cart-holds", "bob-1",
			`{"buyer":"bob","lines":[{"ticket":"stalls","seats":["A-02","A-03"]},{"ticket":"zparking","quantity":1}]}`)
		if r.status != http.StatusConflict || !strings.HasSuffix(bob.Type, "/problems/seats-taken") || len(bob.Lines) != 1 || bob.Lines[0].Ticket != "stalls" ||
			fmt.Sprint(bob.Seats) != "[A-02]" {
			t.Errorf("cart over a taken seat = %d %s, want 409 seats-taken naming stalls and A-02", r.status, r.body)
		}
		expect("hhffffffff")
		parkingLeft(4)

		// Best available: three adjacent in B, bought at once.
		r, cal := b.seatCart(t, p, "carts", "cal-1",
			`{"buyer":"cal","lines":[{"ticket":"stalls","quantity":3,"section":"B"},{"ticket":"zparking","quantity":1}]}`)
		if r.status != http.StatusCreated || len(cal.Orders) != 2 || len(cal.Orders[0].Seats) != 3 || !strings.HasPrefix(cal.Orders[0].Seats[0], "B-") {
			t.Fatalf("bought best-seats cart = %d %s", r.status, r.body)
		}
		expect("hhffffsssf")
		parkingLeft(3)
		// The same key on the other replica replays the same seats.
		if r, again := a.seatCart(t, p, "carts", "cal-1",
			`{"buyer":"cal","lines":[{"ticket":"stalls","quantity":3,"section":"B"},{"ticket":"zparking","quantity":1}]}`); r.status != http.StatusCreated ||
			again.CartID != cal.CartID || fmt.Sprint(again.Orders[0].Seats) != fmt.Sprint(cal.Orders[0].Seats) {
			t.Errorf("retry of the bought cart = %d %s, want its replay", r.status, r.body)
		}
		expect("hhffffsssf")

		if r := b.do(t, http.MethodPost, "/v1/carts/"+ann.CartID+"/confirm", map[string]string{"Idempotency-Key": "ann-c"}, `{"buyer":"ann"}`); r.status != http.StatusCreated ||
			!strings.Contains(string(r.body), `"seats":["A-01","A-02"]`) {
			t.Errorf("confirm = %d %s, want the orders with their seats", r.status, r.body)
		}
		expect("ssffffsssf")
		parkingLeft(3)

		r, dee := a.seatCart(t, p, "cart-holds", "dee-1", `{"buyer":"dee","lines":[{"ticket":"stalls","quantity":2}]}`)
		if r.status != http.StatusCreated || fmt.Sprint(dee.Holds[0].Seats) != "[A-03 A-04]" {
			t.Fatalf("best seats in any section = %d %s, want A-03 A-04", r.status, r.body)
		}
		expect("sshhffsssf")
		if r := b.do(t, http.MethodPost, "/v1/carts/"+dee.CartID+"/cancel", map[string]string{"Idempotency-Key": "dee-x"}, `{"buyer":"dee"}`); r.status != http.StatusOK {
			t.Errorf("cancel = %d %s", r.status, r.body)
		}
		expect("ssffffsssf")
		for range 2 {
			if r := a.do(t, http.MethodPost, "/v1/carts/"+cal.CartID+"/refund", map[string]string{"Idempotency-Key": "cal-r"}, `{"buyer":"cal"}`); r.status != http.StatusOK {
				t.Errorf("refund = %d %s", r.status, r.body)
			}
		}
		expect("ssffffffff")
		parkingLeft(4)
		// B has its four seats back: four adjacent are there to be had.
		if r, _ := b.seatCart(t, p, "carts", "eve-1", `{"buyer":"eve","lines":[{"ticket":"stalls","quantity":4,"section":"B"}]}`); r.status != http.StatusCreated {
			t.Errorf("best four in B after the refund = %d %s", r.status, r.body)
		}
		expect("ssffffssss")

		for _, c := range []struct{ name, body, problem string }{
			{"seats and a section", `{"buyer":"x","lines":[{"ticket":"stalls","seats":["A-05"],"section":"A"}]}`, "invalid-field"},
			{"a quantity other than the seats", `{"buyer":"x","lines":[{"ticket":"stalls","seats":["A-05"],"quantity":2}]}`, "invalid-field"},
			{"a seat twice", `{"buyer":"x","lines":[{"ticket":"stalls","seats":["A-05","A-05"]}]}`, "invalid-field"},
			{"a bad seat id", `{"buyer":"x","lines":[{"ticket":"stalls","seats":["A 5"]}]}`, "invalid-field"},
			{"no quantity and no seats", `{"buyer":"x","lines":[{"ticket":"stalls"}]}`, "invalid-field"},
			{"an unknown seat", `{"buyer":"x","lines":[{"ticket":"stalls","seats":["A-05","Z-9"]},{"ticket":"zparking","quantity":1}]}`, "unknown-seats"},
			{"two sections", `{"buyer":"x","lines":[{"ticket":"stalls","seats":["A-05","B-01"]}]}`, "seats-span-sections"},
			{"seats of a counted ticket", `{"buyer":"x","lines":[{"ticket":"stalls","seats":["A-05"]},{"ticket":"zparking","seats":["A-06"]}]}`, "not-seated"},
			{"no adjacent seats", `{"buyer":"x","lines":[{"ticket":"stalls","quantity":2,"section":"B"}]}`, "no-adjacent-seats"},
			{"over the per-order maximum", `{"buyer":"x","lines":[{"ticket":"stalls","seats":["A-03","A-04","A-05","A-06","B-01"]}]}`, "quantity-over-limit"},
		} {
			for _, route := range []string{"carts", "cart-holds"} {
				r, got := a.seatCart(t, p, route, "bad-"+route+"-"+strings.ReplaceAll(c.name, " ", "-"), c.body)
				if r.status < 400 || r.status >= 500 || !strings.HasSuffix(got.Type, "/problems/"+c.problem) {
					t.Errorf("%s (%s) = %d %s, want problem %s", c.name, route, r.status, r.body, c.problem)
				}
			}
		}
		expect("ssffffssss")
		parkingLeft(4)
	})
}

// 60 carts race over two replicas for the same 6 seats of section A (two
// given seats each, overlapping) and two best seats of section B: no seat
// is had by two carts, every won cart has all its seats in the ledger
// under its holds, and the gate agrees with the ledger on every seat.
func TestCartSeatsRacing(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		dsn := ledgerDSN(t, driver)
		a := startEnv(t, envOptions{driver: driver, dsn: dsn})
		b := startEnv(t, envOptions{driver: driver, dsn: dsn})
		p := keys.MustID(testenv.ID(t, "seatrace"))
		stalls := stock.SKU{Program: p, Ticket: keys.MustID("stalls")}
		a.putSKU(t, stalls, 0, 1, 4)
		a.loadSeats(t, stalls, map[string]int{"A": 6, "B": 8})
		var mu sync.Mutex
		won := map[string][]string{} // cart → seats
		outcomes := map[string]int{}
		var wg sync.WaitGroup
		for i := range 60 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(i), 7))
				first := 1 + rng.IntN(5)
				body := fmt.Sprintf(`{"buyer":"u%d","lines":[{"ticket":"stalls","seats":["A-%02d","A-%02d"]}]}`, i, first, first+1)
				route := "cart-holds"
				if i%3 == 0 {
					body = fmt.Sprintf(`{"buyer":"u%d","lines":[{"ticket":"stalls","quantity":2,"section":"B"}]}`, i)
					route = "carts"
				}
				e := []*env{a, b}[i%2]
				r, c := e.seatCart(t, p, route, fmt.Sprintf("race-%d", i), body)
				mu.Lock()
				defer mu.Unlock()
				outcomes[fmt.Sprint(r.status)]++
				if r.status != http.StatusCreated {
					if r.status != http.StatusConflict {
						t.Errorf("cart %d = %d %s", i, r.status, r.body)
					}
					return
				}
				for _, h := range c.Holds {
					won[c.CartID] = append(won[c.CartID], h.Seats...)
				}
				for _, o := range c.Orders {
					won[c.CartID] = append(won[c.CartID], o.Seats...)
				}
			})
		}
		wg.Wait()
		owner := map[string]string{}
		for cart, ids := range won {
			if len(ids) != 2 {
				t.Errorf("cart %s won %v, want 2 seats", cart, ids)
			}
			for _, id := range ids {
				if prev, ok := owner[id]; ok {
					t.Errorf("seat %s won by carts %s and %s", id, prev, cart)
				}
				owner[id] = cart
			}
		}
		all, err := a.ledger.Seats(context.Background(), stalls, keys.ID{})
		if err != nil {
			t.Fatal(err)
		}
		var taken []string
		for _, s := range all {
			if s.State != "free" {
				taken = append(taken, s.ID.String())
			}
		}
		slices.Sort(taken)
		wonSeats := slices.Sorted(func(yield func(string) bool) {
			for id := range owner {
				if !yield(id) {
					return
				}
			}
		})
		if fmt.Sprint(taken) != fmt.Sprint(wonSeats) {
			t.Errorf("ledger has %v taken, the carts won %v", taken, wonSeats)
		}
		if st := a.state(t, stalls); st.Sold+st.Held != int64(len(taken)) {
			t.Errorf("SKU counts %+v, %d seats taken", st, len(taken))
		}
		if _, differed := a.seatStates(t, stalls); differed != "" {
			t.Errorf("gate differed from the ledger on %s", differed)
		}
		t.Logf("60 carts: %v, %d seats won", outcomes, len(owner))
	})
}

// With every Redis node down, seat carts (given seats and best available,
// held and bought) commit straight in the ledger, a taken seat still
// refuses the cart naming it, and once Redis is back a seat check makes
// the gate agree with the ledger.
func TestCartSeatsWhileRedisIsDown(t *testing.T) {
	// The breaker opens for 2 s at a time: the carts below go around the
	// gate whether it is open or probing (Redis refuses every call), and
	// it closes soon after Redis is back.
	e, c := faultEnv(t, func(o *app.Options) { o.Sale.Breaker.OpenFor = 2 * time.Second })
	p := keys.MustID(testenv.ID(t, "seatdown"))
	stalls, parking := stock.SKU{Program: p, Ticket: keys.MustID("stalls")}, stock.SKU{Program: p, Ticket: keys.MustID("zparking")}
	e.putSKU(t, stalls, 0, 1, 4)
	e.loadSeats(t, stalls, map[string]int{"A": 8})
	e.putSKU(t, parking, 5, 1, 4)
	for _, n := range c.Nodes {
		n.Kill()
	}
	for i := 0; e.srv.BreakerState() != breaker.Open; i++ {
		e.buy(t, newSKU(t), fmt.Sprintf("trip-%d", i), "z", 1)
	}
	if r, _ := e.seatCart(t, p, "cart-holds", "down-1",
		`{"buyer":"ann","lines":[{"ticket":"stalls","seats":["A-01","A-02"]},{"ticket":"zparking","quantity":1}]}`); r.status != http.StatusCreated {
		t.Fatalf("held seat cart with Redis down = %d %s", r.status, r.body)
	}
	if r, got := e.seatCart(t, p, "carts", "down-2",
		`{"buyer":"bob","lines":[{"ticket":"stalls","seats":["A-02"]},{"ticket":"zparking","quantity":1}]}`); r.status != http.StatusConflict ||
		fmt.Sprint(got.Seats) != "[A-02]" {
		t.Errorf("taken seat with Redis down = %d %s, want 409 naming A-02", r.status, r.body)
	}
	r, got := e.seatCart(t, p, "carts", "down-3", `{"buyer":"cat","lines":[{"ticket":"stalls","quantity":3}]}`)
	if r.status != http.StatusCreated || fmt.Sprint(got.Orders[0].Seats) != "[A-03 A-04 A-05]" {
		t.Errorf("best seats with Redis down = %d %s, want A-03..A-05", r.status, r.body)
	}
	if st, _ := e.ledger.SKU(context.Background(), stalls); st.Held != 2 || st.Sold != 3 {
		t.Errorf("stalls held %d sold %d, want 2 and 3", st.Held, st.Sold)
	}
	ctx := context.Background()
	for _, n := range c.Nodes {
		if err := n.Restart(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitHealthy(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// The seat check answers once Redis is back; it repairs what the
	// ledger sold around the gate, and a second check finds nothing.
	waitFor(t, 30*time.Second, "a seat check with Redis back", func() bool {
		r := e.do(t, http.MethodPost, "/v1/admin/skus/"+p.String()+"/stalls/seats/check", nil, "")
		return r.status == http.StatusOK
	})
	if got, differed := e.seatStates(t, stalls); got != "hhsssfff" || differed != "" {
		t.Errorf("seats %s, gate differed on %q; want hhsssfff and none", got, differed)
	}
}

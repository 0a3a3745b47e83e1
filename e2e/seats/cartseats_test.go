package seats_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
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

func seatCart(t *testing.T, e *systest.Env, p keys.ID, route, key, body string) (systest.Reply, seatCartReply) {
	t.Helper()
	r := e.Do(t, http.MethodPost, "/v1/programs/"+p.String()+"/"+route, map[string]string{"Idempotency-Key": key}, body)
	var c seatCartReply
	if len(r.Body) > 0 {
		if err := json.Unmarshal(r.Body, &c); err != nil {
			t.Errorf("cart answer %s: %v", r.Body, err)
		}
	}
	return r, c
}

// seatStates is the ledger's state of every seat of sku, a letter each
// (f, h, s) in seat id order, and what a seat check found differing in
// Redis (it repairs them: a check that finds none shows the gate agreed).
func seatStates(t *testing.T, e *systest.Env, sku stock.SKU) (string, string) {
	t.Helper()
	all, err := e.Ledger.Seats(context.Background(), sku, keys.ID{})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, s := range all {
		b.WriteString(s.State[:1])
	}
	check := e.SeatCheck(t, sku)
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
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		p := keys.MustID(testenv.ID(t, "seatcart"))
		stalls, parking := stock.SKU{Program: p, Ticket: keys.MustID("stalls")}, stock.SKU{Program: p, Ticket: keys.MustID("zparking")}
		a.PutSKU(t, stalls, 0, 1, 4)
		a.LoadSeats(t, stalls, map[string]int{"A": 6, "B": 4})
		a.PutSKU(t, parking, 5, 1, 4)
		parkingLeft := func(want int64) {
			t.Helper()
			if got := a.State(t, parking); got.Sold+got.Held != 5-want || got.RedisRemaining != want {
				t.Errorf("parking: %+v, want %d left in the ledger and in Redis", got, want)
			}
		}
		// Seats A-01..A-06 then B-01..B-04.
		expect := func(want string) {
			t.Helper()
			got, differed := seatStates(t, a, stalls)
			if got != want || differed != "" {
				t.Errorf("seats %s (gate differed on %q), want %s and none differing", got, differed, want)
			}
		}
		r, ann := seatCart(t, a, p, "cart-holds", "ann-1",
			`{"buyer":"ann","lines":[{"ticket":"zparking","quantity":1},{"ticket":"stalls","seats":["A-01","A-02"]}]}`)
		if r.Status != http.StatusCreated || len(ann.Holds) != 2 || fmt.Sprint(ann.Holds[0].Seats) != "[A-01 A-02]" {
			t.Fatalf("held seat cart = %d %s", r.Status, r.Body)
		}
		expect("hhffffffff")
		parkingLeft(4)

		r, bob := seatCart(t, b, p, "cart-holds", "bob-1",
			`{"buyer":"bob","lines":[{"ticket":"stalls","seats":["A-02","A-03"]},{"ticket":"zparking","quantity":1}]}`)
		if r.Status != http.StatusConflict || !strings.HasSuffix(bob.Type, "/problems/seats-taken") || len(bob.Lines) != 1 || bob.Lines[0].Ticket != "stalls" ||
			fmt.Sprint(bob.Seats) != "[A-02]" {
			t.Errorf("cart over a taken seat = %d %s, want 409 seats-taken naming stalls and A-02", r.Status, r.Body)
		}
		expect("hhffffffff")
		parkingLeft(4)

		// Best available: three adjacent in B, bought at once.
		r, cal := seatCart(t, b, p, "carts", "cal-1",
			`{"buyer":"cal","lines":[{"ticket":"stalls","quantity":3,"section":"B"},{"ticket":"zparking","quantity":1}]}`)
		if r.Status != http.StatusCreated || len(cal.Orders) != 2 || len(cal.Orders[0].Seats) != 3 || !strings.HasPrefix(cal.Orders[0].Seats[0], "B-") {
			t.Fatalf("bought best-seats cart = %d %s", r.Status, r.Body)
		}
		expect("hhffffsssf")
		parkingLeft(3)
		// The same key on the other replica replays the same seats.
		if r, again := seatCart(t, a, p, "carts", "cal-1",
			`{"buyer":"cal","lines":[{"ticket":"stalls","quantity":3,"section":"B"},{"ticket":"zparking","quantity":1}]}`); r.Status != http.StatusCreated ||
			again.CartID != cal.CartID || fmt.Sprint(again.Orders[0].Seats) != fmt.Sprint(cal.Orders[0].Seats) {
			t.Errorf("retry of the bought cart = %d %s, want its replay", r.Status, r.Body)
		}
		expect("hhffffsssf")

		if r := b.Do(t, http.MethodPost, "/v1/carts/"+ann.CartID+"/confirm", map[string]string{"Idempotency-Key": "ann-c"}, `{"buyer":"ann"}`); r.Status != http.StatusCreated ||
			!strings.Contains(string(r.Body), `"seats":["A-01","A-02"]`) {
			t.Errorf("confirm = %d %s, want the orders with their seats", r.Status, r.Body)
		}
		expect("ssffffsssf")
		parkingLeft(3)

		r, dee := seatCart(t, a, p, "cart-holds", "dee-1", `{"buyer":"dee","lines":[{"ticket":"stalls","quantity":2}]}`)
		if r.Status != http.StatusCreated || fmt.Sprint(dee.Holds[0].Seats) != "[A-03 A-04]" {
			t.Fatalf("best seats in any section = %d %s, want A-03 A-04", r.Status, r.Body)
		}
		expect("sshhffsssf")
		if r := b.Do(t, http.MethodPost, "/v1/carts/"+dee.CartID+"/cancel", map[string]string{"Idempotency-Key": "dee-x"}, `{"buyer":"dee"}`); r.Status != http.StatusOK {
			t.Errorf("cancel = %d %s", r.Status, r.Body)
		}
		expect("ssffffsssf")
		for range 2 {
			if r := a.Do(t, http.MethodPost, "/v1/carts/"+cal.CartID+"/refund", map[string]string{"Idempotency-Key": "cal-r"}, `{"buyer":"cal"}`); r.Status != http.StatusOK {
				t.Errorf("refund = %d %s", r.Status, r.Body)
			}
		}
		expect("ssffffffff")
		parkingLeft(4)
		// B has its four seats back: four adjacent are there to be had.
		if r, _ := seatCart(t, b, p, "carts", "eve-1", `{"buyer":"eve","lines":[{"ticket":"stalls","quantity":4,"section":"B"}]}`); r.Status != http.StatusCreated {
			t.Errorf("best four in B after the refund = %d %s", r.Status, r.Body)
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
				r, got := seatCart(t, a, p, route, "bad-"+route+"-"+strings.ReplaceAll(c.name, " ", "-"), c.body)
				if r.Status < 400 || r.Status >= 500 || !strings.HasSuffix(got.Type, "/problems/"+c.problem) {
					t.Errorf("%s (%s) = %d %s, want problem %s", c.name, route, r.Status, r.Body, c.problem)
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
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		p := keys.MustID(testenv.ID(t, "seatrace"))
		stalls := stock.SKU{Program: p, Ticket: keys.MustID("stalls")}
		a.PutSKU(t, stalls, 0, 1, 4)
		a.LoadSeats(t, stalls, map[string]int{"A": 6, "B": 8})
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
				e := []*systest.Env{a, b}[i%2]
				// A 503 (Redis calls timed out while 60 carts race on a
				// loaded machine, a node's breaker open) is retried with
				// its key, as a platform's worker does: every cart ends
				// 201 or 409.
				r, _ := e.Retried(t, http.MethodPost, "/v1/programs/"+p.String()+"/"+route, fmt.Sprintf("race-%d", i), body)
				var c seatCartReply
				if r.Status == http.StatusCreated && json.Unmarshal(r.Body, &c) != nil {
					t.Errorf("cart %d answer %s", i, r.Body)
				}
				mu.Lock()
				defer mu.Unlock()
				outcomes[fmt.Sprint(r.Status)]++
				if r.Status != http.StatusCreated {
					if r.Status != http.StatusConflict {
						t.Errorf("cart %d = %d %s", i, r.Status, r.Body)
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
		all, err := a.Ledger.Seats(context.Background(), stalls, keys.ID{})
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
		if st := a.State(t, stalls); st.Sold+st.Held != int64(len(taken)) {
			t.Errorf("SKU counts %+v, %d seats taken", st, len(taken))
		}
		// The gate agrees with the ledger, unless a breaker opened on the
		// way (a busy machine's Redis timeout): carts then took seats in
		// the ledger alone, and the check repairs the gate.
		if _, differed := seatStates(t, a, stalls); differed != "" {
			if !a.RedisFaulted(t) && !b.RedisFaulted(t) {
				t.Errorf("gate differed from the ledger on %s", differed)
			} else {
				t.Logf("a breaker opened; the check repaired %s", differed)
			}
		}
		if _, differed := seatStates(t, a, stalls); differed != "" {
			t.Errorf("gate still differed from the ledger on %s after a check", differed)
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
	e, c := systest.FaultEnv(t, func(o *app.Options) { o.Sale.Breaker.OpenFor = 2 * time.Second })
	p := keys.MustID(testenv.ID(t, "seatdown"))
	stalls, parking := stock.SKU{Program: p, Ticket: keys.MustID("stalls")}, stock.SKU{Program: p, Ticket: keys.MustID("zparking")}
	e.PutSKU(t, stalls, 0, 1, 4)
	e.LoadSeats(t, stalls, map[string]int{"A": 8})
	e.PutSKU(t, parking, 5, 1, 4)
	for _, n := range c.Nodes {
		n.Kill()
	}
	systest.TripBreakers(t, e, c.Masters)
	if r, _ := seatCart(t, e, p, "cart-holds", "down-1",
		`{"buyer":"ann","lines":[{"ticket":"stalls","seats":["A-01","A-02"]},{"ticket":"zparking","quantity":1}]}`); r.Status != http.StatusCreated {
		t.Fatalf("held seat cart with Redis down = %d %s", r.Status, r.Body)
	}
	if r, got := seatCart(t, e, p, "carts", "down-2",
		`{"buyer":"bob","lines":[{"ticket":"stalls","seats":["A-02"]},{"ticket":"zparking","quantity":1}]}`); r.Status != http.StatusConflict ||
		fmt.Sprint(got.Seats) != "[A-02]" {
		t.Errorf("taken seat with Redis down = %d %s, want 409 naming A-02", r.Status, r.Body)
	}
	r, got := seatCart(t, e, p, "carts", "down-3", `{"buyer":"cat","lines":[{"ticket":"stalls","quantity":3}]}`)
	if r.Status != http.StatusCreated || fmt.Sprint(got.Orders[0].Seats) != "[A-03 A-04 A-05]" {
		t.Errorf("best seats with Redis down = %d %s, want A-03..A-05", r.Status, r.Body)
	}
	if st, _ := e.Ledger.SKU(context.Background(), stalls); st.Held != 2 || st.Sold != 3 {
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
	systest.WaitFor(t, 30*time.Second, "a seat check with Redis back", func() bool {
		r := e.Do(t, http.MethodPost, "/v1/admin/skus/"+p.String()+"/stalls/seats/check", nil, "")
		return r.Status == http.StatusOK
	})
	if got, differed := seatStates(t, e, stalls); got != "hhsssfff" || differed != "" {
		t.Errorf("seats %s, gate differed on %q; want hhsssfff and none", got, differed)
	}
}

// Regressions from an attack on seat lines in carts.
func TestCartSeatsAttacks(t *testing.T) {
	t.Run("a seat check reads a section of more than 1000 seats", func(t *testing.T) {
		e := systest.New(t, ledger.SQLite)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 0, 1, 1000)
		e.LoadSeats(t, sku, map[string]int{"S": 1200})
		r := e.Do(t, http.MethodPost, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/seats/check", nil, "")
		if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"checked":1200`) {
			t.Errorf("seat check of a 1200-seat section = %d %s", r.Status, r.Body)
		}
	})
	t.Run("a seated ticket sells no counted units", func(t *testing.T) {
		systest.EachDriver(t, func(t *testing.T, driver string) {
			a, b := systest.Pair(t, driver)
			p := keys.MustID(testenv.ID(t, "vip"))
			vip, sold := stock.SKU{Program: p, Ticket: keys.MustID("vip")}, stock.SKU{Program: p, Ticket: keys.MustID("sold")}
			// A ticket that sold counted units cannot take a seat map.
			a.PutSKU(t, sold, 4, 1, 4)
			if r, _ := seatCart(t, a, p, "carts", "s-1", `{"buyer":"u0","lines":[{"ticket":"sold","quantity":1}]}`); r.Status != http.StatusCreated {
				t.Fatalf("counted cart = %d %s", r.Status, r.Body)
			}
			r := a.Do(t, http.MethodPut, "/v1/admin/skus/"+p.String()+"/sold/seats", nil,
				`{"seats":[{"id":"V-1","section":"V","row":"A","number":1},{"id":"V-2","section":"V","row":"A","number":2}]}`)
			if r.Status != http.StatusConflict || !strings.Contains(string(r.Body), "seat-map-refused") {
				t.Errorf("seat map on a ticket with a counted sale = %d %s, want 409 seat-map-refused", r.Status, r.Body)
			}
			// A replica whose settings predate the map cannot sell counted
			// units of it: the ledger refuses them.
			b.PutSKU(t, vip, 4, 1, 4)
			if r := b.Do(t, http.MethodGet, "/v1/skus/"+p.String()+"/vip/stock", nil, ""); r.Status != http.StatusOK {
				t.Fatalf("stock = %d %s", r.Status, r.Body)
			}
			if r, _ := seatCart(t, b, p, "carts", "warm", `{"buyer":"u1","lines":[{"ticket":"vip","quantity":5}]}`); r.Status < 400 {
				t.Fatalf("warm-up cart over the maximum = %d %s", r.Status, r.Body)
			}
			a.LoadSeats(t, vip, map[string]int{"V": 4})
			// Once b's settings are fresh (a second on), a quantity line of
			// the seated ticket is a best-available seat line: its seats
			// are sold, and the last cart below takes the others.
			free := map[string]bool{"V-01": true, "V-02": true, "V-03": true, "V-04": true}
			for i := range 3 {
				body := fmt.Sprintf(`{"buyer":"u%d","lines":[{"ticket":"vip","quantity":1}]}`, i)
				r, got := seatCart(t, b, p, "carts", fmt.Sprintf("c-%d", i), body)
				if r.Status == http.StatusCreated && len(got.Orders[0].Seats) == 0 {
					t.Fatalf("counted cart of a seated ticket on a stale replica = %d %s", r.Status, r.Body)
				}
				if r.Status == http.StatusCreated {
					for _, id := range got.Orders[0].Seats {
						delete(free, id)
					}
				}
				if r := b.Do(t, http.MethodPost, "/v1/skus/"+p.String()+"/vip/purchases", map[string]string{"Idempotency-Key": fmt.Sprintf("p-%d", i)},
					fmt.Sprintf(`{"buyer":"u%d","quantity":1}`, i)); r.Status == http.StatusCreated {
					t.Fatalf("counted purchase of a seated ticket on a stale replica = %d %s", r.Status, r.Body)
				}
			}
			// Every other seat can still be had.
			rest := slices.Sorted(maps.Keys(free))
			last, _ := json.Marshal(map[string]any{"buyer": "u9", "lines": []map[string]any{{"ticket": "vip", "seats": rest}}})
			if r, _ := seatCart(t, a, p, "carts", "all", string(last)); r.Status != http.StatusCreated {
				t.Errorf("the seats left %v = %d %s", rest, r.Status, r.Body)
			}
			if st := a.State(t, vip); st.Sold != 4 {
				t.Errorf("vip %+v, want the 4 seats sold and nothing else", st)
			}
		})
	})
	t.Run("seat order is not part of the request", func(t *testing.T) {
		e := systest.New(t, ledger.SQLite)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 0, 1, 4)
		e.LoadSeats(t, sku, map[string]int{"A": 4})
		path := "carts"
		r1, c1 := seatCart(t, e, sku.Program, path, "ord", fmt.Sprintf(`{"buyer":"u","lines":[{"ticket":%q,"seats":["A-02","A-01"]}]}`, sku.Ticket))
		r2, c2 := seatCart(t, e, sku.Program, path, "ord", fmt.Sprintf(`{"buyer":"u","lines":[{"ticket":%q,"seats":["A-01","A-02"]}]}`, sku.Ticket))
		if r1.Status != http.StatusCreated || r2.Status != http.StatusCreated || c1.CartID != c2.CartID || r2.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("the same seats in another order = %d %s / %d %s, want the replay", r1.Status, r1.Body, r2.Status, r2.Body)
		}
	})
	t.Run("a retry refused after a stall gives back what the stalled attempt took", func(t *testing.T) {
		c := testenv.NewCluster(t, testenv.ClusterOptions{})
		e := systest.Start(t, systest.Options{Driver: ledger.SQLite, Cluster: c, Tune: func(o *app.Options) {
			o.Sale.Breaker = breaker.Options{ConsecutiveFailures: 1000, MinRequests: 1000}
			o.Sale.RedisTimeout = 200 * time.Millisecond
		}})
		p := keys.MustID(testenv.ID(t, "stall"))
		parking, stalls := stock.SKU{Program: p, Ticket: keys.MustID("parking")}, stock.SKU{Program: p, Ticket: keys.MustID("stalls")}
		e.PutSKU(t, parking, 5, 1, 4)
		e.PutSKU(t, stalls, 0, 1, 4)
		e.LoadSeats(t, stalls, map[string]int{"A": 4})
		// A cart first, so the gateway's connections to every node the
		// cart's calls go to exist: the stalled call is then written at
		// once and runs when Redis resumes.
		if r, _ := seatCart(t, e, p, "carts", "warm", `{"buyer":"zed","lines":[{"ticket":"parking","quantity":1},{"ticket":"stalls","seats":["A-04"]}]}`); r.Status != http.StatusCreated {
			t.Fatalf("warm-up cart = %d %s", r.Status, r.Body)
		}
		body := `{"buyer":"ann","lines":[{"ticket":"parking","quantity":1},{"ticket":"stalls","seats":["A-01"]}]}`
		// Stall the master of parking's shard only: the deduction is
		// written to it and times out, and runs once it resumes. (When the
		// cart's lock lives on that master too, the deduction may find no
		// open connection and never be written: then stall a new cart.)
		ctx := context.Background()
		node, err := c.MasterOf(ctx, keys.Shard(parking.Program, parking.Ticket, 0, 1).Slot())
		if err != nil {
			t.Fatal(err)
		}
		// The deduction's outcome is unknown (sent, no answer): the ledger
		// decides, and the cart commits around the gate. The stalled
		// deduction runs once the master resumes; the gate rebuilt from
		// the ledger drops it, so it is never counted twice.
		if err := node.Pause(); err != nil {
			t.Fatal(err)
		}
		r, _ := seatCart(t, e, p, "carts", "stalled", body)
		if err := node.Resume(); err != nil {
			t.Fatal(err)
		}
		if r.Status != http.StatusCreated {
			t.Fatalf("the stalled cart = %d %s, want 201 (decided by the ledger)", r.Status, r.Body)
		}
		// Commands queued while it was stopped run before a PING sent
		// after it resumed is answered.
		cl := node.Client()
		err = cl.Ping(ctx).Err()
		cl.Close()
		if err != nil {
			t.Fatal(err)
		}
		// The stalled attempt's cart lock may have landed late: until it
		// lapses the retry is answered 503, to be sent again.
		var r2 systest.Reply
		systest.WaitFor(t, 30*time.Second, "the stalled cart's retry to be answered", func() bool {
			r2, _ = seatCart(t, e, p, "carts", "stalled", body)
			return r2.Status != http.StatusServiceUnavailable
		})
		if r2.Status != http.StatusCreated || r2.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("the stalled cart's retry = %d %s, want its replay", r2.Status, r2.Body)
		}
		if r, _ := e.SeatHold(t, stalls, "other", "bob", "A-01"); r.Status != http.StatusConflict {
			t.Errorf("a hold of the stalled cart's seat = %d %s, want 409", r.Status, r.Body)
		}
		// A purchase of parking rebuilds its gate (sold around it) first.
		systest.WaitFor(t, 30*time.Second, "parking's gate rebuilt from the ledger", func() bool {
			e.Buy(t, parking, fmt.Sprintf("after-%d", time.Now().UnixNano()), "cy", 1)
			st := e.State(t, parking)
			return st.RedisRemaining == 5-st.Sold
		})
		if st := e.State(t, parking); st.Sold < 2 || st.Orders != st.Sold {
			t.Errorf("parking after the stalled cart: %+v, want the warm-up's and the stalled cart's sold", st)
		}
	})
}

// A retry of a seated cart after the cart ended (its holds cancelled, its
// orders refunded, alone or whole) is a replay, and leaves no seat held in
// Redis: they are free in the ledger, so the next buyer of them gets them
// and a seat check finds nothing to repair. Given seats and best seats,
// held and bought carts, on both ledgers. A retry sent after the commit is
// answered from the ledger before its seats are touched; a copy that
// passed that check first is sale's TestSeatCopyAfterTheCommitGivesBackWhatItTook.
func TestAttackSeatCartRetryAfterEnd(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		for _, c := range []struct {
			name, route, line string
			end               func(t *testing.T, got seatCartReply) systest.Reply
		}{
			{"a held cart cancelled", "cart-holds", `{"ticket":"stalls","seats":["A-01","A-02"]}`,
				func(t *testing.T, got seatCartReply) systest.Reply {
					return e.Act(t, "/v1/carts/"+got.CartID+"/cancel", got.CartID+"-end", "ann")
				}},
			{"a held cart of best seats cancelled", "cart-holds", `{"ticket":"stalls","quantity":2}`,
				func(t *testing.T, got seatCartReply) systest.Reply {
					return e.Act(t, "/v1/carts/"+got.CartID+"/cancel", got.CartID+"-end", "ann")
				}},
			{"a bought cart refunded", "carts", `{"ticket":"stalls","seats":["A-01","A-02"]}`,
				func(t *testing.T, got seatCartReply) systest.Reply {
					return e.Act(t, "/v1/carts/"+got.CartID+"/refund", got.CartID+"-end", "ann")
				}},
			{"one order of a bought cart refunded", "carts", `{"ticket":"stalls","seats":["A-01","A-02"]}`,
				func(t *testing.T, got seatCartReply) systest.Reply {
					return e.Act(t, "/v1/orders/"+got.Orders[0].OrderID+"/refund", got.CartID+"-end", "ann")
				}},
			{"a held cart confirmed then refunded", "cart-holds", `{"ticket":"stalls","seats":["A-01","A-02"]}`,
				func(t *testing.T, got seatCartReply) systest.Reply {
					if r := e.Act(t, "/v1/carts/"+got.CartID+"/confirm", got.CartID+"-pay", "ann"); r.Status != http.StatusCreated {
						return r
					}
					return e.Act(t, "/v1/carts/"+got.CartID+"/refund", got.CartID+"-end", "ann")
				}},
		} {
			t.Run(c.name, func(t *testing.T) {
				p := keys.MustID(testenv.ID(t, "retry"))
				stalls, parking := stock.SKU{Program: p, Ticket: keys.MustID("stalls")}, stock.SKU{Program: p, Ticket: keys.MustID("zparking")}
				e.PutSKU(t, stalls, 0, 1, 4)
				e.LoadSeats(t, stalls, map[string]int{"A": 2})
				e.PutSKU(t, parking, 5, 1, 4)
				body := `{"buyer":"ann","lines":[{"ticket":"zparking","quantity":1},` + c.line + `]}`
				key := p.String() // keys are the buyer's, across programs
				r, got := seatCart(t, e, p, c.route, key, body)
				if r.Status != http.StatusCreated {
					t.Fatalf("cart = %d %s", r.Status, r.Body)
				}
				if r := c.end(t, got); r.Status >= 300 {
					t.Fatalf("ending the cart = %d %s", r.Status, r.Body)
				}
				// The client's late retry of its original cart.
				again, replay := seatCart(t, e, p, c.route, key, body)
				if again.Status != http.StatusCreated || replay.CartID != got.CartID || again.Header.Get("Idempotent-Replayed") != "true" {
					t.Errorf("retry = %d %s, want the replay of cart %s", again.Status, again.Body, got.CartID)
				}
				// Both seats are free in the ledger: another buyer has
				// them, and the gate agrees.
				if r, _ := seatCart(t, e, p, "carts", key+"-bob", `{"buyer":"bob","lines":[{"ticket":"stalls","seats":["A-01","A-02"]}]}`); r.Status != http.StatusCreated {
					t.Errorf("another buyer's cart of the freed seats = %d %s, want 201", r.Status, r.Body)
				}
				if states, differed := seatStates(t, e, stalls); states != "ss" || differed != "" {
					t.Errorf("seats %s, gate differed on %q; want both sold and none differing", states, differed)
				}
			})
		}
	})
}

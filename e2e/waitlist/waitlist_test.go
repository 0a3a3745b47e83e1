package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

type waitReply struct {
	State    string     `json:"state"`
	Position int64      `json:"position"`
	Quantity int64      `json:"quantity"`
	Offer    *holdReply `json:"offer"`
}

func waitPath(sku stock.SKU, buyer string) string {
	return "/v1/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/waitlist/" + buyer
}

func (e *env) join(t *testing.T, sku stock.SKU, buyer string, q int64) (reply, waitReply) {
	r := e.do(t, http.MethodPut, waitPath(sku, buyer), nil, fmt.Sprintf(`{"quantity":%d}`, q))
	var w waitReply
	_ = json.Unmarshal(r.body, &w)
	return r, w
}

func (e *env) entry(t *testing.T, sku stock.SKU, buyer string) waitReply {
	t.Helper()
	r := e.do(t, http.MethodGet, waitPath(sku, buyer), nil, "")
	if r.status != http.StatusOK {
		t.Fatalf("GET waitlist %s = %d %s", buyer, r.status, r.body)
	}
	var w waitReply
	if err := json.Unmarshal(r.body, &w); err != nil {
		t.Fatal(err)
	}
	return w
}

// offerEvents counts the program's waitlist offers made, by buyer, and
// refuses any offer made twice (one subject, or one entry, twice).
func offerEvents(t *testing.T, e *env, program keys.ID) (made, expired map[string]int) {
	t.Helper()
	made, expired = map[string]int{}, map[string]int{}
	seen := map[keys.ID]bool{}
	for after := int64(0); ; {
		page, err := e.ledger.Events(context.Background(), program, after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range page {
			after = ev.Seq
			switch ev.Type {
			case ledger.EventOfferMade:
				if seen[ev.Subject] {
					t.Errorf("offer %s made twice", ev.Subject)
				}
				seen[ev.Subject] = true
				made[ev.Buyer.String()]++
			case ledger.EventOfferExpired:
				expired[ev.Buyer.String()]++
			}
		}
		if len(page) < 1000 {
			return made, expired
		}
	}
}

// 500 holds expire at once with 200 buyers on the waitlist and 3 sweeping
// replicas: exactly 200 offers, one per waiting buyer, in the ledger
// transactions that took the holds back; the other 300 units back in
// Redis and sold to the public, the offered ones sold to no one else;
// then confirms, cancels passed on to buyers who joined later, and the
// rest back in Redis, ledger and Redis agreeing.
func TestWaitlistTakesExpiredHolds(t *testing.T) {
	t.Parallel() // its own replicas, ledgers and programs: it overlaps the other long tests
	eachDriver(t, func(t *testing.T, driver string) {
		dsn := ledgerDSN(t, driver)
		tune := func(o *app.Options) {
			o.Sale.SweepEvery = 50 * time.Millisecond
			o.Sale.OfferTTL = time.Hour
		}
		// The holds are placed and the line formed before any sweeper
		// runs, so that all 500 expire at once whatever the machine's pace.
		var envs []*env
		for range 3 {
			envs = append(envs, startEnv(t, envOptions{driver: driver, dsn: dsn, tune: tune}))
		}
		sku := newSKU(t)
		const total, waiters = 500, 200
		envs[0].putSKU(t, sku, total, 4, 4)
		counts := envs[0].buyAll(total, 32, func(i int) reply {
			r, _ := envs[i%3].hold(t, sku, fmt.Sprintf("h-%d", i), fmt.Sprintf("b%d", i), 1, 1)
			return r
		})
		if counts[http.StatusCreated] != total {
			t.Fatalf("holds: %v", counts)
		}
		if r, _ := envs[1].join(t, sku, "b0", 1); r.status != http.StatusCreated {
			t.Fatalf("a holder joins = %d %s", r.status, r.body)
		}
		if r := envs[1].do(t, http.MethodDelete, waitPath(sku, "b0"), nil, ""); r.status != http.StatusOK {
			t.Fatalf("leave = %d %s", r.status, r.body)
		}
		counts = envs[0].buyAll(waiters, 16, func(i int) reply {
			r, _ := envs[i%3].join(t, sku, fmt.Sprintf("w%d", i), 1)
			return r
		})
		if counts[http.StatusCreated] != waiters {
			t.Fatalf("joins: %v", counts)
		}
		var places []int64
		for i := range waiters {
			places = append(places, envs[i%3].entry(t, sku, fmt.Sprintf("w%d", i)).Position)
		}
		slices.Sort(places)
		for i, p := range places {
			if p != int64(i+1) {
				t.Fatalf("places in line %v, want 1..%d each once", places, waiters)
			}
		}
		// A join again is the same entry.
		if r, w := envs[2].join(t, sku, "w7", 3); r.status != http.StatusOK || w.Quantity != 1 {
			t.Fatalf("join again = %d %s", r.status, r.body)
		}
		ctx := context.Background()
		waitFor(t, 10*time.Second, "every hold due", func() bool {
			h, err := holdOf(ctx, envs[0].ledger, fmt.Sprintf("b%d", total-1), fmt.Sprintf("h-%d", total-1))
			return err == nil && time.Now().After(h.ExpiresAt)
		})
		for range 3 {
			envs = append(envs, startEnv(t, envOptions{driver: driver, dsn: dsn, sweep: true, tune: tune}))
		}
		waitFor(t, 30*time.Second, "every hold expired and restored", func() bool {
			st, _ := envs[0].ledger.SKU(ctx, sku)
			p, err := envs[0].ledger.PendingRestores(ctx, 0, 1)
			return st.Held == waiters && err == nil && len(p) == 0
		})
		made, _ := offerEvents(t, envs[0], sku.Program)
		if len(made) != waiters {
			t.Fatalf("%d buyers offered, want %d", len(made), waiters)
		}
		for i := range waiters {
			b := fmt.Sprintf("w%d", i)
			w := envs[i%3].entry(t, sku, b)
			if made[b] != 1 || w.State != "offered" || w.Offer == nil || w.Offer.State != ledger.Held {
				t.Fatalf("%s: %d offers, entry %+v", b, made[b], w)
			}
		}
		st := envs[0].state(t, sku)
		if st.Sold != 0 || st.Held != waiters || st.RedisRemaining != total-waiters {
			t.Fatalf("after the expiry: %+v, want 200 held for the line and 300 in Redis", st)
		}
		// The public buys the 300, and nothing more: the offered units
		// are no one else's.
		counts = envs[0].buyAll(total, 32, func(i int) reply {
			return envs[i%3].buy(t, sku, fmt.Sprintf("p-%d", i), fmt.Sprintf("p%d", i), 1)
		})
		if counts[http.StatusCreated] != total-waiters || counts[http.StatusConflict] != waiters {
			t.Fatalf("the public's purchases: %v, want 300 sold and 200 sold-out", counts)
		}

		// 20 more join; waiters 0-99 buy their offer, 100-149 decline it
		// (the first 20 declines go to the 20 who joined, in their order),
		// 150-199 keep theirs.
		for i := range 20 {
			if r, _ := envs[i%3].join(t, sku, fmt.Sprintf("late%d", i), 1); r.status != http.StatusCreated {
				t.Fatalf("late join = %d %s", r.status, r.body)
			}
		}
		for i := range 150 {
			b := fmt.Sprintf("w%d", i)
			w := envs[0].entry(t, sku, b)
			path, want := "/v1/holds/"+w.Offer.HoldID+"/confirm", http.StatusCreated
			if i >= 100 {
				path, want = "/v1/holds/"+w.Offer.HoldID+"/cancel", http.StatusOK
			}
			if r := envs[i%3].act(t, path, "act-"+b, b); r.status != want {
				t.Fatalf("%s %s = %d %s", b, path, r.status, r.body)
			}
		}
		for i := range 20 {
			if w := envs[1].entry(t, sku, fmt.Sprintf("late%d", i)); w.State != "offered" {
				t.Fatalf("late%d: %+v", i, w)
			}
		}
		if w := envs[1].entry(t, sku, "w120"); w.State != "declined" {
			t.Fatalf("w120: %+v", w)
		}
		if w := envs[1].entry(t, sku, "w12"); w.State != "bought" {
			t.Fatalf("w12: %+v", w)
		}
		made, _ = offerEvents(t, envs[0], sku.Program)
		if len(made) != waiters+20 {
			t.Errorf("%d buyers offered, want %d", len(made), waiters+20)
		}
		waitFor(t, 10*time.Second, "the declines' restores", func() bool {
			p, err := envs[0].ledger.PendingRestores(ctx, 0, 1)
			return err == nil && len(p) == 0
		})
		st = envs[0].state(t, sku)
		if st.Sold != 400 || st.Held != 70 || st.RedisRemaining != 30 {
			t.Errorf("at the end: %+v, want 400 sold, 70 held (50 + 20 offers), 30 in Redis", st)
		}
		redisConsistent(t, envs[0], sku)
	})
}

// Offers that expire pass on down the line, skipping a buyer at the cap,
// and with Redis down the ledger still makes and ends them; once Redis is
// back, it and the ledger agree.
func TestWaitlistOffersExpireAndPassOn(t *testing.T) {
	e, c := faultEnv(t, func(o *app.Options) {
		o.Sale.SweepEvery = 50 * time.Millisecond
		o.Sale.OfferTTL = time.Second
		o.Sale.Breaker.OpenFor = 300 * time.Millisecond
	})
	sku := newSKU(t)
	if r := e.do(t, http.MethodPut, adminPath(sku), nil, `{"total":5,"shards":2,"max_per_order":2,"per_buyer":1}`); r.status != http.StatusOK {
		t.Fatalf("PUT = %d %s", r.status, r.body)
	}
	ctx := context.Background()
	for i := range 4 {
		if r, _ := e.hold(t, sku, fmt.Sprintf("h-%d", i), fmt.Sprintf("b%d", i), 1, 1); r.status != http.StatusCreated {
			t.Fatalf("hold = %d %s", r.status, r.body)
		}
	}
	// b4 bought one: at the cap, he waits in vain.
	e.mustBuy(t, sku, "o-b4", "b4", 1)
	for _, b := range []string{"b4", "w0", "w1", "w2", "w3", "w4", "w5", "w6"} {
		if r, _ := e.join(t, sku, b, 1); r.status != http.StatusCreated {
			t.Fatalf("join %s = %d %s", b, r.status, r.body)
		}
	}
	if r, _ := e.join(t, sku, "w9", 2); r.status != http.StatusConflict {
		t.Fatalf("join over the cap = %d %s", r.status, r.body)
	}
	for _, n := range c.Nodes {
		n.Kill()
	}
	// The 4 holds expire: b4 is skipped, w0..w3 get them; those expire
	// and w4..w6 get 3, 1 goes back; then those expire.
	waitFor(t, 20*time.Second, "every offer made and lapsed", func() bool {
		made, expired := offerEvents(t, e, sku.Program)
		st, _ := e.ledger.SKU(ctx, sku)
		return len(made) == 7 && len(expired) == 7 && st.Held == 0
	})
	made, _ := offerEvents(t, e, sku.Program)
	if made["b4"] != 0 {
		t.Errorf("b4 at the cap got an offer")
	}
	if w := e.entry(t, sku, "b4"); w.State != "waiting" || w.Position != 1 {
		t.Errorf("b4: %+v, want still waiting, first", w)
	}
	if w := e.entry(t, sku, "w6"); w.State != "lapsed" {
		t.Errorf("w6: %+v", w)
	}
	for _, n := range c.Nodes {
		if err := n.Restart(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitHealthy(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "pending restores to finish", func() bool {
		p, err := e.ledger.PendingRestores(ctx, 0, 1)
		return err == nil && len(p) == 0
	})
	// A purchase through Redis (it rebuilds the gate if it must).
	waitFor(t, 15*time.Second, "a purchase", func() bool {
		return e.buy(t, sku, fmt.Sprintf("after-%d", time.Now().UnixNano()), fmt.Sprintf("x%d", time.Now().UnixNano()), 1).status == http.StatusCreated
	})
	redisConsistent(t, e, sku)
}

// Hostile and mistaken waitlist requests get a clear problem and put no
// one in line.
func TestWaitlistBadInput(t *testing.T) {
	e := newEnv(t, ledger.SQLite)
	sku := newSKU(t)
	e.putSKU(t, sku, 3, 1, 2)
	if r := e.do(t, http.MethodPut, adminPath(sku)+"/pools/fans", nil, `{"allotment":1,"shards":1,"access":"code"}`); r.status != http.StatusOK {
		t.Fatalf("PUT pool = %d %s", r.status, r.body)
	}
	seated := stock.SKU{Program: sku.Program, Ticket: keys.MustID("seated")}
	e.putSKU(t, seated, 2, 1, 2)
	e.loadSeats(t, seated, map[string]int{"A": 2})
	base := waitPath(sku, "ann")
	for _, c := range []struct {
		method, path, body string
		status             int
		kind               string
	}{
		{http.MethodPut, base, `{"quantity":1}`, 409, "not-sold-out"},
		{http.MethodPut, waitPath(sku, "bad$id"), `{}`, 400, "invalid-id"},
		{http.MethodPut, base, `{"quantity":0}`, 422, "invalid-field"},
		{http.MethodPut, base, `{"quantity":-3}`, 422, "invalid-field"},
		{http.MethodPut, base, `{"quantity":"2"}`, 422, "invalid-field"},
		{http.MethodPut, base, `{"quantity":1,"quantity":2}`, 400, "malformed-json"},
		{http.MethodPut, base, `{"qty":1}`, 400, "malformed-json"},
		{http.MethodPut, base, `[1]`, 400, "malformed-json"},
		{http.MethodPut, base, `{"quantity":99999999999999999999}`, 422, "invalid-field"},
		{http.MethodPut, base + "?pool=nope", `{}`, 404, "unknown-pool"},
		{http.MethodPut, base + "?pool=b@d", `{}`, 400, "invalid-id"},
		{http.MethodPut, base + "?pool=fans", `{}`, 403, "pool-access-denied"},
		{http.MethodPut, waitPath(stock.SKU{Program: sku.Program, Ticket: keys.MustID("none")}, "ann"), `{}`, 404, "unknown-sku"},
		{http.MethodPut, waitPath(seated, "ann"), `{}`, 409, "seated"},
		{http.MethodGet, base, "", 404, "not-on-waitlist"},
		{http.MethodDelete, base, "", 404, "not-on-waitlist"},
	} {
		r := e.do(t, c.method, c.path, nil, c.body)
		if r.status != c.status || problemKind(r) != c.kind {
			t.Errorf("%s %s %s = %d %s, want %d %s", c.method, c.path, c.body, r.status, r.body, c.status, c.kind)
		}
	}
	// Sold out: over the per-order maximum is refused; no body joins for 1.
	e.mustBuy(t, sku, "k1", "zed", 2)
	if r, _ := e.join(t, sku, "ann", 3); r.status != 422 || problemKind(r) != "quantity-over-limit" {
		t.Errorf("join over the max = %d %s", r.status, r.body)
	}
	if n, _ := e.ledger.WaitlistLength(context.Background(), sku); n != 0 {
		t.Fatalf("%d in line after refusals, want 0", n)
	}
	if r := e.do(t, http.MethodPut, base, nil, ""); r.status != http.StatusCreated {
		t.Fatalf("join without a body = %d %s", r.status, r.body)
	}
	if w := e.entry(t, sku, "ann"); w.State != "waiting" || w.Position != 1 || w.Quantity != 1 {
		t.Fatalf("entry %+v", w)
	}
	// The sale ends: the entry stays, closed (no offer will come), and no
	// one joins.
	if r := e.do(t, http.MethodPost, adminPath(sku)+"/end", nil, ""); r.status != http.StatusOK {
		t.Fatalf("end = %d %s", r.status, r.body)
	}
	if w := e.entry(t, sku, "ann"); w.State != "closed" {
		t.Fatalf("entry after the end: %+v", w)
	}
	if r, _ := e.join(t, sku, "bob", 1); r.status != http.StatusConflict || problemKind(r) != "sale-ended" {
		t.Fatalf("join after the end = %d %s", r.status, r.body)
	}
}

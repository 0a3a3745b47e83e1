package waitlist_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// offerEvents counts the program's waitlist offers made, by buyer, and
// refuses any offer made twice (one subject, or one entry, twice).
func offerEvents(t *testing.T, e *systest.Env, program keys.ID) (made, expired map[string]int) {
	t.Helper()
	made, expired = map[string]int{}, map[string]int{}
	seen := map[keys.ID]bool{}
	for after := int64(0); ; {
		page, err := e.Ledger.Events(context.Background(), program, after, 1000)
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
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		tune := func(o *app.Options) {
			o.Sale.SweepEvery = 50 * time.Millisecond
			o.Sale.OfferTTL = time.Hour
		}
		// The holds are placed and the line formed before any sweeper
		// runs, so that all 500 expire at once whatever the machine's pace.
		var envs []*systest.Env
		for range 3 {
			envs = append(envs, systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: tune}))
		}
		sku := systest.NewSKU(t)
		const total, waiters = 500, 200
		envs[0].PutSKU(t, sku, total, 4, 4)
		counts := systest.BuyAll(total, 32, func(i int) systest.Reply {
			r, _ := envs[i%3].Hold(t, sku, fmt.Sprintf("h-%d", i), fmt.Sprintf("b%d", i), 1, 1)
			return r
		})
		if counts[http.StatusCreated] != total {
			t.Fatalf("holds: %v", counts)
		}
		if r, _ := envs[1].Join(t, sku, "b0", 1); r.Status != http.StatusCreated {
			t.Fatalf("a holder joins = %d %s", r.Status, r.Body)
		}
		if r := envs[1].Do(t, http.MethodDelete, systest.WaitPath(sku, "b0"), nil, ""); r.Status != http.StatusOK {
			t.Fatalf("leave = %d %s", r.Status, r.Body)
		}
		counts = systest.BuyAll(waiters, 16, func(i int) systest.Reply {
			r, _ := envs[i%3].Join(t, sku, fmt.Sprintf("w%d", i), 1)
			return r
		})
		if counts[http.StatusCreated] != waiters {
			t.Fatalf("joins: %v", counts)
		}
		var places []int64
		for i := range waiters {
			places = append(places, envs[i%3].Entry(t, sku, fmt.Sprintf("w%d", i)).Position)
		}
		slices.Sort(places)
		for i, p := range places {
			if p != int64(i+1) {
				t.Fatalf("places in line %v, want 1..%d each once", places, waiters)
			}
		}
		// A join again is the same entry.
		if r, w := envs[2].Join(t, sku, "w7", 3); r.Status != http.StatusOK || w.Quantity != 1 {
			t.Fatalf("join again = %d %s", r.Status, r.Body)
		}
		ctx := context.Background()
		systest.WaitFor(t, 10*time.Second, "every hold due", func() bool {
			h, err := systest.HoldOf(ctx, envs[0].Ledger, fmt.Sprintf("b%d", total-1), fmt.Sprintf("h-%d", total-1))
			return err == nil && time.Now().After(h.ExpiresAt)
		})
		for range 3 {
			envs = append(envs, systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: tune}))
		}
		systest.WaitFor(t, 30*time.Second, "every hold expired and restored", func() bool {
			st, _ := envs[0].Ledger.SKU(ctx, sku)
			p, err := envs[0].Ledger.PendingRestores(ctx, 0, 1)
			return st.Held == waiters && err == nil && len(p) == 0
		})
		made, _ := offerEvents(t, envs[0], sku.Program)
		if len(made) != waiters {
			t.Fatalf("%d buyers offered, want %d", len(made), waiters)
		}
		for i := range waiters {
			b := fmt.Sprintf("w%d", i)
			w := envs[i%3].Entry(t, sku, b)
			if made[b] != 1 || w.State != "offered" || w.Offer == nil || w.Offer.State != ledger.Held {
				t.Fatalf("%s: %d offers, entry %+v", b, made[b], w)
			}
		}
		st := envs[0].State(t, sku)
		if st.Sold != 0 || st.Held != waiters || st.RedisRemaining != total-waiters {
			t.Fatalf("after the expiry: %+v, want 200 held for the line and 300 in Redis", st)
		}
		// The public buys the 300, and nothing more: the offered units
		// are no one else's.
		counts = systest.BuyAll(total, 32, func(i int) systest.Reply {
			return envs[i%3].Buy(t, sku, fmt.Sprintf("p-%d", i), fmt.Sprintf("p%d", i), 1)
		})
		if counts[http.StatusCreated] != total-waiters || counts[http.StatusConflict] != waiters {
			t.Fatalf("the public's purchases: %v, want 300 sold and 200 sold-out", counts)
		}

		// 20 more join; waiters 0-99 buy their offer, 100-149 decline it
		// (the first 20 declines go to the 20 who joined, in their order),
		// 150-199 keep theirs.
		for i := range 20 {
			if r, _ := envs[i%3].Join(t, sku, fmt.Sprintf("late%d", i), 1); r.Status != http.StatusCreated {
				t.Fatalf("late join = %d %s", r.Status, r.Body)
			}
		}
		for i := range 150 {
			b := fmt.Sprintf("w%d", i)
			w := envs[0].Entry(t, sku, b)
			path, want := "/v1/holds/"+w.Offer.HoldID+"/confirm", http.StatusCreated
			if i >= 100 {
				path, want = "/v1/holds/"+w.Offer.HoldID+"/cancel", http.StatusOK
			}
			if r := envs[i%3].Act(t, path, "act-"+b, b); r.Status != want {
				t.Fatalf("%s %s = %d %s", b, path, r.Status, r.Body)
			}
		}
		for i := range 20 {
			if w := envs[1].Entry(t, sku, fmt.Sprintf("late%d", i)); w.State != "offered" {
				t.Fatalf("late%d: %+v", i, w)
			}
		}
		if w := envs[1].Entry(t, sku, "w120"); w.State != "declined" {
			t.Fatalf("w120: %+v", w)
		}
		if w := envs[1].Entry(t, sku, "w12"); w.State != "bought" {
			t.Fatalf("w12: %+v", w)
		}
		made, _ = offerEvents(t, envs[0], sku.Program)
		if len(made) != waiters+20 {
			t.Errorf("%d buyers offered, want %d", len(made), waiters+20)
		}
		systest.WaitFor(t, 10*time.Second, "the declines' restores", func() bool {
			p, err := envs[0].Ledger.PendingRestores(ctx, 0, 1)
			return err == nil && len(p) == 0
		})
		st = envs[0].State(t, sku)
		if st.Sold != 400 || st.Held != 70 || st.RedisRemaining != 30 {
			t.Errorf("at the end: %+v, want 400 sold, 70 held (50 + 20 offers), 30 in Redis", st)
		}
		systest.RedisConsistent(t, envs[0], sku)
	})
}

// Offers that expire pass on down the line, skipping a buyer at the cap,
// and with Redis down the ledger still makes and ends them; once Redis is
// back, it and the ledger agree.
func TestWaitlistOffersExpireAndPassOn(t *testing.T) {
	e, c := systest.FaultEnv(t, func(o *app.Options) {
		o.Sale.SweepEvery = 50 * time.Millisecond
		o.Sale.OfferTTL = time.Second
		o.Sale.Breaker.OpenFor = 300 * time.Millisecond
	})
	sku := systest.NewSKU(t)
	if r := e.Do(t, http.MethodPut, systest.AdminPath(sku), nil, `{"total":5,"shards":2,"max_per_order":2,"per_buyer":1}`); r.Status != http.StatusOK {
		t.Fatalf("PUT = %d %s", r.Status, r.Body)
	}
	ctx := context.Background()
	for i := range 4 {
		if r, _ := e.Hold(t, sku, fmt.Sprintf("h-%d", i), fmt.Sprintf("b%d", i), 1, 1); r.Status != http.StatusCreated {
			t.Fatalf("hold = %d %s", r.Status, r.Body)
		}
	}
	// b4 bought one: at the cap, he waits in vain.
	e.MustBuy(t, sku, "o-b4", "b4", 1)
	for _, b := range []string{"b4", "w0", "w1", "w2", "w3", "w4", "w5", "w6"} {
		if r, _ := e.Join(t, sku, b, 1); r.Status != http.StatusCreated {
			t.Fatalf("join %s = %d %s", b, r.Status, r.Body)
		}
	}
	if r, _ := e.Join(t, sku, "w9", 2); r.Status != http.StatusConflict {
		t.Fatalf("join over the cap = %d %s", r.Status, r.Body)
	}
	for _, n := range c.Nodes {
		n.Kill()
	}
	// The 4 holds expire: b4 is skipped, w0..w3 get them; those expire
	// and w4..w6 get 3, 1 goes back; then those expire.
	systest.WaitFor(t, 20*time.Second, "every offer made and lapsed", func() bool {
		made, expired := offerEvents(t, e, sku.Program)
		st, _ := e.Ledger.SKU(ctx, sku)
		return len(made) == 7 && len(expired) == 7 && st.Held == 0
	})
	made, _ := offerEvents(t, e, sku.Program)
	if made["b4"] != 0 {
		t.Errorf("b4 at the cap got an offer")
	}
	if w := e.Entry(t, sku, "b4"); w.State != "waiting" || w.Position != 1 {
		t.Errorf("b4: %+v, want still waiting, first", w)
	}
	if w := e.Entry(t, sku, "w6"); w.State != "lapsed" {
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
	systest.WaitFor(t, 15*time.Second, "pending restores to finish", func() bool {
		p, err := e.Ledger.PendingRestores(ctx, 0, 1)
		return err == nil && len(p) == 0
	})
	// A purchase through Redis (it rebuilds the gate if it must).
	systest.WaitFor(t, 15*time.Second, "a purchase", func() bool {
		return e.Buy(t, sku, fmt.Sprintf("after-%d", time.Now().UnixNano()), fmt.Sprintf("x%d", time.Now().UnixNano()), 1).Status == http.StatusCreated
	})
	systest.RedisConsistent(t, e, sku)
}

// Hostile and mistaken waitlist requests get a clear problem and put no
// one in line.
func TestWaitlistBadInput(t *testing.T) {
	e := systest.New(t, ledger.SQLite)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 3, 1, 2)
	if r := e.Do(t, http.MethodPut, systest.AdminPath(sku)+"/pools/fans", nil, `{"allotment":1,"shards":1,"access":"code"}`); r.Status != http.StatusOK {
		t.Fatalf("PUT pool = %d %s", r.Status, r.Body)
	}
	seated := stock.SKU{Program: sku.Program, Ticket: keys.MustID("seated")}
	e.PutSKU(t, seated, 2, 1, 2)
	e.LoadSeats(t, seated, map[string]int{"A": 2})
	base := systest.WaitPath(sku, "ann")
	for _, c := range []struct {
		method, path, body string
		status             int
		kind               string
	}{
		{http.MethodPut, base, `{"quantity":1}`, 409, "not-sold-out"},
		{http.MethodPut, systest.WaitPath(sku, "bad$id"), `{}`, 400, "invalid-id"},
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
		{http.MethodPut, systest.WaitPath(stock.SKU{Program: sku.Program, Ticket: keys.MustID("none")}, "ann"), `{}`, 404, "unknown-sku"},
		{http.MethodPut, systest.WaitPath(seated, "ann"), `{}`, 409, "seated"},
		{http.MethodGet, base, "", 404, "not-on-waitlist"},
		{http.MethodDelete, base, "", 404, "not-on-waitlist"},
	} {
		r := e.Do(t, c.method, c.path, nil, c.body)
		if r.Status != c.status || systest.ProblemKind(r) != c.kind {
			t.Errorf("%s %s %s = %d %s, want %d %s", c.method, c.path, c.body, r.Status, r.Body, c.status, c.kind)
		}
	}
	// Sold out: over the per-order maximum is refused; no body joins for 1.
	e.MustBuy(t, sku, "k1", "zed", 2)
	if r, _ := e.Join(t, sku, "ann", 3); r.Status != 422 || systest.ProblemKind(r) != "quantity-over-limit" {
		t.Errorf("join over the max = %d %s", r.Status, r.Body)
	}
	if n, _ := e.Ledger.WaitlistLength(context.Background(), sku); n != 0 {
		t.Fatalf("%d in line after refusals, want 0", n)
	}
	if r := e.Do(t, http.MethodPut, base, nil, ""); r.Status != http.StatusCreated {
		t.Fatalf("join without a body = %d %s", r.Status, r.Body)
	}
	if w := e.Entry(t, sku, "ann"); w.State != "waiting" || w.Position != 1 || w.Quantity != 1 {
		t.Fatalf("entry %+v", w)
	}
	// An empty body sent chunked (no Content-Length) is no body too: it
	// was read as malformed JSON (helper-69).
	if status := chunkedEmptyPut(t, e, systest.WaitPath(sku, "cy")); status != "201" {
		t.Errorf("join with an empty chunked body = %s, want 201", status)
	}
	// The sale ends: the entry stays, closed (no offer will come), and no
	// one joins.
	if r := e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/end", nil, ""); r.Status != http.StatusOK {
		t.Fatalf("end = %d %s", r.Status, r.Body)
	}
	if w := e.Entry(t, sku, "ann"); w.State != "closed" {
		t.Fatalf("entry after the end: %+v", w)
	}
	if r, _ := e.Join(t, sku, "bob", 1); r.Status != http.StatusConflict || systest.ProblemKind(r) != "sale-ended" {
		t.Fatalf("join after the end = %d %s", r.Status, r.Body)
	}
}

// chunkedEmptyPut sends PUT path with an empty chunked body on a
// connection of its own (Go's client sends an empty body as
// Content-Length: 0) and returns the answer's status code.
func chunkedEmptyPut(t *testing.T, e *systest.Env, path string) string {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "PUT "+path+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(line)
	if len(fields) < 2 {
		t.Fatalf("answer %q", line)
	}
	return fields[1]
}

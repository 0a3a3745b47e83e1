package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
	"github.com/stockgate/stockgate/waitroom"
)

// putQueue turns program's waiting room on with body, or fails the test.
func (e *env) putQueue(t *testing.T, program keys.ID, body string) {
	t.Helper()
	if r := e.do(t, http.MethodPut, "/v1/admin/programs/"+program.String()+"/queue", nil, body); r.status != http.StatusOK {
		t.Fatalf("PUT queue = %d %s", r.status, r.body)
	}
}

// admitted joins buyer to program's line and waits until it is admitted;
// it returns the buyer's last check.
func (e *env) admitted(t *testing.T, program keys.ID, buyer string) queueReply {
	t.Helper()
	r, q := e.queueJoin(t, program, buyer)
	if r.status != http.StatusCreated && r.status != http.StatusOK {
		t.Fatalf("join %s = %d %s", buyer, r.status, r.body)
	}
	return e.untilAdmitted(t, program, q.Ticket, buyer+" admitted", 20*time.Second)
}

// untilAdmitted checks ticket's place until it is admitted (what, within)
// and returns that check.
func (e *env) untilAdmitted(t *testing.T, program keys.ID, ticket, what string, within time.Duration) queueReply {
	t.Helper()
	var q queueReply
	waitFor(t, within, what, func() bool {
		_, q = e.queueCheck(t, program, ticket)
		return q.State == "admitted"
	})
	return q
}

func (e *env) buyWith(t *testing.T, sku stock.SKU, key, buyer string, q int64, token string) reply {
	return e.do(t, http.MethodPost, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/purchases",
		map[string]string{"Idempotency-Key": key, "Admission-Token": token}, fmt.Sprintf(`{"buyer":%q,"quantity":%d}`, buyer, q))
}

// An admission is spent by the request that bought with it, not by one
// that was refused having moved nothing: a buyer admitted once may ask
// for too many, find one tier sold out, send a wrong pool code, and still
// buy another tier with the same admission; then it is spent, for every
// other request, on every replica, while the buying request's retry is
// answered its order.
func TestQueueAdmissionOutlivesRefusals(t *testing.T) {
	t.Parallel() // its own env and programs: it overlaps the others' waits
	eachDriver(t, func(t *testing.T, driver string) {
		dsn := ledgerDSN(t, driver)
		a := startEnv(t, envOptions{driver: driver, dsn: dsn, pacer: true})
		b := startEnv(t, envOptions{driver: driver, dsn: dsn})
		scarce := newSKU(t)
		plenty := stock.SKU{Program: scarce.Program, Ticket: keys.MustID("vip")}
		a.putSKU(t, scarce, 1, 1, 2)
		a.putSKU(t, plenty, 10, 2, 2)
		a.putQueue(t, scarce.Program, `{"opens_in_seconds":0,"rate_per_second":100,"window_seconds":60,"per_remaining":10}`)
		first := a.admitted(t, scarce.Program, "first")
		if r := a.buyWith(t, scarce, "first-1", "first", 1, first.Admission); r.status != http.StatusCreated {
			t.Fatalf("the scarce ticket = %d %s", r.status, r.body)
		}
		ann := b.admitted(t, scarce.Program, "ann")
		for _, c := range []struct {
			sku    stock.SKU
			key    string
			q      int64
			status int
			kind   string
		}{
			{plenty, "ann-too-many", 3, http.StatusUnprocessableEntity, "quantity-over-limit"},
			{scarce, "ann-scarce", 1, http.StatusConflict, "sold-out"},
		} {
			e := []*env{a, b}[len(c.key)%2]
			if r := e.buyWith(t, c.sku, c.key, "ann", c.q, ann.Admission); r.status != c.status || problemKind(r) != c.kind {
				t.Fatalf("%s = %d %s, want %d %s", c.key, r.status, r.body, c.status, c.kind)
			}
		}
		if r := a.do(t, http.MethodPost, "/v1/skus/"+plenty.Program.String()+"/"+plenty.Ticket.String()+"/purchases?pool=nosuch",
			map[string]string{"Idempotency-Key": "ann-pool", "Admission-Token": ann.Admission}, `{"buyer":"ann","quantity":1}`); r.status < 400 || r.status >= 500 {
			t.Fatalf("a purchase from no such pool = %d %s", r.status, r.body)
		}
		if r := b.buyWith(t, plenty, "ann-ok", "ann", 2, ann.Admission); r.status != http.StatusCreated {
			t.Fatalf("after three refusals, a purchase = %d %s", r.status, r.body)
		}
		for i, e := range []*env{a, b} {
			if r := e.buyWith(t, plenty, fmt.Sprintf("ann-again-%d", i), "ann", 1, ann.Admission); r.status != http.StatusConflict || problemKind(r) != "admission-used" {
				t.Fatalf("a second order on one admission = %d %s", r.status, r.body)
			}
			if r := e.buyWith(t, plenty, "ann-ok", "ann", 2, ann.Admission); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("the retry of the order = %d %s", r.status, r.body)
			}
		}
		// Another buyer's admission is not ann's.
		if r := a.buyWith(t, plenty, "ann-other", "ann", 1, first.Admission); r.status != http.StatusForbidden || problemKind(r) != "admission-invalid" {
			t.Fatalf("another buyer's admission = %d %s", r.status, r.body)
		}
		if st := a.state(t, plenty); st.Sold != 2 {
			t.Fatalf("vip sold %d, want 2", st.Sold)
		}
		if st := a.state(t, scarce); st.Sold != 1 {
			t.Fatalf("ga sold %d, want 1", st.Sold)
		}
	})
}

// When the last ticket sells, every waiting buyer is told sold-out by every
// replica within one refresh of the sale's answer (a replica's memory of a
// line is never older than waitroom.Refresh, and it reads the ledger, so
// it needs no pacer to know: the one that admitted the buyers is gone by
// the last sale), and nobody is admitted after it.
func TestQueueSoldOutToldWithinARefresh(t *testing.T) {
	t.Parallel() // its own env and programs: it overlaps the others' waits
	eachDriver(t, func(t *testing.T, driver string) {
		dsn := ledgerDSN(t, driver)
		pacer := startEnv(t, envOptions{driver: driver, dsn: dsn, pacer: true})
		a := startEnv(t, envOptions{driver: driver, dsn: dsn})
		b := startEnv(t, envOptions{driver: driver, dsn: dsn})
		sku := newSKU(t)
		const total, buyers = 3, 40
		a.putSKU(t, sku, total, 1, 1)
		a.putQueue(t, sku.Program, `{"opens_in_seconds":0,"rate_per_second":1000,"window_seconds":60,"per_remaining":1}`)
		tickets := make([]string, buyers)
		for i := range buyers {
			r, q := []*env{a, b}[i%2].queueJoin(t, sku.Program, fmt.Sprintf("u%d", i))
			if r.status != http.StatusCreated {
				t.Fatalf("join %d = %d %s", i, r.status, r.body)
			}
			tickets[i] = q.Ticket
		}
		// The first three places are admitted, one per ticket left.
		var admitted []queueReply
		for i := range total {
			q := a.admitted(t, sku.Program, fmt.Sprintf("u%d", i))
			if q.Position != int64(i+1) {
				t.Fatalf("u%d admitted at %d", i, q.Position)
			}
			admitted = append(admitted, q)
		}
		pacer.kill()
		var last time.Time
		for i, q := range admitted {
			if r := b.buyWith(t, sku, fmt.Sprintf("k%d", i), fmt.Sprintf("u%d", i), 1, q.Admission); r.status != http.StatusCreated {
				t.Fatalf("u%d buys = %d %s", i, r.status, r.body)
			}
			last = time.Now()
		}
		time.Sleep(time.Until(last.Add(waitroom.Refresh)))
		for i := range buyers {
			for _, e := range []*env{a, b} {
				r, q := e.queueCheck(t, sku.Program, tickets[i])
				if r.status != http.StatusOK || q.State != "sold-out" {
					t.Fatalf("u%d checks %v after the last sale: %d %s", i, time.Since(last), r.status, r.body)
				}
			}
		}
		var v struct {
			Serving int64
			SoldOut bool `json:"sold_out"`
		}
		r := b.do(t, http.MethodGet, "/v1/admin/programs/"+sku.Program.String()+"/queue", nil, "")
		if err := json.Unmarshal(r.body, &v); err != nil || !v.SoldOut || v.Serving != total {
			t.Fatalf("the line after the sold-out: %d %s", r.status, r.body)
		}
	})
}

// A line Redis loses whole (a restart without persistence) is made again
// from the ledger: a new buyer's place comes after every place given
// before, a buyer presenting its ticket keeps its place, old tickets still
// check, admitted buyers still buy, and the sale sells every ticket once.
func TestQueueLineSurvivesRedisLoss(t *testing.T) {
	t.Parallel() // its own env and programs: it overlaps the others' waits
	eachDriver(t, func(t *testing.T, driver string) {
		cl := testenv.NewCluster(t, testenv.ClusterOptions{})
		dsn := ledgerDSN(t, driver)
		a := startEnv(t, envOptions{driver: driver, dsn: dsn, cluster: cl, pacer: true})
		b := startEnv(t, envOptions{driver: driver, dsn: dsn, cluster: cl, pacer: true})
		sku := newSKU(t)
		const total, before = 6, 20
		a.putSKU(t, sku, total, 2, 1)
		// At most 2 admitted and not bought at a time.
		a.putQueue(t, sku.Program, `{"opens_in_seconds":0,"rate_per_second":1000,"window_seconds":60,"per_remaining":0.34}`)
		tickets := map[string]string{}
		positions := map[int64]string{}
		join := func(e *env, buyer string, body string) queueReply {
			t.Helper()
			r := e.do(t, http.MethodPost, "/v1/programs/"+sku.Program.String()+"/queue", nil, body)
			var q queueReply
			if err := json.Unmarshal(r.body, &q); err != nil || r.status >= 300 {
				t.Fatalf("join %s = %d %s", buyer, r.status, r.body)
			}
			return q
		}
		for i := range before {
			buyer := fmt.Sprintf("u%d", i)
			q := join([]*env{a, b}[i%2], buyer, fmt.Sprintf(`{"buyer":%q}`, buyer))
			tickets[buyer] = q.Ticket
			positions[q.Position] = buyer
		}
		// u0 is admitted and buys; u1 is admitted and keeps its admission.
		q0 := a.admitted(t, sku.Program, "u0")
		if r := a.buyWith(t, sku, "k-u0", "u0", 1, q0.Admission); r.status != http.StatusCreated {
			t.Fatalf("u0 buys = %d %s", r.status, r.body)
		}
		q1 := b.admitted(t, sku.Program, "u1")
		// Everything in Redis is lost.
		ctx := context.Background()
		for _, n := range cl.Nodes {
			c := n.Client()
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			c.Close()
		}
		// Old tickets still check, at their places.
		for buyer, tk := range tickets {
			r, q := b.queueCheck(t, sku.Program, tk)
			if r.status != http.StatusOK || positions[q.Position] != buyer {
				t.Fatalf("%s's ticket after the loss = %d %s", buyer, r.status, r.body)
			}
		}
		// A buyer with its ticket keeps its place; new buyers come after
		// every place given before.
		if q := join(a, "u7", fmt.Sprintf(`{"buyer":"u7","ticket":%q}`, tickets["u7"])); q.Ticket != tickets["u7"] || positions[q.Position] != "u7" {
			t.Fatalf("u7 joins with its ticket after the loss: %+v", q)
		}
		for i := range 10 {
			buyer := fmt.Sprintf("n%d", i)
			q := join([]*env{a, b}[i%2], buyer, fmt.Sprintf(`{"buyer":%q}`, buyer))
			if q.Position <= before || positions[q.Position] != "" {
				t.Fatalf("%s joins after the loss at %d (taken by %q)", buyer, q.Position, positions[q.Position])
			}
			positions[q.Position] = buyer
			tickets[buyer] = q.Ticket
		}
		// u1's admission still buys.
		waitFor(t, 20*time.Second, "u1 buys after the loss", func() bool {
			r := b.buyWith(t, sku, "k-u1", "u1", 1, q1.Admission)
			return r.status == http.StatusCreated
		})
		// The rest of the sale: buyers buy as they are admitted, until
		// every ticket is sold and everyone else is told so.
		bought := map[string]bool{"u0": true, "u1": true}
		deadline := time.Now().Add(60 * time.Second)
		for {
			open := false
			for buyer, tk := range tickets {
				if bought[buyer] {
					continue
				}
				e := []*env{a, b}[len(buyer)%2]
				r, q := e.queueCheck(t, sku.Program, tk)
				switch {
				case r.status != http.StatusOK:
					t.Fatalf("%s checks = %d %s", buyer, r.status, r.body)
				case q.State == "admitted":
					r := e.buyWith(t, sku, "k-"+buyer, buyer, 1, q.Admission)
					switch {
					case r.status == http.StatusCreated:
						bought[buyer] = true
					case r.status == http.StatusConflict && problemKind(r) == "sold-out":
					case r.status == http.StatusServiceUnavailable: // the gate being rebuilt: again
						open = true
					default:
						t.Fatalf("%s buys = %d %s", buyer, r.status, r.body)
					}
				case q.State == "waiting":
					open = true
				}
			}
			if !open {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after 60s: %d bought", len(bought))
			}
		}
		if st := a.state(t, sku); st.Sold != total || len(bought) != total {
			t.Fatalf("sold %d (%d buyers), want %d", st.Sold, len(bought), total)
		}
	})
}

// holdWith holds q of sku for ttl seconds with an admission.
func (e *env) holdWith(t *testing.T, sku stock.SKU, key, buyer string, q int64, ttl int, token string) (reply, holdReply) {
	r := e.do(t, http.MethodPost, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/holds",
		map[string]string{"Idempotency-Key": key, "Admission-Token": token}, fmt.Sprintf(`{"buyer":%q,"quantity":%d,"ttl_seconds":%d}`, buyer, q, ttl))
	var h holdReply
	_ = json.Unmarshal(r.body, &h)
	return r, h
}

// Stock that comes back lets the next buyers in: with every ticket held
// the line stands still (and is not sold out: the holds may lapse); a hold
// that expires admits the next place, a refund the one after; when the
// last ticket is sold for good the line closes. The wait-time histogram
// counts each admission spent.
func TestQueueReturnedStockLetsMoreIn(t *testing.T) {
	t.Parallel() // its own env and programs: it overlaps the others' waits
	e := startEnv(t, envOptions{driver: "sqlite", pacer: true, sweep: true})
	sku := newSKU(t)
	e.putSKU(t, sku, 2, 1, 1)
	e.putQueue(t, sku.Program, `{"opens_in_seconds":0,"rate_per_second":100,"window_seconds":60,"per_remaining":1}`)
	ann := e.admitted(t, sku.Program, "ann")
	bob := e.admitted(t, sku.Program, "bob")
	_, cy := e.queueJoin(t, sku.Program, "cy")
	_, dan := e.queueJoin(t, sku.Program, "dan")
	if r, _ := e.holdWith(t, sku, "ann-h", "ann", 1, 2, ann.Admission); r.status != http.StatusCreated {
		t.Fatalf("ann holds = %d %s", r.status, r.body)
	}
	r := e.buyWith(t, sku, "bob-1", "bob", 1, bob.Admission)
	if r.status != http.StatusCreated {
		t.Fatalf("bob buys = %d %s", r.status, r.body)
	}
	var bobOrder struct {
		OrderID string `json:"order_id"`
	}
	_ = json.Unmarshal(r.body, &bobOrder)
	// Nothing left to sell, one ticket held: cy waits, not told sold-out.
	if _, q := e.queueCheck(t, sku.Program, cy.Ticket); q.State != "waiting" || *q.Ahead != 0 {
		t.Fatalf("cy while every ticket is held or sold: %+v", q)
	}
	// ann's hold lapses: cy is let in, and buys.
	cy = e.untilAdmitted(t, sku.Program, cy.Ticket, "cy admitted after ann's hold expired", 20*time.Second)
	if r := e.buyWith(t, sku, "cy-1", "cy", 1, cy.Admission); r.status != http.StatusCreated {
		t.Fatalf("cy buys = %d %s", r.status, r.body)
	}
	// Sold out for good: dan is told so.
	waitFor(t, 5*time.Second, "dan told sold-out", func() bool {
		_, q := e.queueCheck(t, sku.Program, dan.Ticket)
		return q.State == "sold-out"
	})
	// bob's refund brings a ticket back: the line opens again for dan.
	if r := e.do(t, http.MethodPost, "/v1/orders/"+bobOrder.OrderID+"/refund", map[string]string{"Idempotency-Key": "bob-refund"},
		`{"buyer":"bob"}`); r.status != http.StatusOK {
		t.Fatalf("refund = %d %s", r.status, r.body)
	}
	dan = e.untilAdmitted(t, sku.Program, dan.Ticket, "dan admitted after bob's refund", 20*time.Second)
	if r := e.buyWith(t, sku, "dan-1", "dan", 1, dan.Admission); r.status != http.StatusCreated {
		t.Fatalf("dan buys = %d %s", r.status, r.body)
	}
	m := e.do(t, http.MethodGet, "/metrics", nil, "")
	if !strings.Contains(string(m.body), "stockgate_queue_wait_seconds_count 4") {
		t.Fatalf("the wait histogram does not count the 4 admissions spent:\n%s", grepLines(string(m.body), "stockgate_queue_wait"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// With Redis gone, checks still answer, promptly, from the ledger's facts
// (the line stands still without Redis: its places, and who was admitted
// as the pacer last recorded it); joins and purchases of the queued
// program answer 503 with Retry-After and move nothing.
func TestQueueChecksWithoutRedis(t *testing.T) {
	t.Parallel() // its own env and programs: it overlaps the others' waits
	cl := testenv.NewCluster(t, testenv.ClusterOptions{})
	e := startEnv(t, envOptions{driver: "sqlite", cluster: cl, pacer: true})
	sku := newSKU(t)
	e.putSKU(t, sku, 2, 1, 1)
	e.putQueue(t, sku.Program, `{"opens_in_seconds":0,"rate_per_second":100,"window_seconds":60,"per_remaining":1}`)
	var tickets []string
	for i := range 5 {
		_, q := e.queueJoin(t, sku.Program, fmt.Sprintf("u%d", i))
		tickets = append(tickets, q.Ticket)
	}
	first := e.admitted(t, sku.Program, "u0")
	ctx := context.Background()
	waitFor(t, 10*time.Second, "the ledger to record two admitted", func() bool {
		ln, err := e.ledger.QueueLine(ctx, sku.Program)
		return err == nil && ln.Serving == 2
	})
	for _, n := range cl.Nodes {
		n.Kill()
	}
	for i, tk := range tickets {
		start := time.Now()
		r, q := e.queueCheck(t, sku.Program, tk)
		want := "waiting"
		if i < 2 {
			want = "admitted"
		}
		if r.status != http.StatusOK || q.State != want || q.Position != int64(i+1) {
			t.Fatalf("u%d checks without Redis = %d %s, want %s at %d", i, r.status, r.body, want, i+1)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("a check without Redis took %v", took)
		}
	}
	if r, _ := e.queueJoin(t, sku.Program, "late"); r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("a join without Redis = %d %s", r.status, r.body)
	}
	if r := e.buyWith(t, sku, "u0-1", "u0", 1, first.Admission); r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("a purchase without Redis = %d %s", r.status, r.body)
	}
	if st, err := e.ledger.SKU(ctx, sku); err != nil || st.Sold != 0 {
		t.Fatalf("sold %+v %v, want nothing", st, err)
	}
}

// A queued program has no waitlist: a join is refused (409
// queued-program), and a buyer who joined before the room was turned on is
// offered nothing; the ticket that comes back goes to the buyer the room
// lets in next.
func TestQueueProgramHasNoWaitlist(t *testing.T) {
	t.Parallel() // its own env and programs: it overlaps the others' waits
	e := startEnv(t, envOptions{driver: "sqlite", pacer: true})
	sku := newSKU(t)
	e.putSKU(t, sku, 1, 1, 1)
	_, h := e.hold(t, sku, "ann-h", "ann", 1, 60) // sold out, before the room
	if r, _ := e.join(t, sku, "early-bird", 1); r.status != http.StatusCreated {
		t.Fatalf("a waitlist join before the room = %d %s", r.status, r.body)
	}
	e.putQueue(t, sku.Program, `{"opens_in_seconds":0,"rate_per_second":100,"window_seconds":60,"per_remaining":1}`)
	waitFor(t, 5*time.Second, "the room refuses waitlist joins", func() bool {
		r, _ := e.join(t, sku, "late-bird", 1)
		return r.status == http.StatusConflict && problemKind(r) == "queued-program"
	})
	_, cy := e.queueJoin(t, sku.Program, "cy")
	if r := e.act(t, "/v1/holds/"+h.HoldID+"/cancel", "ann-c", "ann"); r.status != http.StatusOK {
		t.Fatalf("ann cancels = %d %s", r.status, r.body)
	}
	if w := e.entry(t, sku, "early-bird"); w.State == "offered" {
		t.Fatalf("a waitlist entry of a queued program was offered the returned ticket: %+v", w)
	}
	cy = e.untilAdmitted(t, sku.Program, cy.Ticket, "cy admitted with the returned ticket", 10*time.Second)
	if r := e.buyWith(t, sku, "cy-1", "cy", 1, cy.Admission); r.status != http.StatusCreated {
		t.Fatalf("cy buys the returned ticket = %d %s", r.status, r.body)
	}
}

// laggingCommits makes every group commit of orders take delay: a purchase
// spent its admission and took its ticket in Redis long before the
// ledger, which the pacer reads the stock from, sells it.
type laggingCommits struct {
	sale.Ledger
	delay time.Duration
}

func (l laggingCommits) Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult {
	time.Sleep(l.delay)
	return l.Ledger.Commit(ctx, takes, direct)
}

// With one admitted buyer per ticket left and nobody walking away, every
// buyer admitted buys: the pacer steps (every 200 ms) while purchases are
// in flight for 400 ms, spent in Redis and not yet sold in the ledger, and
// counts them as admitted-but-unused, so it never lets in a buyer for a
// ticket another admitted buyer is buying. (It let in one per purchase in
// flight: they were told sold-out.)
func TestQueueAdmitsNoMoreThanItSells(t *testing.T) {
	t.Parallel() // its own env and programs: it overlaps the others' waits
	e := startEnv(t, envOptions{driver: "sqlite", pacer: true, tune: func(o *app.Options) {
		o.WrapLedger = func(l sale.Ledger) sale.Ledger { return laggingCommits{Ledger: l, delay: 400 * time.Millisecond} }
		o.Sale.LedgerWaitBudget = -1 // a lagging ledger, not an overloaded one: nothing is shed
	}})
	sku := newSKU(t)
	const total, buyers = 6, 20
	e.putSKU(t, sku, total, 1, 1)
	e.putQueue(t, sku.Program, `{"opens_in_seconds":0,"rate_per_second":1000,"window_seconds":60,"per_remaining":1}`)
	tickets := make([]string, buyers)
	for i := range buyers {
		r, q := e.queueJoin(t, sku.Program, fmt.Sprintf("b%d", i))
		if r.status != http.StatusCreated {
			t.Fatalf("join %d = %d %s", i, r.status, r.body)
		}
		tickets[i] = q.Ticket
	}
	var wg sync.WaitGroup
	ends := make([]string, buyers) // each buyer's end: bought, sold-out, or what went wrong
	for i := range buyers {
		wg.Go(func() {
			deadline := time.Now().Add(60 * time.Second)
			for time.Now().Before(deadline) {
				_, q := e.queueCheck(t, sku.Program, tickets[i])
				switch q.State {
				case "sold-out":
					ends[i] = "sold-out"
					return
				case "admitted":
					buyer := fmt.Sprintf("b%d", i)
					r := e.buyAdmitted(t, sku, "k-"+buyer, buyer, q.Admission)
					if r.status == http.StatusCreated {
						ends[i] = "bought"
					} else {
						ends[i] = fmt.Sprintf("admitted, then %d %s", r.status, problemKind(r))
					}
					return
				}
				time.Sleep(20 * time.Millisecond) // a buyer's poll, not a wait for a condition
			}
			ends[i] = "still waiting after 60s"
		})
	}
	wg.Wait()
	got := map[string]int{}
	for _, end := range ends {
		got[end]++
	}
	if got["bought"] != total || got["sold-out"] != buyers-total {
		t.Fatalf("ends %v, want %d bought and %d told sold-out", got, total, buyers-total)
	}
	if st := e.state(t, sku); st.Sold != total {
		t.Fatalf("sold %d, want %d", st.Sold, total)
	}
}

package shed_test

// Attacks on a slow ledger shed at the lane's door (503 overloaded, stock
// given back) and on replays held back off an unconfirmed standby, where
// they meet the older operations: confirm (whole and partial), cancel,
// refund, late payment, carts, transfer, resale and extend. Each sends
// the requests again with their keys afterwards and checks that the
// retries answer what happened, once, and that Redis equals the ledger.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// shedOp is one request of an attack: sent once in the fault, then again
// with its key once the ledger is well.
type shedOp struct {
	name, path, key, body string
	want                  int // the status its retry must answer
	first                 systest.Reply
}

func problemOutcome(r systest.Reply) string {
	var p struct {
		Outcome string `json:"outcome"`
	}
	_ = json.Unmarshal(r.Body, &p)
	return p.Outcome
}

// check5xx fails an answer in the fault that is a 5xx other than a 503
// with Retry-After and an outcome. An overloaded 503 may be "unknown":
// an action of a hold or order shed while a copy of it may commit
// elsewhere, or a take whose deduction another copy holds
// (TestAttackBehindUnchangedWhileTwinCommits); the tests check that an
// "unchanged" one moved nothing.
func check5xx(t *testing.T, name string, r systest.Reply) {
	t.Helper()
	if r.Status < 500 {
		return
	}
	out := problemOutcome(r)
	switch {
	case r.Status != http.StatusServiceUnavailable:
		t.Errorf("%s = %d %s: want 503 for a slow ledger", name, r.Status, r.Body)
	case r.Header.Get("Retry-After") == "":
		t.Errorf("%s = 503 without Retry-After: %s", name, r.Body)
	case out != "unchanged" && out != "unknown":
		t.Errorf("%s = 503 with outcome %q: %s", name, out, r.Body)
	}
}

// pressure keeps a SKU's commit lane busy: workers buy one ticket each
// under fresh keys until stopped.
type pressure struct {
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
	mu   sync.Mutex
	keys map[string]int // key: its first answer's status
	shed int
}

func press(t *testing.T, e *systest.Env, sku stock.SKU, workers int, prefix string) *pressure {
	p := &pressure{stop: make(chan struct{}), keys: map[string]int{}}
	t.Cleanup(p.halt)
	for w := range workers {
		p.wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-p.stop:
					return
				default:
				}
				key := fmt.Sprintf("%s-%d-%d", prefix, w, n)
				r := e.Buy(t, sku, key, key, 1)
				check5xx(t, "pressure "+key, r)
				p.mu.Lock()
				p.keys[key] = r.Status
				if systest.ProblemKind(r) == "overloaded" {
					p.shed++
				}
				p.mu.Unlock()
				time.Sleep(10 * time.Millisecond) // time under test: the load's pace (shed answers come at once)
			}
		})
	}
	return p
}

func (p *pressure) halt() {
	p.once.Do(func() { close(p.stop) })
	p.wg.Wait()
}

// end stops the workers and, once the ledger is well, sends each
// purchase not answered 201 again with its key (a 409: the SKU sold out
// meanwhile); it returns how many sold.
func (p *pressure) end(t *testing.T, e *systest.Env, sku stock.SKU, heal func()) int {
	p.halt()
	heal()
	sold := 0
	for key, status := range p.keys {
		if status != http.StatusCreated {
			r, _ := e.Retried(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", key, fmt.Sprintf(`{"buyer":%q,"quantity":1}`, key))
			status = r.Status
		}
		switch {
		case status == http.StatusCreated:
			sold++
		case status == http.StatusConflict:
			// Shed, then sold out by the time it was sent again: the
			// pressure keeps buying until it stops.
		default:
			t.Errorf("pressure purchase %s sent again once the ledger was well = %d", key, status)
		}
	}
	t.Logf("pressure: %d purchases, %d shed, %d sold", len(p.keys), p.shed, sold)
	return sold
}

func holdState(t *testing.T, e *systest.Env, id string) string {
	t.Helper()
	var h systest.HoldReply
	_ = json.Unmarshal(e.Do(t, http.MethodGet, "/v1/holds/"+id, nil, "").Body, &h)
	return h.State
}

func orderState(t *testing.T, e *systest.Env, id string) string {
	t.Helper()
	var o struct {
		State string `json:"state"`
	}
	_ = json.Unmarshal(e.Do(t, http.MethodGet, "/v1/orders/"+id, nil, "").Body, &o)
	return o.State
}

func replyQuantity(r systest.Reply) int64 {
	var v struct {
		Quantity int64 `json:"quantity"`
	}
	_ = json.Unmarshal(r.Body, &v)
	return v.Quantity
}

// retryAll sends each op again with its key (retrying 503s) and checks it
// answers want, the same thing its first 2xx answered, as a replay.
func retryAll(t *testing.T, e *systest.Env, ops []*shedOp) {
	t.Helper()
	for _, op := range ops {
		r, _ := e.Retried(t, http.MethodPost, op.path, op.key, op.body)
		switch {
		case r.Status != op.want:
			t.Errorf("%s (first %d %s) sent again with its key = %d %s; want %d",
				op.name, op.first.Status, systest.ProblemKind(op.first), r.Status, r.Body, op.want)
		case op.first.Status/100 == 2 && (op.first.Status != r.Status || systest.ReplyID(op.first) != systest.ReplyID(r) ||
			r.Header.Get("Idempotent-Replayed") != "true"):
			t.Errorf("%s first %d %s, its retry %d (replayed %q) %s: want the same answer, replayed",
				op.name, op.first.Status, op.first.Body, r.Status, r.Header.Get("Idempotent-Replayed"), r.Body)
		}
	}
}

// slowSpell makes the link 500 ms slower per round trip; heal makes it
// fast again (once; at the test's end if nothing did).
func slowSpell(t *testing.T, link *systest.Link) (heal func()) {
	link.Latency(t, 250*time.Millisecond)
	var once sync.Once
	heal = func() { once.Do(func() { link.Heal(t) }) }
	t.Cleanup(heal)
	return heal
}

// underPressure sends ops at once while sku's lane is shed: a purchase
// on the slow link first (the lane learns its flush time), then workers
// pressing the SKU until one is shed. It returns the pressure and a
// tally of the first answers.
func underPressure(t *testing.T, e *systest.Env, sku stock.SKU, workers int, ops []*shedOp) (*pressure, map[string]int) {
	t.Helper()
	if r := e.Buy(t, sku, "warm", "warm", 1); r.Status != http.StatusCreated {
		t.Fatalf("a purchase on the slow link = %d %s", r.Status, r.Body)
	}
	p := press(t, e, sku, workers, "press")
	systest.WaitFor(t, 20*time.Second, "the pressure to be shed", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.shed > 0
	})
	var wg sync.WaitGroup
	for _, op := range ops {
		wg.Go(func() {
			op.first = e.Do(t, http.MethodPost, op.path, map[string]string{"Idempotency-Key": op.key}, op.body)
			check5xx(t, op.name, op.first)
		})
	}
	wg.Wait()
	kinds := map[string]int{}
	for _, op := range ops {
		kinds[fmt.Sprintf("%d %s", op.first.Status, systest.ProblemKind(op.first))]++
	}
	return p, kinds
}

// slowEnv is a replica on PostgreSQL behind a link, with production's
// wait budget.
func slowEnv(t *testing.T, tune func(o *app.Options)) (*systest.Env, *systest.Link) {
	t.Helper()
	link, dsn := systest.LedgerLink(t, systest.LedgerDSN(t, ledger.Postgres))
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: func(o *app.Options) {
		o.Sale.SettingsTTL = time.Minute // every request reaches the commit
		o.Sale.LedgerWaitBudget = 250 * time.Millisecond
		if tune != nil {
			tune(o)
		}
	}})
	return e, link
}

// TestAttackShedHoldEnds: with the ledger slow, a burst of whole
// confirms, partial confirms, cancels and refunds of one SKU (one lane
// each) after one of each taught the lanes the flush time. Each shed one
// must have moved nothing (its hold still held, its order still paid);
// sent again with its key once the link is fast, each does its work once,
// and the ledger and Redis agree.
func TestAttackShedHoldEnds(t *testing.T) {
	systest.FullTier(t)
	e, link := slowEnv(t, nil)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 400, 2, 4)
	const n = 10
	holds := make([]string, 3*n)
	for i := range holds {
		r, h := e.Hold(t, sku, fmt.Sprintf("h-%d", i), fmt.Sprintf("hb-%d", i), 2, 600)
		if r.Status != http.StatusCreated {
			t.Fatalf("hold %d = %d %s", i, r.Status, r.Body)
		}
		holds[i] = h.HoldID
	}
	orders := make([]string, n)
	for i := range orders {
		orders[i] = systest.OrderID(e.MustBuy(t, sku, fmt.Sprintf("p-%d", i), fmt.Sprintf("rb-%d", i), 2))
	}
	var ops []*shedOp
	for i := range n {
		h, hp, hx := holds[i], holds[n+i], holds[2*n+i]
		ops = append(ops,
			&shedOp{name: "confirm " + h, path: "/v1/holds/" + h + "/confirm", key: fmt.Sprintf("c-%d", i),
				body: fmt.Sprintf(`{"buyer":"hb-%d"}`, i), want: http.StatusCreated},
			&shedOp{name: "partial confirm " + hp, path: "/v1/holds/" + hp + "/confirm", key: fmt.Sprintf("pc-%d", i),
				body: fmt.Sprintf(`{"buyer":"hb-%d","quantity":1}`, n+i), want: http.StatusCreated},
			&shedOp{name: "cancel " + hx, path: "/v1/holds/" + hx + "/cancel", key: fmt.Sprintf("x-%d", i),
				body: fmt.Sprintf(`{"buyer":"hb-%d"}`, 2*n+i), want: http.StatusOK},
			&shedOp{name: "refund " + orders[i], path: "/v1/orders/" + orders[i] + "/refund", key: fmt.Sprintf("r-%d", i),
				body: fmt.Sprintf(`{"buyer":"rb-%d"}`, i), want: http.StatusOK})
	}
	link.Latency(t, 250*time.Millisecond)
	healed := false
	t.Cleanup(func() {
		if !healed {
			link.Heal(t)
		}
	})
	send := func(op *shedOp) {
		op.first = e.Do(t, http.MethodPost, op.path, map[string]string{"Idempotency-Key": op.key}, op.body)
		check5xx(t, op.name, op.first)
	}
	for _, op := range ops[:4] { // one of each kind: the lanes learn the flush time
		send(op)
	}
	var wg sync.WaitGroup
	for _, op := range ops[4:] {
		wg.Go(func() { send(op) })
	}
	wg.Wait()
	kinds := map[string]int{}
	for i, op := range ops {
		kind := fmt.Sprintf("%d %s", op.first.Status, systest.ProblemKind(op.first))
		kinds[kind]++
		if op.first.Status >= 500 && problemOutcome(op.first) != "unchanged" {
			t.Logf("%s: %s", op.name, op.first.Body)
		}
		if op.first.Status != http.StatusServiceUnavailable || problemOutcome(op.first) != "unchanged" {
			continue
		}
		// Shed, unchanged: nothing moved.
		switch i % 4 {
		case 0, 1, 2:
			if st := holdState(t, e, pathID(op.path)); st != "held" {
				t.Errorf("%s answered 503 unchanged (%s), yet its hold is %q", op.name, op.first.Body, st)
			}
		case 3:
			if st := orderState(t, e, pathID(op.path)); st == "refunded" {
				t.Errorf("%s answered 503 unchanged (%s), yet its order is refunded", op.name, op.first.Body)
			}
		}
	}
	t.Logf("in the fault: %v", kinds)
	link.Heal(t)
	healed = true
	retryAll(t, e, ops)
	for i := range n {
		if st := holdState(t, e, holds[2*n+i]); st != "cancelled" {
			t.Errorf("hold %s cancelled is %q", holds[2*n+i], st)
		}
		if st := orderState(t, e, orders[i]); st != "refunded" {
			t.Errorf("order %s refunded is %q", orders[i], st)
		}
	}
	st := e.State(t, sku)
	if st.Sold != 3*n || st.Held != 0 {
		t.Errorf("ledger %+v: want %d sold (%d confirmed whole of 2, %d of 1), none held", st, 3*n, n, n)
	}
	systest.RedisConsistent(t, e, sku)
}

// pathID is the id in an action's path (/v1/holds/{id}/confirm).
func pathID(path string) string {
	var kind, id, act string
	_, _ = fmt.Sscanf(pathFields(path), "%s %s %s", &kind, &id, &act)
	return id
}

func pathFields(path string) string {
	out := []byte(path)
	for i, c := range out {
		if c == '/' {
			out[i] = ' '
		}
	}
	return string(out[len(" v1 "):])
}

// TestAttackShedLatePayment: holds past their expiry (no sweeper) paid
// late while purchases keep the SKU's take lane busy on a slow ledger:
// the late payment expires the hold and gives its units back, then its
// take may be shed. Sent again with the key once the link is fast, each
// late payment buys once, its quantity, under the same order a first 201
// named; another key naming no quantity gets that order; nothing sold
// twice and Redis equals the ledger.
func TestAttackShedLatePayment(t *testing.T) {
	systest.FullTier(t)
	e, link := slowEnv(t, func(o *app.Options) { o.Sale.LatePayment = time.Minute })
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 1000, 2, 4)
	const n = 10
	holds := make([]systest.HoldReply, n)
	for i := range holds {
		r, h := e.Hold(t, sku, fmt.Sprintf("h-%d", i), fmt.Sprintf("lb-%d", i), 2, 1)
		if r.Status != http.StatusCreated {
			t.Fatalf("hold %d = %d %s", i, r.Status, r.Body)
		}
		holds[i] = h
	}
	systest.WaitFor(t, 10*time.Second, "the holds' expiry to pass", func() bool {
		return time.Now().After(holds[n-1].ExpiresAt.Add(50 * time.Millisecond))
	})
	var ops []*shedOp
	wantQ := map[string]int64{}
	for i, h := range holds {
		body := fmt.Sprintf(`{"buyer":"lb-%d"}`, i)
		wantQ[h.HoldID] = 2
		if i%2 == 1 {
			body = fmt.Sprintf(`{"buyer":"lb-%d","quantity":1}`, i)
			wantQ[h.HoldID] = 1
		}
		ops = append(ops, &shedOp{name: "late payment " + h.HoldID, path: "/v1/holds/" + h.HoldID + "/confirm",
			key: fmt.Sprintf("lc-%d", i), body: body, want: http.StatusCreated})
	}
	heal := slowSpell(t, link)
	p, kinds := underPressure(t, e, sku, 6, ops)
	t.Logf("late payments in the fault: %v", kinds)
	sold := p.end(t, e, sku, heal) + 1 // and warm
	retryAll(t, e, ops)
	late := int64(0)
	for i, h := range holds {
		r, _ := e.Retried(t, http.MethodPost, "/v1/holds/"+h.HoldID+"/confirm", fmt.Sprintf("lc-%d", i), ops[i].body)
		if q := replyQuantity(r); r.Status != http.StatusCreated || q != wantQ[h.HoldID] {
			t.Errorf("late payment %d again = %d %s; want 201 of %d", i, r.Status, r.Body, wantQ[h.HoldID])
		}
		late += wantQ[h.HoldID]
		// Retried as a client retries a 503 with its key: the lane may
		// still shed while its flush times come down from the fault's
		// (a make test failure: 503 overloaded, outcome unchanged).
		other, _ := e.Retried(t, http.MethodPost, "/v1/holds/"+h.HoldID+"/confirm", fmt.Sprintf("lc2-%d", i), fmt.Sprintf(`{"buyer":"lb-%d"}`, i))
		if other.Status != http.StatusCreated || systest.OrderID(other) != systest.OrderID(r) {
			t.Errorf("late payment %d under another key = %d %s; want 201 order %s", i, other.Status, other.Body, systest.OrderID(r))
		}
	}
	st := e.State(t, sku)
	if st.Held != 0 || st.Sold != int64(sold)+late || st.Orders != int64(sold)+n {
		t.Errorf("ledger %+v: want %d sold in %d orders (%d purchases, %d late payments of %d), none held",
			st, int64(sold)+late, sold+n, sold, n, late)
	}
	systest.RedisConsistent(t, e, sku)
}

type listingReply struct {
	ListingID string `json:"listing_id"`
	State     string `json:"state"`
	Quantity  int64  `json:"quantity"`
	Sold      int64  `json:"sold"`
	Withdrawn int64  `json:"withdrawn"`
}

func listingOfReply(r systest.Reply) listingReply {
	var x listingReply
	_ = json.Unmarshal(r.Body, &x)
	return x
}

// TestAttackShedWithdrawCommitLost: a withdrawal takes the listing's
// unsold units out of the gate, then out of the ledger. When the ledger's
// COMMIT reply is lost (the withdrawal committed; the replica cannot
// know), the answer is 503 outcome unknown and the units must stay out of
// the gate: sent again with its key, the withdrawal answers its replay,
// and Redis equals the ledger. The skips walk the lost reply over each
// COMMIT the withdrawal makes (settles first, then its own).
func TestAttackShedWithdrawCommitLost(t *testing.T) {
	systest.FullTier(t)
	link, dsn := systest.LedgerLink(t, systest.LedgerDSN(t, ledger.Postgres))
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn})
	for skip := range 4 {
		t.Run(fmt.Sprintf("skip-%d", skip), func(t *testing.T) {
			sku := systest.NewSKU(t)
			e.PutSKU(t, sku, 20, 2, 4)
			order := systest.OrderID(e.MustBuy(t, sku, fmt.Sprintf("p1-%d", skip), "ann", 3))
			r := e.Do(t, http.MethodPost, "/v1/orders/"+order+"/resale", map[string]string{"Idempotency-Key": fmt.Sprintf("l1-%d", skip)},
				`{"buyer":"ann","quantity":2}`)
			if r.Status != http.StatusCreated {
				t.Fatalf("list = %d %s", r.Status, r.Body)
			}
			x := listingOfReply(r)
			systest.RedisConsistent(t, e, sku)
			path := "/v1/listings/" + x.ListingID + "/withdraw"
			lost := link.LoseCommitReplies(t, skip, 1)
			key := fmt.Sprintf("w1-%d", skip)
			first := e.Act(t, path, key, "ann")
			n := lost()
			link.Heal(t)
			check5xx(t, "withdraw", first)
			again, _ := e.Retried(t, http.MethodPost, path, key, `{"buyer":"ann"}`)
			t.Logf("COMMIT replies lost %d: withdraw = %d %s; again = %d %s", n, first.Status, first.Body, again.Status, again.Body)
			if again.Status != http.StatusOK || listingOfReply(again).Withdrawn != 2 {
				t.Errorf("the withdrawal sent again = %d %s; want 200, 2 withdrawn", again.Status, again.Body)
			}
			st := e.State(t, sku)
			if st.Sold != 3 {
				t.Errorf("ledger %+v: want 3 sold", st)
			}
			systest.RedisConsistent(t, e, sku)
		})
	}
}

// TestAttackShedDurableReplays: with the synchronous standby silent,
// retries of requests committed before, of the operations the durable
// check's test leaves out (transfer, resale listing, withdrawal, extend,
// partial confirm, late payment whole and of a quantity, a second late
// payment under another key, a cart, a held cart, its confirm, its cancel
// and a cart's refund), answer 503 outcome unknown, never their replays;
// once no standby is named, each answers its replay, the same as before,
// and nothing moved twice: Redis equals the ledger.
func TestAttackShedDurableReplays(t *testing.T) {
	systest.FullTier(t)
	pg := testenv.NewSyncPostgres(t)
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: pg.DSN, Tune: func(o *app.Options) {
		o.Sale.WorkTimeout = 2 * time.Second
		o.Sale.LatePayment = time.Minute
	}})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 40, 1, 4)
	var ops []*shedOp
	do := func(name, path, key, body string, want int) systest.Reply {
		t.Helper()
		r := e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": key}, body)
		if r.Status != want {
			t.Fatalf("%s = %d %s, want %d", name, r.Status, r.Body, want)
		}
		ops = append(ops, &shedOp{name: name, path: path, key: key, body: body, want: want, first: r})
		return r
	}
	o1 := systest.OrderID(e.MustBuy(t, sku, "p1", "ann", 3))
	do("transfer", "/v1/orders/"+o1+"/transfer", "t1", `{"buyer":"ann","to":"bob","quantity":1}`, http.StatusOK)
	o2 := systest.OrderID(e.MustBuy(t, sku, "p2", "ann", 3))
	x := listingOfReply(do("list", "/v1/orders/"+o2+"/resale", "l1", `{"buyer":"ann","quantity":2}`, http.StatusCreated))
	do("withdraw", "/v1/listings/"+x.ListingID+"/withdraw", "w1", `{"buyer":"ann"}`, http.StatusOK)
	_, h1 := e.Hold(t, sku, "h1", "ann", 1, 60)
	do("extend", "/v1/holds/"+h1.HoldID+"/extend", "e1", `{"buyer":"ann","ttl_seconds":120}`, http.StatusOK)
	_, h2 := e.Hold(t, sku, "h2", "ann", 3, 60)
	do("partial confirm", "/v1/holds/"+h2.HoldID+"/confirm", "pc1", `{"buyer":"ann","quantity":2}`, http.StatusCreated)
	_, h3 := e.Hold(t, sku, "h3", "ann", 2, 1)
	_, h4 := e.Hold(t, sku, "h4", "ann", 2, 1)
	systest.WaitFor(t, 10*time.Second, "the holds' expiry to pass", func() bool {
		return time.Now().After(h4.ExpiresAt.Add(50*time.Millisecond)) && time.Now().After(h3.ExpiresAt.Add(50*time.Millisecond))
	})
	late := do("late payment", "/v1/holds/"+h3.HoldID+"/confirm", "lp1", `{"buyer":"ann"}`, http.StatusCreated)
	do("late payment of 1", "/v1/holds/"+h4.HoldID+"/confirm", "lp2", `{"buyer":"ann","quantity":1}`, http.StatusCreated)

	p, skus := systest.CartSKUs(t, e, [3]int64{20, 20, 20}, 0)
	lines := map[string]int64{"adult": 2, "child": 1}
	carts := "/v1/programs/" + p.String()
	c1 := systest.ReplyID(do("cart", carts+"/carts", "ct1", systest.CartBody("cid", lines, "adult", "child"), http.StatusCreated))
	c2 := systest.ReplyID(do("held cart", carts+"/cart-holds", "ch1", systest.CartBody("cid", lines, "adult", "child"), http.StatusCreated))
	c3 := systest.ReplyID(do("held cart 2", carts+"/cart-holds", "ch2", systest.CartBody("cid", lines, "adult", "child"), http.StatusCreated))
	do("cart confirm", "/v1/carts/"+c2+"/confirm", "cc1", `{"buyer":"cid"}`, http.StatusCreated)
	do("cart cancel", "/v1/carts/"+c3+"/cancel", "cx1", `{"buyer":"cid"}`, http.StatusOK)
	do("cart refund", "/v1/carts/"+c1+"/refund", "cr1", `{"buyer":"cid"}`, http.StatusOK)

	pg.Standby(t, "nobody") // a synchronous standby that never answers
	t.Cleanup(func() { pg.Standby(t, "") })
	for _, op := range ops {
		r := e.Do(t, http.MethodPost, op.path, map[string]string{"Idempotency-Key": op.key}, op.body)
		if r.Status != http.StatusServiceUnavailable || problemOutcome(r) != "unknown" {
			t.Errorf("%s sent again with the standby silent = %d %s; want 503 outcome unknown, not a replay", op.name, r.Status, r.Body)
		}
	}
	// Another key's late payment of the paid hold replays the derived
	// key's order: not off a row the standby may lack either.
	if r := e.Act(t, "/v1/holds/"+h3.HoldID+"/confirm", "lp1b", "ann"); r.Status != http.StatusServiceUnavailable {
		t.Errorf("a late payment under another key with the standby silent = %d %s; want 503", r.Status, r.Body)
	}

	pg.Standby(t, "")
	retryAll(t, e, ops)
	if r, _ := e.Retried(t, http.MethodPost, "/v1/holds/"+h3.HoldID+"/confirm", "lp1b", `{"buyer":"ann"}`); r.Status != http.StatusCreated ||
		systest.OrderID(r) != systest.OrderID(late) {
		t.Errorf("the late payment under another key = %d %s; want 201 order %s", r.Status, r.Body, systest.OrderID(late))
	}
	// 3 + 3 - 2 withdrawn ... sold: p1 3, p2 3 (2 listed then withdrawn:
	// still the seller's), h2 confirmed 2, late 2 + 1, h1 held 1.
	if st := e.State(t, sku); st.Sold != 3+3+2+2+1 || st.Held != 1 {
		t.Errorf("ledger %+v: want 11 sold, 1 held", st)
	}
	systest.RedisConsistent(t, e, sku)
	for _, s := range skus {
		systest.RedisConsistent(t, e, s)
	}
}

// TestAttackShedFreshCommitUnconfirmed: with the synchronous standby
// silent, a request committed fresh waits for the standby until its work
// timeout, when the driver cancels the wait; PostgreSQL then reports the
// COMMIT done (the row is on the primary only, with a warning). No such
// request may be answered 2xx: a failover takes the row back, and with
// it a sale the buyer was told is confirmed. Purchase, hold, confirm,
// cancel, refund and transfer are each sent once with the standby silent
// (503 outcome unknown wanted), then again with their keys once no
// standby is named (their work once, Redis equal to the ledger).
func TestAttackShedFreshCommitUnconfirmed(t *testing.T) {
	systest.FullTier(t)
	pg := testenv.NewSyncPostgres(t)
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: pg.DSN, Tune: func(o *app.Options) {
		o.Sale.WorkTimeout = 2 * time.Second
	}})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 40, 1, 4)
	_, h1 := e.Hold(t, sku, "h1", "ann", 2, 600)
	_, h2 := e.Hold(t, sku, "h2", "ann", 2, 600)
	o1 := systest.OrderID(e.MustBuy(t, sku, "p1", "ann", 2))
	o2 := systest.OrderID(e.MustBuy(t, sku, "p2", "ann", 2))
	ops := []*shedOp{
		{name: "purchase", path: systest.SKUPath(sku) + "/purchases", key: "p3", body: `{"buyer":"ann","quantity":1}`, want: http.StatusCreated},
		{name: "hold", path: systest.SKUPath(sku) + "/holds", key: "h3", body: `{"buyer":"ann","quantity":1}`, want: http.StatusCreated},
		{name: "confirm", path: "/v1/holds/" + h1.HoldID + "/confirm", key: "c1", body: `{"buyer":"ann"}`, want: http.StatusCreated},
		{name: "cancel", path: "/v1/holds/" + h2.HoldID + "/cancel", key: "x1", body: `{"buyer":"ann"}`, want: http.StatusOK},
		{name: "refund", path: "/v1/orders/" + o1 + "/refund", key: "r1", body: `{"buyer":"ann"}`, want: http.StatusOK},
		{name: "transfer", path: "/v1/orders/" + o2 + "/transfer", key: "t1", body: `{"buyer":"ann","to":"bob","quantity":1}`, want: http.StatusOK},
	}
	pg.Standby(t, "nobody")
	t.Cleanup(func() { pg.Standby(t, "") })
	for _, op := range ops {
		op.first = e.Do(t, http.MethodPost, op.path, map[string]string{"Idempotency-Key": op.key}, op.body)
		if op.first.Status/100 == 2 {
			t.Errorf("%s with the standby silent = %d %s; want 503 outcome unknown, not a sale only the primary has",
				op.name, op.first.Status, op.first.Body)
		} else {
			check5xx(t, op.name, op.first)
		}
	}
	pg.Standby(t, "")
	for _, op := range ops {
		op.first = systest.Reply{} // the retry decides: its work, once
	}
	retryAll(t, e, ops)
	// Sold: p1 refunded, p2 2, h1 2, p3 1; held: h3 1.
	if st := e.State(t, sku); st.Sold != 5 || st.Held != 1 {
		t.Errorf("ledger %+v: want 5 sold, 1 held", st)
	}
	systest.RedisConsistent(t, e, sku)
}

// TestAttackShedCarts: carts and held carts of buyers under a program cap
// of 6, sent while purchases keep the first line's lane busy on a slow
// ledger. A shed cart gives back every line's stock and the buyer's
// counts; sent again with its key once the link is fast, each cart is
// bought (or held) once. Then each buyer can buy exactly up to the cap
// (one more ticket, not two): counts neither leaked nor given back twice.
// Half the held carts are confirmed, half cancelled; Redis equals the
// ledger on every ticket.
func TestAttackShedCarts(t *testing.T) {
	systest.FullTier(t)
	e, link := slowEnv(t, nil)
	p, skus := systest.CartSKUs(t, e, [3]int64{400, 400, 400}, 6)
	carts := "/v1/programs/" + p.String()
	const n = 10
	var ops []*shedOp
	for i := range n {
		buyer := fmt.Sprintf("cb-%d", i)
		ops = append(ops,
			&shedOp{name: "cart " + buyer, path: carts + "/carts", key: fmt.Sprintf("cart-%d", i),
				body: systest.CartBody(buyer, map[string]int64{"adult": 2, "child": 1}, "adult", "child"), want: http.StatusCreated},
			&shedOp{name: "held cart " + buyer, path: carts + "/cart-holds", key: fmt.Sprintf("chold-%d", i),
				body: systest.CartBody(buyer, map[string]int64{"adult": 1, "parking": 1}, "adult", "parking"), want: http.StatusCreated})
	}
	heal := slowSpell(t, link)
	pr, kinds := underPressure(t, e, skus[0], 6, ops)
	t.Logf("carts in the fault: %v", kinds)
	// The carts first: the pressure's purchases, sent again, may sell the
	// adult tickets out.
	pr.halt()
	heal()
	retryAll(t, e, ops)
	sold := pr.end(t, e, skus[0], heal) + 1
	for i := range n {
		buyer := fmt.Sprintf("cb-%d", i)
		if r := e.Buy(t, skus[1], "cap-"+buyer, buyer, 1); r.Status != http.StatusCreated {
			t.Errorf("%s's sixth ticket = %d %s; want 201 (5 of the cap 6 taken)", buyer, r.Status, r.Body)
		}
		if r := e.Buy(t, skus[1], "over-"+buyer, buyer, 1); r.Status != http.StatusConflict || systest.ProblemKind(r) != "limit-reached" {
			t.Errorf("%s's seventh ticket = %d %s; want 409 limit-reached", buyer, r.Status, r.Body)
		}
		r, _ := e.Retried(t, http.MethodPost, ops[2*i+1].path, ops[2*i+1].key, ops[2*i+1].body)
		id := systest.ReplyID(r)
		if i%2 == 0 {
			if c := e.Act(t, "/v1/carts/"+id+"/confirm", "cc-"+buyer, buyer); c.Status != http.StatusCreated {
				t.Errorf("confirm of %s's held cart = %d %s", buyer, c.Status, c.Body)
			}
		} else if c := e.Act(t, "/v1/carts/"+id+"/cancel", "cx-"+buyer, buyer); c.Status != http.StatusOK {
			t.Errorf("cancel of %s's held cart = %d %s", buyer, c.Status, c.Body)
		}
	}
	want := []int64{int64(sold) + 2*n + n/2, n + n, n / 2}
	for i, s := range skus {
		if st := e.State(t, s); st.Sold != want[i] || st.Held != 0 {
			t.Errorf("%s: ledger %+v; want %d sold, none held", s.Ticket, st, want[i])
		}
		systest.RedisConsistent(t, e, s)
	}
}

// TestAttackShedResale: a sold-out SKU's only stock is 3 listed tickets
// of ann's 4; buyers press for them on a slow ledger (most shed)
// while ann withdraws the listing. Sent again with their keys once the
// link is fast, every purchase is bought once or sold out; the listing's
// sold and withdrawn add up to 3, ann's refund gives back only what her
// order still stands for (never a ticket resold), and Redis equals the
// ledger.
func TestAttackShedResale(t *testing.T) {
	systest.FullTier(t)
	e, link := slowEnv(t, nil)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 10, 2, 4)
	order := systest.OrderID(e.MustBuy(t, sku, "ann-1", "ann", 4))
	for i := range 3 {
		e.MustBuy(t, sku, fmt.Sprintf("o-%d", i), fmt.Sprintf("o-%d", i), 2)
	}
	r := e.Do(t, http.MethodPost, "/v1/orders/"+order+"/resale", map[string]string{"Idempotency-Key": "l1"}, `{"buyer":"ann","quantity":3}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("list = %d %s", r.Status, r.Body)
	}
	x := listingOfReply(r)
	heal := slowSpell(t, link)
	if r := e.Buy(t, sku, "warm", "warm", 1); r.Status != http.StatusCreated {
		t.Fatalf("a purchase of a listed ticket on the slow link = %d %s", r.Status, r.Body)
	}
	pr := press(t, e, sku, 6, "press")
	systest.WaitFor(t, 20*time.Second, "the pressure to be answered", func() bool {
		pr.mu.Lock()
		defer pr.mu.Unlock()
		return len(pr.keys) > 6
	})
	path := "/v1/listings/" + x.ListingID + "/withdraw"
	first := e.Act(t, path, "w1", "ann")
	check5xx(t, "withdraw", first)
	sold := pr.end(t, e, sku, heal) + 1
	again, _ := e.Retried(t, http.MethodPost, path, "w1", `{"buyer":"ann"}`)
	t.Logf("withdraw in the fault = %d %s; again = %d %s", first.Status, first.Body, again.Status, again.Body)
	g := e.Do(t, http.MethodGet, "/v1/listings/"+x.ListingID, nil, "")
	got := listingOfReply(g)
	if got.Sold != int64(sold) {
		// Settle what sold, then read again.
		systest.WaitFor(t, 10*time.Second, "the listing to settle", func() bool {
			e.Act(t, path, "w-settle", "ann")
			got = listingOfReply(e.Do(t, http.MethodGet, "/v1/listings/"+x.ListingID, nil, ""))
			return got.Sold == int64(sold)
		})
	}
	if got.Sold+got.Withdrawn != 3 && got.State != "listed" {
		t.Errorf("listing %s: sold %d + withdrawn %d != 3 (%d purchases of listed tickets)", g.Body, got.Sold, got.Withdrawn, sold)
	}
	rf := e.Act(t, "/v1/orders/"+order+"/refund", "rf1", "ann")
	t.Logf("listing %+v; refund of ann's order = %d %s", got, rf.Status, rf.Body)
	if got.State != "listed" && rf.Status != http.StatusOK {
		t.Errorf("refund of ann's order (%d of 4 resold) = %d %s; want 200", got.Sold, rf.Status, rf.Body)
	}
	var o struct {
		Units struct{ Began, Standing, Resold, Refunded int64 } `json:"units"`
	}
	_ = json.Unmarshal(e.Do(t, http.MethodGet, "/v1/orders/"+order, nil, "").Body, &o)
	if o.Units.Resold != got.Sold || o.Units.Resold+o.Units.Refunded+o.Units.Standing != 4 {
		t.Errorf("ann's order units %+v: want %d resold, resold+refunded+standing = 4", o.Units, got.Sold)
	}
	st := e.State(t, sku)
	// A resale moves sold tickets from the seller to the buyer.
	if st.Sold != 10-o.Units.Refunded || st.OrderUnits != st.Sold {
		t.Errorf("ledger %+v: want %d sold (10 - %d refunded), each in an order", st, 10-o.Units.Refunded, o.Units.Refunded)
	}
	systest.RedisConsistent(t, e, sku)
}

// TestAttackShedRefundAfterResaleUnits: ann buys 4 and lists 3, which
// others buy (settled by a withdrawal that finds the listing sold); her
// refund gives back the 1 left. Every answer that carries an order says
// where its tickets went (API.md, Orders and their money: began is what
// the order was sold, began = standing + resold + refunded + transferred):
// the refund's answer, and its replay's, must say what GET says.
func TestAttackShedRefundAfterResaleUnits(t *testing.T) {
	systest.FullTier(t)
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 4, 1, 4)
	order := systest.OrderID(e.MustBuy(t, sku, "ann-1", "ann", 4))
	r := e.Do(t, http.MethodPost, "/v1/orders/"+order+"/resale", map[string]string{"Idempotency-Key": "l1"}, `{"buyer":"ann","quantity":3}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("list = %d %s", r.Status, r.Body)
	}
	x := listingOfReply(r)
	for i := range 3 {
		e.MustBuy(t, sku, fmt.Sprintf("b-%d", i), fmt.Sprintf("b-%d", i), 1)
	}
	systest.WaitFor(t, 10*time.Second, "the listing to settle", func() bool {
		e.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w1", "ann")
		return listingOfReply(e.Do(t, http.MethodGet, "/v1/listings/"+x.ListingID, nil, "")).Sold == 3
	})
	type units struct{ Began, Standing, Resold, Refunded int64 }
	unitsOf := func(r systest.Reply) units {
		var o struct {
			Units units `json:"units"`
		}
		_ = json.Unmarshal(r.Body, &o)
		return o.Units
	}
	rf := e.Act(t, "/v1/orders/"+order+"/refund", "rf1", "ann")
	rf2 := e.Act(t, "/v1/orders/"+order+"/refund", "rf1", "ann")
	g := e.Do(t, http.MethodGet, "/v1/orders/"+order, nil, "")
	want := units{Began: 4, Resold: 3, Refunded: 1}
	if got := unitsOf(g); got != want {
		t.Errorf("GET ann's order: units %+v, want %+v", got, want)
	}
	for name, r := range map[string]systest.Reply{"refund": rf, "refund's replay": rf2} {
		if got := unitsOf(r); r.Status != http.StatusOK || got != want {
			t.Errorf("the %s of ann's order = %d, units %+v; want 200 and %+v (as GET says): %s", name, r.Status, got, want, r.Body)
		}
	}
	if st := e.State(t, sku); st.Sold != 3 || st.OrderUnits != 3 {
		t.Errorf("ledger %+v: want 3 sold (resold to 3 buyers), 1 refunded", st)
	}
	systest.RedisConsistent(t, e, sku)
}

// TestAttackShedBuyerCap: buyers under a per-buyer cap of 4 hold 2 and
// buy 1 of a ticket while pressure keeps its lane busy on a slow ledger
// (most shed, their counts given back). Sent again with their keys once
// the link is fast, each takes once; then each buyer gets exactly one
// more ticket (4 of 4), not two: a shed request neither leaks its count
// nor gives back one twice. Cancelled holds free their 2 again.
func TestAttackShedBuyerCap(t *testing.T) {
	systest.FullTier(t)
	e, link := slowEnv(t, nil)
	sku := systest.NewSKU(t)
	e.PutCapped(t, sku, 2, 4)
	const n = 8
	var ops []*shedOp
	for i := range n {
		buyer := fmt.Sprintf("cap-%d", i)
		ops = append(ops,
			&shedOp{name: "hold " + buyer, path: systest.SKUPath(sku) + "/holds", key: "h-" + buyer,
				body: fmt.Sprintf(`{"buyer":%q,"quantity":2}`, buyer), want: http.StatusCreated},
			&shedOp{name: "purchase " + buyer, path: systest.SKUPath(sku) + "/purchases", key: "p-" + buyer,
				body: fmt.Sprintf(`{"buyer":%q,"quantity":1}`, buyer), want: http.StatusCreated})
	}
	heal := slowSpell(t, link)
	pr, kinds := underPressure(t, e, sku, 4, ops)
	t.Logf("in the fault: %v", kinds)
	sold := pr.end(t, e, sku, heal) + 1
	retryAll(t, e, ops)
	for i := range n {
		buyer := fmt.Sprintf("cap-%d", i)
		if r := e.Buy(t, sku, "more-"+buyer, buyer, 1); r.Status != http.StatusCreated {
			t.Errorf("%s's fourth ticket = %d %s; want 201", buyer, r.Status, r.Body)
		}
		if r := e.Buy(t, sku, "over-"+buyer, buyer, 1); r.Status != http.StatusConflict || systest.ProblemKind(r) != "limit-reached" {
			t.Errorf("%s's fifth ticket = %d %s; want 409 limit-reached", buyer, r.Status, r.Body)
		}
		h, _ := e.Retried(t, http.MethodPost, ops[2*i].path, ops[2*i].key, ops[2*i].body)
		if c := e.Act(t, "/v1/holds/"+systest.ReplyID(h)+"/cancel", "x-"+buyer, buyer); c.Status != http.StatusOK {
			t.Errorf("cancel of %s's hold = %d %s", buyer, c.Status, c.Body)
		}
		if r := e.Buy(t, sku, "after-"+buyer, buyer, 2); r.Status != http.StatusCreated {
			t.Errorf("%s's 2 after the cancel = %d %s; want 201", buyer, r.Status, r.Body)
		}
	}
	if st := e.State(t, sku); st.Sold != int64(sold)+4*n || st.Held != 0 {
		t.Errorf("ledger %+v: want %d sold, none held", st, int64(sold)+4*n)
	}
	systest.RedisConsistent(t, e, sku)
}

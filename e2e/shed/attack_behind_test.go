package shed_test

// Attacks on shedBehind (sale/batcher.go, 63c1baa): a lane's timer
// refuses (503 overloaded, outcome unchanged, stock given back) what
// queued behind a flush that runs past the budget, while that flush still
// runs. The hung flush's own items are left to commit, or not, later. A
// client retries at once with the same key on another replica, whose
// link is well; after the fault both replicas must answer every key the
// same, each request must have moved its stock once, and Redis must
// equal the ledger.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// behindOp is one request of the attack: sent to the faulty replica, then
// at once to the other with the same key, then to both once well.
type behindOp struct {
	kind, name, path, key, body string
	q                           int64 // units it takes (a cart: of its first line)
	a, b                        systest.Reply
}

// behindPair is replica a, behind a link, and replica b on the same
// ledger directly; both at production's wait budget.
func behindPair(t *testing.T, tune func(o *app.Options)) (a, b *systest.Env, link *systest.Link) {
	t.Helper()
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	link, linked := systest.LedgerLink(t, dsn)
	opts := func(o *app.Options) {
		o.Sale.SettingsTTL = time.Minute // every request reaches the commit
		o.Sale.LedgerWaitBudget = 250 * time.Millisecond
		o.Sale.WorkTimeout = 2 * time.Second
		o.Sale.LatePayment = time.Minute
		if tune != nil {
			tune(o)
		}
	}
	a = systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: linked, Tune: opts})
	b = systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: opts})
	return a, b, link
}

// attackBehind sends ops to a, all at once, right after fault broke a's
// link; each answer is followed at once by the same request to b. Then
// the link heals and every op is sent again to both (retrying 503s): the
// two must agree, with any 2xx given before, as a replay.
func attackBehind(t *testing.T, a, b *systest.Env, fault, heal func(), ops []*behindOp) {
	t.Helper()
	fault()
	var wg sync.WaitGroup
	for _, op := range ops {
		wg.Go(func() {
			// An impatient client: it gives up on a after 300 ms (or its
			// answer) and sends the request to b, while a's copy may still
			// be in a flush that hangs, or commits late.
			done := make(chan struct{})
			go func() {
				defer close(done)
				op.a = a.Do(t, http.MethodPost, op.path, map[string]string{"Idempotency-Key": op.key}, op.body)
				check5xx(t, "A: "+op.name, op.a)
			}()
			select {
			case <-done:
			case <-time.After(300 * time.Millisecond): // time under test: a client's timeout
			}
			op.b = b.Do(t, http.MethodPost, op.path, map[string]string{"Idempotency-Key": op.key}, op.body)
			check5xx(t, "B: "+op.name, op.b)
			<-done
		})
	}
	wg.Wait()
	kinds := map[string]int{}
	for _, op := range ops {
		kinds[fmt.Sprintf("A %s %d %s %s", op.kind, op.a.Status, systest.ProblemKind(op.a), problemOutcome(op.a))]++
		kinds[fmt.Sprintf("B %s %d %s", op.kind, op.b.Status, systest.ProblemKind(op.b))]++
	}
	t.Logf("in the fault: %v", kinds)
	heal()
	for _, op := range ops {
		ra, _ := a.Retried(t, http.MethodPost, op.path, op.key, op.body)
		rb, _ := b.Retried(t, http.MethodPost, op.path, op.key, op.body)
		if ra.Status/100 != 2 || ra.Status != rb.Status || systest.ReplyID(ra) != systest.ReplyID(rb) {
			t.Errorf("%s once well: A = %d %s, B = %d %s; want the same 2xx", op.name, ra.Status, ra.Body, rb.Status, rb.Body)
		}
		for who, first := range map[string]systest.Reply{"A": op.a, "B": op.b} {
			if first.Status/100 == 2 && (first.Status != ra.Status || systest.ReplyID(first) != systest.ReplyID(ra)) {
				t.Errorf("%s: %s first answered %d %s, its retry %d %s: want the same", op.name, who, first.Status, first.Body, ra.Status, ra.Body)
			}
		}
		op.a = ra
	}
}

// TestAttackBehindCutRetriedElsewhere: a's link to PostgreSQL is
// black-holed while purchases, holds, confirms and carts of one SKU and
// one program queue behind the flush it hangs; each answer of a is
// followed at once by the same request on b, whose link is well, while
// a's flush still hangs. Once healed: every key answers the same on both,
// each moved its units once, Redis equals the ledger.
func TestAttackBehindCutRetriedElsewhere(t *testing.T) {
	systest.FullTier(t)
	a, b, link := behindPair(t, nil)
	runBehind(t, a, b, func() { link.Cut(t) }, func() { link.Heal(t) })
}

// TestAttackBehindSlowRetriedElsewhere: as the cut, with a's link 500 ms
// slower per round trip: a's hung flush commits later, while b is
// committing the same keys.
func TestAttackBehindSlowRetriedElsewhere(t *testing.T) {
	systest.FullTier(t)
	a, b, link := behindPair(t, func(o *app.Options) { o.Sale.WorkTimeout = 5 * time.Second })
	runBehind(t, a, b, func() { link.Latency(t, 150*time.Millisecond) }, func() { link.Heal(t) })
}

func runBehind(t *testing.T, a, b *systest.Env, fault, heal func()) {
	t.Helper()
	var once sync.Once
	healOnce := func() { once.Do(heal) }
	t.Cleanup(healOnce)
	sku := systest.NewSKU(t)
	a.PutSKU(t, sku, 200, 2, 4)
	p, cskus := systest.CartSKUs(t, a, [3]int64{100, 100, 100}, 0)
	const holds, buys, newHolds, carts, parts, cancels, lates = 8, 12, 6, 6, 4, 4, 4
	preHold := func(name string, n, ttl int) []string {
		ids := make([]string, n)
		for i := range ids {
			r, h := b.Hold(t, sku, fmt.Sprintf("pre-%s-%d", name, i), fmt.Sprintf("%s-%d", name, i), 2, ttl)
			if r.Status != http.StatusCreated {
				t.Fatalf("hold %s %d = %d %s", name, i, r.Status, r.Body)
			}
			ids[i] = h.HoldID
		}
		return ids
	}
	held := preHold("cb", holds, 600)
	partHeld := preHold("qb", parts, 600)
	cancelHeld := preHold("xb", cancels, 600)
	lateHeld := preHold("lb", lates, 1)
	time.Sleep(1100 * time.Millisecond) // time under test: the late holds' expiry passes (no sweeper runs)
	// Warm both: settings cached, lanes and connections used.
	for i, e := range []*systest.Env{a, b} {
		name := fmt.Sprintf("warm-%d", i)
		e.MustBuy(t, sku, name, "warm", 1)
		if r := e.Do(t, http.MethodPost, "/v1/programs/"+p.String()+"/carts", map[string]string{"Idempotency-Key": name + "-cart"},
			systest.CartBody("warm", map[string]int64{"adult": 1, "child": 1}, "adult", "child")); r.Status != http.StatusCreated {
			t.Fatalf("warm cart = %d %s", r.Status, r.Body)
		}
	}
	var ops []*behindOp
	for i := range buys {
		q := int64(1 + i%2)
		ops = append(ops, &behindOp{kind: "purchase", name: fmt.Sprintf("purchase %d", i), path: systest.SKUPath(sku) + "/purchases",
			key: fmt.Sprintf("p-%d", i), body: fmt.Sprintf(`{"buyer":"pb-%d","quantity":%d}`, i, q), q: q})
	}
	for i := range newHolds {
		ops = append(ops, &behindOp{kind: "hold", name: fmt.Sprintf("hold %d", i), path: systest.SKUPath(sku) + "/holds",
			key: fmt.Sprintf("h-%d", i), body: fmt.Sprintf(`{"buyer":"hb-%d","quantity":2,"ttl_seconds":600}`, i), q: 2})
	}
	for i, h := range held {
		ops = append(ops, &behindOp{kind: "confirm", name: "confirm " + h, path: "/v1/holds/" + h + "/confirm",
			key: fmt.Sprintf("c-%d", i), body: fmt.Sprintf(`{"buyer":"cb-%d"}`, i), q: 2})
	}
	for i, h := range partHeld {
		ops = append(ops, &behindOp{kind: "partial", name: "partial confirm " + h, path: "/v1/holds/" + h + "/confirm",
			key: fmt.Sprintf("q-%d", i), body: fmt.Sprintf(`{"buyer":"qb-%d","quantity":1}`, i), q: 1})
	}
	for i, h := range cancelHeld {
		ops = append(ops, &behindOp{kind: "cancel", name: "cancel " + h, path: "/v1/holds/" + h + "/cancel",
			key: fmt.Sprintf("x-%d", i), body: fmt.Sprintf(`{"buyer":"xb-%d"}`, i)})
	}
	for i, h := range lateHeld {
		ops = append(ops, &behindOp{kind: "late", name: "late payment " + h, path: "/v1/holds/" + h + "/confirm",
			key: fmt.Sprintf("l-%d", i), body: fmt.Sprintf(`{"buyer":"lb-%d"}`, i), q: 2})
	}
	for i := range carts {
		ops = append(ops, &behindOp{kind: "cart", name: fmt.Sprintf("cart %d", i), path: "/v1/programs/" + p.String() + "/carts",
			key: fmt.Sprintf("cart-%d", i), body: systest.CartBody(fmt.Sprintf("kb-%d", i), map[string]int64{"adult": 2, "child": 1}, "adult", "child"), q: 2})
	}
	attackBehind(t, a, b, fault, healOnce, ops)

	// What the ledger must hold: 2 warm purchases, the pre-holds (each
	// confirmed by its op), every purchase and hold once.
	var sold, hold int64 = 2, 0
	for _, op := range ops {
		switch op.kind {
		case "purchase", "confirm", "partial", "late":
			sold += op.q
		case "hold":
			hold += op.q
		}
	}
	if st := a.State(t, sku); st.Sold != sold || st.Held != hold || st.OrderUnits != st.Sold || st.Orders != 2+buys+holds+parts+lates {
		t.Errorf("ledger %+v: want %d sold in %d orders, %d held", st, sold, 2+buys+holds+parts+lates, hold)
	}
	for i, s := range cskus {
		want := []int64{2*carts + 2, carts + 2, 0}[i]
		if st := a.State(t, s); st.Sold != want || st.Held != 0 {
			t.Errorf("%s: ledger %+v; want %d sold, none held", s.Ticket, st, want)
		}
	}
	for _, s := range append([]stock.SKU{sku}, cskus...) {
		systest.RedisConsistent(t, a, s)
	}
	// Every hold op left one hold, held.
	for _, op := range ops {
		if op.kind != "hold" {
			continue
		}
		var h systest.HoldReply
		_ = json.Unmarshal(op.a.Body, &h)
		if st := holdState(t, b, h.HoldID); st != "held" {
			t.Errorf("%s: hold %s is %q, want held", op.name, h.HoldID, st)
		}
	}
}

// TestAttackBehindUnchangedWhileTwinCommits: one request, two copies.
// Both replicas' links are slow. The copy on a goes into a's flush, which
// commits it about a second later; the client, impatient, sends the same
// key to b, where it queues behind b's running flush (another buyer's)
// and is shed by the lane's timer at the budget (shedBehind). b took that
// copy's stock at the gate as a join of a's deduction (the line
// replayed), so it knows another attempt holds it and may yet commit: its
// 503 says outcome "unknown". It said "unchanged" ("nothing moved",
// API.md) before take.undo reported the shared deduction, and a then
// answered 201 for the same key: an answer that contradicted the ledger
// (DESIGN.md invariant 8).
func TestAttackBehindUnchangedWhileTwinCommits(t *testing.T) {
	systest.FullTier(t)
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	opts := func(o *app.Options) {
		o.Sale.SettingsTTL = time.Minute
		o.Sale.LedgerWaitBudget = 250 * time.Millisecond
		o.Sale.WorkTimeout = 5 * time.Second
	}
	// b's copy reads the ledger first (its line replayed: was it
	// committed?), a round trip on the slow link: b's other buyer comes
	// that much later, so that b's flush runs when the copy reaches its
	// lane.
	for n, lag := range []time.Duration{250 * time.Millisecond, 300 * time.Millisecond} {
		t.Run(fmt.Sprintf("lag-%v", lag), func(t *testing.T) {
			k := func(s string) string { return fmt.Sprintf("%s-%d", s, n) }
			// Fresh replicas: lanes that have not learned the slow flush
			// time, so b's door takes the copy and the lane's timer sheds it.
			la, dsnA := systest.LedgerLink(t, dsn)
			lb, dsnB := systest.LedgerLink(t, dsn)
			a := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsnA, Tune: opts})
			b := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsnB, Tune: opts})
			sku := systest.NewSKU(t)
			a.PutSKU(t, sku, 100, 2, 4)
			a.MustBuy(t, sku, k("warm-a"), "warm", 1)
			b.MustBuy(t, sku, k("warm-b"), "warm", 1)
			heal := func() { la.Heal(t); lb.Heal(t) }
			t.Cleanup(heal)
			la.Latency(t, 300*time.Millisecond) // a's commit takes seconds
			lb.Latency(t, 100*time.Millisecond)
			key, buyer := k("k"), "kb"
			var ra, rb, press systest.Reply
			var took time.Duration
			var wg sync.WaitGroup
			wg.Go(func() { ra = a.Buy(t, sku, key, buyer, 1) })
			time.Sleep(100 * time.Millisecond) // time under test: the client's impatience; a's copy is in its flush
			began := time.Now()
			wg.Go(func() {
				rb = b.Buy(t, sku, key, buyer, 1)
				took = time.Since(began)
			})
			time.Sleep(lag) // time under test: b's other buyer, so b's flush runs when the copy queues
			press = b.Buy(t, sku, k("press"), "press", 1)
			wg.Wait()
			heal()
			t.Logf("a %d %s %s; b %d %s %s after %v; b's other buyer %d", ra.Status, systest.ProblemKind(ra), problemOutcome(ra),
				rb.Status, systest.ProblemKind(rb), problemOutcome(rb), took.Round(time.Millisecond), press.Status)
			check5xx(t, "a", ra)
			check5xx(t, "b", rb)
			if ra.Status == http.StatusCreated && rb.Status >= 500 && problemOutcome(rb) == "unchanged" {
				t.Errorf("key %s answered 201 by a (order %s) and, %v after it was sent, 503 %s outcome unchanged by b: %s",
					key, systest.OrderID(ra), took.Round(time.Millisecond), systest.ProblemKind(rb), rb.Body)
			}
			r, _ := b.Retried(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", key, fmt.Sprintf(`{"buyer":%q,"quantity":1}`, buyer))
			if r.Status != http.StatusCreated || (ra.Status == http.StatusCreated && systest.OrderID(r) != systest.OrderID(ra)) {
				t.Errorf("%s sent again = %d %s", key, r.Status, r.Body)
			}
			b.Retried(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", k("press"), `{"buyer":"press","quantity":1}`)
			if st := a.State(t, sku); st.Sold != 4 || st.Orders != 4 {
				t.Errorf("ledger %+v: want 4 sold in 4 orders", st)
			}
			systest.RedisConsistent(t, a, sku)
		})
	}
}

// TestAttackBehindConfirmUnchangedWhileTwinCommits: as the purchase's
// twin, with a confirm: the copy on a commits a second later; the same
// key on b queues behind b's confirm flush of another hold of the SKU and
// is shed. Nothing on b can see a's copy (a confirm takes nothing at the
// gate), so a shed action of a hold or order says outcome "unknown"; it
// said "unchanged" though the hold was confirmed under that very key.
func TestAttackBehindConfirmUnchangedWhileTwinCommits(t *testing.T) {
	systest.FullTier(t)
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	la, dsnA := systest.LedgerLink(t, dsn)
	lb, dsnB := systest.LedgerLink(t, dsn)
	opts := func(o *app.Options) {
		o.Sale.SettingsTTL = time.Minute
		o.Sale.LedgerWaitBudget = 250 * time.Millisecond
		o.Sale.WorkTimeout = 5 * time.Second
	}
	a := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsnA, Tune: opts})
	b := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsnB, Tune: opts})
	sku := systest.NewSKU(t)
	a.PutSKU(t, sku, 100, 2, 4)
	var ids []string
	for i := range 4 {
		r, h := a.Hold(t, sku, fmt.Sprintf("h-%d", i), fmt.Sprintf("hb-%d", i), 2, 600)
		if r.Status != http.StatusCreated {
			t.Fatalf("hold %d = %d %s", i, r.Status, r.Body)
		}
		ids = append(ids, h.HoldID)
	}
	// Warm both replicas' confirm lanes.
	if r := a.Act(t, "/v1/holds/"+ids[2]+"/confirm", "c-2", "hb-2"); r.Status != http.StatusCreated {
		t.Fatalf("warm confirm = %d %s", r.Status, r.Body)
	}
	if r := b.Act(t, "/v1/holds/"+ids[3]+"/confirm", "c-3", "hb-3"); r.Status != http.StatusCreated {
		t.Fatalf("warm confirm = %d %s", r.Status, r.Body)
	}
	heal := func() { la.Heal(t); lb.Heal(t) }
	t.Cleanup(heal)
	// The other hold b confirms: a fresh one, so its flush runs on b.
	r, h := a.Hold(t, sku, "h-press", "press", 1, 600)
	if r.Status != http.StatusCreated {
		t.Fatalf("hold = %d %s", r.Status, r.Body)
	}
	la.Latency(t, 300*time.Millisecond)
	lb.Latency(t, 100*time.Millisecond)
	path := "/v1/holds/" + ids[0] + "/confirm"
	var ra, rb, press systest.Reply
	var took time.Duration
	var wg sync.WaitGroup
	wg.Go(func() { ra = a.Act(t, path, "c-0", "hb-0") })
	time.Sleep(100 * time.Millisecond) // time under test: a's copy is in its flush
	wg.Go(func() { press = b.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c-press", "press") })
	time.Sleep(100 * time.Millisecond) // time under test: b's flush of the other confirm has begun
	began := time.Now()
	rb = b.Act(t, path, "c-0", "hb-0")
	took = time.Since(began)
	wg.Wait()
	heal()
	t.Logf("a %d %s %s; b %d %s %s after %v; b's other confirm %d", ra.Status, systest.ProblemKind(ra), problemOutcome(ra),
		rb.Status, systest.ProblemKind(rb), problemOutcome(rb), took.Round(time.Millisecond), press.Status)
	check5xx(t, "a", ra)
	check5xx(t, "b", rb)
	if ra.Status == http.StatusCreated && rb.Status >= 500 && problemOutcome(rb) == "unchanged" {
		t.Errorf("confirm key c-0 answered 201 by a (order %s) and, %v after it was sent, 503 %s outcome unchanged by b: %s",
			systest.OrderID(ra), took.Round(time.Millisecond), systest.ProblemKind(rb), rb.Body)
	}
	again, _ := b.Retried(t, http.MethodPost, path, "c-0", `{"buyer":"hb-0"}`)
	if again.Status != http.StatusCreated || (ra.Status == http.StatusCreated && systest.OrderID(again) != systest.OrderID(ra)) {
		t.Errorf("c-0 sent again = %d %s", again.Status, again.Body)
	}
	b.Retried(t, http.MethodPost, "/v1/holds/"+h.HoldID+"/confirm", "c-press", `{"buyer":"press"}`)
	if st := a.State(t, sku); st.Sold != 2+2+2+1 || st.Held != 2 || st.Orders != 4 {
		t.Errorf("ledger %+v: want 7 sold in 4 orders, 2 held", st)
	}
	systest.RedisConsistent(t, a, sku)
}

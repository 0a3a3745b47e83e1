package waitroom_test

// Attacks on the door's stale answers (e6af8d7): a replica whose ledger
// link is slower than 50 ms per read answers a program's room from its
// last reload at once. A room turned on elsewhere must still be enforced
// (its notice makes the replica read it again, however slow), an
// admission must buy once across replicas, and a room turned off lets
// buyers in.

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
)

// TestAttackBehindDoorStaleOnASlowLink: b's link to PostgreSQL is 200 ms
// slower per round trip, so its door answers from memory. A room turned
// on through a: every new purchase on b without a token is refused
// (403), none sold around the room; ann's one admission, spent at once
// on a and on b under two keys, buys once; then the room is turned off
// through a and b sells without a token again. The ledger holds exactly
// the 201s and Redis equals it.
func TestAttackBehindDoorStaleOnASlowLink(t *testing.T) {
	systest.FullTier(t)
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	link, linked := systest.LedgerLink(t, dsn)
	a := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Pacer: true})
	b := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: linked})
	sku := systest.NewSKU(t)
	a.PutSKU(t, sku, 20, 2, 4)
	sold := 0
	if r := b.Buy(t, sku, "before", "eve", 1); r.Status != http.StatusCreated {
		t.Fatalf("a purchase before the room = %d %s", r.Status, r.Body)
	}
	sold++
	link.Latency(t, 100*time.Millisecond)
	t.Cleanup(func() { link.Heal(t) })
	// b's door, asked past its 1 s ttl, reloads slowly: it answers "no
	// room" from memory, and is slow for every program.
	time.Sleep(1100 * time.Millisecond) // time under test: past the door cache's ttl
	if r := b.Buy(t, sku, "stale", "eve", 1); r.Status != http.StatusCreated {
		t.Fatalf("a purchase on the slow replica before the room = %d %s", r.Status, r.Body)
	}
	sold++
	putQueue(t, a, sku.Program, qaRoom(0, 100, 60, "5"))
	// Until the room's notice reaches b (or its slow reload ends), b may
	// still sell without a token: a moment's lag, not a break. A probe
	// sold then counts as sold.
	probes := 0
	systest.WaitFor(t, 10*time.Second, "b's door to know the room", func() bool {
		probes++
		r := b.Buy(t, sku, fmt.Sprintf("probe-%d", probes), fmt.Sprintf("probe-%d", probes), 1)
		if r.Status == http.StatusCreated {
			sold++
		}
		return r.Status == http.StatusForbidden
	})
	var mu sync.Mutex
	var wg sync.WaitGroup
	got := map[int]int{}
	for i := range 30 {
		wg.Go(func() {
			r := b.Buy(t, sku, fmt.Sprintf("nt-%d", i), fmt.Sprintf("nt-%d", i), 1)
			mu.Lock()
			got[r.Status]++
			mu.Unlock()
			if r.Status/100 == 2 {
				t.Errorf("purchase nt-%d without a token on b after the room was turned on = %d %s", i, r.Status, r.Body)
			}
		})
		time.Sleep(50 * time.Millisecond) // time under test: purchases spread over the slow reloads
	}
	wg.Wait()
	t.Logf("without a token on b after the room: %v", got)
	ann := admitted(t, a, sku.Program, "ann")
	var ra, rb systest.Reply
	wg.Go(func() { ra = buyWith(t, a, sku, "ann-a", "ann", 1, ann.Admission) })
	wg.Go(func() { rb = buyWith(t, b, sku, "ann-b", "ann", 1, ann.Admission) })
	wg.Wait()
	link.Heal(t)
	t.Logf("ann's admission on a = %d %s; on b = %d %s", ra.Status, systest.ProblemKind(ra), rb.Status, systest.ProblemKind(rb))
	// Sent again as clients do, each key answers what it did: one order.
	fa, _ := a.Retried(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", "ann-a", `{"buyer":"ann","quantity":1}`)
	fb, _ := b.Retried(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", "ann-b", `{"buyer":"ann","quantity":1}`)
	ok := 0
	for _, r := range []systest.Reply{fa, fb} {
		if r.Status == http.StatusCreated {
			ok++
		}
	}
	if ok != 1 {
		t.Errorf("ann's one admission bought %d times: a %d %s, b %d %s", ok, fa.Status, fa.Body, fb.Status, fb.Body)
	}
	sold += ok
	if r := a.Do(t, http.MethodDelete, "/v1/admin/programs/"+sku.Program.String()+"/queue", nil, ""); r.Status != http.StatusNoContent {
		t.Fatalf("DELETE queue = %d %s", r.Status, r.Body)
	}
	systest.WaitFor(t, 10*time.Second, "b to sell without a token once the room is off", func() bool {
		return b.Buy(t, sku, "after", "eve", 1).Status == http.StatusCreated
	})
	sold++
	if st := a.State(t, sku); st.Sold != int64(sold) || st.Orders != int64(sold) {
		t.Errorf("ledger %+v: want %d sold in %d orders (the 201s)", st, sold, sold)
	}
	systest.RedisConsistent(t, a, sku)
}

// TestAttackBehindShedPurchaseKeepsTheAdmission: a queued program on a
// replica whose ledger link turned slow; admitted buyers buy on it at
// once, and the lane sheds some (503 overloaded, outcome "unchanged":
// nothing moved, API.md). The door settles a shed request as "unknown"
// (sale.movedNothing: an ErrBusy may still commit), so the buyer's
// admission stays spent by that request: told nothing moved, the buyer
// buys under a new key with the same admission once the link is fast,
// and is refused. Logged, not failed: the same key (what Retry-After asks
// for) still buys with it, and the buyer ends with one order either way.
func TestAttackBehindShedPurchaseKeepsTheAdmission(t *testing.T) {
	systest.FullTier(t)
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	link, linked := systest.LedgerLink(t, dsn)
	a := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Pacer: true})
	b := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: linked, Tune: func(o *app.Options) {
		o.Sale.SettingsTTL = time.Minute
		o.Sale.LedgerWaitBudget = 250 * time.Millisecond
		o.Sale.WorkTimeout = 5 * time.Second
	}})
	sku := systest.NewSKU(t)
	a.PutSKU(t, sku, 40, 2, 4)
	putQueue(t, a, sku.Program, qaRoom(0, 100, 60, "5"))
	const n = 10
	tokens := make([]string, n)
	for i := range n {
		tokens[i] = admitted(t, a, sku.Program, fmt.Sprintf("u-%d", i)).Admission
	}
	if r := buyWith(t, b, sku, "warm", "warm", 1, admitted(t, a, sku.Program, "warm").Admission); r.Status != http.StatusCreated {
		t.Fatalf("a purchase on b = %d %s", r.Status, r.Body)
	}
	sold := 1
	link.Latency(t, 100*time.Millisecond)
	t.Cleanup(func() { link.Heal(t) })
	first := make([]systest.Reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { first[i] = buyWith(t, b, sku, fmt.Sprintf("k1-%d", i), fmt.Sprintf("u-%d", i), 1, tokens[i]) })
		time.Sleep(40 * time.Millisecond) // time under test: arrivals spread over the slow flushes
	}
	wg.Wait()
	link.Heal(t)
	refused := 0
	for i, r := range first {
		buyer := fmt.Sprintf("u-%d", i)
		if r.Status == http.StatusCreated {
			sold++
			continue
		}
		if r.Status != http.StatusServiceUnavailable || systest.ProblemKind(r) != "overloaded" || outcomeOf(r) != "unchanged" {
			t.Logf("%s's purchase = %d %s %s", buyer, r.Status, systest.ProblemKind(r), outcomeOf(r))
			continue
		}
		again := buyWith(t, b, sku, fmt.Sprintf("k2-%d", i), buyer, 1, tokens[i])
		retry := buyWith(t, b, sku, fmt.Sprintf("k1-%d", i), buyer, 1, tokens[i])
		t.Logf("%s: 503 overloaded unchanged; then a new key with the admission = %d %s; the first key again = %d",
			buyer, again.Status, systest.ProblemKind(again), retry.Status)
		if again.Status != http.StatusCreated {
			refused++
		}
		ok := 0
		for _, x := range []systest.Reply{again, retry} {
			if x.Status == http.StatusCreated {
				ok++
			}
		}
		if ok != 1 {
			t.Errorf("%s's one admission bought %d times: new key %d %s, first key %d %s", buyer, ok, again.Status, again.Body, retry.Status, retry.Body)
		}
		sold += ok
	}
	if refused > 0 {
		t.Logf("%d buyers answered 503 outcome unchanged found their admission spent by that request (a new key refused)", refused)
	}
	if st := a.State(t, sku); st.Sold != int64(sold) || st.Orders != int64(sold) {
		t.Errorf("ledger %+v: want %d sold (the 201s)", st, sold)
	}
	systest.RedisConsistent(t, a, sku)
}

// outcomeOf is a 5xx problem's outcome ("unchanged" or "unknown").
func outcomeOf(r systest.Reply) string {
	var p struct {
		Outcome string `json:"outcome"`
	}
	_ = json.Unmarshal(r.Body, &p)
	return p.Outcome
}

package pools_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

func pools(t *testing.T, e *systest.Env, sku stock.SKU) map[string]systest.PoolReply {
	t.Helper()
	r := e.Do(t, http.MethodGet, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/pools", nil, "")
	if r.Status != http.StatusOK {
		t.Fatalf("GET pools = %d %s", r.Status, r.Body)
	}
	var v struct{ Pools []systest.PoolReply }
	if err := json.Unmarshal(r.Body, &v); err != nil {
		t.Fatal(err)
	}
	out := map[string]systest.PoolReply{}
	for _, p := range v.Pools {
		out[p.Pool] = p
	}
	return out
}

// buyIn buys from a pool (the public one for pool "").
func buyIn(t *testing.T, e *systest.Env, sku stock.SKU, pool, key, buyer string, q int64, extra string) systest.Reply {
	path := "/v1/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/purchases"
	if pool != "" {
		path += "?pool=" + pool
	}
	return e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": key}, fmt.Sprintf(`{"buyer":%q,"quantity":%d%s}`, buyer, q, extra))
}

// A presale pool closes while its buyers are still buying, on two
// replicas: what the pool sold plus what its close moved into the public
// pool is its allotment, no unit is sold twice (every row's sold equals
// its order rows, never over its total), the pool refuses buyers once
// closed, and the public pool, sold out before the close, sells the moved
// units on both replicas within a bounded time (measured), until exactly
// its own stock and the moved units are sold. Redis and the ledger agree
// on every pool at the end.
func TestPresaleClosesWhileBuying(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		fast := func(o *app.Options) { o.Sale.SweepEvery = 50 * time.Millisecond }
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: fast})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: fast})
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 300, 4, 2)
		a.PutPool(t, sku, "presale", `{"allotment":200,"shards":4}`)
		if got := pools(t, a, sku); got["public"].Allotment != 100 || got["presale"].Allotment != 200 {
			t.Fatalf("pools after the allotment: %+v", got)
		}
		// The public pool sells out first.
		counts := systest.BuyAll(150, 16, func(i int) systest.Reply {
			return buyIn(t, []*systest.Env{a, b}[i%2], sku, "", fmt.Sprintf("pub-%d", i), fmt.Sprintf("pb%d", i), 1, "")
		})
		if counts[http.StatusCreated] != 100 || counts[http.StatusConflict] != 50 {
			t.Fatalf("public before the close: %v, want 100 sold and 50 sold out", counts)
		}
		// Presale buyers buy on both replicas; the pool closes under them.
		var presaleSold atomic.Int64
		var closedSeen atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					e := []*systest.Env{a, b}[(w+i)%2]
					r := buyIn(t, e, sku, "presale", fmt.Sprintf("pre-%d-%d", w, i), fmt.Sprintf("fan%d-%d", w, i), 1, "")
					switch {
					case r.Status == http.StatusCreated:
						presaleSold.Add(1)
					case r.Status == http.StatusConflict && strings.Contains(string(r.Body), "pool-closed"):
						closedSeen.Add(1)
					case r.Status == http.StatusConflict && (strings.Contains(string(r.Body), "sale-ended") || strings.Contains(string(r.Body), "sold-out")):
						// Under the fence, or on a replica that has not yet
						// read the closed rule: the pool's gate is empty.
						closedSeen.Add(1)
					default:
						t.Errorf("presale purchase = %d %s", r.Status, r.Body)
						return
					}
					if closedSeen.Load() > 0 && i > 2 {
						return
					}
				}
			})
		}
		systest.WaitFor(t, 30*time.Second, "60 presale sales", func() bool { return presaleSold.Load() >= 60 })
		r := b.Do(t, http.MethodPost, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/pools/presale/close", nil, "")
		if r.Status != http.StatusOK {
			t.Fatalf("close = %d %s", r.Status, r.Body)
		}
		closedAt := time.Now()
		// The moved units are on sale in public, on both replicas, soon.
		var waited [2]time.Duration
		for k, e := range []*systest.Env{a, b} {
			for n := 0; ; n++ {
				r := buyIn(t, e, sku, "", fmt.Sprintf("moved-%d-%d", k, n), fmt.Sprintf("mv%d-%d", k, n), 1, "")
				if r.Status == http.StatusCreated {
					waited[k] = time.Since(closedAt)
					break
				}
				if r.Status != http.StatusConflict || time.Since(closedAt) > 10*time.Second {
					t.Fatalf("public after the close on replica %d = %d %s (%v after the close)", k, r.Status, r.Body, time.Since(closedAt))
				}
				time.Sleep(5 * time.Millisecond) // poll interval
			}
		}
		close(stop)
		wg.Wait()
		t.Logf("%s: presale sold %d before its close; public sold out until %v (replica a) and %v (replica b) after it",
			driver, presaleSold.Load(), waited[0], waited[1])
		if r := buyIn(t, b, sku, "presale", "late", "late", 1, ""); r.Status != http.StatusConflict || !strings.Contains(string(r.Body), "pool-closed") {
			t.Errorf("presale after its close = %d %s, want 409 pool-closed", r.Status, r.Body)
		}
		ps := pools(t, a, sku)
		moved := ps["public"].Allotment - 100
		if ps["presale"].Sold+moved != 200 || ps["presale"].Sold != presaleSold.Load() || ps["presale"].ClosedAt == "" {
			t.Errorf("presale sold %d (acknowledged %d) + moved %d, want 200 in all; %+v", ps["presale"].Sold, presaleSold.Load(), moved, ps)
		}
		// Public sells exactly its own 100 and the moved units.
		counts = systest.BuyAll(int(moved)+20, 16, func(i int) systest.Reply {
			return buyIn(t, []*systest.Env{a, b}[i%2], sku, "", fmt.Sprintf("pub2-%d", i), fmt.Sprintf("pc%d", i), 1, "")
		})
		if got := int64(counts[http.StatusCreated]) + 2; got != moved {
			t.Errorf("public after the close sold %d more (with the 2 probes), want the %d moved: %v", got, moved, counts)
		}
		ctx := context.Background()
		for _, p := range []keys.ID{{}, keys.MustID("presale")} {
			s := sku.InPool(p)
			got := a.State(t, s)
			st, _ := a.Ledger.SKU(ctx, s)
			if got.Sold > st.Total || got.OrderUnits != got.Sold {
				t.Errorf("%s: sold %d of %d, order units %d", s, got.Sold, st.Total, got.OrderUnits)
			}
			if got.RedisRemaining != st.Remaining() {
				t.Errorf("%s: Redis has %d left, the ledger %d", s, got.RedisRemaining, st.Remaining())
			}
		}
	})
}

// A pool with a closing time closes by itself (the sweepers of two
// replicas), moving what it has left once; one with an opening time
// refuses buyers before it; a channel pool sells only to requests with
// its credential; an unknown pool is a 404; and per-buyer caps count the
// ticket's units of every pool.
func TestPoolRules(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		fast := func(o *app.Options) { o.Sale.SweepEvery = 50 * time.Millisecond }
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: fast})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: fast})
		sku := systest.NewSKU(t)
		r := a.Do(t, http.MethodPut, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String(), nil, `{"total":100,"shards":2,"max_per_order":4,"per_buyer":3}`)
		if r.Status != http.StatusOK {
			t.Fatal(r.Status, string(r.Body))
		}
		later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
		a.PutPool(t, sku, "later", `{"allotment":10,"opens_at":"`+later+`"}`)
		a.PutPool(t, sku, "partner", `{"allotment":10,"access":"channel","channel_token":"partner-secret-0123456789"}`)
		if r := buyIn(t, a, sku, "later", "l1", "ann", 1, ""); r.Status != http.StatusConflict || !strings.Contains(string(r.Body), "pool-not-open") {
			t.Errorf("before the opening = %d %s, want 409 pool-not-open", r.Status, r.Body)
		}
		if r := buyIn(t, a, sku, "partner", "c1", "ann", 1, ""); r.Status != http.StatusForbidden || !strings.Contains(string(r.Body), "pool-access-denied") {
			t.Errorf("channel pool without a credential = %d %s, want 403", r.Status, r.Body)
		}
		if r := buyIn(t, a, sku, "partner", "c2", "ann", 1, `,"channel_token":"wrong-secret-0123456789"`); r.Status != http.StatusForbidden {
			t.Errorf("channel pool with a wrong credential = %d %s, want 403", r.Status, r.Body)
		}
		if r := buyIn(t, b, sku, "partner", "c3", "ann", 2, `,"channel_token":"partner-secret-0123456789"`); r.Status != http.StatusCreated {
			t.Errorf("channel pool with its credential = %d %s, want 201", r.Status, r.Body)
		}
		if r := buyIn(t, a, sku, "nope", "n1", "ann", 1, ""); r.Status != http.StatusNotFound || !strings.Contains(string(r.Body), "unknown-pool") {
			t.Errorf("unknown pool = %d %s, want 404 unknown-pool", r.Status, r.Body)
		}
		if r := buyIn(t, a, sku, "", "p1", "ann", 2, ""); r.Status != http.StatusConflict || !strings.Contains(string(r.Body), "limit-reached") {
			t.Errorf("2 more in public after 2 in a pool (cap 3) = %d %s, want 409 limit-reached", r.Status, r.Body)
		}
		if r := buyIn(t, a, sku, "public", "p2", "ann", 1, ""); r.Status != http.StatusCreated {
			t.Errorf("1 more in public (pool=public) = %d %s, want 201", r.Status, r.Body)
		}
		// A pool that closes in a moment: the sweepers move it, once.
		soon := time.Now().Add(300 * time.Millisecond).UTC().Format(time.RFC3339Nano)
		a.PutPool(t, sku, "flash", `{"allotment":20,"closes_at":"`+soon+`"}`)
		if r := buyIn(t, b, sku, "flash", "f1", "bob", 3, ""); r.Status != http.StatusCreated && !strings.Contains(string(r.Body), "pool-closed") {
			t.Errorf("flash pool = %d %s", r.Status, r.Body)
		}
		systest.WaitFor(t, 20*time.Second, "the flash pool to close by itself", func() bool { return pools(t, a, sku)["flash"].ClosedAt != "" })
		ps := pools(t, a, sku)
		if got := ps["public"].Allotment + ps["later"].Allotment + ps["partner"].Allotment + ps["flash"].Allotment; got != 100 {
			t.Errorf("allotments add up to %d, want the ticket's 100: %+v", got, ps)
		}
		if ps["flash"].Allotment != ps["flash"].Sold || ps["public"].Allotment != 100-10-10-ps["flash"].Sold {
			t.Errorf("after the flash close: %+v", ps)
		}
		var v struct{ Total, Sold, Remaining int64 }
		r = a.Do(t, http.MethodGet, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String(), nil, "")
		if err := json.Unmarshal(r.Body, &v); err != nil || v.Total != 100 || v.Sold != 3+ps["flash"].Sold {
			t.Errorf("the ticket as a whole = %s, want total 100 and every pool's sales", r.Body)
		}
	})
}

// What an attacker found, each refused or kept whole: a pool follows its
// ticket's settings at once; ending a ticket's sale ends its pools; a
// seated ticket has no pools and a ticket with pools takes no seat map;
// pool times before 1970, shards below 1, an unknown `into` and ?pool= on
// a cart are clear 422s; an unknown pool's stock and reconcile are
// unknown-pool; and a
// retry with another credential is another request (422).
func TestPoolAttacks(t *testing.T) {
	e := systest.New(t, ledger.SQLite)
	sku := systest.NewSKU(t)
	path := "/v1/admin/skus/" + sku.Program.String() + "/" + sku.Ticket.String()
	put := func(body string) {
		if r := e.Do(t, http.MethodPut, path, nil, body); r.Status != http.StatusOK {
			t.Fatalf("PUT sku = %d %s", r.Status, r.Body)
		}
	}
	put(`{"total":100,"shards":1,"max_per_order":10}`)
	e.PutPool(t, sku, "pre", `{"allotment":20}`)
	e.PutPool(t, sku, "chan", `{"allotment":5,"access":"channel","channel_token":"partner-secret-0123456789"}`)
	if r := buyIn(t, e, sku, "pre", "w1", "w1", 1, ""); r.Status != http.StatusCreated {
		t.Fatalf("warm = %d %s", r.Status, r.Body)
	}
	put(`{"total":100,"shards":1,"max_per_order":1}`)
	if r := buyIn(t, e, sku, "pre", "w2", "w2", 5, ""); r.Status != http.StatusUnprocessableEntity {
		t.Errorf("5 in a pool after max_per_order became 1 = %d %s, want 422", r.Status, r.Body)
	}
	for _, c := range []struct{ pool, body string }{
		{"old", `{"allotment":1,"closes_at":"1000-01-01T00:00:00Z"}`},
		{"epoch", `{"allotment":1,"closes_at":"1970-01-01T00:00:00Z"}`},
		{"neg", `{"allotment":1,"shards":-3}`},
		{"lost", `{"allotment":1,"into":"nowhere"}`},
		// Made closed: its allotment left the public stock and moved on
		// at once, and the id was spent for good (helper-69 #3).
		{"past", `{"allotment":1,"closes_at":"2020-01-01T00:00:00Z"}`},
	} {
		if r := e.Do(t, http.MethodPut, path+"/pools/"+c.pool, nil, c.body); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("PUT pool %s %s = %d %s, want 422", c.pool, c.body, r.Status, r.Body)
		}
	}
	if r := e.Do(t, http.MethodGet, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/stock?pool=nope", nil, ""); r.Status != http.StatusNotFound || !strings.Contains(string(r.Body), "unknown-pool") {
		t.Errorf("stock of an unknown pool = %d %s", r.Status, r.Body)
	}
	// ?pool= on a write of the whole ticket was ignored: "end" ended the
	// ticket and all its pools, a PUT reset the public ticket (helper-69 #2).
	for _, w := range []struct{ method, path, body string }{
		{http.MethodPost, path + "/end?pool=pre", ""},
		{http.MethodPut, path + "?pool=pre", `{"total":3,"shards":1}`},
		{http.MethodPost, path + "/seats/check?pool=pre", ""},
	} {
		if r := e.Do(t, w.method, w.path, nil, w.body); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("%s %s = %d %s, want 422", w.method, w.path, r.Status, r.Body)
		}
	}
	if r := e.Do(t, http.MethodGet, path, nil, ""); r.Status != http.StatusOK || strings.Contains(string(r.Body), `"ended":true`) || !strings.Contains(string(r.Body), `"total":100`) {
		t.Errorf("the ticket after refused pool writes = %d %s, want it whole and selling", r.Status, r.Body)
	}
	// A reconcile of an unknown pool said the ticket was unknown (helper-67 #10).
	if r := e.Do(t, http.MethodPost, path+"/reconcile?pool=nope", nil, ""); r.Status != http.StatusNotFound || systest.ProblemKind(r) != "unknown-pool" {
		t.Errorf("reconcile of an unknown pool = %d %s, want 404 unknown-pool", r.Status, r.Body)
	}
	if r := buyIn(t, e, sku, "chan", "c1", "cc", 1, `,"channel_token":"partner-secret-0123456789"`); r.Status != http.StatusCreated {
		t.Fatalf("channel purchase = %d %s", r.Status, r.Body)
	}
	if r := buyIn(t, e, sku, "chan", "c1", "cc", 1, `,"channel_token":"other-secret-0123456789"`); r.Status != http.StatusUnprocessableEntity {
		t.Errorf("the same key with another credential = %d %s, want 422", r.Status, r.Body)
	}
	if r := e.Do(t, http.MethodPost, "/v1/programs/"+sku.Program.String()+"/carts?pool=pre", map[string]string{"Idempotency-Key": "k"},
		`{"buyer":"x","lines":[{"ticket":"ga","quantity":1}]}`); r.Status != http.StatusUnprocessableEntity {
		t.Errorf("?pool= on a cart = %d %s, want 422", r.Status, r.Body)
	}
	if r := e.Do(t, http.MethodPut, path+"/seats", nil, `{"seats":[{"id":"A-01","section":"A","row":"A","number":1}]}`); r.Status != http.StatusConflict && r.Status != http.StatusUnprocessableEntity {
		t.Errorf("a seat map on a ticket with pools = %d %s, want a refusal", r.Status, r.Body)
	}
	if r := e.Do(t, http.MethodPost, path+"/end", nil, ""); r.Status != http.StatusOK {
		t.Fatalf("end = %d %s", r.Status, r.Body)
	}
	if r := buyIn(t, e, sku, "pre", "w3", "w3", 1, ""); r.Status != http.StatusConflict {
		t.Errorf("a pool of an ended ticket = %d %s, want 409", r.Status, r.Body)
	}
	if r := e.Do(t, http.MethodPut, path+"/pools/late", nil, `{"allotment":1}`); r.Status != http.StatusConflict {
		t.Errorf("a new pool of an ended ticket = %d %s, want 409", r.Status, r.Body)
	}
}

// A refused pool change changes nothing: a new pool asking more than the
// public stock has left is refused 409 total-below-committed and no pool
// is made (none listed, its stock unknown-pool, the public stock whole in
// the ledger and in Redis); an existing pool shrunk below what it sold,
// or grown past what the public stock has left, keeps its allotment and
// rule.
func TestPoolChangeRefusedChangesNothing(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 10, 1, 4)
		path := "/v1/admin/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/pools/"
		refused := func(pool, body string) {
			t.Helper()
			if r := e.Do(t, http.MethodPut, path+pool, nil, body); r.Status != http.StatusConflict || systest.ProblemKind(r) != "total-below-committed" {
				t.Fatalf("PUT pool %s %s = %d %s, want 409 total-below-committed", pool, body, r.Status, r.Body)
			}
		}
		refused("fans", `{"allotment":11}`)
		if ps := pools(t, e, sku); len(ps) != 1 || ps["public"].Allotment != 10 {
			t.Errorf("pools after a refused new pool: %+v, want the public pool of 10 alone", ps)
		}
		if r := buyIn(t, e, sku, "fans", "f1", "ann", 1, ""); r.Status != http.StatusNotFound || systest.ProblemKind(r) != "unknown-pool" {
			t.Errorf("a purchase in the refused pool = %d %s, want 404 unknown-pool", r.Status, r.Body)
		}
		if st := e.State(t, sku); st.Sold != 0 || st.RedisRemaining != 10 {
			t.Errorf("the public stock after a refused new pool: %+v, want 10 left in Redis", st)
		}
		e.PutPool(t, sku, "vip", `{"allotment":4,"access":"code"}`)
		code := addCodes(t, e, sku, "vip", 1, 3)[0]
		if r := buyIn(t, e, sku, "vip", "v1", "ann", 3, codeBody(code)); r.Status != http.StatusCreated {
			t.Fatalf("3 of vip = %d %s", r.Status, r.Body)
		}
		before := pools(t, e, sku)
		refused("vip", `{"allotment":2}`)
		refused("vip", `{"allotment":11}`)
		if diff := cmp.Diff(before, pools(t, e, sku)); diff != "" {
			t.Errorf("pools after refused changes of vip (-before +after):\n%s", diff)
		}
		if r := buyIn(t, e, sku, "vip", "v2", "bob", 1, ""); r.Status != http.StatusForbidden || systest.ProblemKind(r) != "pool-access-denied" && systest.ProblemKind(r) != "access-code-invalid" {
			t.Errorf("vip without its code after the refused changes = %d %s, want it still behind its code", r.Status, r.Body)
		}
		if r := e.Do(t, http.MethodPost, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/end", nil, ""); r.Status != http.StatusOK {
			t.Fatalf("end the sale = %d %s", r.Status, r.Body)
		}
		if r := e.Do(t, http.MethodPut, path+"late", nil, `{"allotment":1}`); r.Status != http.StatusConflict || systest.ProblemKind(r) != "sale-ended" {
			t.Errorf("a new pool of an ended ticket = %d %s, want 409 sale-ended", r.Status, r.Body)
		}
		if _, ok := pools(t, e, sku)["late"]; ok {
			t.Errorf("a pool refused for the ended sale is listed: %+v", pools(t, e, sku))
		}
	})
}

// Admins on two replicas create the same pool at once with allotments the
// public stock can and cannot give: the refused changes make nothing, the
// pool ends with one of the allotments answered 200, the ticket's pools
// add up to its total, and each gate shows what its ledger row has left.
// A pool every change of which is refused is never made.
func TestPoolCreatedConcurrently(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 10, 1, 4)
		path := "/v1/admin/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/pools/"
		var mu sync.Mutex
		granted := map[int64]bool{}
		var wg sync.WaitGroup
		for i, n := range []int64{11, 3, 12, 4, 13, 5, 14, 2} {
			for pool, n := range map[string]int64{"race": n, "never": n + 10} {
				wg.Go(func() {
					r := []*systest.Env{a, b}[i%2].Do(t, http.MethodPut, path+pool, nil, fmt.Sprintf(`{"allotment":%d}`, n))
					unchanged := strings.Contains(string(r.Body), "nothing changed") // the gates not closed within ReseedWait
					switch {
					case r.Status == http.StatusServiceUnavailable && unchanged:
					case (r.Status == http.StatusOK || r.Status == http.StatusServiceUnavailable) && pool == "race" && n <= 10:
						mu.Lock()
						granted[n] = true // a 503 here: changed, its gate rebuilt later
						mu.Unlock()
					case r.Status == http.StatusConflict && systest.ProblemKind(r) == "total-below-committed" && n > 10:
					default:
						t.Errorf("PUT pool %s allotment %d = %d %s", pool, n, r.Status, r.Body)
					}
				})
			}
		}
		wg.Wait()
		ps := pools(t, a, sku)
		if _, ok := ps["never"]; ok || !granted[ps["race"].Allotment] || len(ps) != 2 || ps["public"].Allotment+ps["race"].Allotment != 10 {
			t.Errorf("pools %+v after allotments %v granted, want race with one of them and public the rest", ps, granted)
		}
		for name, s := range map[string]stock.SKU{"public": sku, "race": sku.InPool(keys.MustID("race"))} {
			systest.WaitFor(t, 10*time.Second, name+"'s gate to show what its row has left", func() bool {
				return a.State(t, s).RedisRemaining == ps[name].Remaining
			})
		}
	})
}

// A partner's channel pool sells around the program's waiting room: the
// line leaves its stock out (it is the organizer's channel), and its
// buyers bring the channel credential, not an admission. It was 403
// admission-required, and once the public line sold out the line said
// sold-out, so the pool never sold (helper-109). Without the credential,
// with a wrong one, or from the public pool, a purchase still meets the
// door or the pool's rule.
func TestAChannelPoolSellsAroundTheWaitingRoom(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 10, 1, 4)
		e.PutPool(t, sku, "partner", `{"allotment":4,"access":"channel","channel_token":"partner-secret-0123456789"}`)
		if r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String()+"/queue", nil,
			`{"opens_in_seconds":0,"rate_per_second":100,"window_seconds":60,"per_remaining":1}`); r.Status != http.StatusOK {
			t.Fatalf("PUT queue = %d %s", r.Status, r.Body)
		}
		const token = `,"channel_token":"partner-secret-0123456789"`
		for _, c := range []struct {
			pool, key, extra string
			status           int
			kind             string
		}{
			{"partner", "c1", token, http.StatusCreated, ""},
			{"partner", "c2", "", http.StatusForbidden, "admission-required"},
			{"partner", "c3", `,"channel_token":"wrong-secret-0123456789"`, http.StatusForbidden, "pool-access-denied"},
			{"", "p1", token, http.StatusForbidden, "admission-required"},
		} {
			r := buyIn(t, e, sku, c.pool, c.key, "pat", 1, c.extra)
			if r.Status != c.status || c.kind != "" && systest.ProblemKind(r) != c.kind {
				t.Errorf("pool %q, key %s, credential %q: %d %s; want %d %s", c.pool, c.key, c.extra, r.Status, r.Body, c.status, c.kind)
			}
		}
		if r := buyIn(t, e, sku, "partner", "c1", "pat", 1, token); r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("the channel purchase again = %d %s (replayed %q), want its 201 replayed", r.Status, r.Body, r.Header.Get("Idempotent-Replayed"))
		}
	})
}

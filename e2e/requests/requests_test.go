package requests_test

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

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// Regression tests for the request model (issue 13): each finding of the
// review, through the HTTP API, on both ledgers.

// Finding 1: stock the ledger gives back after a rebuild reaches Redis.
// Hold 2 of 2, rebuild (each kind), then cancel, expire or refund: the next
// buyer gets the units, and Redis and the ledger agree.
func TestReturnAfterRebuildReachesRedis(t *testing.T) {
	rebuilds := map[string]func(t *testing.T, e *systest.Env, sku stock.SKU){
		"reconcile": func(t *testing.T, e *systest.Env, sku stock.SKU) {
			if r := e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/reconcile", nil, ""); r.Status != 200 {
				t.Fatalf("reconcile = %d %s", r.Status, r.Body)
			}
		},
		"restock": func(t *testing.T, e *systest.Env, sku stock.SKU) { e.PutSKU(t, sku, 3, 2, 4) },
		"resize":  func(t *testing.T, e *systest.Env, sku stock.SKU) { e.PutSKU(t, sku, 2, 4, 4) },
		"collapse": func(t *testing.T, e *systest.Env, sku stock.SKU) {
			if _, err := e.Sale.Collapse(context.Background(), sku); err != nil {
				t.Fatal(err)
			}
		},
	}
	returns := []string{"cancel", "refund", "expire"}
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.Start(t, systest.Options{Driver: driver, Sweep: true})
		for name, rebuild := range rebuilds {
			for _, ret := range returns {
				t.Run(name+"/"+ret, func(t *testing.T) {
					sku := systest.NewSKU(t)
					e.PutSKU(t, sku, 2, 2, 4)
					ttl := 0
					if ret == "expire" {
						ttl = 1
					}
					r, h := e.Hold(t, sku, sku.Program.String()+"-h", "ann", 2, ttl)
					if r.Status != 201 {
						t.Fatalf("hold = %d %s", r.Status, r.Body)
					}
					orderPath := ""
					if ret == "refund" {
						c := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", sku.Program.String()+"-c", "ann")
						if c.Status != 201 {
							t.Fatalf("confirm = %d %s", c.Status, c.Body)
						}
						orderPath = "/v1/orders/" + systest.OrderID(c)
					}
					rebuild(t, e, sku)
					switch ret {
					case "cancel":
						if c := e.Act(t, "/v1/holds/"+h.HoldID+"/cancel", sku.Program.String()+"-x", "ann"); c.Status != 200 {
							t.Fatalf("cancel = %d %s", c.Status, c.Body)
						}
					case "refund":
						if c := e.Act(t, orderPath+"/refund", sku.Program.String()+"-x", "ann"); c.Status != 200 {
							t.Fatalf("refund = %d %s", c.Status, c.Body)
						}
					case "expire":
						systest.WaitFor(t, 10e9, "the hold to expire", func() bool {
							st, _ := e.Ledger.SKU(context.Background(), sku)
							return st.Held == 0
						})
					}
					left := systest.Settled(t, e, sku)
					if left < 2 {
						t.Fatalf("ledger remaining %d after the return, want >= 2", left)
					}
					if b := e.Buy(t, sku, sku.Program.String()+"-n", "bob", 2); b.Status != 201 {
						t.Errorf("the next buyer of the returned units = %d %s, want 201", b.Status, b.Body)
					}
					systest.Settled(t, e, sku)
				})
			}
		}
	})
}

// Finding 2: the order key a confirm uses cannot be taken by a client.
func TestConfirmOrderKeyCannotBeTaken(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 10, 1, 4)
		r, h := e.Hold(t, sku, "h1", "ann", 2, 0)
		if r.Status != 201 {
			t.Fatalf("hold = %d %s", r.Status, r.Body)
		}
		for _, key := range []string{"hold-" + h.HoldID, "confirm-" + h.HoldID, h.HoldID} {
			if b := e.Buy(t, sku, key[:min(len(key), 64)], "mallory", 1); b.Status != 201 {
				t.Fatalf("purchase with key %s = %d %s", key, b.Status, b.Body)
			}
		}
		c := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c1", "ann")
		if c.Status != 201 {
			t.Fatalf("confirm = %d %s", c.Status, c.Body)
		}
		if g := e.Do(t, http.MethodGet, "/v1/orders/"+systest.OrderID(c), nil, ""); g.Status != 200 {
			t.Errorf("GET the confirmed order = %d %s, want 200", g.Status, g.Body)
		}
		got := e.State(t, sku)
		if got.Sold != 5 || got.Orders != 4 || got.OrderUnits != 5 {
			t.Errorf("state %+v, want sold 5 in 4 orders", got)
		}
	})
}

// Finding 3: a retry of a paid purchase is answered with its order from any
// replica: on a sold-out SKU, after a reconcile, after a restart (a new
// replica), after the end of the sale; a new key gets 409.
func TestRetryOfPaidPurchaseReplayedEverywhere(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn})
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 3, 2, 4)
		first := a.Buy(t, sku, "paid", "ann", 1)
		if first.Status != 201 {
			t.Fatalf("purchase = %d %s", first.Status, first.Body)
		}
		for i := range 2 {
			if r := b.Buy(t, sku, fmt.Sprintf("other-%d", i), "bob", 1); r.Status != 201 {
				t.Fatalf("purchase = %d %s", r.Status, r.Body)
			}
		}
		// Both replicas see the SKU sold out (and cache it).
		for _, e := range []*systest.Env{a, b} {
			if r := e.Buy(t, sku, "late", "cat", 1); r.Status != 409 {
				t.Fatalf("purchase of a sold-out SKU = %d %s", r.Status, r.Body)
			}
		}
		retry := func(what string, e *systest.Env) {
			t.Helper()
			r := e.Buy(t, sku, "paid", "ann", 1)
			if r.Status != 201 || systest.OrderID(r) != systest.OrderID(first) || r.Header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("%s: retry = %d %s (replayed %q), want 201 with order %s replayed",
					what, r.Status, r.Body, r.Header.Get("Idempotent-Replayed"), systest.OrderID(first))
			}
			if r := e.Buy(t, sku, "never-paid", "ann", 1); r.Status != 409 {
				t.Errorf("%s: a new key = %d %s, want 409", what, r.Status, r.Body)
			}
			// The storm's path refuses a key no buyer sold under before
			// reading the body (a body that is not even JSON); a key that
			// sold is always read, so its retry is never refused early.
			// The replica knows the sale is sold out for SoldOutTTL (500 ms)
			// after a refusal: on a busy machine the next request may come
			// later, so it is sent right after a refusal until it comes
			// within that time.
			path := "/v1/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/purchases"
			systest.WaitFor(t, 10*time.Second, what+": a new key with an unread body refused before it is read", func() bool {
				e.Buy(t, sku, "never-paid", "ann", 1)
				r = e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "never-paid-raw"}, "{not json")
				return r.Status == 409 || r.Status != 400
			})
			if r.Status != 409 {
				t.Errorf("%s: a new key with an unread body = %d %s, want 409 before the body is read", what, r.Status, r.Body)
			}
			if r := e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "paid"}, "{not json"); r.Status != 400 {
				t.Errorf("%s: a sold key with a bad body = %d %s, want 400 (its body read)", what, r.Status, r.Body)
			}
		}
		retry("sold out, same replica", a)
		retry("sold out, other replica", b)
		if r := a.Do(t, http.MethodPost, systest.AdminPath(sku)+"/reconcile", nil, ""); r.Status != 200 {
			t.Fatalf("reconcile = %d %s", r.Status, r.Body)
		}
		retry("after a reconcile", b)
		c := systest.Start(t, systest.Options{Driver: driver, DSN: dsn})
		retry("on a new replica", c)
		if r := a.Do(t, http.MethodPost, systest.AdminPath(sku)+"/end", nil, ""); r.Status != 200 {
			t.Fatalf("end = %d %s", r.Status, r.Body)
		}
		retry("after the end of the sale", b)
		got := a.State(t, sku)
		if got.Sold != 3 || got.Orders != 3 {
			t.Errorf("state %+v, want 3 sold in 3 orders", got)
		}
	})
}

// Finding 4: one key cannot move stock twice through two endpoints.
func TestKeyAcrossEndpoints(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 10, 2, 4)
		e.MustBuy(t, sku, "k", "ann", 1)
		if r, _ := e.Hold(t, sku, "k", "ann", 1, 0); r.Status != 422 {
			t.Errorf("hold with the purchase's key = %d %s, want 422", r.Status, r.Body)
		}
		if r, _ := e.Hold(t, sku, "k2", "ann", 1, 0); r.Status != 201 {
			t.Fatalf("hold = %d %s", r.Status, r.Body)
		}
		if r := e.Buy(t, sku, "k2", "ann", 1); r.Status != 422 {
			t.Errorf("purchase with the hold's key = %d %s, want 422", r.Status, r.Body)
		}
		if r := e.Buy(t, sku, "k", "ann", 2); r.Status != 422 {
			t.Errorf("purchase with the key and another quantity = %d %s, want 422", r.Status, r.Body)
		}
		// Another buyer's key is another request.
		if r := e.Buy(t, sku, "k", "bob", 1); r.Status != 201 {
			t.Errorf("another buyer's purchase with the same key = %d %s, want 201", r.Status, r.Body)
		}
		got := e.State(t, sku)
		if got.Sold != 2 || got.Held != 1 {
			t.Errorf("state %+v, want sold 2, held 1", got)
		}
		if left := systest.Settled(t, e, sku); left != 7 {
			t.Errorf("remaining %d, want 7", left)
		}
	})
}

// Finding 5: the same request sent to two replicas at once gives one order
// and leaves Redis exactly at the ledger's remaining.
func TestSameRequestTwoReplicasAtOnce(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 200, 1, 4)
		var wg sync.WaitGroup
		ids := make([][2]string, 50)
		for i := range 50 {
			for j, e := range []*systest.Env{a, b} {
				wg.Go(func() {
					r := e.Buy(t, sku, fmt.Sprintf("twice-%d", i), "ann", 2)
					if r.Status != 201 {
						t.Errorf("purchase = %d %s", r.Status, r.Body)
					}
					ids[i][j] = systest.OrderID(r)
				})
			}
		}
		wg.Wait()
		for i, p := range ids {
			if p[0] != p[1] {
				t.Errorf("request %d: replicas answered orders %s and %s", i, p[0], p[1])
			}
		}
		got := a.State(t, sku)
		if got.Orders != 50 || got.Sold != 100 {
			t.Errorf("state %+v, want 50 orders, sold 100", got)
		}
		if left := systest.Settled(t, a, sku); left != 100 {
			t.Errorf("remaining %d, want 100", left)
		}
	})
}

// Finding 6: a request refused for a reused key releases the per-buyer
// count it took.
func TestReusedKeyReleasesQuota(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutCapped(t, sku, 2, 3)
		e.MustBuy(t, sku, "k", "ann", 1)
		for i := range 5 {
			if r := e.Buy(t, sku, "k", "ann", 2); r.Status != 422 {
				t.Fatalf("reuse %d = %d %s, want 422", i, r.Status, r.Body)
			}
		}
		if r := e.Buy(t, sku, "k2", "ann", 2); r.Status != 201 {
			t.Errorf("a fitting purchase after the reused keys = %d %s, want 201 (count leaked)", r.Status, r.Body)
		}
		if r := e.Buy(t, sku, "k3", "ann", 1); r.Status != 409 {
			t.Errorf("a purchase over the cap = %d %s, want 409", r.Status, r.Body)
		}
	})
}

// Finding 7: a seat hold with a reused key takes no seats and blocks none.
func TestSeatHoldKeyReuseBlocksNothing(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 0, 1, 4)
		e.LoadSeats(t, sku, map[string]int{"A": 6})
		if r, _ := e.SeatHold(t, sku, "k", "ann", "A-01"); r.Status != 201 {
			t.Fatalf("seat hold = %d %s", r.Status, r.Body)
		}
		for _, seats := range [][]string{{"A-02"}, {"A-01", "A-03"}} {
			if r, _ := e.SeatHold(t, sku, "k", "ann", seats...); r.Status != 422 {
				t.Errorf("seat hold of %v with the used key = %d %s, want 422", seats, r.Status, r.Body)
			}
		}
		if r, _ := e.SeatHold(t, sku, "b1", "bob", "A-02", "A-03"); r.Status != 201 {
			t.Errorf("another buyer's hold of the seats the reused key asked for = %d %s, want 201", r.Status, r.Body)
		}
		if r, _ := e.SeatHold(t, sku, "b2", "bob", "A-01"); r.Status != 409 {
			t.Errorf("a hold of the first request's seat = %d %s, want 409", r.Status, r.Body)
		}
		var check sale.SeatCheck
		r := e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/seats/check", nil, "")
		if err := json.Unmarshal(r.Body, &check); err != nil || r.Status != 200 || len(check.Differed) != 0 {
			t.Errorf("seat check = %d %s, want Redis and the ledger to agree", r.Status, r.Body)
		}
	})
}

// Finding 11 (smaller ones).
func TestSmallerFindings(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		// A seat map for a SKU that does not exist: 404, not 503.
		r := e.Do(t, http.MethodPut, systest.AdminPath(sku)+"/seats", nil, `{"seats":[{"id":"A-1","section":"A","row":"A","number":1}]}`)
		if r.Status != 404 {
			t.Errorf("seat map before its SKU = %d %s, want 404", r.Status, r.Body)
		}
		e.PutSKU(t, sku, 10, 1, 4)
		// Duplicate member names are refused, not "last wins".
		r = e.Do(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", map[string]string{"Idempotency-Key": "dup"},
			`{"buyer":"ann","quantity":1,"quantity":4}`)
		if r.Status != 400 {
			t.Errorf("duplicate member names = %d %s, want 400", r.Status, r.Body)
		}
		// The quoted form of the draft's Idempotency-Key is the same key.
		r = e.Do(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", map[string]string{"Idempotency-Key": `"q1"`},
			`{"buyer":"ann","quantity":1}`)
		if r.Status != 201 {
			t.Fatalf("quoted key = %d %s, want 201", r.Status, r.Body)
		}
		again := e.Buy(t, sku, "q1", "ann", 1)
		if again.Status != 201 || systest.OrderID(again) != systest.OrderID(r) {
			t.Errorf("the unquoted key after the quoted one = %d %s, want the same order", again.Status, again.Body)
		}
		// Cancel of a confirmed hold is refused and moves nothing.
		_, h := e.Hold(t, sku, "h", "ann", 1, 0)
		if c := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c", "ann"); c.Status != 201 {
			t.Fatalf("confirm = %d %s", c.Status, c.Body)
		}
		if c := e.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "x", "ann"); c.Status != 409 {
			t.Errorf("cancel of a confirmed hold = %d %s, want 409", c.Status, c.Body)
		}
		if got := e.State(t, sku); got.Sold != 2 || got.Held != 0 {
			t.Errorf("state %+v, want sold 2 held 0", got)
		}
	})
}

// slowCommits holds the ledger commit of the purchase with key hold until
// released, after telling held that it got there.
type slowCommits struct {
	sale.Ledger
	key      string
	held     chan struct{}
	release  chan struct{}
	heldOnce sync.Once
}

func (l *slowCommits) wait(orders ...ledger.Order) {
	for _, o := range orders {
		if o.Req.Key.String() == l.key {
			l.heldOnce.Do(func() { close(l.held) })
			<-l.release
		}
	}
}

func (l *slowCommits) Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult {
	for _, t := range takes {
		l.wait(t.Orders...)
	}
	return l.Ledger.Commit(ctx, takes, direct)
}

// Finding 10: the fence waits for work, not for a timer. A purchase the
// gate admitted whose commit reaches the ledger only after a rebuild read
// the facts is refused as stale and taken again through the new gate: one
// order, and Redis exactly at the ledger's remaining (under the timer it
// committed against a gate rebuilt without it, and Redis was one ahead).
func TestCommitAfterRebuildIsTakenAgain(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		slow := &slowCommits{key: "late", held: make(chan struct{}), release: make(chan struct{})}
		e := systest.Start(t, systest.Options{Driver: driver, Tune: func(o *app.Options) {
			o.WrapLedger = func(l sale.Ledger) sale.Ledger { slow.Ledger = l; return slow }
		}})
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 10, 2, 4)
		done := make(chan systest.Reply, 1)
		go func() { done <- e.Buy(t, sku, "late", "ann", 2) }()
		<-slow.held // admitted by the gate, its commit not yet sent
		if r := e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/reconcile", nil, ""); r.Status != 200 {
			t.Fatalf("reconcile = %d %s", r.Status, r.Body)
		}
		close(slow.release)
		r := <-done
		if r.Status != 201 {
			t.Fatalf("the late purchase = %d %s, want 201", r.Status, r.Body)
		}
		got := e.State(t, sku)
		if got.Sold != 2 || got.Orders != 1 || got.RedisRemaining != 8 {
			t.Errorf("state %+v, want sold 2 in 1 order, Redis remaining 8", got)
		}
		if n := systest.Counter(t, e.Registry, "stockgate_reseeds_total", map[string]string{"reason": "stale"}); n != 0 {
			t.Logf("rebuilds for a stale gate: %v (the reconcile already built the new one)", n)
		}
	})
}

// A return on one replica reaches the others' memory through a restock
// notice: replica B, told sold out and remembering it for 10s, sells the
// returned unit at once, and a retry of that sale on B is replayed (not
// 409 until B's flag expires).
func TestRestockNoticeReachesOtherReplicas(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: func(o *app.Options) {
			o.Cache.SoldOutTTL = 10 * time.Second
		}})
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 1, 1, 4)
		r, h := a.Hold(t, sku, "h", "xena", 1, 0)
		if r.Status != 201 {
			t.Fatalf("hold = %d %s", r.Status, r.Body)
		}
		if r := b.Buy(t, sku, "y", "yuri", 1); r.Status != 409 {
			t.Fatalf("purchase of a sold-out SKU on B = %d %s, want 409", r.Status, r.Body)
		}
		if c := a.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c", "xena"); c.Status != 200 {
			t.Fatalf("cancel = %d %s", c.Status, c.Body)
		}
		start := time.Now()
		var won systest.Reply
		systest.WaitFor(t, 3*time.Second, "replica B to sell the returned unit", func() bool {
			won = b.Buy(t, sku, "z", "zoe", 1)
			return won.Status == 201
		})
		t.Logf("B sold the returned unit %v after the cancel on A (B's sold-out memory: 10s)", time.Since(start).Round(time.Millisecond))
		if r := b.Buy(t, sku, "z", "zoe", 1); r.Status != 201 || systest.OrderID(r) != systest.OrderID(won) {
			t.Errorf("retry on B = %d %s, want the replay of %s", r.Status, r.Body, systest.OrderID(won))
		}
	})
}

// Issue 43: a sold-out storm and a read flood cost Redis calls per change,
// not per unit of time. While the replica hears the restock notices, its
// sold-out flag stands past the TTL until a notice: the purchases and
// stock reads of a sold-out SKU, at one pace and then at half of it, make
// no Redis call for the SKU at all (one re-check at most, for a flag
// marked before the subscription was confirmed). With the TTL's flag
// alone, each phase re-checks every TTL: ten times each.
func TestSoldOutStormCallsRedisPerChange(t *testing.T) {
	const ttl = 100 * time.Millisecond
	e := systest.Start(t, systest.Options{Driver: ledger.SQLite, Tune: func(o *app.Options) { o.Cache.SoldOutTTL = ttl }})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 0, 4, 4)
	calls := &skuCalls{program: sku.Program.String()}
	e.Guarded.AddHook(calls)
	if r := e.Buy(t, sku, "warm", "w", 1); r.Status != http.StatusConflict {
		t.Fatalf("purchase at stock 0 = %d %s", r.Status, r.Body)
	}
	stockPath := "/v1/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/stock"
	phase := func(name string, every time.Duration, n int) int64 {
		before := calls.n.Load()
		for i := range n {
			if r := e.Buy(t, sku, fmt.Sprintf("%s-%d", name, i), "b", 1); r.Status != http.StatusConflict {
				t.Fatalf("%s: purchase %d = %d %s, want 409", name, i, r.Status, r.Body)
			}
			if r := e.Do(t, http.MethodGet, stockPath, nil, ""); r.Status != 200 || !strings.Contains(string(r.Body), `"sold_out":true`) {
				t.Fatalf("%s: stock read %d = %d %s, want sold out", name, i, r.Status, r.Body)
			}
			time.Sleep(every) // time under test: the requests' pace, ten TTLs a phase
		}
		return calls.n.Load() - before
	}
	full := phase("full", ttl/4, 40)
	half := phase("half", ttl/2, 20)
	t.Logf("Redis calls for the SKU: %d at the full pace (40 purchases, 40 reads), %d at half (20, 20)", full, half)
	// One re-check is one deduct script per shard.
	if full+half > 4 {
		t.Errorf("the storm made %d and %d Redis calls for a SKU nobody changed, want at most one re-check (4) in all", full, half)
	}
}

// A replica whose notices' connection dies does not trust its sold-out
// flags while it may have missed a notice, subscribes again, and trusts
// them again once it is back: the storm's re-checks stop, and a return on
// another replica reaches it through a notice, not its flag's max age.
func TestNoticesHeardAgainAfterTheirConnectionDies(t *testing.T) {
	const ttl = 100 * time.Millisecond
	dsn := systest.LedgerDSN(t, ledger.SQLite)
	a := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn})
	b := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Tune: func(o *app.Options) {
		o.Cache.SoldOutTTL, o.Cache.NoticeMaxAge = ttl, time.Minute
	}})
	sku := systest.NewSKU(t)
	a.PutSKU(t, sku, 1, 1, 4)
	r, h := a.Hold(t, sku, "h", "xena", 1, 0)
	if r.Status != 201 {
		t.Fatalf("hold = %d %s", r.Status, r.Body)
	}
	calls := &skuCalls{program: sku.Program.String()}
	b.Guarded.AddHook(calls)
	// Every subscriber's connection on every node, B's among them.
	err := b.Redis.ForEachShard(context.Background(), func(ctx context.Context, c *redis.Client) error {
		return c.ClientKillByFilter(ctx, "TYPE", "pubsub").Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	buy := func() {
		i++
		if r := b.Buy(t, sku, fmt.Sprintf("storm-%d", i), "b", 1); r.Status != http.StatusConflict {
			t.Fatalf("purchase %d on B = %d %s, want 409", i, r.Status, r.Body)
		}
	}
	// Back and trusted: ten TTLs of purchases without a Redis call.
	systest.WaitFor(t, 20*time.Second, "B's storm to cost no Redis call for ten TTLs", func() bool {
		before := calls.n.Load()
		for range 10 {
			buy()
			time.Sleep(ttl) // time under test: a TTL per purchase
		}
		return calls.n.Load() == before
	})
	if c := a.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c", "xena"); c.Status != 200 {
		t.Fatalf("cancel = %d %s", c.Status, c.Body)
	}
	systest.WaitFor(t, 5*time.Second, "B to sell the returned unit", func() bool {
		return b.Buy(t, sku, "z", "zoe", 1).Status == 201
	})
}

// skuCalls counts the Redis commands that name a program's keys.
type skuCalls struct {
	program string
	n       atomic.Int64
}

func (c *skuCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *skuCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}

func (c *skuCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *skuCalls) count(cmd redis.Cmder) {
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && strings.Contains(s, c.program) {
			c.n.Add(1)
			return
		}
	}
}

// Issue 43: a stock view changes per change, not per unit of time. Reads
// of a SKU nobody buys cost Redis one load in all (ten reads per
// StockTTL, for forty TTLs); a purchase on another replica reaches the
// reader's view by its change notice, within a few StockTTLs, not the
// view's max age.
func TestStockViewCallsRedisPerChange(t *testing.T) {
	const ttl = 50 * time.Millisecond
	dsn := systest.LedgerDSN(t, ledger.SQLite)
	a := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn})
	b := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Tune: func(o *app.Options) {
		o.Sale.StockTTL, o.Cache.NoticeMaxAge = ttl, time.Minute
	}})
	sku := systest.NewSKU(t)
	a.PutSKU(t, sku, 10, 4, 4)
	path := "/v1/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/stock"
	read := func() string {
		r := b.Do(t, http.MethodGet, path, nil, "")
		if r.Status != 200 {
			t.Fatalf("stock read = %d %s", r.Status, r.Body)
		}
		var st struct{ Remaining int64 }
		if err := json.Unmarshal(r.Body, &st); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(st.Remaining)
	}
	calls := &skuCalls{program: sku.Program.String()}
	b.Guarded.AddHook(calls)
	// Until a view is loaded while B's notices are heard (B just started).
	systest.WaitFor(t, 10*time.Second, "a view that stands for ten TTLs", func() bool {
		read()
		before := calls.n.Load()
		for range 20 {
			read()
			time.Sleep(ttl / 2) // time under test: two reads per TTL
		}
		return calls.n.Load() == before
	})
	before := calls.n.Load()
	for range 80 {
		if got := read(); got != "10" {
			t.Fatalf("stock view = %s, want 10", got)
		}
		time.Sleep(ttl / 2) // time under test: two reads per TTL, forty TTLs
	}
	if n := calls.n.Load() - before; n != 0 {
		t.Errorf("80 reads over 40 TTLs of a SKU nobody changed made %d Redis calls, want 0", n)
	}
	if r := a.Buy(t, sku, "k1", "ann", 1); r.Status != 201 {
		t.Fatalf("purchase on A = %d %s", r.Status, r.Body)
	}
	systest.WaitFor(t, 5*time.Second, "B's view to show A's sale", func() bool { return read() == "9" })
}

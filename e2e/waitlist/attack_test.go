package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// waitSettled waits for every restore to reach Redis, then checks that Redis
// and the ledger agree on sku.
func waitSettled(t *testing.T, e *env, sku stock.SKU) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, 10*time.Second, "pending restores to finish", func() bool {
		p, err := e.ledger.PendingRestores(ctx, 0, 1)
		return err == nil && len(p) == 0
	})
	redisConsistent(t, e, sku)
}

// A pool that closes moves its unsold stock into the public pool, whose
// line gets it first; what nobody in line takes is sold to the public, and
// Redis and the ledger agree.
func TestAttackWaitPoolCloseOffersPublicLine(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver)
		sku := newSKU(t)
		e.putSKU(t, sku, 4, 2, 2)
		e.putPool(t, sku, "fans", `{"allotment":2,"shards":1}`)
		e.mustBuy(t, sku, "p1", "pa", 2)
		if r, _ := e.join(t, sku, "w1", 1); r.status != http.StatusCreated {
			t.Fatalf("join = %d %s", r.status, r.body)
		}
		if r := e.do(t, http.MethodPost, adminPath(sku)+"/pools/fans/close", nil, ""); r.status != http.StatusOK {
			t.Fatalf("close = %d %s", r.status, r.body)
		}
		if w := e.entry(t, sku, "w1"); w.State != "offered" || w.Offer == nil {
			t.Fatalf("w1 after the close: %+v", w)
		}
		waitSettled(t, e, sku)
		if r := e.buy(t, sku, "p2", "pb", 1); r.status != http.StatusCreated {
			t.Errorf("the unit nobody waited for = %d %s", r.status, r.body)
		}
		if r := e.buy(t, sku, "p3", "pc", 1); r.status != http.StatusConflict {
			t.Errorf("the offered unit sold to the public = %d %s", r.status, r.body)
		}
		redisConsistent(t, e, sku)
	})
}

// An order bought from an offer is refunded with nobody in line: its unit
// goes back to Redis (once), also across a gate rebuild while the offer
// stood.
func TestAttackWaitRefundOfOfferOrder(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver)
		sku := newSKU(t)
		e.putSKU(t, sku, 2, 2, 2)
		_, h1 := e.hold(t, sku, "h1", "b1", 1, 60)
		e.mustBuy(t, sku, "o2", "b2", 1)
		if r, _ := e.join(t, sku, "w1", 1); r.status != http.StatusCreated {
			t.Fatalf("join = %d %s", r.status, r.body)
		}
		if r := e.act(t, "/v1/holds/"+h1.HoldID+"/cancel", "c1", "b1"); r.status != http.StatusOK {
			t.Fatalf("cancel = %d %s", r.status, r.body)
		}
		w := e.entry(t, sku, "w1")
		if w.State != "offered" {
			t.Fatalf("w1: %+v", w)
		}
		waitSettled(t, e, sku)
		// A rebuild while the offer stands.
		if r := e.do(t, http.MethodPost, adminPath(sku)+"/reconcile", nil, ""); r.status != http.StatusOK {
			t.Fatalf("reconcile = %d %s", r.status, r.body)
		}
		if r := e.do(t, http.MethodPut, adminPath(sku), nil, `{"total":2,"shards":3,"max_per_order":2}`); r.status != http.StatusOK {
			t.Fatalf("resize = %d %s", r.status, r.body)
		}
		c := e.act(t, "/v1/holds/"+w.Offer.HoldID+"/confirm", "k1", "w1")
		if c.status != http.StatusCreated {
			t.Fatalf("confirm offer = %d %s", c.status, c.body)
		}
		// Reused key on the confirm: the same order.
		if again := e.act(t, "/v1/holds/"+w.Offer.HoldID+"/confirm", "k1", "w1"); again.status != http.StatusCreated || orderID(again) != orderID(c) {
			t.Errorf("confirm again = %d %s", again.status, again.body)
		}
		if r := e.act(t, "/v1/orders/"+orderID(c)+"/refund", "r1", "w1"); r.status != http.StatusOK {
			t.Fatalf("refund = %d %s", r.status, r.body)
		}
		waitSettled(t, e, sku)
		if r := e.buy(t, sku, "p3", "pc", 1); r.status != http.StatusCreated {
			t.Errorf("the refunded unit = %d %s", r.status, r.body)
		}
		if r := e.buy(t, sku, "p4", "pd", 1); r.status != http.StatusConflict {
			t.Errorf("a unit too many = %d %s", r.status, r.body)
		}
		redisConsistent(t, e, sku)
	})
}

// The program's per-buyer cap: an entry over it can never be offered
// anything, so joining over it is refused like joining over the ticket's
// own cap (409 limit-reached), and no one is put in line.
func TestAttackWaitJoinOverProgramCap(t *testing.T) {
	e := newEnv(t, ledger.SQLite)
	sku := newSKU(t)
	e.putSKU(t, sku, 2, 1, 4)
	if r := e.do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String(), nil, `{"per_buyer":1}`); r.status != 200 {
		t.Fatalf("program cap = %d %s", r.status, r.body)
	}
	e.mustBuy(t, sku, "a", "a", 1)
	e.mustBuy(t, sku, "b", "b", 1)
	over, _ := e.join(t, sku, "w", 2)
	if over.status != http.StatusConflict || problemKind(over) != "limit-reached" {
		t.Errorf("join of 2 over the program's cap of 1 = %d %s, want 409 limit-reached", over.status, over.body)
	}
	if n, _ := e.ledger.WaitlistLength(context.Background(), sku); n != 0 {
		t.Errorf("%d in line, want 0", n)
	}
}

// The same buyer joins on two replicas at once, many times over: one
// entry, one 201.
func TestAttackWaitSameBuyerTwoReplicas(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		dsn := ledgerDSN(t, driver)
		a := startEnv(t, envOptions{driver: driver, dsn: dsn})
		b := startEnv(t, envOptions{driver: driver, dsn: dsn})
		sku := newSKU(t)
		a.putSKU(t, sku, 1, 1, 2)
		a.mustBuy(t, sku, "x", "x", 1)
		for round := range 10 {
			buyer := fmt.Sprintf("w%d", round)
			var mu sync.Mutex
			counts := map[int]int{}
			var wg sync.WaitGroup
			for i := range 6 {
				wg.Go(func() {
					r, _ := []*env{a, b}[i%2].join(t, sku, buyer, 1)
					mu.Lock()
					counts[r.status]++
					mu.Unlock()
				})
			}
			wg.Wait()
			if counts[http.StatusCreated] != 1 || counts[http.StatusOK] != 5 {
				t.Fatalf("%s joins: %v, want one 201 and five 200", buyer, counts)
			}
		}
		if n, _ := a.ledger.WaitlistLength(context.Background(), sku); n != 10 {
			t.Errorf("%d in line, want 10", n)
		}
	})
}

// Leaving races the offer that would go to the leaver; confirm races the
// offer's expiry. Whatever wins, no unit is lost or offered twice.
func TestAttackWaitLeaveRacesOffer(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		dsn := ledgerDSN(t, driver)
		tune := func(o *app.Options) {
			o.Sale.SweepEvery = 20 * time.Millisecond
			o.Sale.OfferTTL = time.Second
		}
		a := startEnv(t, envOptions{driver: driver, dsn: dsn, sweep: true, tune: tune})
		b := startEnv(t, envOptions{driver: driver, dsn: dsn, sweep: true, tune: tune})
		sku := newSKU(t)
		const n = 20
		a.putSKU(t, sku, n, 2, 2)
		var holds []holdReply
		for i := range n {
			_, h := a.hold(t, sku, fmt.Sprintf("h%d", i), fmt.Sprintf("b%d", i), 1, 60)
			holds = append(holds, h)
		}
		for i := range n {
			if r, _ := b.join(t, sku, fmt.Sprintf("w%d", i), 1); r.status != http.StatusCreated {
				t.Fatalf("join = %d %s", r.status, r.body)
			}
		}
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				a.act(t, "/v1/holds/"+holds[i].HoldID+"/cancel", fmt.Sprintf("c%d", i), fmt.Sprintf("b%d", i))
			})
			wg.Go(func() {
				r := b.do(t, http.MethodDelete, waitPath(sku, fmt.Sprintf("w%d", i)), nil, "")
				if r.status != http.StatusOK && r.status != http.StatusConflict {
					t.Errorf("leave = %d %s", r.status, r.body)
				}
			})
		}
		wg.Wait()
		// Confirms race the expiry of every live offer: each is sent as
		// its offer's own expiry comes up.
		for i := range n {
			w := a.entry(t, sku, fmt.Sprintf("w%d", i))
			if w.Offer != nil {
				wg.Go(func() {
					for time.Until(w.Offer.ExpiresAt) > 30*time.Millisecond {
						time.Sleep(5 * time.Millisecond)
					}
					r := []*env{a, b}[i%2].act(t, "/v1/holds/"+w.Offer.HoldID+"/confirm", "k", fmt.Sprintf("w%d", i))
					if r.status != http.StatusCreated && r.status != http.StatusGone && r.status != http.StatusConflict {
						t.Errorf("confirm = %d %s", r.status, r.body)
					}
				})
			}
		}
		wg.Wait()
		ctx := context.Background()
		waitFor(t, 10*time.Second, "every offer settled", func() bool {
			st, _ := a.ledger.SKU(ctx, sku)
			return st.Held == 0
		})
		offerEvents(t, a, sku.Program)
		waitSettled(t, a, sku)
	})
}

// A pool's line is for a pool open to all: a pool sold by code has no
// waitlist, since an offer would pass the rule by. A pool whose rule turns
// to "code" after buyers joined its line still offers its returns to them:
// the buyer without a code gets the pool's unit.
func TestAttackWaitPoolTurnsToCodeStillOffers(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver)
		sku := newSKU(t)
		e.putSKU(t, sku, 3, 1, 2)
		e.putPool(t, sku, "fans", `{"allotment":1,"shards":1}`)
		path := "/v1/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/holds?pool=fans"
		r := e.do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "h1"}, `{"buyer":"fan","quantity":1,"ttl_seconds":60}`)
		if r.status != http.StatusCreated {
			t.Fatalf("pool hold = %d %s", r.status, r.body)
		}
		var h holdReply
		_ = json.Unmarshal(r.body, &h)
		j := e.do(t, http.MethodPut, waitPath(sku, "w1")+"?pool=fans", nil, `{"quantity":1}`)
		if j.status != http.StatusCreated {
			t.Fatalf("join the pool's line = %d %s", j.status, j.body)
		}
		// The pool is now sold by code only.
		e.putPool(t, sku, "fans", `{"allotment":1,"shards":1,"access":"code"}`)
		if c := e.act(t, "/v1/holds/"+h.HoldID+"/cancel", "c1", "fan"); c.status != http.StatusOK {
			t.Fatalf("cancel = %d %s", c.status, c.body)
		}
		made, _ := offerEvents(t, e, sku.Program)
		if made["w1"] != 0 {
			t.Errorf("w1, with no code, was offered the unit of a pool sold by code: %v", made)
		}
		if st, _ := e.ledger.SKU(context.Background(), sku.InPool(keys.MustID("fans"))); st.Held != 0 {
			t.Errorf("the pool's unit is held (%+v), want it back in the pool for a buyer with a code", st)
		}
	})
}

// Holds expire into a line (offers lapse and pass on) while the admin
// rebuilds the gate again and again (reconcile, resize) and the public
// buys what the line does not take, on two replicas: never oversold, no
// offer twice, and Redis and the ledger agree once settled.
func TestAttackWaitOffersDuringRebuilds(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		dsn := ledgerDSN(t, driver)
		tune := func(o *app.Options) {
			o.Sale.SweepEvery = 30 * time.Millisecond
			o.Sale.OfferTTL = 700 * time.Millisecond
		}
		a := startEnv(t, envOptions{driver: driver, dsn: dsn, sweep: true, tune: tune})
		b := startEnv(t, envOptions{driver: driver, dsn: dsn, sweep: true, tune: tune})
		sku := newSKU(t)
		const total = 40
		a.putSKU(t, sku, total, 4, 2)
		for i := range total {
			// Held long enough for the 30 joins below to find the ticket sold
			// out on a busy machine (a 1 s hold lapsed first under -race).
			if r, _ := a.hold(t, sku, fmt.Sprintf("h%d", i), fmt.Sprintf("b%d", i), 1, 5); r.status != http.StatusCreated {
				t.Fatalf("hold = %d %s", r.status, r.body)
			}
		}
		for i := range 30 {
			if r, _ := b.join(t, sku, fmt.Sprintf("w%d", i), 1+int64(i%2)); r.status != http.StatusCreated {
				t.Fatalf("join = %d %s", r.status, r.body)
			}
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				e := []*env{a, b}[i%2]
				if i%3 == 0 {
					e.do(t, http.MethodPut, adminPath(sku), nil, fmt.Sprintf(`{"total":%d,"shards":%d,"max_per_order":2}`, total, 1+i%5))
				} else {
					e.do(t, http.MethodPost, adminPath(sku)+"/reconcile", nil, "")
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
		var sold sync.Map
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := []*env{a, b}[i%2].buy(t, sku, fmt.Sprintf("p%d", i), fmt.Sprintf("pub%d", i), 1)
				if r.status == http.StatusCreated {
					sold.Store(i, true)
				} else if r.status >= 500 {
					t.Errorf("purchase = %d %s", r.status, r.body)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
		ctx := context.Background()
		waitFor(t, 30*time.Second, "every offer lapsed", func() bool {
			st, _ := a.ledger.SKU(ctx, sku)
			n, _ := a.ledger.WaitlistLength(ctx, sku)
			return st.Held == 0 && (n == 0 || st.Sold == total)
		})
		close(stop)
		wg.Wait()
		st, _ := a.ledger.SKU(ctx, sku)
		if st.Sold+st.Held > st.Total {
			t.Fatalf("oversold: %+v", st)
		}
		offerEvents(t, a, sku.Program)
		waitSettled(t, a, sku)
		// What is left sells, and not one more.
		left := st.Remaining()
		counts := a.buyAll(int(left)+5, 4, func(i int) reply {
			return []*env{a, b}[i%2].buy(t, sku, fmt.Sprintf("end%d", i), fmt.Sprintf("end%d", i), 1)
		})
		if counts[http.StatusCreated] != int(left) {
			t.Errorf("after the sale: %v, want %d sold", counts, left)
		}
		redisConsistent(t, a, sku)
	})
}

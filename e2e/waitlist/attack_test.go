package waitlist_test

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
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// A pool that closes moves its unsold stock into the public pool, whose
// line gets it first; what nobody in line takes is sold to the public, and
// Redis and the ledger agree.
func TestAttackWaitPoolCloseOffersPublicLine(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 4, 2, 2)
		e.PutPool(t, sku, "fans", `{"allotment":2,"shards":1}`)
		e.MustBuy(t, sku, "p1", "pa", 2)
		if r, _ := e.Join(t, sku, "w1", 1); r.Status != http.StatusCreated {
			t.Fatalf("join = %d %s", r.Status, r.Body)
		}
		if r := e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/pools/fans/close", nil, ""); r.Status != http.StatusOK {
			t.Fatalf("close = %d %s", r.Status, r.Body)
		}
		if w := e.Entry(t, sku, "w1"); w.State != "offered" || w.Offer == nil {
			t.Fatalf("w1 after the close: %+v", w)
		}
		systest.WaitSettled(t, e, sku)
		if r := e.Buy(t, sku, "p2", "pb", 1); r.Status != http.StatusCreated {
			t.Errorf("the unit nobody waited for = %d %s", r.Status, r.Body)
		}
		if r := e.Buy(t, sku, "p3", "pc", 1); r.Status != http.StatusConflict {
			t.Errorf("the offered unit sold to the public = %d %s", r.Status, r.Body)
		}
		systest.RedisConsistent(t, e, sku)
	})
}

// An order bought from an offer is refunded with nobody in line: its unit
// goes back to Redis (once), also across a gate rebuild while the offer
// stood.
func TestAttackWaitRefundOfOfferOrder(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 2, 2, 2)
		_, h1 := e.Hold(t, sku, "h1", "b1", 1, 60)
		e.MustBuy(t, sku, "o2", "b2", 1)
		if r, _ := e.Join(t, sku, "w1", 1); r.Status != http.StatusCreated {
			t.Fatalf("join = %d %s", r.Status, r.Body)
		}
		if r := e.Act(t, "/v1/holds/"+h1.HoldID+"/cancel", "c1", "b1"); r.Status != http.StatusOK {
			t.Fatalf("cancel = %d %s", r.Status, r.Body)
		}
		w := e.Entry(t, sku, "w1")
		if w.State != "offered" {
			t.Fatalf("w1: %+v", w)
		}
		systest.WaitSettled(t, e, sku)
		// A rebuild while the offer stands.
		if r := e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/reconcile", nil, ""); r.Status != http.StatusOK {
			t.Fatalf("reconcile = %d %s", r.Status, r.Body)
		}
		if r := e.Do(t, http.MethodPut, systest.AdminPath(sku), nil, `{"total":2,"shards":3,"max_per_order":2}`); r.Status != http.StatusOK {
			t.Fatalf("resize = %d %s", r.Status, r.Body)
		}
		c := e.Act(t, "/v1/holds/"+w.Offer.HoldID+"/confirm", "k1", "w1")
		if c.Status != http.StatusCreated {
			t.Fatalf("confirm offer = %d %s", c.Status, c.Body)
		}
		// Reused key on the confirm: the same order.
		if again := e.Act(t, "/v1/holds/"+w.Offer.HoldID+"/confirm", "k1", "w1"); again.Status != http.StatusCreated || systest.OrderID(again) != systest.OrderID(c) {
			t.Errorf("confirm again = %d %s", again.Status, again.Body)
		}
		if r := e.Act(t, "/v1/orders/"+systest.OrderID(c)+"/refund", "r1", "w1"); r.Status != http.StatusOK {
			t.Fatalf("refund = %d %s", r.Status, r.Body)
		}
		systest.WaitSettled(t, e, sku)
		if r := e.Buy(t, sku, "p3", "pc", 1); r.Status != http.StatusCreated {
			t.Errorf("the refunded unit = %d %s", r.Status, r.Body)
		}
		if r := e.Buy(t, sku, "p4", "pd", 1); r.Status != http.StatusConflict {
			t.Errorf("a unit too many = %d %s", r.Status, r.Body)
		}
		systest.RedisConsistent(t, e, sku)
	})
}

// The program's per-buyer cap: an entry over it can never be offered
// anything, so joining over it is refused like joining over the ticket's
// own cap (409 limit-reached), and no one is put in line.
func TestAttackWaitJoinOverProgramCap(t *testing.T) {
	systest.FullTier(t)
	e := systest.New(t, ledger.SQLite)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 2, 1, 4)
	if r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String(), nil, `{"per_buyer":1}`); r.Status != 200 {
		t.Fatalf("program cap = %d %s", r.Status, r.Body)
	}
	e.MustBuy(t, sku, "a", "a", 1)
	e.MustBuy(t, sku, "b", "b", 1)
	over, _ := e.Join(t, sku, "w", 2)
	if over.Status != http.StatusConflict || systest.ProblemKind(over) != "limit-reached" {
		t.Errorf("join of 2 over the program's cap of 1 = %d %s, want 409 limit-reached", over.Status, over.Body)
	}
	if n, _ := e.Ledger.WaitlistLength(context.Background(), sku); n != 0 {
		t.Errorf("%d in line, want 0", n)
	}
}

// The same buyer joins on two replicas at once, many times over: one
// entry, one 201.
func TestAttackWaitSameBuyerTwoReplicas(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 1, 1, 2)
		a.MustBuy(t, sku, "x", "x", 1)
		for round := range 10 {
			buyer := fmt.Sprintf("w%d", round)
			var mu sync.Mutex
			counts := map[int]int{}
			var wg sync.WaitGroup
			for i := range 6 {
				wg.Go(func() {
					r, _ := []*systest.Env{a, b}[i%2].Join(t, sku, buyer, 1)
					mu.Lock()
					counts[r.Status]++
					mu.Unlock()
				})
			}
			wg.Wait()
			if counts[http.StatusCreated] != 1 || counts[http.StatusOK] != 5 {
				t.Fatalf("%s joins: %v, want one 201 and five 200", buyer, counts)
			}
		}
		if n, _ := a.Ledger.WaitlistLength(context.Background(), sku); n != 10 {
			t.Errorf("%d in line, want 10", n)
		}
	})
}

// Leaving races the offer that would go to the leaver; confirm races the
// offer's expiry. Whatever wins, no unit is lost or offered twice.
func TestAttackWaitLeaveRacesOffer(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		tune := func(o *app.Options) {
			o.Sale.SweepEvery = 20 * time.Millisecond
			o.Sale.OfferTTL = time.Second
		}
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: tune})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: tune})
		sku := systest.NewSKU(t)
		const n = 20
		a.PutSKU(t, sku, n, 2, 2)
		var holds []systest.HoldReply
		for i := range n {
			_, h := a.Hold(t, sku, fmt.Sprintf("h%d", i), fmt.Sprintf("b%d", i), 1, 60)
			holds = append(holds, h)
		}
		for i := range n {
			if r, _ := b.Join(t, sku, fmt.Sprintf("w%d", i), 1); r.Status != http.StatusCreated {
				t.Fatalf("join = %d %s", r.Status, r.Body)
			}
		}
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				a.Act(t, "/v1/holds/"+holds[i].HoldID+"/cancel", fmt.Sprintf("c%d", i), fmt.Sprintf("b%d", i))
			})
			wg.Go(func() {
				r := b.Do(t, http.MethodDelete, systest.WaitPath(sku, fmt.Sprintf("w%d", i)), nil, "")
				if r.Status != http.StatusOK && r.Status != http.StatusConflict {
					t.Errorf("leave = %d %s", r.Status, r.Body)
				}
			})
		}
		wg.Wait()
		// Confirms race the expiry of every live offer: each is sent as
		// its offer's own expiry comes up.
		for i := range n {
			w := a.Entry(t, sku, fmt.Sprintf("w%d", i))
			if w.Offer != nil {
				wg.Go(func() {
					for time.Until(w.Offer.ExpiresAt) > 30*time.Millisecond {
						time.Sleep(5 * time.Millisecond) // time under test: sent as the offer's expiry comes up
					}
					r := []*systest.Env{a, b}[i%2].Act(t, "/v1/holds/"+w.Offer.HoldID+"/confirm", "k", fmt.Sprintf("w%d", i))
					if r.Status != http.StatusCreated && r.Status != http.StatusGone && r.Status != http.StatusConflict {
						t.Errorf("confirm = %d %s", r.Status, r.Body)
					}
				})
			}
		}
		wg.Wait()
		ctx := context.Background()
		systest.WaitFor(t, 10*time.Second, "every offer settled", func() bool {
			st, _ := a.Ledger.SKU(ctx, sku)
			return st.Held == 0
		})
		offerEvents(t, a, sku.Program)
		systest.WaitSettled(t, a, sku)
	})
}

// A pool's line is for a pool open to all: a pool sold by code has no
// waitlist, since an offer would pass the rule by. A pool whose rule turns
// to "code" after buyers joined its line still offers its returns to them:
// the buyer without a code gets the pool's unit.
func TestAttackWaitPoolTurnsToCodeStillOffers(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 3, 1, 2)
		e.PutPool(t, sku, "fans", `{"allotment":1,"shards":1}`)
		path := "/v1/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/holds?pool=fans"
		r := e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "h1"}, `{"buyer":"fan","quantity":1,"ttl_seconds":60}`)
		if r.Status != http.StatusCreated {
			t.Fatalf("pool hold = %d %s", r.Status, r.Body)
		}
		var h systest.HoldReply
		_ = json.Unmarshal(r.Body, &h)
		j := e.Do(t, http.MethodPut, systest.WaitPath(sku, "w1")+"?pool=fans", nil, `{"quantity":1}`)
		if j.Status != http.StatusCreated {
			t.Fatalf("join the pool's line = %d %s", j.Status, j.Body)
		}
		// The pool is now sold by code only. w1's entry still reads (it
		// is closed, and keeps its place), which it did not: 403 for the
		// read and the leave alike, so a buyer could neither leave nor
		// find a live offer's hold (helper-68).
		e.PutPool(t, sku, "fans", `{"allotment":1,"shards":1,"access":"code"}`)
		if g := e.Do(t, http.MethodGet, systest.WaitPath(sku, "w1")+"?pool=fans", nil, ""); g.Status != http.StatusOK || !strings.Contains(string(g.Body), `"closed"`) {
			t.Errorf("w1's entry after the pool turned to code = %d %s, want 200, closed", g.Status, g.Body)
		}
		if c := e.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c1", "fan"); c.Status != http.StatusOK {
			t.Fatalf("cancel = %d %s", c.Status, c.Body)
		}
		made, _ := offerEvents(t, e, sku.Program)
		if made["w1"] != 0 {
			t.Errorf("w1, with no code, was offered the unit of a pool sold by code: %v", made)
		}
		if st, _ := e.Ledger.SKU(context.Background(), sku.InPool(keys.MustID("fans"))); st.Held != 0 {
			t.Errorf("the pool's unit is held (%+v), want it back in the pool for a buyer with a code", st)
		}
		if d := e.Do(t, http.MethodDelete, systest.WaitPath(sku, "w1")+"?pool=fans", nil, ""); d.Status != http.StatusOK {
			t.Errorf("w1 leaving the line of a pool turned to code = %d %s, want 200", d.Status, d.Body)
		}
	})
}

// Holds expire into a line (offers lapse and pass on) while the admin
// rebuilds the gate again and again (reconcile, resize) and the public
// buys what the line does not take, on two replicas: never oversold, no
// offer twice, and Redis and the ledger agree once settled.
func TestAttackWaitOffersDuringRebuilds(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		tune := func(o *app.Options) {
			o.Sale.SweepEvery = 30 * time.Millisecond
			o.Sale.OfferTTL = 700 * time.Millisecond
		}
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: tune})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: tune})
		sku := systest.NewSKU(t)
		const total = 40
		a.PutSKU(t, sku, total, 4, 2)
		for i := range total {
			// Held long enough for the 30 joins below to find the ticket sold
			// out on a busy machine (a 1 s hold lapsed first under -race).
			if r, _ := a.Hold(t, sku, fmt.Sprintf("h%d", i), fmt.Sprintf("b%d", i), 1, 5); r.Status != http.StatusCreated {
				t.Fatalf("hold = %d %s", r.Status, r.Body)
			}
		}
		for i := range 30 {
			if r, _ := b.Join(t, sku, fmt.Sprintf("w%d", i), 1+int64(i%2)); r.Status != http.StatusCreated {
				t.Fatalf("join = %d %s", r.Status, r.Body)
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
				e := []*systest.Env{a, b}[i%2]
				if i%3 == 0 {
					e.Do(t, http.MethodPut, systest.AdminPath(sku), nil, fmt.Sprintf(`{"total":%d,"shards":%d,"max_per_order":2}`, total, 1+i%5))
				} else {
					e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/reconcile", nil, "")
				}
				time.Sleep(20 * time.Millisecond) // time under test: the admin writes' pace
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
				r := []*systest.Env{a, b}[i%2].Buy(t, sku, fmt.Sprintf("p%d", i), fmt.Sprintf("pub%d", i), 1)
				if r.Status == http.StatusCreated {
					sold.Store(i, true)
				} else if r.Status >= 500 {
					t.Errorf("purchase = %d %s", r.Status, r.Body)
				}
				time.Sleep(10 * time.Millisecond) // time under test: the buyers' pace
			}
		})
		ctx := context.Background()
		systest.WaitFor(t, 30*time.Second, "every offer lapsed", func() bool {
			st, _ := a.Ledger.SKU(ctx, sku)
			n, _ := a.Ledger.WaitlistLength(ctx, sku)
			return st.Held == 0 && (n == 0 || st.Sold == total)
		})
		close(stop)
		wg.Wait()
		st, _ := a.Ledger.SKU(ctx, sku)
		if st.Sold+st.Held > st.Total {
			t.Fatalf("oversold: %+v", st)
		}
		offerEvents(t, a, sku.Program)
		systest.WaitSettled(t, a, sku)
		// What is left sells, and not one more.
		left := st.Remaining()
		counts := systest.BuyAll(int(left)+5, 4, func(i int) systest.Reply {
			return []*systest.Env{a, b}[i%2].Buy(t, sku, fmt.Sprintf("end%d", i), fmt.Sprintf("end%d", i), 1)
		})
		if counts[http.StatusCreated] != int(left) {
			t.Errorf("after the sale: %v, want %d sold", counts, left)
		}
		systest.RedisConsistent(t, a, sku)
	})
}

package requests_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// A retry of a committed seat hold (given seats) after the hold was
// cancelled is answered as a replay, but it first takes the seats again in
// Redis under the hold's owner id and never gives them back: the seats are
// free in the ledger and taken in the gate, so the next buyer of them is
// told they are taken (invariants 3 and 5; Redis and ledger disagree).
func TestAttackSeatHoldRetryAfterCancel(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 0, 1, 4)
		e.LoadSeats(t, sku, map[string]int{"A": 4})
		r, h := e.SeatHold(t, sku, "sh", "ann", "A-01", "A-02")
		if r.Status != 201 {
			t.Fatalf("seat hold = %d %s", r.Status, r.Body)
		}
		if c := e.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c1", "ann"); c.Status != 200 {
			t.Fatalf("cancel = %d %s", c.Status, c.Body)
		}
		// The client's retry of its original seat hold (a late network retry).
		again, h2 := e.SeatHold(t, sku, "sh", "ann", "A-01", "A-02")
		if again.Status != 201 || h2.HoldID != h.HoldID || again.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry = %d %s, want the replay of hold %s", again.Status, again.Body, h.HoldID)
		}
		// The ledger has both seats free: another buyer may hold them.
		if r, _ := e.SeatHold(t, sku, "b1", "bob", "A-01", "A-02"); r.Status != 201 {
			t.Errorf("another buyer's hold of the freed seats = %d %s, want 201 (the retry re-took them in Redis)", r.Status, r.Body)
		}
		var check sale.SeatCheck
		c := e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/seats/check", nil, "")
		if err := json.Unmarshal(c.Body, &check); err != nil || c.Status != 200 || len(check.Differed) != 0 {
			t.Errorf("seat check = %d %s, want Redis and the ledger to agree", c.Status, c.Body)
		}
	})
}

// The same after expiry and after a refund of the confirmed seat hold.
func TestAttackSeatHoldRetryAfterRefund(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 0, 1, 4)
		e.LoadSeats(t, sku, map[string]int{"A": 4})
		r, h := e.SeatHold(t, sku, "sh", "ann", "A-03")
		if r.Status != 201 {
			t.Fatalf("seat hold = %d %s", r.Status, r.Body)
		}
		c := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c1", "ann")
		if c.Status != 201 {
			t.Fatalf("confirm = %d %s", c.Status, c.Body)
		}
		if f := e.Act(t, "/v1/orders/"+systest.OrderID(c)+"/refund", "f1", "ann"); f.Status != 200 {
			t.Fatalf("refund = %d %s", f.Status, f.Body)
		}
		if again, _ := e.SeatHold(t, sku, "sh", "ann", "A-03"); again.Status != 201 {
			t.Errorf("retry = %d %s, want the replay", again.Status, again.Body)
		}
		if r, _ := e.SeatHold(t, sku, "b1", "bob", "A-03"); r.Status != 201 {
			t.Errorf("another buyer's hold of the refunded seat = %d %s, want 201", r.Status, r.Body)
		}
	})
}

// A retry of a committed purchase after its refund is replayed, but its
// per-buyer count is taken again in Redis (the refund released it) and
// never released: the buyer, who owns nothing in the ledger, is refused
// "limit reached" (invariant 3: the quota count moved twice for one
// request; the Redis gate disagrees with the ledger for good).
func TestAttackQuotaLeakRetryAfterRefund(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutCapped(t, sku, 2, 2)
		b := e.MustBuy(t, sku, "k1", "ann", 2)
		if f := e.Act(t, "/v1/orders/"+systest.OrderID(b)+"/refund", "f1", "ann"); f.Status != 200 {
			t.Fatalf("refund = %d %s", f.Status, f.Body)
		}
		if again := e.Buy(t, sku, "k1", "ann", 2); again.Status != 201 || systest.OrderID(again) != systest.OrderID(b) {
			t.Fatalf("retry = %d %s, want the replay", again.Status, again.Body)
		}
		units, _ := e.Ledger.BuyerUnits(context.Background(), sku, keys.MustID("ann"))
		if r := e.Buy(t, sku, "k2", "ann", 2); r.Status != 201 {
			t.Errorf("purchase of 2 by a buyer owning %d of a cap of 2 = %d %s, want 201 (quota count leaked)", units, r.Status, r.Body)
		}
	})
}

// The same with a hold: hold, cancel, retry of the hold.
func TestAttackQuotaLeakRetryAfterCancel(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutCapped(t, sku, 1, 1)
		r, h := e.Hold(t, sku, "h1", "ann", 1, 0)
		if r.Status != 201 {
			t.Fatalf("hold = %d %s", r.Status, r.Body)
		}
		if c := e.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c1", "ann"); c.Status != 200 {
			t.Fatalf("cancel = %d %s", c.Status, c.Body)
		}
		if again, _ := e.Hold(t, sku, "h1", "ann", 1, 0); again.Status != 201 {
			t.Fatalf("retry = %d %s, want the replay", again.Status, again.Body)
		}
		if r := e.Buy(t, sku, "k2", "ann", 1); r.Status != 201 {
			t.Errorf("purchase by a buyer owning nothing = %d %s, want 201 (quota count leaked)", r.Status, r.Body)
		}
	})
}

// A key the buyer used for a purchase of another SKU, sent to a sold-out
// (or ended) SKU with another body: that SKU answers its refusal from
// memory (its committed-key set is per SKU, so a reuse from elsewhere is
// not seen there), 409 rather than 422. This is the price of refusing a
// storm without a ledger call per request, and it is documented; what must
// hold is that nothing moves, and that the same reuse on a SKU that still
// sells gets 422.
func TestAttackReusedKeyOnClosedSKU(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		open, closed, ended := systest.NewSKU(t), systest.NewSKU(t), systest.NewSKU(t)
		closed.Ticket, ended.Ticket = keys.MustID("sold"), keys.MustID("ended")
		e.PutSKU(t, open, 10, 1, 4)
		e.PutSKU(t, closed, 1, 1, 4)
		e.PutSKU(t, ended, 5, 1, 4)
		e.MustBuy(t, open, "k", "ann", 1)
		e.MustBuy(t, closed, "other", "bob", 1)
		if r := e.Do(t, http.MethodPost, systest.AdminPath(ended)+"/end", nil, ""); r.Status != 200 {
			t.Fatalf("end = %d %s", r.Status, r.Body)
		}
		before := map[stock.SKU]systest.State{}
		for _, sku := range []stock.SKU{open, closed, ended} {
			before[sku] = e.State(t, sku)
		}
		for _, sku := range []stock.SKU{closed, ended} {
			if r := e.Buy(t, sku, "k", "ann", 1); r.Status != 422 && r.Status != 409 {
				t.Errorf("%s: key used for another request = %d %s, want 422 or the SKU's 409", sku, r.Status, r.Body)
			}
		}
		if r := e.Buy(t, open, "k", "ann", 2); r.Status != 422 {
			t.Errorf("the key with another body on a SKU that sells = %d %s, want 422", r.Status, r.Body)
		}
		// What the headers alone show wrong is told before the sold-out
		// (helper-69 #1): it costs no more than the 409 (API.md).
		for _, sku := range []stock.SKU{closed, ended} {
			path := systest.SKUPath(sku) + "/purchases"
			if r := e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "t1", "Content-Type": "text/plain"},
				`{"buyer":"ann","quantity":1}`); r.Status != http.StatusUnsupportedMediaType {
				t.Errorf("%s: a text/plain body = %d %s, want 415", sku, r.Status, r.Body)
			}
			if r := e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "t2"},
				`{"buyer":"ann","quantity":1,"x":"`+strings.Repeat("a", 5000)+`"}`); r.Status != http.StatusRequestEntityTooLarge {
				t.Errorf("%s: a body over the limit = %d %s, want 413", sku, r.Status, r.Body)
			}
		}
		for sku, st := range before {
			if got := e.State(t, sku); got.Sold != st.Sold || got.Held != st.Held || got.Orders != st.Orders {
				t.Errorf("%s moved: %+v, was %+v", sku, got, st)
			}
		}
	})
}

// Replica B seals its committed-key set of a SKU while it is sold out (a
// hold has the last unit). The hold is cancelled on A and the unit bought
// on A. B still remembers the SKU as sold out and answers from memory until
// its flag's next re-check (at most 2 × the sold-out TTL, 500ms by
// default): the buyer's retry on B must get its order within that bound.
func TestAttackSealedReplaysMissRetry(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 1, 1, 4)
		r, h := a.Hold(t, sku, "x", "xena", 1, 0)
		if r.Status != 201 {
			t.Fatalf("hold = %d %s", r.Status, r.Body)
		}
		if r := b.Buy(t, sku, "y", "yuri", 1); r.Status != 409 {
			t.Fatalf("purchase on a sold-out SKU = %d %s, want 409", r.Status, r.Body)
		}
		if c := a.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c", "xena"); c.Status != 200 {
			t.Fatalf("cancel = %d %s", c.Status, c.Body)
		}
		won := a.Buy(t, sku, "z", "zoe", 1)
		if won.Status != 201 {
			t.Fatalf("purchase of the returned unit = %d %s", won.Status, won.Body)
		}
		start := time.Now()
		for {
			retry := b.Buy(t, sku, "z", "zoe", 1)
			if retry.Status == 201 && systest.OrderID(retry) == systest.OrderID(won) {
				t.Logf("retry on replica B answered with its order after %v", time.Since(start).Round(time.Millisecond))
				break
			}
			if retry.Status != 409 || time.Since(start) > 1500*time.Millisecond {
				t.Fatalf("retry on replica B = %d %s after %v, want 201 with order %s within 2 × the sold-out TTL",
					retry.Status, retry.Body, time.Since(start), systest.OrderID(won))
			}
			time.Sleep(20 * time.Millisecond) // poll interval
		}
	})
}

// Retries racing their originals on other replicas while the gate is
// rebuilt between take and commit: one movement per request, Redis ends
// at the ledger's remaining.
func TestAttackRetriesRaceRebuilds(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		var envs []*systest.Env
		for range 3 {
			envs = append(envs, systest.Start(t, systest.Options{Driver: driver, DSN: dsn}))
		}
		sku := systest.NewSKU(t)
		envs[0].PutSKU(t, sku, 60, 4, 4)
		var wg sync.WaitGroup
		var mu sync.Mutex
		ids := map[int]map[string]bool{}
		falseRefusals := 0
		answers := map[int][]string{}
		stop := make(chan struct{})
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				e := envs[i%3]
				switch i % 3 {
				case 0:
					e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/reconcile", nil, "")
				case 1:
					e.Do(t, http.MethodPut, systest.AdminPath(sku), nil, fmt.Sprintf(`{"total":60,"shards":%d,"max_per_order":4}`, 1+i%5))
				case 2:
					e.Do(t, http.MethodPut, systest.AdminPath(sku), nil, `{"total":60,"shards":4,"max_per_order":4}`)
				}
			}
		})
		var buyers sync.WaitGroup
		for i := range 30 {
			for j := range 3 {
				buyers.Go(func() {
					r := envs[j].Buy(t, sku, fmt.Sprintf("r-%d", i), fmt.Sprintf("b%d", i), 2)
					mu.Lock()
					defer mu.Unlock()
					if ids[i] == nil {
						ids[i] = map[string]bool{}
					}
					switch r.Status {
					case 201:
						ids[i][systest.OrderID(r)] = true
					case 409, 503:
						answers[i] = append(answers[i], fmt.Sprintf("replica %d: %d %s", j, r.Status, r.Body))
						falseRefusals++ // the ledger had stock for every request: sent again below
					default:
						t.Errorf("purchase %d on %d = %d %s", i, j, r.Status, r.Body)
					}
				})
			}
		}
		buyers.Wait()
		close(stop)
		wg.Wait()
		t.Logf("%d refusals (409/503) while every request had stock in the ledger", falseRefusals)
		for i := range 30 {
			var r systest.Reply
			systest.WaitFor(t, 5*time.Second, fmt.Sprintf("201 for request %d", i), func() bool {
				r = envs[i%3].Buy(t, sku, fmt.Sprintf("r-%d", i), fmt.Sprintf("b%d", i), 2)
				return r.Status == 201
			})
			ids[i][systest.OrderID(r)] = true
			if len(ids[i]) != 1 {
				t.Errorf("request %d answered orders %v", i, ids[i])
			}
			if len(answers[i]) > 0 && len(ids[i]) == 1 {
				t.Logf("request %d: copies answered %v and 201", i, answers[i])
			}
		}
		got := envs[0].State(t, sku)
		if got.Sold != 60 || got.Orders != 30 {
			t.Errorf("state %+v, want 30 orders, sold 60", got)
		}
		if left := systest.Settled(t, envs[0], sku); left != 0 {
			t.Errorf("remaining %d, want 0", left)
		}
	})
}

// An ended sale's gate is rebuilt with 0 left while the ledger row still
// has units (the sale ended with stock, or stock came back after the end):
// the drift check sees a difference that never goes away and "repairs"
// it with a rebuild every second check, for ever.
func TestAttackEndedSKUDriftLoop(t *testing.T) {
	systest.FullTier(t)
	e := systest.Start(t, systest.Options{Driver: ledger.SQLite, Drift: true})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 5, 1, 4)
	if r := e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/end", nil, ""); r.Status != 200 {
		t.Fatalf("end = %d %s", r.Status, r.Body)
	}
	before := systest.Counter(t, e.Registry, "stockgate_reseeds_total", map[string]string{"reason": "drift"})
	deadline := time.Now().Add(1500 * time.Millisecond)
	systest.WaitFor(t, 3*time.Second, "1.5s of drift checks", func() bool { return time.Now().After(deadline) })
	if n := systest.Counter(t, e.Registry, "stockgate_reseeds_total", map[string]string{"reason": "drift"}) - before; n != 0 {
		t.Errorf("%v drift rebuilds of an ended SKU in 1.5s, want 0", n)
	}
}

// Held: a best-available seat hold retried after its cancel is answered
// from the ledger and takes nothing.
func TestAttackBestSeatsRetryAfterCancel(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 0, 1, 4)
		e.LoadSeats(t, sku, map[string]int{"A": 4})
		best := func(key, buyer string) (systest.Reply, systest.HoldReply) {
			r := e.Do(t, http.MethodPost, systest.SKUPath(sku)+"/seat-holds", map[string]string{"Idempotency-Key": key},
				fmt.Sprintf(`{"buyer":%q,"quantity":2,"section":"A"}`, buyer))
			var h systest.HoldReply
			_ = json.Unmarshal(r.Body, &h)
			return r, h
		}
		r, h := best("b", "ann")
		if r.Status != 201 {
			t.Fatalf("best seats = %d %s", r.Status, r.Body)
		}
		if c := e.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c", "ann"); c.Status != 200 {
			t.Fatalf("cancel = %d %s", c.Status, c.Body)
		}
		if again, h2 := best("b", "ann"); again.Status != 201 || h2.HoldID != h.HoldID {
			t.Errorf("retry = %d %s", again.Status, again.Body)
		}
		if r, _ := e.SeatHold(t, sku, "o", "bob", "A-01", "A-02", "A-03", "A-04"); r.Status != 201 {
			t.Errorf("another buyer's hold of all 4 free seats = %d %s", r.Status, r.Body)
		}
	})
}

// Held: a sold-out storm over three replicas, then every hold cancelled or
// expired: the returned units are sold again, once, within a bound, and
// Redis settles at the ledger's remaining.
func TestAttackSoldOutStormThenReturns(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		var envs []*systest.Env
		for range 3 {
			envs = append(envs, systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true}))
		}
		sku := systest.NewSKU(t)
		envs[0].PutSKU(t, sku, 6, 3, 4)
		var holds []string
		for i := range 6 {
			r, h := envs[i%3].Hold(t, sku, fmt.Sprintf("h%d", i), fmt.Sprintf("hb%d", i), 1, 1+i%2*100)
			if r.Status != 201 {
				t.Fatalf("hold %d = %d %s", i, r.Status, r.Body)
			}
			holds = append(holds, h.HoldID)
		}
		counts := systest.BuyAll(300, 30, func(i int) systest.Reply {
			return envs[i%3].Buy(t, sku, fmt.Sprintf("s%d", i), fmt.Sprintf("sb%d", i), 1)
		})
		// A 1 s hold may expire during the storm on a busy machine (make
		// test once sold one unit so): its unit is sold in the storm,
		// once, and the rest come back after it.
		early := counts[201]
		if counts[409]+early != 300 || early > 3 {
			t.Fatalf("storm answers %v, want 409s and at most 3×201 (the 1 s holds expiring)", counts)
		}
		for i, id := range holds {
			if i%2 == 1 { // the 1s holds expire by themselves
				if c := envs[(i+1)%3].Act(t, "/v1/holds/"+id+"/cancel", fmt.Sprintf("c%d", i), fmt.Sprintf("hb%d", i)); c.Status != 200 {
					t.Fatalf("cancel = %d %s", c.Status, c.Body)
				}
			}
		}
		sold := 0
		start := time.Now()
		systest.WaitFor(t, 10*time.Second, "the returned units sold again", func() bool {
			r := envs[sold%3].Buy(t, sku, fmt.Sprintf("late%d", sold), fmt.Sprintf("lb%d", sold), 1)
			if r.Status == 201 {
				sold++
			}
			return sold+early == 6
		})
		t.Logf("returned units sold again within %v", time.Since(start).Round(time.Millisecond))
		if r := envs[1].Buy(t, sku, "late-extra", "x", 1); r.Status != 409 {
			t.Errorf("a 7th = %d %s, want 409", r.Status, r.Body)
		}
		got := envs[0].State(t, sku)
		if got.Sold != 6 || got.Held != 0 {
			t.Errorf("state %+v, want sold 6 held 0", got)
		}
		if left := systest.Settled(t, envs[0], sku); left != 0 {
			t.Errorf("remaining %d", left)
		}
	})
}

// A retry of a committed request after the SKU's settings changed (an
// admin lowered max_per_order, per_buyer, the program's cap or the hold
// lifetime) is refused by the settings check before the ledger's record
// of it is looked at: 422 or 409 instead of its order (invariant 3: the
// same request gives the same answer).
func TestAttackRetryAfterSettingsChange(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		if r := e.Do(t, http.MethodPut, systest.AdminPath(sku), nil, `{"total":100,"shards":1,"max_per_order":4,"per_buyer":4,"hold_ttl_max_seconds":3600}`); r.Status != 200 {
			t.Fatalf("PUT = %d %s", r.Status, r.Body)
		}
		b := e.MustBuy(t, sku, "k", "ann", 4)
		hr, _ := e.Hold(t, sku, "h", "bob", 1, 3000)
		if hr.Status != 201 {
			t.Fatalf("hold = %d %s", hr.Status, hr.Body)
		}
		for _, change := range []string{
			`{"total":100,"shards":1,"max_per_order":2,"per_buyer":4,"hold_ttl_max_seconds":3600}`,
			`{"total":100,"shards":1,"max_per_order":4,"per_buyer":2,"hold_ttl_max_seconds":3600}`,
			`{"total":100,"shards":1,"max_per_order":4,"per_buyer":4,"hold_ttl_seconds":60,"hold_ttl_max_seconds":600}`,
		} {
			if r := e.Do(t, http.MethodPut, systest.AdminPath(sku), nil, change); r.Status != 200 {
				t.Fatalf("PUT = %d %s", r.Status, r.Body)
			}
			if r := e.Buy(t, sku, "k", "ann", 4); r.Status != 201 || systest.OrderID(r) != systest.OrderID(b) {
				t.Errorf("after %s: retry of the committed purchase = %d %s, want its order", change, r.Status, r.Body)
			}
			if r, _ := e.Hold(t, sku, "h", "bob", 1, 3000); r.Status != 201 {
				t.Errorf("after %s: retry of the committed hold = %d %s, want its hold", change, r.Status, r.Body)
			}
		}
	})
}

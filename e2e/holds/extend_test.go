package holds_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// extend asks for buyer's hold id to expire ttl seconds from now (0: the
// SKU's hold TTL).
func extend(t *testing.T, e *systest.Env, id, key, buyer string, ttl int) (systest.Reply, systest.HoldReply) {
	body := fmt.Sprintf(`{"buyer":%q}`, buyer)
	if ttl > 0 {
		body = fmt.Sprintf(`{"buyer":%q,"ttl_seconds":%d}`, buyer, ttl)
	}
	r := e.Do(t, http.MethodPost, "/v1/holds/"+id+"/extend", map[string]string{"Idempotency-Key": key}, body)
	var h systest.HoldReply
	_ = json.Unmarshal(r.Body, &h)
	return r, h
}

// A hold's owner extends it, on any replica, up to its SKU's maximum
// lifetime: a retry (on the other replica) answers the same expiry, a
// request for less changes nothing, one past the maximum is capped there,
// and one at the maximum is refused. Bad input changes nothing; a
// confirmed, cancelled or expired hold is not extended.
func TestExtendHold(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		if r := a.Do(t, http.MethodPut, systest.AdminPath(sku), nil,
			`{"total":10,"shards":2,"max_per_order":4,"hold_ttl_seconds":60,"hold_ttl_max_seconds":600}`); r.Status != http.StatusOK {
			t.Fatalf("PUT sku = %d %s", r.Status, r.Body)
		}
		r, h := a.Hold(t, sku, "h1", "ann", 2, 0)
		if r.Status != http.StatusCreated {
			t.Fatalf("hold = %d %s", r.Status, r.Body)
		}
		r, x := extend(t, a, h.HoldID, "x1", "ann", 300)
		if r.Status != http.StatusOK || x.State != "held" || x.ExpiresAt.Sub(h.ExpiresAt) < 200*time.Second {
			t.Fatalf("extend by 300 s = %d %s (held until %v)", r.Status, r.Body, h.ExpiresAt)
		}
		if r, again := extend(t, b, h.HoldID, "x1", "ann", 300); r.Status != http.StatusOK ||
			r.Header.Get("Idempotent-Replayed") != "true" || !again.ExpiresAt.Equal(x.ExpiresAt) {
			t.Fatalf("the retry on the other replica = %d %s, want the same expiry %v", r.Status, r.Body, x.ExpiresAt)
		}
		if r, less := extend(t, b, h.HoldID, "x2", "ann", 5); r.Status != http.StatusOK || !less.ExpiresAt.Equal(x.ExpiresAt) {
			t.Fatalf("an extension to less = %d %s, want the hold as it was (%v)", r.Status, r.Body, x.ExpiresAt)
		}
		r, most := extend(t, a, h.HoldID, "x3", "ann", 86400)
		if r.Status != http.StatusOK || most.ExpiresAt.After(time.Now().Add(600*time.Second)) || !most.ExpiresAt.After(x.ExpiresAt) {
			t.Fatalf("an extension past the maximum = %d %s, want it capped at 600 s from the hold's creation", r.Status, r.Body)
		}
		if r, _ := extend(t, b, h.HoldID, "x4", "ann", 900); r.Status != http.StatusConflict || systest.ProblemKind(r) != "hold-at-max-lifetime" {
			t.Fatalf("an extension at the maximum = %d %s", r.Status, r.Body)
		}
		if r, same := extend(t, b, h.HoldID, "x4b", "ann", 10); r.Status != http.StatusOK || !same.ExpiresAt.Equal(most.ExpiresAt) {
			t.Fatalf("an extension to less, at the maximum = %d %s, want the hold as it is", r.Status, r.Body)
		}
		for _, c := range []struct {
			name, path, key, body string
			status                int
		}{
			{"another buyer", "/v1/holds/" + h.HoldID + "/extend", "y1", `{"buyer":"bob","ttl_seconds":60}`, http.StatusForbidden},
			{"no such hold", "/v1/holds/nosuch/extend", "y2", `{"buyer":"ann","ttl_seconds":60}`, http.StatusNotFound},
			{"ttl 0", "/v1/holds/" + h.HoldID + "/extend", "y3", `{"buyer":"ann","ttl_seconds":0}`, http.StatusUnprocessableEntity},
			{"ttl over a day", "/v1/holds/" + h.HoldID + "/extend", "y4", `{"buyer":"ann","ttl_seconds":86401}`, http.StatusUnprocessableEntity},
			{"ttl a string", "/v1/holds/" + h.HoldID + "/extend", "y5", `{"buyer":"ann","ttl_seconds":"60"}`, http.StatusUnprocessableEntity},
			{"unknown field", "/v1/holds/" + h.HoldID + "/extend", "y6", `{"buyer":"ann","until":"never"}`, http.StatusBadRequest},
			{"no buyer", "/v1/holds/" + h.HoldID + "/extend", "y7", `{"ttl_seconds":60}`, http.StatusUnprocessableEntity},
			{"the key reused", "/v1/holds/" + h.HoldID + "/extend", "x1", `{"buyer":"ann","ttl_seconds":61}`, http.StatusUnprocessableEntity},
		} {
			r := a.Do(t, http.MethodPost, c.path, map[string]string{"Idempotency-Key": c.key}, c.body)
			if r.Status != c.status || r.Header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("%s = %d %s, want %d problem+json", c.name, r.Status, r.Body, c.status)
			}
		}
		got, err := a.Ledger.HoldByID(context.Background(), keys.MustID(h.HoldID))
		if err != nil || !got.ExpiresAt.Equal(most.ExpiresAt) || got.State != ledger.Held {
			t.Fatalf("after the refusals the hold is %+v, %v; want held until %v", got, err, most.ExpiresAt)
		}
		// Ended holds are not extended.
		if r := b.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c1", "ann"); r.Status != http.StatusCreated {
			t.Fatalf("confirm = %d %s", r.Status, r.Body)
		}
		if r, _ := extend(t, a, h.HoldID, "x5", "ann", 60); r.Status != http.StatusConflict || systest.ProblemKind(r) != "hold-confirmed" {
			t.Errorf("extend a confirmed hold = %d %s", r.Status, r.Body)
		}
		_, c := a.Hold(t, sku, "h2", "ann", 1, 0)
		if r := a.Act(t, "/v1/holds/"+c.HoldID+"/cancel", "k2", "ann"); r.Status != http.StatusOK {
			t.Fatalf("cancel = %d %s", r.Status, r.Body)
		}
		if r, _ := extend(t, b, c.HoldID, "x6", "ann", 60); r.Status != http.StatusConflict || systest.ProblemKind(r) != "hold-cancelled" {
			t.Errorf("extend a cancelled hold = %d %s", r.Status, r.Body)
		}
		_, short := a.Hold(t, sku, "h3", "ann", 1, 1)
		systest.WaitFor(t, 10*time.Second, "the short hold's expiry to pass", func() bool { return time.Now().After(short.ExpiresAt) })
		if r, _ := extend(t, b, short.HoldID, "x7", "ann", 60); r.Status != http.StatusGone || systest.ProblemKind(r) != "hold-expired" {
			t.Errorf("extend an expired hold (not swept yet) = %d %s", r.Status, r.Body)
		}
		// The 410 is told once the ledger has the hold expired (a confirm
		// still committing would have won): its unit is back, unswept.
		if st := a.State(t, sku); st.Sold != 2 || st.Held != 0 || a.HoldState(t, short.HoldID) != ledger.Expired {
			t.Errorf("state %+v, want 2 sold and the expired hold ended, its unit back", st)
		}
	})
}

// Extensions racing the expiry instant, on another replica than the
// sweepers': each hold is extended (and then still held, and confirmable)
// or expired (its unit back in Redis once), never both.
func TestExtendRacesExpiry(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		fast := func(o *app.Options) { o.Sale.SweepEvery = 20 * time.Millisecond }
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: fast})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: true, Tune: fast})
		sku := systest.NewSKU(t)
		const n, total = 60, 100
		a.PutSKU(t, sku, total, 4, 4)
		hs := make([]systest.HoldReply, n)
		systest.BuyAll(n, 16, func(i int) systest.Reply {
			r, h := a.Hold(t, sku, fmt.Sprintf("race-%d", i), "b", 1, 1)
			hs[i] = h
			return r
		})
		extended := make([]bool, n)
		var gone atomic.Int64
		var wg sync.WaitGroup
		for i, h := range hs {
			wg.Go(func() {
				time.Sleep(time.Until(h.ExpiresAt) - time.Duration(rand.IntN(30))*time.Millisecond) // time under test: sent just before the hold's expiry
				r, _ := extend(t, b, h.HoldID, fmt.Sprintf("x-%d", i), "b", 60)
				switch r.Status {
				case http.StatusOK:
					extended[i] = true
				case http.StatusGone:
					gone.Add(1)
				default:
					t.Errorf("extend = %d %s", r.Status, r.Body)
				}
			})
		}
		wg.Wait()
		ctx := context.Background()
		var kept int64
		for i, h := range hs {
			got, err := a.Ledger.HoldByID(ctx, keys.MustID(h.HoldID))
			if err != nil {
				t.Fatal(err)
			}
			if extended[i] != (got.State == ledger.Held && got.ExpiresAt.After(time.Now().Add(30*time.Second))) {
				t.Errorf("hold %d: extended %v but %+v", i, extended[i], got)
			}
			if extended[i] {
				kept++
			}
		}
		systest.WaitFor(t, 10*time.Second, "the others to expire and come back", func() bool {
			st, _ := a.Ledger.SKU(ctx, sku)
			p, _ := a.Ledger.PendingRestores(ctx, 0, 1)
			return st.Held == kept && len(p) == 0
		})
		if st := a.State(t, sku); st.Held != kept || st.Sold != 0 || st.RedisRemaining != total-kept {
			t.Errorf("state %+v with %d extended, %d gone", st, kept, gone.Load())
		}
		// An extended hold is confirmed as any hold.
		for i, h := range hs {
			if extended[i] {
				if r := a.Act(t, "/v1/holds/"+h.HoldID+"/confirm", fmt.Sprintf("c-%d", i), "b"); r.Status != http.StatusCreated {
					t.Fatalf("confirm an extended hold = %d %s", r.Status, r.Body)
				}
				break
			}
		}
		t.Logf("extend at the expiry instant: %d extended, %d expired", kept, gone.Load())
	})
}

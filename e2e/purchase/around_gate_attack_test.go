package purchase_test

// Attacks on the buyer's counts at the gate (the quota hash per buyer,
// keys.Quota) where a take goes around the gate: its gate was rebuilt
// under it by a resize from either replica (ErrStaleGate, the retake
// keeping the counts of the stale attempt), or its replica's Redis is
// cut and its breakers open. After things settle a buyer is never counted
// at the gate for more than it owns and holds in the ledger, and a buyer
// under its cap in the ledger can buy.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// resizeBackToBack resizes sku from both replicas back to back until the
// returned stop is called.
func resizeBackToBack(envs []*systest.Env, sku stock.SKU) (stop func() int64) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	var wg sync.WaitGroup
	for w := range envs {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				if _, err := envs[w].Sale.Resize(ctx, sku, 1+(i+w)%5); err == nil {
					n.Add(1)
				}
			}
		})
	}
	var once sync.Once
	return func() int64 {
		once.Do(func() { cancel(); wg.Wait() })
		return n.Load()
	}
}

// quotaUsed is the buyer's "used" count at the gate for sku.
func quotaUsed(t *testing.T, e *systest.Env, sku stock.SKU, buyer string) int64 {
	t.Helper()
	used, err := e.Redis.HGet(context.Background(), keys.Quota(sku.Program, sku.Ticket, keys.MustID(buyer)), "used").Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return used
}

// checkCounts asserts, for each buyer, that the gate counts no more than
// the ledger says it owns and holds, waiting a little for restores in
// flight; it returns the buyers counted over.
func checkCounts(t *testing.T, e *systest.Env, sku stock.SKU, buyers []string) int {
	t.Helper()
	ctx := context.Background()
	over := 0
	for _, b := range buyers {
		var used, owns int64
		deadline := time.Now().Add(3 * time.Second)
		for {
			var err error
			owns, err = e.Ledger.BuyerUnits(ctx, sku, keys.MustID(b))
			if err != nil {
				t.Fatal(err)
			}
			used = quotaUsed(t, e, sku, b)
			if used <= owns || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond) // a restore may still be on its way
		}
		if used > owns {
			over++
			qh, _ := e.Redis.HGetAll(ctx, keys.Quota(sku.Program, sku.Ticket, keys.MustID(b))).Result()
			t.Errorf("%s: counted %d at the gate, owns+holds %d in the ledger; quota hash %v", b, used, owns, qh)
		}
	}
	return over
}

// canBuy asserts each buyer under its cap can buy q (a fresh key): 201.
func canBuy(t *testing.T, ans *answers, envs []*systest.Env, sku stock.SKU, buyers []string, q int64, tag string) int {
	t.Helper()
	refused := 0
	for i, b := range buyers {
		r := ans.retried(envs[i%len(envs)], "buy under the cap", http.MethodPost, systest.SKUPath(sku)+"/purchases", b+"-"+tag,
			fmt.Sprintf(`{"buyer":%q,"quantity":%d}`, b, q))
		if r.Status != http.StatusCreated {
			refused++
			t.Errorf("%s: under its cap in the ledger, buy %d = %d %s (counted %d at the gate)", b, q, r.Status, r.Body, quotaUsed(t, envs[0], sku, b))
		}
	}
	return refused
}

func putCapped(t *testing.T, e *systest.Env, sku stock.SKU, total, perBuyer int64) {
	t.Helper()
	r := e.Do(t, http.MethodPut, systest.AdminPath(sku), nil, fmt.Sprintf(`{"total":%d,"shards":1,"max_per_order":4,"per_buyer":%d}`, total, perBuyer))
	if r.Status != http.StatusOK {
		t.Fatalf("PUT sku = %d %s", r.Status, r.Body)
	}
}

// A purchase bought at the cap and refunded; then its Idempotency-Key is
// sent again (a platform's worker retrying a request it never saw the
// answer of) while resizes run back to back. The retry is a replay of the
// refunded order and takes nothing: the buyer must not be counted for it.
// The retry's first attempt counts afresh (the refund gave the request's
// count back), meets a gate rebuilt under it and keeps its counts for the
// retake; the retake is answered with the replay.
func TestAroundGateAttackRetryAfterRefundLeavesNoCounts(t *testing.T) {
	returnThenRetry(t, "ra", func(t *testing.T, ans *answers, envs []*systest.Env, sku stock.SKU, i int, buyer string) (retry func(*systest.Env) systest.Reply, first string) {
		body := fmt.Sprintf(`{"buyer":%q,"quantity":2}`, buyer)
		r1 := ans.retried(envs[i%2], "capped buy", http.MethodPost, systest.SKUPath(sku)+"/purchases", buyer+"-k", body)
		if r1.Status != http.StatusCreated {
			t.Errorf("%s buy = %d %s", buyer, r1.Status, r1.Body)
			return nil, ""
		}
		rf := ans.retried(envs[(i+1)%2], "refund", http.MethodPost, "/v1/orders/"+systest.OrderID(r1)+"/refund", buyer+"-rf", fmt.Sprintf(`{"buyer":%q}`, buyer))
		if rf.Status != http.StatusOK {
			t.Errorf("%s refund = %d %s", buyer, rf.Status, rf.Body)
			return nil, ""
		}
		return func(e *systest.Env) systest.Reply {
			return ans.retried(e, "retry of the refunded purchase", http.MethodPost, systest.SKUPath(sku)+"/purchases", buyer+"-k", body)
		}, systest.OrderID(r1)
	})
}

// The same with a hold: held at the cap, cancelled, and the hold's key
// sent again while resizes run: a replay of the cancelled hold.
func TestAroundGateAttackRetryAfterCancelLeavesNoCounts(t *testing.T) {
	returnThenRetry(t, "ca", func(t *testing.T, ans *answers, envs []*systest.Env, sku stock.SKU, i int, buyer string) (func(*systest.Env) systest.Reply, string) {
		body := fmt.Sprintf(`{"buyer":%q,"quantity":2,"ttl_seconds":120}`, buyer)
		r1 := ans.retried(envs[i%2], "capped hold", http.MethodPost, systest.SKUPath(sku)+"/holds", buyer+"-k", body)
		if r1.Status != http.StatusCreated {
			t.Errorf("%s hold = %d %s", buyer, r1.Status, r1.Body)
			return nil, ""
		}
		var h systest.HoldReply
		if err := json.Unmarshal(r1.Body, &h); err != nil {
			t.Errorf("%s hold body: %v", buyer, err)
			return nil, ""
		}
		rc := ans.retried(envs[(i+1)%2], "cancel", http.MethodPost, "/v1/holds/"+h.HoldID+"/cancel", buyer+"-c", fmt.Sprintf(`{"buyer":%q}`, buyer))
		if rc.Status != http.StatusOK {
			t.Errorf("%s cancel = %d %s", buyer, rc.Status, rc.Body)
			return nil, ""
		}
		return func(e *systest.Env) systest.Reply {
			return ans.retried(e, "retry of the cancelled hold", http.MethodPost, systest.SKUPath(sku)+"/holds", buyer+"-k", body)
		}, ""
	})
}

// The same with a transfer: bought at the cap, transferred whole to
// another buyer (the sender's counts go), and the purchase's key sent
// again by the sender while resizes run.
func TestAroundGateAttackRetryAfterTransferLeavesNoCounts(t *testing.T) {
	returnThenRetry(t, "ta", func(t *testing.T, ans *answers, envs []*systest.Env, sku stock.SKU, i int, buyer string) (func(*systest.Env) systest.Reply, string) {
		body := fmt.Sprintf(`{"buyer":%q,"quantity":2}`, buyer)
		r1 := ans.retried(envs[i%2], "capped buy", http.MethodPost, systest.SKUPath(sku)+"/purchases", buyer+"-k", body)
		if r1.Status != http.StatusCreated {
			t.Errorf("%s buy = %d %s", buyer, r1.Status, r1.Body)
			return nil, ""
		}
		rt := ans.retried(envs[(i+1)%2], "transfer", http.MethodPost, "/v1/orders/"+systest.OrderID(r1)+"/transfer", buyer+"-t",
			fmt.Sprintf(`{"buyer":%q,"to":"to-%s"}`, buyer, buyer))
		if rt.Status != http.StatusOK && rt.Status != http.StatusCreated {
			t.Errorf("%s transfer = %d %s", buyer, rt.Status, rt.Body)
			return nil, ""
		}
		return func(e *systest.Env) systest.Reply {
			return ans.retried(e, "retry of the transferred purchase", http.MethodPost, systest.SKUPath(sku)+"/purchases", buyer+"-k", body)
		}, systest.OrderID(r1)
	})
}

// returnThenRetry runs the three tests above: 16 buyers capped at 2 on a
// SKU resized back to back from both replicas each take 2 and give them
// back (step, which returns the retry of the first request's key, and the
// order a retry that answers 201 must name, if any); the key is sent again
// 4 times from alternate replicas; then no buyer is counted at the gate
// for more than it owns, each can buy 2, and Redis equals the ledger.
func returnThenRetry(t *testing.T, prefix string,
	step func(t *testing.T, ans *answers, envs []*systest.Env, sku stock.SKU, i int, buyer string) (retry func(*systest.Env) systest.Reply, first string)) {
	eachAttackDriver(t, func(t *testing.T, driver string) {
		a, b := attackPair(t, driver, nil)
		envs := []*systest.Env{a, b}
		ans := newAnswers(t)
		sku := systest.NewSKU(t)
		putCapped(t, a, sku, 400, 2)
		stop := resizeBackToBack(envs, sku)
		defer stop()
		const n, retries = 16, 4
		var buyers []string
		for i := range n {
			buyers = append(buyers, fmt.Sprintf("%s%d", prefix, i))
		}
		var wg sync.WaitGroup
		for i, buyer := range buyers {
			wg.Go(func() {
				retry, first := step(t, ans, envs, sku, i, buyer)
				if retry == nil {
					return
				}
				for k := range retries {
					r := retry(envs[(i+k)%2])
					if first != "" && r.Status == http.StatusCreated && systest.OrderID(r) != first {
						t.Errorf("%s: retry %d of its key made order %s, first %s", buyer, k, systest.OrderID(r), first)
					}
				}
			})
		}
		wg.Wait()
		resizes := stop()
		over := checkCounts(t, a, sku, buyers)
		refused := canBuy(t, ans, envs, sku, buyers, 2, "after")
		st := checkLedger(t, a, sku)
		t.Logf("%s: %d of %d buyers counted over what they own, %d refused under the cap; sold %d held %d of %d; %d resizes; answers %v",
			driver, over, n, refused, st.Sold, st.Held, st.Total, resizes, ans.counts)
	})
}

// cutPair is replica a with Redis and replica b whose Redis link is cut
// (breakers tripped) while cut is set: b's takes go around the gate.
func cutPair(t *testing.T, driver string) (a, b *systest.Env, cut *atomic.Bool) {
	t.Helper()
	dsn := systest.LedgerDSN(t, driver)
	a = systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Drift: true, Sweep: true, Tune: autoTune})
	cut = &atomic.Bool{}
	dialer := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if cut.Load() {
			return nil, errCut
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return cutConn{c, cut}, nil
	}
	b = systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Drift: true, Sweep: true, Tune: autoTune, Dialer: dialer})
	return a, b, cut
}

// Takes around the gate on a replica whose Redis is cut, every return
// path after Redis comes back, on the replica that has Redis: refund,
// cancel, expiry by the sweeper, partial confirm, transfer. Each buyer
// at the cap first counted through the gate on a (a count that stays),
// then sells around it on b. After: counts <= owns, and buyers under the
// cap can buy.
func TestAroundGateAttackBreakerReturns(t *testing.T) {
	eachAttackDriver(t, func(t *testing.T, driver string) {
		a, b, cut := cutPair(t, driver)
		envs := []*systest.Env{a, b}
		ans := newAnswers(t)
		sku := systest.NewSKU(t)
		putCapped(t, a, sku, 400, 4)
		const n = 10
		var buyers []string
		for i := range n {
			buyers = append(buyers, fmt.Sprintf("ba%d", i))
		}
		// 1 unit each through the gate on a.
		for _, buyer := range buyers {
			r := ans.retried(a, "through the gate", http.MethodPost, systest.SKUPath(sku)+"/purchases", buyer+"-g", fmt.Sprintf(`{"buyer":%q,"quantity":1}`, buyer))
			if r.Status != http.StatusCreated {
				t.Fatalf("%s = %d %s", buyer, r.Status, r.Body)
			}
		}
		cut.Store(true)
		systest.TripBreakers(t, b, testenv.SharedCluster(t).Masters)
		type took struct {
			buyer, order, hold string
		}
		var tooks []took
		for i, buyer := range buyers {
			var tk took
			tk.buyer = buyer
			if i%5 == 1 || i%5 == 2 || i%5 == 3 { // holds: cancel, expire, partial confirm
				ttl := 120
				if i%5 == 2 {
					ttl = 1
				}
				r := ans.see("hold around", b.Do(t, http.MethodPost, systest.SKUPath(sku)+"/holds", map[string]string{"Idempotency-Key": buyer + "-h"},
					fmt.Sprintf(`{"buyer":%q,"quantity":3,"ttl_seconds":%d}`, buyer, ttl)))
				if r.Status != http.StatusCreated {
					t.Fatalf("%s hold around the gate = %d %s", buyer, r.Status, r.Body)
				}
				var h systest.HoldReply
				_ = json.Unmarshal(r.Body, &h)
				tk.hold = h.HoldID
			} else {
				r := ans.see("buy around", b.Buy(t, sku, buyer+"-b", buyer, 3))
				if r.Status != http.StatusCreated {
					t.Fatalf("%s buy around the gate = %d %s", buyer, r.Status, r.Body)
				}
				tk.order = systest.OrderID(r)
			}
			tooks = append(tooks, tk)
		}
		cut.Store(false)
		for i, tk := range tooks {
			switch i % 5 {
			case 0:
				r := ans.retried(a, "refund", http.MethodPost, "/v1/orders/"+tk.order+"/refund", tk.buyer+"-rf", fmt.Sprintf(`{"buyer":%q}`, tk.buyer))
				if r.Status != http.StatusOK {
					t.Errorf("%s refund = %d %s", tk.buyer, r.Status, r.Body)
				}
			case 1:
				r := ans.retried(a, "cancel", http.MethodPost, "/v1/holds/"+tk.hold+"/cancel", tk.buyer+"-c", fmt.Sprintf(`{"buyer":%q}`, tk.buyer))
				if r.Status != http.StatusOK {
					t.Errorf("%s cancel = %d %s", tk.buyer, r.Status, r.Body)
				}
			case 3:
				r := ans.retried(a, "partial confirm", http.MethodPost, "/v1/holds/"+tk.hold+"/confirm", tk.buyer+"-pc", fmt.Sprintf(`{"buyer":%q,"quantity":1}`, tk.buyer))
				if r.Status != http.StatusCreated {
					t.Errorf("%s partial confirm = %d %s", tk.buyer, r.Status, r.Body)
				}
			case 4:
				r := ans.retried(a, "transfer", http.MethodPost, "/v1/orders/"+tk.order+"/transfer", tk.buyer+"-t", fmt.Sprintf(`{"buyer":%q,"to":"to-%s"}`, tk.buyer, tk.buyer))
				if r.Status != http.StatusOK && r.Status != http.StatusCreated {
					t.Errorf("%s transfer = %d %s", tk.buyer, r.Status, r.Body)
				}
			}
		}
		ctx := context.Background()
		systest.WaitFor(t, 15*time.Second, "the sweeper to expire the short holds", func() bool {
			for i, tk := range tooks {
				if i%5 == 2 {
					if h, err := a.Ledger.HoldByID(ctx, keys.MustID(tk.hold)); err != nil || h.State == "held" {
						return false
					}
				}
			}
			return true
		})
		over := checkCounts(t, a, sku, buyers)
		// Every buyer owns 1 or 2 units now (cap 4): 2 more must sell.
		refused := canBuy(t, ans, envs[:1], sku, buyers, 2, "after")
		st := checkLedger(t, a, sku)
		t.Logf("%s: %d over, %d refused; sold %d held %d; answers %v", driver, over, refused, st.Sold, st.Held, ans.counts)
	})
}

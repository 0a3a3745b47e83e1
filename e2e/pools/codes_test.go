package pools_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// addCodes generates n codes of a pool with maxUses each, through the
// admin route, and returns them.
func addCodes(t *testing.T, e *systest.Env, sku stock.SKU, pool string, n int, maxUses int64) []string {
	t.Helper()
	r := e.Do(t, http.MethodPost, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/pools/"+pool+"/codes", nil,
		fmt.Sprintf(`{"generate":%d,"max_uses":%d}`, n, maxUses))
	var v struct {
		Added     int
		Generated []string
	}
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &v) != nil || v.Added != n || len(v.Generated) != n {
		t.Fatalf("POST codes = %d %s", r.Status, r.Body)
	}
	return v.Generated
}

func codeBody(code string) string { return fmt.Sprintf(`,"access_code":%q`, code) }

// Codes with a use limit of 2 raced by five requests each, from two
// replicas on one ledger: no code is used more than twice (in the answers
// and in the ledger), the pool sold exactly the uses answered, every
// refusal is access-code-used-up, and Redis and the ledger agree on the
// pool's stock. Then a refunded order and a cancelled hold each give their
// code's use back, once. The full size (10,000 codes, 50,000 requests)
// runs with STOCKGATE_FULL_SCALE=1 (about 4 minutes on PostgreSQL under
// -race on 2 cores); make test runs a tenth of it on PostgreSQL and a
// twenty-fifth on SQLite, within CI's time. A 503 is retried with the
// same key, as a client does.
func TestCodesRaced(t *testing.T) {
	t.Parallel() // its own replicas, ledgers and programs: it overlaps the other long tests
	systest.EachDriver(t, func(t *testing.T, driver string) {
		codes, requests := 1_000, 5_000
		if driver == ledger.SQLite {
			codes, requests = 250, 1_250
		}
		if os.Getenv("STOCKGATE_FULL_SCALE") != "" {
			codes, requests = 10_000, 50_000
		}
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, int64(3*codes), 8, 4)
		a.PutPool(t, sku, "fans", fmt.Sprintf(`{"allotment":%d,"shards":8,"access":"code"}`, 5*codes/2))
		list := addCodes(t, a, sku, "fans", codes, 2)
		var mu sync.Mutex
		uses := map[string]int{}
		statuses := map[string]int{}
		start := time.Now()
		counts := systest.BuyAll(requests, 24, func(i int) systest.Reply {
			code := list[i%codes]
			// A client retries a 503 with the same key (on a busy CI
			// machine a request can time out queued for the ledger).
			var r systest.Reply
			for attempt := range 20 {
				r = buyIn(t, []*systest.Env{a, b}[(i+attempt)%2], sku, "fans", fmt.Sprintf("k%d", i), fmt.Sprintf("fan%d", i), 1, codeBody(code))
				if r.Status != http.StatusServiceUnavailable {
					break
				}
				time.Sleep(time.Duration(attempt+1) * 50 * time.Millisecond) // poll interval: a client's growing backoff
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case r.Status == http.StatusCreated:
				uses[code]++
			case r.Status == http.StatusConflict && strings.Contains(string(r.Body), "access-code-used-up"):
				statuses["used-up"]++
			default:
				statuses[fmt.Sprintf("%d %s", r.Status, r.Body)]++
			}
			return r
		})
		elapsed := time.Since(start)
		t.Logf("%s: %d requests for %d codes in %v: %v, %v", driver, requests, codes, elapsed, counts, statuses)
		if len(statuses) != 1 {
			t.Errorf("answers other than 201 and access-code-used-up: %v", statuses)
		}
		sold := 0
		for code, n := range uses {
			if n > 2 {
				t.Errorf("code %s used %d times, limit 2", code, n)
			}
			sold += n
		}
		if sold != 2*codes {
			t.Errorf("%d uses answered, want every code used twice (%d): stock was there for all", sold, 2*codes)
		}
		ctx := context.Background()
		fans := sku.InPool(keys.MustID("fans"))
		got := a.State(t, fans)
		st, _ := a.Ledger.SKU(ctx, fans)
		if got.Sold != int64(sold) || got.OrderUnits != got.Sold || got.RedisRemaining != st.Remaining() {
			t.Errorf("pool: sold %d, order units %d, Redis %d vs ledger %d remaining; %d uses answered", got.Sold, got.OrderUnits,
				got.RedisRemaining, st.Remaining(), sold)
		}
		for i := 0; i < codes; i += codes / 100 {
			if n, err := a.Ledger.CodeUses(ctx, fans, codeHashOf(fans, list[i])); err != nil || n != int64(uses[list[i]]) {
				t.Errorf("ledger uses of code %d = %d, %v; answered %d", i, n, err, uses[list[i]])
			}
		}

		// A refund gives its code's use back, once.
		code := list[0]
		order := buyIn(t, b, sku, "fans", "again-0", "again", 1, codeBody(code))
		if order.Status != http.StatusConflict {
			t.Fatalf("a third use = %d %s, want 409", order.Status, order.Body)
		}
		var mine systest.Reply
		for i := range 5 {
			if r := buyIn(t, a, sku, "fans", fmt.Sprintf("k%d", i*codes), fmt.Sprintf("fan%d", i*codes), 1, codeBody(code)); r.Status == http.StatusCreated {
				mine = r // the retry of one of code 0's winners replays it
				if r.Header.Get("Idempotent-Replayed") != "true" {
					t.Errorf("retry of a winner = %s, want a replay", r.Header)
				}
				break
			}
		}
		id := systest.OrderID(mine)
		var buyer string
		for i := range 5 {
			if r := buyIn(t, a, sku, "fans", fmt.Sprintf("k%d", i*codes), fmt.Sprintf("fan%d", i*codes), 1, codeBody(code)); systest.OrderID(r) == id {
				buyer = fmt.Sprintf("fan%d", i*codes)
				break
			}
		}
		for k := range 2 {
			if r := []*systest.Env{a, b}[k].Act(t, "/v1/orders/"+id+"/refund", "refund-0", buyer); r.Status != http.StatusOK {
				t.Fatalf("refund = %d %s", r.Status, r.Body)
			}
		}
		systest.WaitFor(t, 10*time.Second, "the refund's restore", func() bool {
			p, err := a.Ledger.PendingRestores(ctx, 0, 1)
			return err == nil && len(p) == 0
		})
		if r := buyIn(t, b, sku, "fans", "again-1", "again", 1, codeBody(code)); r.Status != http.StatusCreated {
			t.Errorf("the use a refund gave back = %d %s, want 201", r.Status, r.Body)
		}
		if r := buyIn(t, a, sku, "fans", "again-2", "again2", 1, codeBody(code)); r.Status != http.StatusConflict {
			t.Errorf("a use beyond the one given back = %d %s, want 409", r.Status, r.Body)
		}
	})
}

// codeHashOf is how the service names a code of a pool in the ledger.
func codeHashOf(pool stock.SKU, code string) string { return sale.CodeHash(pool, code) }

// Wrong codes are refused (403 access-code-invalid), a code bound to a
// buyer works for that buyer only, a cancelled hold gives its use back,
// and a client guessing codes is slowed down: past its wrong guesses a
// minute it gets 429 with Retry-After, even for a right code (a retry of
// a take that committed is the exception:
// TestLimitedClientsRetryOfACommittedTakeIsAnswered), and nothing moved
// for any of them.
func TestCodeRules(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 100, 2, 4)
		e.PutPool(t, sku, "club", `{"allotment":50,"access":"code"}`)
		r := e.Do(t, http.MethodPost, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/pools/club/codes", nil,
			`{"codes":[{"code":"ALICE-ONLY-1","max_uses":1,"buyer":"alice"},{"code":"SHARED-CODE-1","max_uses":1}]}`)
		if r.Status != http.StatusOK {
			t.Fatalf("POST codes = %d %s", r.Status, r.Body)
		}
		if r := buyIn(t, e, sku, "club", "n1", "bob", 1, ""); r.Status != http.StatusForbidden || !strings.Contains(string(r.Body), "pool-access-denied") {
			t.Errorf("no code = %d %s, want 403 pool-access-denied", r.Status, r.Body)
		}
		if r := buyIn(t, e, sku, "club", "b1", "bob", 1, codeBody("ALICE-ONLY-1")); r.Status != http.StatusForbidden || !strings.Contains(string(r.Body), "access-code-invalid") {
			t.Errorf("alice's code for bob = %d %s, want 403 access-code-invalid", r.Status, r.Body)
		}
		if r := buyIn(t, e, sku, "club", "a1", "alice", 1, codeBody("ALICE-ONLY-1")); r.Status != http.StatusCreated {
			t.Errorf("alice's code for alice = %d %s", r.Status, r.Body)
		}
		r = e.Do(t, http.MethodPost, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/holds?pool=club",
			map[string]string{"Idempotency-Key": "h1"}, `{"buyer":"carl","quantity":2,"access_code":"SHARED-CODE-1"}`)
		if r.Status != http.StatusCreated {
			t.Fatalf("hold with a code = %d %s", r.Status, r.Body)
		}
		var h struct {
			HoldID string `json:"hold_id"`
		}
		_ = json.Unmarshal(r.Body, &h)
		if r := buyIn(t, e, sku, "club", "d1", "dana", 1, codeBody("SHARED-CODE-1")); r.Status != http.StatusConflict || !strings.Contains(string(r.Body), "access-code-used-up") {
			t.Errorf("a held code's second use = %d %s, want 409 access-code-used-up", r.Status, r.Body)
		}
		if r := e.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c1", "carl"); r.Status != http.StatusOK {
			t.Fatalf("cancel = %d %s", r.Status, r.Body)
		}
		systest.WaitFor(t, 10*time.Second, "the cancel's restore", func() bool {
			p, err := e.Ledger.PendingRestores(context.Background(), 0, 1)
			return err == nil && len(p) == 0
		})
		if r := buyIn(t, e, sku, "club", "d2", "dana", 1, codeBody("SHARED-CODE-1")); r.Status != http.StatusCreated {
			t.Errorf("the use a cancel gave back = %d %s, want 201", r.Status, r.Body)
		}
		before := e.State(t, sku.InPool(keys.MustID("club")))
		limited := 0
		for i := range 40 {
			r := buyIn(t, e, sku, "club", fmt.Sprintf("g%d", i), "mallory", 1, codeBody(fmt.Sprintf("GUESS-%06d", i)))
			switch {
			case r.Status == http.StatusForbidden:
			case r.Status == http.StatusTooManyRequests && r.Header.Get("Retry-After") != "":
				limited++
			default:
				t.Fatalf("guess %d = %d %s", i, r.Status, r.Body)
			}
		}
		if limited < 15 {
			t.Errorf("%d of 40 wrong guesses were rate limited, want all past the first 20 or so", limited)
		}
		if after := e.State(t, sku.InPool(keys.MustID("club"))); after != before {
			t.Errorf("guessing moved stock: %+v, was %+v", after, before)
		}
	})
}

// Code calls past their bounds are refused whole, 422, with no code
// added (helper-33: a generate count near 2^63 overflowed the per-call
// bound into a negative one that passed, and the handler panicked: 500,
// outcome unknown).
func TestCodeCallsOutOfBoundsRefused(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 100, 1, 4)
		e.PutPool(t, sku, "club", `{"allotment":50,"access":"code"}`)
		path := "/v1/admin/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/pools/club/codes"
		for _, body := range []string{
			`{"codes":[{"code":"GIVEN-CODE-1","max_uses":1}],"generate":9223372036854775807,"max_uses":1}`,
			`{"codes":[{"code":"GIVEN-CODE-1","max_uses":1}],"generate":10000,"max_uses":1}`,
			`{"codes":[{"code":"GIVEN-CODE-1","max_uses":1}],"generate":-1,"max_uses":1}`,
			`{"codes":[{"code":"GIVEN-CODE-1","max_uses":1}],"generate":9223372036854775808,"max_uses":1}`,
			`{"generate":10001,"max_uses":1}`,
			`{"generate":0}`,
		} {
			r := e.Do(t, http.MethodPost, path, nil, body)
			if r.Status != http.StatusUnprocessableEntity && r.Status != http.StatusBadRequest {
				t.Errorf("POST codes %s = %d %s, want 4xx", body, r.Status, r.Body)
			}
		}
		if r := buyIn(t, e, sku, "club", "g1", "ann", 1, codeBody("GIVEN-CODE-1")); r.Status != http.StatusForbidden || !strings.Contains(string(r.Body), "access-code-invalid") {
			t.Errorf("the refused calls' given code = %d %s, want 403 access-code-invalid (not added)", r.Status, r.Body)
		}
		if got := addCodes(t, e, sku, "club", 10000, 1); len(got) != 10000 {
			t.Errorf("the bound itself: %d codes", len(got))
		}
	})
}

// A code's one use stands while any part of its purchase does: ann buys
// 4 with a single-use code and transfers 3 to bob, then refunds her 1.
// Bob's 3 still stand on the code, so it stays used up (it was given back
// with ann's refund, and bought 4 more each round); once bob refunds too,
// the use is back, once.
func TestCodeUseStandsWithATransferredPart(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 100, 2, 4)
		e.PutPool(t, sku, "club", `{"allotment":50,"access":"code"}`)
		if r := e.Do(t, http.MethodPost, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/pools/club/codes", nil,
			`{"codes":[{"code":"ONE-USE-1","max_uses":1}]}`); r.Status != http.StatusOK {
			t.Fatalf("POST codes = %d %s", r.Status, r.Body)
		}
		settled := func() {
			t.Helper()
			systest.WaitFor(t, 10*time.Second, "the refund's restore", func() bool {
				p, err := e.Ledger.PendingRestores(context.Background(), 0, 1)
				return err == nil && len(p) == 0
			})
		}
		bought := buyIn(t, e, sku, "club", "p1", "ann", 4, codeBody("ONE-USE-1"))
		if bought.Status != http.StatusCreated {
			t.Fatalf("ann's 4 with the code = %d %s", bought.Status, bought.Body)
		}
		order := systest.OrderID(bought)
		r := e.Do(t, http.MethodPost, "/v1/orders/"+order+"/transfer", map[string]string{"Idempotency-Key": "x1"},
			`{"buyer":"ann","to":"bob","quantity":3}`)
		if r.Status != http.StatusOK {
			t.Fatalf("transfer of 3 to bob = %d %s", r.Status, r.Body)
		}
		split := systest.OrderID(r)
		if r := e.Act(t, "/v1/orders/"+order+"/refund", "r1", "ann"); r.Status != http.StatusOK {
			t.Fatalf("ann's refund of her 1 = %d %s", r.Status, r.Body)
		}
		settled()
		if r := buyIn(t, e, sku, "club", "p2", "carl", 4, codeBody("ONE-USE-1")); r.Status != http.StatusConflict || !strings.Contains(string(r.Body), "access-code-used-up") {
			t.Fatalf("the code again, bob's 3 standing on it = %d %s, want 409 access-code-used-up", r.Status, r.Body)
		}
		if r := e.Act(t, "/v1/orders/"+split+"/refund", "r2", "bob"); r.Status != http.StatusOK {
			t.Fatalf("bob's refund = %d %s", r.Status, r.Body)
		}
		settled()
		if r := buyIn(t, e, sku, "club", "p3", "carl", 4, codeBody("ONE-USE-1")); r.Status != http.StatusCreated {
			t.Fatalf("the code once its whole purchase was refunded = %d %s, want 201", r.Status, r.Body)
		}
		if r := buyIn(t, e, sku, "club", "p4", "dana", 1, codeBody("ONE-USE-1")); r.Status != http.StatusConflict {
			t.Fatalf("the code used again = %d %s, want 409", r.Status, r.Body)
		}
		if st := e.State(t, sku.InPool(keys.MustID("club"))); st.Sold != 4 {
			t.Errorf("the pool after: %+v, want carl's 4 sold", st)
		}
	})
}

// A client out of wrong access-code guesses still gets the answers of the
// takes it committed when it retries them (helper-94 #4: 429 until the
// limit let it through): a purchase's and a hold's replays, 422 for its
// key sent for another take, and 429 for a new take; nothing moves. One
// wrong guess a minute, so the client stays limited for the whole test.
func TestLimitedClientsRetryOfACommittedTakeIsAnswered(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.Start(t, systest.Options{Driver: driver, Tune: func(o *app.Options) { o.HTTP.CodeGuesses = 1 }})
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 100, 4, 4)
		e.PutPool(t, sku, "club", `{"allotment":50,"access":"code"}`)
		r := e.Do(t, http.MethodPost, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/pools/club/codes", nil,
			`{"codes":[{"code":"CLUB-CODE-1","max_uses":5}]}`)
		if r.Status != http.StatusOK {
			t.Fatalf("POST codes = %d %s", r.Status, r.Body)
		}
		bought := buyIn(t, e, sku, "club", "p1", "dana", 1, codeBody("CLUB-CODE-1"))
		if bought.Status != http.StatusCreated {
			t.Fatalf("purchase = %d %s", bought.Status, bought.Body)
		}
		holdPath := "/v1/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/holds?pool=club"
		held := e.Do(t, http.MethodPost, holdPath, map[string]string{"Idempotency-Key": "h1"}, `{"buyer":"carl","quantity":2,"access_code":"CLUB-CODE-1"}`)
		if held.Status != http.StatusCreated {
			t.Fatalf("hold = %d %s", held.Status, held.Body)
		}
		if r := buyIn(t, e, sku, "club", "g1", "mallory", 1, codeBody("WRONG-CODE-1")); r.Status != http.StatusForbidden {
			t.Fatalf("the wrong guess = %d %s, want 403", r.Status, r.Body)
		}
		if r := buyIn(t, e, sku, "club", "g2", "mallory", 1, codeBody("WRONG-CODE-2")); r.Status != http.StatusTooManyRequests {
			t.Fatalf("a guess past the limit = %d %s, want 429", r.Status, r.Body)
		}
		before := e.State(t, sku.InPool(keys.MustID("club")))
		if r := buyIn(t, e, sku, "club", "p1", "dana", 1, codeBody("CLUB-CODE-1")); r.Status != http.StatusCreated ||
			r.Header.Get("Idempotent-Replayed") != "true" || string(r.Body) != string(bought.Body) {
			t.Errorf("the committed purchase's retry = %d %s, want its replay %s", r.Status, r.Body, bought.Body)
		}
		if r := e.Do(t, http.MethodPost, holdPath, map[string]string{"Idempotency-Key": "h1"}, `{"buyer":"carl","quantity":2,"access_code":"CLUB-CODE-1"}`); r.Status != http.StatusCreated ||
			r.Header.Get("Idempotent-Replayed") != "true" || string(r.Body) != string(held.Body) {
			t.Errorf("the committed hold's retry = %d %s, want its replay %s", r.Status, r.Body, held.Body)
		}
		if r := buyIn(t, e, sku, "club", "p1", "dana", 2, codeBody("CLUB-CODE-1")); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("the purchase's key for another quantity = %d %s, want 422", r.Status, r.Body)
		}
		if r := buyIn(t, e, sku, "club", "p2", "dana", 1, codeBody("CLUB-CODE-1")); r.Status != http.StatusTooManyRequests {
			t.Errorf("a new take with a right code = %d %s, want 429", r.Status, r.Body)
		}
		if after := e.State(t, sku.InPool(keys.MustID("club"))); after != before {
			t.Errorf("the limited client's retries moved stock: %+v, was %+v", after, before)
		}
	})
}

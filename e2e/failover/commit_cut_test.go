package failover

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// lostReplies commits the takes of the requests under keys in the
// background, and answers them after wait as a COMMIT whose reply was
// lost: the outcome unknown while the COMMIT still runs. It is what a
// batch's own deadline does to a request queued behind an older one
// (make test, 2026-12-02), without the race: the driver's cut closes
// the connection, and the backend then ends its wait and shows the row,
// before or after the lookup.
//
// The takes under drop are never committed, and answered the same: a
// COMMIT that never reached the server, its client none the wiser.
//
// With tries, a take under keys that comes a second time is not committed
// and says so (its time ran out before its COMMIT was sent); a third and
// later go to the ledger.
type lostReplies struct {
	sale.Ledger
	keys, drop []string
	wait       time.Duration
	pending    *sync.WaitGroup
	tries      *sync.Map // key → *atomic.Int64; nil: every try as the first
}

func (l lostReplies) Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult {
	lost := errors.New("ledger: take: commit: reply lost")
	if len(takes) == 1 && slices.Contains(l.drop, takes[0].Req.Key.String()) {
		return []ledger.TakeResult{{Take: takes[0], Err: lost}}
	}
	if len(takes) == 1 && l.tries != nil && slices.Contains(l.keys, takes[0].Req.Key.String()) {
		n, _ := l.tries.LoadOrStore(takes[0].Req.Key.String(), new(atomic.Int64))
		if n.(*atomic.Int64).Add(1) == 2 {
			return []ledger.TakeResult{{Take: takes[0], Err: fmt.Errorf("ledger: take: %w: context deadline exceeded", ledger.ErrNotCommitted)}}
		}
	}
	if len(takes) != 1 || !slices.Contains(l.keys, takes[0].Req.Key.String()) {
		return l.Ledger.Commit(ctx, takes, direct)
	}
	// The background commit gets its own copy: Commit writes into its
	// takes' orders and holds.
	t := takes[0]
	t.Orders, t.Holds = slices.Clone(t.Orders), slices.Clone(t.Holds)
	l.pending.Go(func() { l.Ledger.Commit(context.WithoutCancel(ctx), []ledger.Take{t}, direct) })
	time.Sleep(l.wait) // the reply that never comes
	return []ledger.TakeResult{{Take: takes[0], Err: lost}}
}

// TestFaultCommitCutWhileStandbyWaits: a purchase's and a hold's COMMIT
// wait for a silent synchronous standby, and their replies are lost
// while the requests still have time. PostgreSQL shows their rows to
// nobody until the wait ends, so the lookup that follows finds nothing; that proves nothing, and the stock must stay taken in
// Redis (a give-back left Redis a unit ahead of the ledger once the rows
// landed). Sent again with their keys once no standby is named, each is
// answered from its row, and Redis equals the ledger.
func TestFaultCommitCutWhileStandbyWaits(t *testing.T) {
	systest.FullTier(t)
	pg := testenv.NewSyncPostgres(t)
	var pending sync.WaitGroup
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: pg.DSN, Tune: func(o *app.Options) {
		o.Sale.WorkTimeout = 10 * time.Second
		o.WrapLedger = func(l sale.Ledger) sale.Ledger {
			return lostReplies{Ledger: l, keys: []string{"p-cut", "h-cut"}, drop: []string{"p-drop"}, wait: time.Second, pending: &pending}
		}
	}})
	ctx := context.Background()
	// Two SKUs: a waiting COMMIT keeps its SKU row locked.
	sku, sku2 := systest.NewSKU(t), systest.NewSKU(t)
	for i, s := range []stock.SKU{sku, sku2} {
		e.PutSKU(t, s, 10, 1, 4)
		e.MustBuy(t, s, fmt.Sprintf("p%d", i), "ann", 1)
	}

	pg.Standby(t, "nobody")
	t.Cleanup(func() { pg.Standby(t, "") })
	ops := []struct{ path, key, body string }{
		{systest.SKUPath(sku) + "/purchases", "p-cut", `{"buyer":"bob","quantity":2}`},
		{systest.SKUPath(sku2) + "/holds", "h-cut", `{"buyer":"cat","quantity":3}`},
	}
	for _, op := range ops {
		r := e.Do(t, http.MethodPost, op.path, map[string]string{"Idempotency-Key": op.key}, op.body)
		if r.Status != http.StatusServiceUnavailable {
			t.Errorf("%s with its COMMIT cut = %d %s; want 503", op.key, r.Status, r.Body)
		}
	}
	// The rows wait on the primary, seen by nobody: the ledger shows 9
	// left, and Redis must still count each take as taken.
	for i, s := range []stock.SKU{sku, sku2} {
		st, err := e.Ledger.SKU(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		left, _, err := e.Gate.Remaining(ctx, s, st.Shards)
		if err != nil {
			t.Fatal(err)
		}
		if want := 7 - int64(i); st.Remaining() != 9 || left != want {
			t.Errorf("%s with its COMMIT waiting: ledger remaining %d, Redis %d; want 9 and %d (nothing given back)",
				ops[i].key, st.Remaining(), left, want)
		}
	}

	pg.Standby(t, "")
	pending.Wait()
	for _, op := range ops {
		r, _ := e.Retried(t, http.MethodPost, op.path, op.key, op.body)
		if r.Status != http.StatusCreated {
			t.Errorf("%s sent again = %d %s; want 201 from its row", op.key, r.Status, r.Body)
		}
	}
	if st := e.State(t, sku); st.Sold != 3 || st.Held != 0 {
		t.Errorf("%s: ledger %+v; want 3 sold", sku, st)
	}
	if st := e.State(t, sku2); st.Sold != 1 || st.Held != 3 {
		t.Errorf("%s: ledger %+v; want 1 sold, 3 held", sku2, st)
	}
	systest.RedisConsistent(t, e, sku)
	systest.RedisConsistent(t, e, sku2)
}

// TestFaultCommitNeverLandedFreesTheCap: a purchase whose COMMIT outcome
// is unknown, and which in fact never landed, keeps its stock out of
// Redis (the drift check's to repair) but not the buyer's count at the
// gate: dan, at a cap of 1, buys with a new key after the 503 and gets
// his ticket, not 409 limit-reached for one he never had. The ledger
// still holds him to the cap.
func TestFaultCommitNeverLandedFreesTheCap(t *testing.T) {
	systest.FullTier(t)
	var pending sync.WaitGroup
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, Tune: func(o *app.Options) {
		o.WrapLedger = func(l sale.Ledger) sale.Ledger {
			return lostReplies{Ledger: l, drop: []string{"p-drop"}, pending: &pending}
		}
	}})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 10, 1, 4)
	if r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String(), nil, `{"per_buyer":1}`); r.Status != http.StatusOK {
		t.Fatalf("program cap = %d %s", r.Status, r.Body)
	}
	if r := e.Buy(t, sku, "p-drop", "dan", 1); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("a purchase whose COMMIT never landed = %d %s; want 503", r.Status, r.Body)
	}
	if r := e.Buy(t, sku, "p-dan", "dan", 1); r.Status != http.StatusCreated {
		t.Errorf("dan's first ticket after a 503 = %d %s; want 201", r.Status, r.Body)
	}
	if r := e.Buy(t, sku, "p-dan-2", "dan", 1); r.Status != http.StatusConflict || systest.ProblemKind(r) != "limit-reached" {
		t.Errorf("dan's second ticket = %d %s; want 409 limit-reached", r.Status, r.Body)
	}
	if st := e.State(t, sku); st.Sold != 1 {
		t.Errorf("ledger %+v; want 1 sold", st)
	}
}

// TestFaultCartRetryWhileFirstCommitWaits: a cart's COMMIT waits for a
// silent synchronous standby and its reply is lost (503), so the first
// attempt lets go of the cart's lock while its row is unseen. The retry
// takes the lock, joins the first attempt's deductions, and is itself not
// committed (its time ran out before COMMIT). Holding the lock proves
// the first attempt done no more than a row not found does: the retry
// must not give back the deductions that attempt's COMMIT stands on.
// Before the ledger was asked to wait out the first attempt's writer, it
// gave them all back (Redis 20 and 20 left, the ledger 18 and 19 once the
// row landed). The cart sent again once no standby is named is answered
// from its row, and Redis equals the ledger.
func TestFaultCartRetryWhileFirstCommitWaits(t *testing.T) {
	systest.FullTier(t)
	pg := testenv.NewSyncPostgres(t)
	var pending sync.WaitGroup
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: pg.DSN, Tune: func(o *app.Options) {
		o.Sale.WorkTimeout = 10 * time.Second
		o.WrapLedger = func(l sale.Ledger) sale.Ledger {
			return lostReplies{Ledger: l, keys: []string{"c-cut"}, wait: time.Second, pending: &pending, tries: &sync.Map{}}
		}
	}})
	ctx := context.Background()
	p, skus := systest.CartSKUs(t, e, [3]int64{20, 20, 20}, 0)
	path := "/v1/programs/" + p.String() + "/carts"
	body := systest.CartBody("cid", map[string]int64{"adult": 2, "child": 1}, "adult", "child")

	pg.Standby(t, "nobody")
	t.Cleanup(func() { pg.Standby(t, "") })
	for _, what := range []string{"the cart, its COMMIT cut", "its retry, not committed"} {
		if r := e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "c-cut"}, body); r.Status != http.StatusServiceUnavailable {
			t.Errorf("%s = %d %s; want 503", what, r.Status, r.Body)
		}
	}
	for i, want := range []int64{18, 19} {
		st, err := e.Ledger.SKU(ctx, skus[i])
		if err != nil {
			t.Fatal(err)
		}
		left, _, err := e.Gate.Remaining(ctx, skus[i], st.Shards)
		if err != nil {
			t.Fatal(err)
		}
		if left != want {
			t.Errorf("%s while the cart's COMMIT waits: Redis %d left; want %d (nothing given back)", skus[i], left, want)
		}
	}

	pg.Standby(t, "")
	pending.Wait()
	if r, _ := e.Retried(t, http.MethodPost, path, "c-cut", body); r.Status != http.StatusCreated {
		t.Errorf("the cart sent again = %d %s; want 201 from its row", r.Status, r.Body)
	}
	for i, want := range []int64{2, 1} {
		if st := e.State(t, skus[i]); st.Sold != want {
			t.Errorf("%s: ledger %+v; want %d sold", skus[i], st, want)
		}
		systest.RedisConsistent(t, e, skus[i])
	}
}

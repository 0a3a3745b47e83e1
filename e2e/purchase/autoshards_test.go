package purchase_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/ledger"
)

// Self-sized shards (AutoShards) under load, two replicas on one ledger:
// a SKU made with one shard grows while buyers rush it, folds back when
// the rush slows to a trickle, grows again, and folds onto one shard as
// its units run out; every move is a fenced resize mid-sale. Nothing is
// sold twice or lost: the ledger sells exactly the total, one order per
// 201, and Redis ends equal to the ledger. The per-shard rate is set low
// (50 takes a second) so that a loaded test machine's rush is a rush.
func TestSelfSizedShards(t *testing.T) {
	tune := func(o *app.Options) { o.Sale.AutoShards, o.Sale.AutoShardRate = 8, 50 }
	dsn := testenv.PostgresURL(t)
	a := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Drift: true, Tune: tune})
	b := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Drift: true, Tune: tune})
	sku := systest.NewSKU(t)
	const total = 3000
	a.PutSKU(t, sku, total, 1, 4)
	ctx := context.Background()
	shards := func() int {
		st, err := a.Ledger.SKU(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		return st.Shards
	}
	// The sizer's resizes, and the drift check's collapse: a sold-out
	// tail moved onto one shard is the last fold when the check comes
	// to it before the sizer does (3 "resize" of the 4 wanted, once in
	// three runs, with the four moves seen above).
	resizes := func() float64 {
		var n float64
		for _, e := range []*systest.Env{a, b} {
			for _, reason := range []string{"resize", "collapse"} {
				n += systest.Counter(t, e.Registry, "stockgate_reseeds_total", map[string]string{"reason": reason})
			}
		}
		return n
	}

	s := systest.StartSalePaced(t, []*systest.Env{a, b}, sku, total, 16, 2)
	s.WaitSold(5, 30*time.Second)
	if n := shards(); n != 1 {
		t.Errorf("a trickle of 2 sales a second grew the SKU to %d shards, want 1", n)
	}
	s.Unpace()
	systest.WaitFor(t, 60*time.Second, "the rush to grow the shards", func() bool { return shards() > 1 })
	grown := shards()
	s.Pace(2)
	systest.WaitFor(t, 60*time.Second, "the trickle to fold them back", func() bool { return shards() < grown })
	// Past the fold it saw, not past one shard: a fold from 4 to 2 is
	// still more than one, and waiting for "> 1" counted no second grow
	// (3 resizes of the 4 wanted, once in a loaded make test).
	folded, soldAtFold := shards(), s.Counts()[http.StatusCreated]
	s.Unpace()
	systest.WaitFor(t, 60*time.Second, "the second rush to grow them again", func() bool { return shards() > folded })
	t.Logf("grew to %d, folded to %d with %d sold, grew to %d with %d sold", grown, folded, soldAtFold, shards(), s.Counts()[http.StatusCreated])
	s.WaitSold(total, 120*time.Second)
	systest.WaitFor(t, 30*time.Second, "the sold-out SKU onto one shard", func() bool { return shards() == 1 })

	st := s.Oracle() // every 201 an order under its key, none oversold
	if st.Sold != total {
		t.Errorf("sold %d across the resizes, want %d", st.Sold, total)
	}
	systest.RedisConsistent(t, a, sku)
	if n := resizes(); n < 4 {
		t.Errorf("%v resizes and collapses, want at least 4 (grow, fold, grow, fold)", n)
	}
	t.Logf("grew to %d shards; %v resizes in all; answers %v", grown, resizes(), s.Counts())
}

// A refund that lands while its SKU's gate is being rebuilt (the ledger's
// gate epoch moved on, Redis not yet seeded at it: a resize's few
// milliseconds, here held open by moving the epoch by hand) frees the
// buyer's place under the cap at once. The attacker's pass found the
// buyer refused at the cap (409 limit-reached) for the sweeper's 5-s
// grace after such a refund's 200: the counts went back only with the
// units, and the units wait for their epoch's gate. The next purchase
// rebuilds the stale gate and sells; units and counts end exact.
func TestRefundDuringRebuildFreesTheCap(t *testing.T) {
	for _, driver := range []string{ledger.Postgres, ledger.SQLite} {
		t.Run(driver, func(t *testing.T) {
			e := systest.Start(t, systest.Options{Driver: driver, DSN: systest.LedgerDSN(t, driver), Sweep: true})
			sku := systest.NewSKU(t)
			e.PutCapped(t, sku, 2, 2)
			first := e.MustBuy(t, sku, "cap-1", "ann", 2)
			if r := e.Buy(t, sku, "cap-2", "ann", 1); r.Status != http.StatusConflict {
				t.Fatalf("a third ticket over a cap of 2 = %d %s", r.Status, r.Body)
			}
			if _, err := e.Ledger.AdvanceGate(context.Background(), sku); err != nil {
				t.Fatal(err)
			}
			if r := e.Do(t, http.MethodPost, "/v1/orders/"+systest.OrderID(first)+"/refund",
				map[string]string{"Idempotency-Key": "cap-refund"}, `{"buyer":"ann"}`); r.Status != http.StatusOK {
				t.Fatalf("refund = %d %s", r.Status, r.Body)
			}
			if r := e.Buy(t, sku, "cap-3", "ann", 2); r.Status != http.StatusCreated {
				t.Fatalf("two tickets after the refund of two, the cap 2 = %d %s", r.Status, r.Body)
			}
			if r := e.Buy(t, sku, "cap-4", "ann", 1); r.Status != http.StatusConflict {
				t.Errorf("a third ticket again = %d %s", r.Status, r.Body)
			}
			systest.WaitSettled(t, e, sku)
			if st := e.State(t, sku); st.Sold != 2 || st.Orders != 1 {
				t.Errorf("after the refund and the second purchase: %+v, want 2 sold in 1 standing order", st)
			}
		})
	}
}

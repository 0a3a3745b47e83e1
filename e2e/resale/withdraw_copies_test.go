package resale_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// pausedWithdrawals holds a replica's ledger withdrawals of one listing
// until released, after telling that one arrived.
type pausedWithdrawals struct {
	sale.Ledger
	listing *string
	arrived chan struct{}
	release chan struct{}
	once    sync.Once
}

func (l *pausedWithdrawals) Withdraw(ctx context.Context, id, seller keys.ID, expect, epoch int64, req ledger.Request) (ledger.Listing, []ledger.Event, error) {
	if id.String() == *l.listing {
		l.once.Do(func() { close(l.arrived) })
		<-l.release
	}
	return l.Ledger.Withdraw(ctx, id, seller, expect, epoch, req)
}

// Two copies of one withdrawal (one key, two replicas) that read
// different counts left: copy A reads 5 and takes 5 at the gate, then
// waits at the ledger; a resale settles one ticket; copy B reads 4 and
// withdraws them. A's withdrawal of 5 is then refused and gives back what
// it took. Sharing one deduction record (it was named by the request
// alone), B stood on A's 5 units, A's give-back only let go of them, and
// the fifth stayed out of Redis: the gate one below the ledger
// (found by a read of the holder change, 2026-12-02).
func TestWithdrawCopiesReadingDifferentCounts(t *testing.T) {
	systest.FullTier(t)
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	var listingID string
	paused := &pausedWithdrawals{listing: &listingID, arrived: make(chan struct{}), release: make(chan struct{})}
	a := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: func(o *app.Options) {
		o.WrapLedger = func(l sale.Ledger) sale.Ledger { paused.Ledger = l; return paused }
	}})
	b := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Sweep: true,
		Tune: func(o *app.Options) { o.Sale.SweepEvery = 20 * time.Millisecond }})
	sku := systest.NewSKU(t)
	b.PutSKU(t, sku, 20, 1, 10)
	ann := systest.OrderID(b.MustBuy(t, sku, "p1", "ann", 10))
	x := mustList(t, b, ann, "l1", "ann", 5)
	listingID = x.ListingID
	systest.WaitFor(t, 10*time.Second, "the listed units at the gate", func() bool { return b.State(t, sku).RedisRemaining == 15 })

	path := "/v1/listings/" + x.ListingID + "/withdraw"
	first := make(chan systest.Reply, 1)
	go func() { first <- a.Act(t, path, "w1", "ann") }()
	select {
	case <-paused.arrived:
	case r := <-first:
		t.Fatalf("copy A answered before its ledger withdrawal: %d %s", r.Status, r.Body)
	}
	// A took 5 at the gate. A buyer takes one ticket, which (resale
	// "first") is the listing's once settled.
	b.MustBuy(t, sku, "p2", "bob", 1)
	systest.WaitFor(t, 20*time.Second, "the resale settled", func() bool { return getListing(t, b, x.ListingID).Sold == 1 })

	if r := b.Act(t, path, "w1", "ann"); r.Status != http.StatusOK {
		close(paused.release)
		t.Fatalf("copy B's withdrawal = %d %s", r.Status, r.Body)
	}
	close(paused.release)
	if r := <-first; r.Status/100 == 5 && r.Status != http.StatusServiceUnavailable {
		t.Errorf("copy A = %d %s", r.Status, r.Body)
	}
	if got := getListing(t, b, x.ListingID); got.State != "withdrawn" || got.Withdrawn != 4 || got.Sold != 1 {
		t.Errorf("listing %+v, want withdrawn 4 after 1 sold", got)
	}
	systest.WaitSettled(t, b, sku) // Redis equal to the ledger
}

// laterSettles stands for a settle that ran before a resale came of age:
// while armed, the replica's Settle of the SKU finds nothing, and its
// withdrawals wait until the sales before them are due, so the one the
// ledger's withdrawal settles on its way is the first to settle them.
type laterSettles struct {
	sale.Ledger
	armed  atomic.Bool
	soldAt atomic.Int64 // Unix ns of the last sale to come of age
}

func (l *laterSettles) Settle(ctx context.Context, sku stock.SKU) ([]ledger.Event, error) {
	if l.armed.Load() {
		return nil, nil
	}
	return l.Ledger.Settle(ctx, sku)
}

func (l *laterSettles) Withdraw(ctx context.Context, id, seller keys.ID, expect, epoch int64, req ledger.Request) (ledger.Listing, []ledger.Event, error) {
	if l.armed.Load() {
		due := time.Unix(0, l.soldAt.Load()).Add(ledger.ResaleHorizon + 100*time.Millisecond)
		time.Sleep(time.Until(due)) // the horizon is under test: a sale settles once it is ResaleHorizon old
	}
	return l.Ledger.Withdraw(ctx, id, seller, expect, epoch, req)
}

// A sale of one seller's listing settled inside another listing's
// withdrawal (the sale came of age between the service's settle and the
// ledger's) took the seller's units in the ledger but never gave back
// their count at the gate: carol, owning 3 of a cap of 4, was refused one
// more for as long as Redis kept the count (helper-49).
func TestASaleSettledInsideAWithdrawalFreesItsSellersCount(t *testing.T) {
	systest.FullTier(t)
	later := &laterSettles{}
	a := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: systest.LedgerDSN(t, ledger.Postgres), Tune: func(o *app.Options) {
		o.WrapLedger = func(l sale.Ledger) sale.Ledger { later.Ledger = l; return later }
	}})
	sku := systest.NewSKU(t)
	a.PutCapped(t, sku, 1, 4)
	carol := systest.OrderID(a.MustBuy(t, sku, "c1", "carol", 4))
	ann := systest.OrderID(a.MustBuy(t, sku, "a1", "ann", 1))
	mustList(t, a, carol, "lc", "carol", 2)
	x := mustList(t, a, ann, "la", "ann", 1)
	later.armed.Store(true)
	a.MustBuy(t, sku, "b1", "bob", 1) // carol's listing, the oldest, once settled
	later.soldAt.Store(time.Now().UnixNano())
	if r := a.Act(t, "/v1/listings/"+x.ListingID+"/withdraw", "w1", "ann"); r.Status != http.StatusOK {
		t.Fatalf("withdraw = %d %s", r.Status, r.Body)
	}
	later.armed.Store(false)
	if got := orderQuantity(t, a, carol); got != 3 {
		t.Fatalf("carol's order holds %d after one resold, want 3 (the sale settled by the withdrawal)", got)
	}
	if r := a.Buy(t, sku, "c2", "carol", 1); r.Status != http.StatusCreated {
		t.Errorf("carol owns 3 of a cap of 4 and buys 1: %d %s", r.Status, r.Body)
	}
}

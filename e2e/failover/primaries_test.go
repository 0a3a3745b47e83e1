package failover_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// One of two primaries stops mid-sale (its server halted, then started
// again): the program on the other sells to its last ticket meanwhile with
// nothing lost, the stopped one's buyers get 503 and nothing else, and once
// it is back its sale finishes; every 201 of both is in the ledger.
func TestFaultPrimaryDown(t *testing.T) {
	systest.FullTier(t)
	ctx := context.Background()
	own, err := testenv.StartOwnPostgres(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Stop)
	second, drop, err := own.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	o := systest.Options{Driver: ledger.Postgres, DSN: testenv.PostgresURL(t), Primaries: []string{second}, Sweep: true, Drift: true,
		Tune: func(o *app.Options) { o.Sale.SweepEvery = 100 * time.Millisecond }}
	a, b := systest.Start(t, o), systest.Start(t, o)
	envs := []*systest.Env{a, b}
	up := stock.SKU{Program: keys.MustID(testenv.ID(t, "up")), Ticket: keys.MustID("ga")}
	down := stock.SKU{Program: keys.MustID(testenv.ID(t, "down")), Ticket: keys.MustID("ga")}
	place(t, a, up.Program, app.FirstPrimary)
	place(t, a, down.Program, systest.PrimaryName(0))
	const total = 600
	a.PutSKU(t, up, total, 2, 4)
	a.PutSKU(t, down, total, 2, 4)
	// Each SKU row is on its program's primary only.
	if _, err := a.Ledger.Primary(systest.PrimaryName(0)).SKU(ctx, down); err != nil {
		t.Fatalf("%s on %s: %v", down, systest.PrimaryName(0), err)
	}
	if _, err := a.Ledger.First().SKU(ctx, down); !errors.Is(err, stock.ErrUnknownSKU) {
		t.Fatalf("%s on %s: %v, want none there", down, app.FirstPrimary, err)
	}
	sUp := systest.StartSaleAs(t, envs, up, total, 12, "u-")
	sDown := systest.StartSaleAs(t, envs, down, total, 12, "d-")
	sDown.WaitSold(total/5, 60*time.Second)
	sUp.WaitSold(total/5, 60*time.Second)

	own.Halt()
	halted := time.Now()
	before := sDown.Counts()
	sUp.WaitSold(total, 120*time.Second)
	st := sUp.Oracle()
	if st.Sold != total {
		t.Errorf("the live primary's program sold %d, want %d", st.Sold, total)
	}
	// A take that finds no primary waits for one until a second before
	// its work time ends (a failover's gap costs no 503), so the stopped
	// primary's buyers hear 503 only then: wait for it, not for the other
	// program's sell-out.
	systest.WaitFor(t, 30*time.Second, "a 503 for the stopped primary's program", func() bool {
		return sDown.Counts()[http.StatusServiceUnavailable] > before[http.StatusServiceUnavailable]
	})
	during := sDown.Counts()
	for status := range during {
		if status != http.StatusCreated && status != http.StatusServiceUnavailable {
			t.Errorf("the stopped primary's program answered %d while it was down or before (%v)", status, during)
		}
	}
	t.Logf("%s: sold out %v after the other primary stopped", up.Program, time.Since(halted).Round(time.Millisecond))

	if err := own.Restart(ctx); err != nil {
		t.Fatalf("restart the stopped primary: %v", err)
	}
	sDown.WaitSold(total, 120*time.Second)
	if st := sDown.Oracle(); st.Sold != total {
		t.Errorf("the stopped primary's program sold %d after it came back, want %d", st.Sold, total)
	}
	systest.RedisConsistent(t, a, up)
	systest.RedisConsistent(t, a, down)
}

// A request's row is on its program's primary, and only that primary is
// asked for it (helper-48). Before, every primary was: with another
// primary's link black-holed, a healthy program's refusals (a quantity
// over its maximum, a sold-out SKU) and a committed purchase's retry each
// waited on the silent primary and answered 503 instead of 422, 409 and
// 201. And a key one buyer used on two programs on two primaries (each its
// own request, OPERATIONS.md) answered a retry of the second 422, the
// first primary in the configured order having the first.
func TestAnotherPrimaryCutCostsThisProgramNothing(t *testing.T) {
	systest.FullTier(t)
	urls := testenv.PostgresURLs(t, 2)
	link, p1 := systest.LedgerLink(t, urls[1])
	o := systest.Options{Driver: ledger.Postgres, DSN: urls[0], Primaries: []string{p1}}
	a, b := systest.Start(t, o), systest.Start(t, o)
	up := stock.SKU{Program: keys.MustID(testenv.ID(t, "up")), Ticket: keys.MustID("ga")}
	cut := stock.SKU{Program: keys.MustID(testenv.ID(t, "cut")), Ticket: keys.MustID("ga")}
	gone := stock.SKU{Program: up.Program, Ticket: keys.MustID("gone")}
	place(t, a, up.Program, app.FirstPrimary)
	place(t, a, cut.Program, systest.PrimaryName(0))
	a.PutSKU(t, up, 100, 1, 4)
	a.PutSKU(t, gone, 1, 1, 4)
	a.PutSKU(t, cut, 100, 1, 4)
	a.MustBuy(t, gone, "last", "ann", 1)

	// One key, one buyer, a program on each primary: two requests.
	first := a.MustBuy(t, up, "k", "bob", 1)
	second := a.MustBuy(t, cut, "k", "bob", 2)
	for _, e := range []*systest.Env{a, b} {
		for _, c := range []struct {
			sku   stock.SKU
			q     int64
			order string
		}{{up, 1, systest.OrderID(first)}, {cut, 2, systest.OrderID(second)}} {
			if r := e.Buy(t, c.sku, "k", "bob", c.q); r.Status != http.StatusCreated || systest.OrderID(r) != c.order {
				t.Errorf("retry of k on %s = %d %s, want 201 with order %s", c.sku.Program, r.Status, r.Body, c.order)
			}
		}
	}

	link.Cut(t)
	for i, e := range []*systest.Env{a, b} {
		if r := e.Buy(t, up, "over", "cat", 5); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("5 over a maximum of 4, another primary cut: %d %s, want 422", r.Status, r.Body)
		}
		if r := e.Buy(t, gone, "late", "cat", 1); r.Status != http.StatusConflict {
			t.Errorf("a sold-out SKU, another primary cut: %d %s, want 409", r.Status, r.Body)
		}
		if r := e.Buy(t, up, "k", "bob", 1); r.Status != http.StatusCreated || systest.OrderID(r) != systest.OrderID(first) {
			t.Errorf("retry of a committed purchase, another primary cut: %d %s, want 201 with its order", r.Status, r.Body)
		}
		if r := e.Buy(t, up, fmt.Sprintf("new-%d", i), "cat", 1); r.Status != http.StatusCreated {
			t.Errorf("a purchase, another primary cut: %d %s", r.Status, r.Body)
		}
	}
}

// place puts program on the primary named on.
func place(t *testing.T, e *systest.Env, program keys.ID, on string) {
	t.Helper()
	if err := e.Ledger.Place(context.Background(), program, on); err != nil {
		t.Fatal(err)
	}
}

package failover_test

import (
	"context"
	"errors"
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
	for _, p := range []struct {
		program keys.ID
		on      string
	}{{up.Program, app.FirstPrimary}, {down.Program, systest.PrimaryName(0)}} {
		if err := a.Ledger.Place(ctx, p.program, p.on); err != nil {
			t.Fatal(err)
		}
	}
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

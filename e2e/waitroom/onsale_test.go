package waitroom_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/client"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/onsale"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/waitroom"
)

// An on-sale through the waiting room, on two replicas that both run the
// pacer: 1,000 buyers for 20 tickets, 30 % of the admitted walking away,
// every buyer polling as Retry-After says (the load tool's onsale
// scenario, at the size a -race run affords; `stockbench run -scenario
// onsale -n 100000 -tickets 1000` is the full size). Every ticket sold;
// admission in position order and within the stock's slack; nobody
// admitted after the sold-out; every waiting buyer told sold-out a refresh
// after the last sale.
func TestQueueOnSale(t *testing.T) {
	t.Parallel() // its own env and programs: it overlaps the others' waits
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Pacer: true})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Pacer: true})
		admin, err := client.New(client.Options{BaseURL: a.URL})
		if err != nil {
			t.Fatal(err)
		}
		// Share 0, the older rule, whose promise is exact: never more
		// admitted-but-unused buyers than the slack. With the default
		// share the pacer may admit past it, within a share it judges
		// from the buyers it saw walk away; on a loaded make test machine
		// buyers came back after their 2-s windows (150 of 284 late),
		// read as walk-aways, and 45 admitted buyers met sold out against
		// a slack of 20. The share has tests of its own
		// (TestQueueSoldOutShare, TestPacerStaysWithinItsSoldOutShare).
		share := 0.0
		rep, err := onsale.Run(context.Background(), onsale.Options{BaseURLs: []string{a.URL, b.URL}, Admin: admin,
			Program: testenv.ID(t, "onsale"), Buyers: 1000, Tickets: 20, Abandon: 0.3, Rate: 200, Window: 2 * time.Second,
			PerRemaining: 1, Workers: 32, Refresh: waitroom.Refresh, Seed: 7, Timeout: 4 * time.Minute, SoldOutShare: &share})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v", rep)
		if len(rep.Violations) > 0 {
			t.Fatalf("%d violations:\n%s", len(rep.Violations), strings.Join(rep.Violations, "\n"))
		}
		if rep.Sold != 20 || rep.Walked == 0 || rep.Swept != 1000-20 || rep.Admitted < 20+rep.Walked {
			t.Fatalf("the sale went otherwise: %+v", rep)
		}
	})
}

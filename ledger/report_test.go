package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// The report's balanced holds the SKU row's listed units to the sellers'
// orders (order_listings), not only to itself: two of its
// four checks held by how they were counted, so a listed count drifting
// from the listings read balanced (helper-72 #1). Here each side is put
// out of step by hand and read back.
func TestReportBalancesTheListings(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		s := stock.SKU{Program: keys.MustID(fmt.Sprintf("rep%d", time.Now().UnixNano())), Ticket: keys.MustID("t")}
		listOne(t, l, s, 3)
		balanced := func() bool {
			t.Helper()
			rs, err := l.Report(ctx, s.Program)
			if err != nil || len(rs) != 1 {
				t.Fatalf("report: %v, %v", rs, err)
			}
			return rs[0].Balanced()
		}
		if !balanced() {
			t.Fatal("a ticket with one live listing reads unbalanced")
		}
		for _, c := range []struct{ drift, undo string }{
			{`UPDATE skus SET listed = listed + 1, total = total + 1 WHERE program = $1`,
				`UPDATE skus SET listed = listed - 1, total = total - 1 WHERE program = $1`},
			{`UPDATE order_listings SET listed = listed - 1 WHERE order_id IN (SELECT id FROM orders WHERE program = $1)`,
				`UPDATE order_listings SET listed = listed + 1 WHERE order_id IN (SELECT id FROM orders WHERE program = $1)`},
		} {
			if _, err := l.DB().ExecContext(ctx, c.drift, s.Program); err != nil {
				t.Fatal(err)
			}
			if balanced() {
				t.Errorf("after %q the report reads balanced", c.drift)
			}
			if _, err := l.DB().ExecContext(ctx, c.undo, s.Program); err != nil {
				t.Fatal(err)
			}
			if !balanced() {
				t.Fatalf("after %q the report still reads unbalanced", c.undo)
			}
		}
	})
}

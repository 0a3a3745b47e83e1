package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/fleet"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// `stockgate move` as docs/OPERATIONS.md shows it: configured like the
// gateway (-ledger-dsn, -ledger-primaries), it moves a closed program and
// logs every table's rows on both sides; a sale still open, an unknown
// program or primary, or no -program exit 1 saying why and move nothing.
func TestMoveCommand(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	ps := []fleet.Primary{{Name: "main", Ledger: ledger.Options{Driver: ledger.Postgres, DSN: urls[0]}},
		{Name: "p1", Ledger: ledger.Options{Driver: ledger.Postgres, DSN: urls[1]}}}
	f, err := fleet.Open(ctx, fleet.Options{Primaries: ps, PlaceTTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sku := stock.SKU{Program: keys.MustID(testenv.ID(t, "show")), Ticket: keys.MustID("ga")}
	if err := f.Place(ctx, sku.Program, "main"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"k1", "k2"} {
		r := f.Commit(ctx, []ledger.Take{ledger.PurchaseTake(ledger.Order{IdempotencyKey: keys.MustID(key), SKU: sku,
			Buyer: keys.MustID("ann"), Quantity: 2, Gate: `[{"shards":1}]`,
			Req: ledger.Request{Scope: keys.MustID("ann"), Key: keys.MustID(key), Fingerprint: key, Op: ledger.OpPurchase}})}, false)
		if r[0].Err != nil {
			t.Fatal(r[0].Err)
		}
	}
	t.Setenv("STOCKGATE_LEDGER_DRIVER", "postgres")
	t.Setenv("STOCKGATE_LEDGER_DSN", urls[0])
	t.Setenv("STOCKGATE_LEDGER_PRIMARIES", "p1="+urls[1])
	t.Setenv("STOCKGATE_PLACE_TTL", "10ms")
	for _, bad := range []struct {
		args []string
		says string
	}{
		{[]string{"move", "-to", "p1"}, "STOCKGATE_PROGRAM (-program)"},
		{[]string{"move", "-program", sku.Program.String(), "-to", "nowhere"}, `no primary named \"nowhere\"`},
		{[]string{"move", "-program", "unknown-show", "-to", "p1"}, "is on no primary"},
		{[]string{"move", "-program", sku.Program.String(), "-to", "p1"}, "not closed"}, // its sale is open
	} {
		if code, out := runBounded(t, bad.args...); code != 1 || !strings.Contains(out, bad.says) {
			t.Errorf("%v = %d, want 1 saying %q: %s", bad.args, code, bad.says, out)
		}
	}
	if pl, err := f.First().PlacementOf(ctx, sku.Program); err != nil || pl.Primary != "main" || pl.Moving {
		t.Fatalf("after the refused moves: %+v %v, want on main, not moving", pl, err)
	}
	if _, err := f.EndSale(ctx, sku); err != nil {
		t.Fatal(err)
	}
	code, out := runBounded(t, "move", "-program", sku.Program.String(), "-to", "p1")
	if code != 0 || !strings.Contains(out, `"msg":"program moved"`) || !strings.Contains(out, `"table":"orders","source_rows":2,"target_rows":2`) {
		t.Fatalf("move = %d, want 0 logging the rows moved: %s", code, out)
	}
	st, err := f.Primary("p1").SKU(ctx, sku)
	if err != nil || st.Sold != 4 {
		t.Errorf("on p1 after the move: %+v %v, want sold 4", st, err)
	}
	if _, err := f.Primary("main").SKU(ctx, sku); !errors.Is(err, stock.ErrUnknownSKU) {
		t.Errorf("on main after the move: %v, want none", err)
	}
}

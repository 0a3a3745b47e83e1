package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stockgate/stockgate/fleet"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// open opens a fleet over the given URLs, named main, p1, p2, ...
func open(t *testing.T, urls []string, ttl time.Duration) *fleet.Fleet {
	t.Helper()
	var ps []fleet.Primary
	for i, u := range urls {
		name := "main"
		if i > 0 {
			name = fmt.Sprintf("p%d", i)
		}
		ps = append(ps, fleet.Primary{Name: name, Ledger: ledger.Options{Driver: ledger.Postgres, DSN: u}})
	}
	f, err := fleet.Open(context.Background(), fleet.Options{Primaries: ps, PlaceTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func sku(program string) stock.SKU {
	return stock.SKU{Program: keys.MustID(program), Ticket: keys.MustID("ga")}
}

func buy(t *testing.T, f *fleet.Fleet, s stock.SKU, key, buyer string, q int64) ledger.Order {
	t.Helper()
	r := f.Commit(context.Background(), []ledger.Take{ledger.PurchaseTake(ledger.Order{IdempotencyKey: keys.MustID(key), SKU: s,
		Buyer: keys.MustID(buyer), Quantity: q, Gate: `[{"shards":1}]`,
		Req: ledger.Request{Scope: keys.MustID(buyer), Key: keys.MustID(key), Fingerprint: "buy " + key, Op: ledger.OpPurchase}})}, false)
	if r[0].Err != nil {
		t.Fatalf("buy %s: %v", key, r[0].Err)
	}
	return r[0].Order()
}

// New programs are placed on the primary holding the fewest, each
// program's rows live on its primary only, and a replica that has seen
// none of them (a fresh fleet) finds every row by its id: orders, holds
// and a batch of confirms spread over both primaries.
func TestProgramsSpreadAndRowsAreFound(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	f := open(t, urls, time.Minute)
	skus := []stock.SKU{sku("a"), sku("b"), sku("c"), sku("d")}
	for _, s := range skus {
		if _, err := f.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
	}
	on := map[string]int{}
	for _, s := range skus {
		pl, err := f.First().PlacementOf(ctx, s.Program)
		if err != nil {
			t.Fatal(err)
		}
		on[pl.Primary]++
		other := "main"
		if pl.Primary == "main" {
			other = "p1"
		}
		if _, err := f.Primary(pl.Primary).SKU(ctx, s); err != nil {
			t.Errorf("%s on its primary %s: %v", s, pl.Primary, err)
		}
		if _, err := f.Primary(other).SKU(ctx, s); !errors.Is(err, stock.ErrUnknownSKU) {
			t.Errorf("%s on %s too: %v", s, other, err)
		}
	}
	if on["main"] != 2 || on["p1"] != 2 {
		t.Errorf("4 programs placed %v, want 2 on each", on)
	}

	var orders []ledger.Order
	var holds []ledger.HoldRequest
	for i, s := range skus {
		orders = append(orders, buy(t, f, s, fmt.Sprintf("o%d", i), "ann", 1))
		r := f.Commit(ctx, []ledger.Take{ledger.HoldTake(ledger.Hold{IdempotencyKey: keys.MustID(fmt.Sprintf("h%d", i)), SKU: s,
			Buyer: keys.MustID("bob"), Quantity: 2, ExpiresAt: time.Now().Add(time.Hour), Gate: `[{"shards":1}]`})}, false)[0]
		h := r.Hold()
		if r.Err != nil || h.ID.IsZero() {
			t.Fatalf("hold on %s: %v", s, r.Err)
		}
		holds = append(holds, ledger.HoldRequest{HoldID: h.ID, Buyer: h.Buyer,
			Req: ledger.Request{Scope: h.Buyer, Key: keys.MustID(fmt.Sprintf("c%d", i)), Fingerprint: "confirm", Op: ledger.OpConfirm}})
	}

	fresh := open(t, urls, time.Minute)
	for _, o := range orders {
		got, err := fresh.OrderByID(ctx, o.ID)
		if err != nil || got.SKU != o.SKU {
			t.Errorf("order %s of %s from a fresh replica: %+v, %v", o.ID, o.SKU, got, err)
		}
	}
	// Events live on their program's primary; the fleet knows them all.
	var evIDs []keys.ID
	for _, s := range skus {
		evs, err := fresh.Events(ctx, s.Program, 0, 10)
		if err != nil || len(evs) == 0 {
			t.Fatalf("events of %s: %d, %v", s, len(evs), err)
		}
		evIDs = append(evIDs, evs[0].ID)
	}
	if known, err := fresh.KnownEvents(ctx, append(evIDs, ledger.NewID())); err != nil || len(known) != len(evIDs) {
		t.Errorf("known of %d events over both primaries and a made-up one = %v, %v; want the %d", len(evIDs)+1, known, err, len(evIDs))
	}
	if _, err := fresh.OrderByID(ctx, ledger.NewIDOf(skus[0])); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("an order nowhere: %v, want ErrNotFound", err)
	}
	got, err := fresh.ConfirmBatch(ctx, holds)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range got {
		if errors.Is(r.Err, ledger.ErrSplit) {
			// Not where its lane was guessed: decided alone.
			o, err := fresh.Confirm(ctx, holds[i].HoldID, holds[i].Buyer, holds[i].Req)
			r = ledger.BatchResult{Order: o, Err: err}
		}
		if r.Err != nil || r.Order.SKU != skus[i] || r.Order.Quantity != 2 {
			t.Errorf("confirm of the hold on %s: %+v", skus[i], r)
		}
	}
	for _, s := range skus {
		st, err := fresh.SKU(ctx, s)
		if err != nil || st.Sold != 3 || st.Held != 0 {
			t.Errorf("%s: sold %d held %d (%v), want 3 and 0", s, st.Sold, st.Held, err)
		}
	}
	all, err := fresh.SKUs(ctx, stock.SKU{}, 10)
	if err != nil || len(all) != len(skus) {
		t.Fatalf("SKUs over both primaries: %d (%v), want %d", len(all), err, len(skus))
	}
	for i := range all {
		if all[i].SKU != skus[i] {
			t.Errorf("SKUs in order: #%d is %s, want %s", i, all[i].SKU, skus[i])
		}
	}
}

// A closed program moves between primaries with every row, checked table
// by table; the source keeps nothing; every replica reads it on the target
// (a fresh one from the directory); a sale still open is refused and left
// where it was, writable.
func TestMoveProgram(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	f := open(t, urls, 200*time.Millisecond)
	s, open2 := sku("moving"), sku("open")
	for _, x := range []stock.SKU{s, open2} {
		if err := f.Place(ctx, x.Program, "main"); err != nil {
			t.Fatal(err)
		}
		if _, err := f.PutSKU(ctx, ledger.SKUConfig{SKU: x, Total: 20, Shards: 1, MaxPerOrder: 4, PerBuyer: 8}); err != nil {
			t.Fatal(err)
		}
	}
	a := buy(t, f, s, "k1", "ann", 3)
	buy(t, f, s, "k2", "bob", 2)
	if _, _, err := f.Refund(ctx, a.ID, a.Buyer, ledger.Request{Scope: a.Buyer, Key: keys.MustID("r1"), Fingerprint: "refund", Op: ledger.OpRefund}); err != nil {
		t.Fatal(err)
	}
	buy(t, f, open2, "k3", "cat", 1)

	if _, err := f.Move(ctx, s.Program, "p1"); !errors.Is(err, ledger.ErrSaleOpen) {
		t.Fatalf("move of a sale not ended: %v, want ErrSaleOpen", err)
	}
	if pl, _ := f.First().PlacementOf(ctx, s.Program); pl.Primary != "main" || pl.Moving {
		t.Fatalf("after a refused move: %+v, want on main and not moving", pl)
	}
	buy(t, f, s, "k4", "dan", 1) // still writable where it was
	if _, err := f.EndSale(ctx, s); err != nil {
		t.Fatal(err)
	}
	before, _ := f.SKU(ctx, s)
	r, err := f.Move(ctx, s.Program, "p1")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range r.Counts {
		if c.Source != c.Target {
			t.Errorf("%s: %d rows on the source, %d on the target", c.Table, c.Source, c.Target)
		}
	}
	if r.From != "main" || r.To != "p1" || r.Sums != [3]int64{before.Total, before.Sold, before.Held} {
		t.Errorf("report %+v; SKU before %+v", r, before)
	}
	if has, err := f.Primary("main").HasProgram(ctx, s.Program); err != nil || has {
		t.Errorf("the source still has the program: %v %v", has, err)
	}
	for _, g := range []*fleet.Fleet{f, open(t, urls, time.Minute)} {
		st, err := g.SKU(ctx, s)
		if err != nil || st.Sold != before.Sold || st.Total != before.Total {
			t.Errorf("after the move: %+v %v, want sold %d of %d", st, err, before.Sold, before.Total)
		}
		if o, err := systestOrder(ctx, g, "bob", "k2"); err != nil || o.Quantity != 2 {
			t.Errorf("bob's order after the move: %+v %v", o, err)
		}
		if n, err := g.BuyerUnits(ctx, s, keys.MustID("bob")); err != nil || n != 2 {
			t.Errorf("bob's counted units after the move: %d %v, want 2", n, err)
		}
	}
	// Run again: nothing left to do, nothing dropped.
	again, err := f.Move(ctx, s.Program, "p1")
	if err != nil || len(again.Dropped) != 0 {
		t.Errorf("the move again: %+v %v", again, err)
	}
	// The other program never moved.
	if pl, _ := f.First().PlacementOf(ctx, open2.Program); pl.Primary != "main" {
		t.Errorf("%s is on %s", open2.Program, pl.Primary)
	}
}

func systestOrder(ctx context.Context, f *fleet.Fleet, buyer, key string) (ledger.Order, error) {
	rec, err := f.RequestByKey(ctx, keys.ID{}, keys.MustID(buyer), keys.MustID(key))
	if err != nil {
		return ledger.Order{}, err
	}
	if rec.Order == nil {
		return ledger.Order{}, fmt.Errorf("not an order: %s", rec.Op)
	}
	return f.OrderByID(ctx, rec.Order.ID)
}

// With the directory's primary unreachable, a replica keeps routing the
// programs it read, and a fresh one finds a program on another primary by
// asking; the program on the unreachable one answers unavailable.
func TestDirectoryDown(t *testing.T) {
	ctx := context.Background()
	mainURL, proxy := testenv.ProxiedPostgresURL(t)
	urls := []string{mainURL, testenv.PostgresURLs(t, 2)[1]}
	// A PlaceTTL of 1ns: every call reads the directory again, or tries.
	f := open(t, urls, time.Nanosecond)
	fresh := open(t, urls, time.Nanosecond)
	far := sku("far")
	if err := f.Place(ctx, far.Program, "p1"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.PutSKU(ctx, ledger.SKUConfig{SKU: far, Total: 5, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	defer proxy.Restore()
	// f placed the program; fresh has never read its place.
	for i, g := range []*fleet.Fleet{f, fresh} {
		name := []string{"a replica that read it", "a replica that never did"}[i]
		o := buy(t, g, far, fmt.Sprintf("k%d", i), "ann", 1)
		if o.SKU != far {
			t.Errorf("%s: bought %+v", name, o)
		}
	}
	if _, err := f.SKU(ctx, sku("nowhere")); !errors.Is(err, ledger.ErrNotCommitted) {
		t.Errorf("a program placed nowhere with the directory down: %v, want unavailable", err)
	}
}

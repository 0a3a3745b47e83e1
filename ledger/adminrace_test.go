package ledger_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv/ledgerenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// Admin changes racing on PostgreSQL (SQLite's one writer serializes
// them). A plain transaction holds the ticket's row, as the racing change
// would; the calls under test queue behind it, in a known order, and are
// let go together.

// lockWaiter is a second connection to the ledger's database: it holds a
// ticket's row, and counts the backends waiting for a lock.
type lockWaiter struct {
	t  *testing.T
	db *sql.DB
	tx *sql.Tx
}

func holdTicketRow(t *testing.T, dsn string, s stock.SKU) *lockWaiter {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() })
	if _, err := tx.Exec(`SELECT total FROM skus WHERE program = $1 AND ticket = $2 FOR UPDATE`, s.Program, s.Ticket); err != nil {
		t.Fatal(err)
	}
	return &lockWaiter{t: t, db: db, tx: tx}
}

// waiting returns once n backends wait for a lock, or done has a value
// (a call that should have waited ended): then it fails with what it was.
func (w *lockWaiter) waiting(n int, done <-chan error, what string) {
	w.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) { // poll interval
		select {
		case err := <-done:
			w.t.Fatalf("%s ended while the ticket's row was held (err %v): it did not wait for it", what, err)
		default:
		}
		var got int
		err := w.db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&got)
		if err == nil && got >= n {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%d lock waits after 20 s, want %d (%v)", got, n, err)
		}
	}
}

func (w *lockWaiter) release() { w.tx.Rollback() }

func runAsync(f func() error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	return done
}

// A seat map loaded while a pool of the same ticket is made: one of the
// two stands, never both (helper-33: the map's check of "no pools" read
// before the pool committed, and each wrote the ticket's total over the
// other's: a seated ticket of 100 seats beside a counted pool of 20).
func TestSeatMapAndPoolTakeTurns(t *testing.T) {
	ctx := context.Background()
	dsn := ledgerenv.DSN(t, ledger.Postgres)
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 100, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	w := holdTicketRow(t, dsn, sku)
	pool := sku.InPool(keys.MustID("fans"))
	pooled := runAsync(func() error {
		_, err := l.PutPool(ctx, ledger.PoolConfig{SKU: pool, Allotment: 20, Shards: 1, Create: true})
		return err
	})
	w.waiting(1, pooled, "the pool")
	seats := make([]ledger.Seat, 100)
	for i := range seats {
		seats[i] = ledger.Seat{ID: keys.MustID(fmt.Sprintf("A-%d", i+1)), Section: keys.MustID("A"), Row: "A", Number: i + 1}
	}
	mapped := runAsync(func() error {
		_, err := l.LoadSeats(ctx, sku, seats)
		return err
	})
	w.waiting(2, mapped, "the seat map")
	w.release()
	perr, merr := <-pooled, <-mapped
	if (perr == nil) == (merr == nil) {
		t.Fatalf("pool: %v, seat map: %v; want exactly one to stand", perr, merr)
	}
	for _, err := range []error{perr, merr} {
		if err != nil && !errors.Is(err, stock.ErrInvalid) {
			t.Errorf("the refused one: %v, want stock.ErrInvalid", err)
		}
	}
	st, err := l.SKU(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	ps, _ := l.SKU(ctx, pool)
	switch {
	case merr == nil && (!st.Seated || st.Total != 100 || ps.Total != 0):
		t.Errorf("seat map stood: ticket %+v, pool %+v; want seated 100 and no pool stock", st, ps)
	case perr == nil && (st.Seated || st.Total != 80 || ps.Total != 20):
		t.Errorf("pool stood: ticket %+v, pool %+v; want 80 counted and 20 pooled", st, ps)
	}
}

// Two parts of a seat map loaded at once (two replicas, disjoint seats):
// the ticket's total is every seat of both (helper-38: each load counted
// the map before it waited for the ticket's row, and the last to commit
// wrote its own count: 50 of 100 seats sellable).
func TestSeatMapsLoadedTogetherCountBoth(t *testing.T) {
	ctx := context.Background()
	dsn := ledgerenv.DSN(t, ledger.Postgres)
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 1, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	w := holdTicketRow(t, dsn, sku)
	var loads []<-chan error
	for i, section := range []string{"A", "B"} {
		seats := make([]ledger.Seat, 50)
		for k := range seats {
			seats[k] = ledger.Seat{ID: keys.MustID(fmt.Sprintf("%s-%d", section, k+1)), Section: keys.MustID(section), Row: "1", Number: k + 1}
		}
		loads = append(loads, runAsync(func() error {
			_, err := l.LoadSeats(ctx, sku, seats)
			return err
		}))
		w.waiting(i+1, loads[i], "section "+section)
	}
	w.release()
	for i, done := range loads {
		if err := <-done; err != nil {
			t.Fatalf("load %d: %v", i, err)
		}
	}
	st, err := l.SKU(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Seated || st.Total != 100 {
		t.Errorf("after two loads of 50 seats each: seated %v, total %d; want 100", st.Seated, st.Total)
	}
}

// A transfer waits for a buyer cap being switched on (helper-33): the
// switch recounts the ticket's buyers from one read, and a transfer that
// locked nothing the switch held committed in between, so the sender
// stayed counted for units gone and the receiver was counted for none
// (under a cap of 4, bob could own 8). Here the switch is held up at the
// ticket's row (by the plain transaction) after it took its cap lock; the
// transfer must queue behind it, and then count under the cap.
func TestTransferWaitsForACapSwitch(t *testing.T) {
	ctx := context.Background()
	dsn := ledgerenv.DSN(t, ledger.Postgres)
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cfg := ledger.SKUConfig{SKU: sku, Total: 100, Shards: 1, MaxPerOrder: 4}
	if _, err := l.PutSKU(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	o, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("p"), SKU: sku, Buyer: keys.MustID("ann"), Quantity: 4,
		Gate: `[{"shards":1}]`, Req: req("ann", "p", "buy", ledger.OpPurchase)})
	if err != nil {
		t.Fatal(err)
	}
	w := holdTicketRow(t, dsn, sku)
	capped := cfg
	capped.PerBuyer = 4
	switched := runAsync(func() error {
		_, err := l.PutSKU(ctx, capped)
		return err
	})
	w.waiting(1, switched, "the cap switch")
	moved := runAsync(func() error {
		_, err := l.Transfer(ctx, o.ID, o.Buyer, keys.MustID("bob"), 0, req("ann", "xf", "transfer", ledger.OpTransfer))
		return err
	})
	w.waiting(2, moved, "the transfer")
	w.release()
	if err := <-switched; err != nil {
		t.Fatal(err)
	}
	if err := <-moved; err != nil {
		t.Fatal(err)
	}
	buy := func(buyer, key string) error {
		_, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID(key), SKU: sku, Buyer: keys.MustID(buyer), Quantity: 1,
			Gate: `[{"shards":1}]`, Req: req(buyer, key, key, ledger.OpPurchase)})
		return err
	}
	if err := buy("bob", "b1"); !errors.Is(err, stock.ErrLimit) {
		t.Errorf("bob, who owns 4 under a cap of 4, buys 1: %v, want stock.ErrLimit", err)
	}
	if err := buy("ann", "a1"); err != nil {
		t.Errorf("ann, who owns none, buys 1: %v", err)
	}
}

// A transfer does not hold up the sales of its ticket (helper-36: a share
// lock on the ticket's row did, for the transfer's length, and closed
// cycles with listings and settles, which lock the row, then the order).
// The transfer is stopped in its count of the receiver (bob's count row
// held by a plain transaction), past its cap locks; a purchase of the
// ticket must commit meanwhile.
func TestTransferHoldsNoSKURow(t *testing.T) {
	ctx := context.Background()
	dsn := ledgerenv.DSN(t, ledger.Postgres)
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 100, Shards: 1, MaxPerOrder: 4, PerBuyer: 10}); err != nil {
		t.Fatal(err)
	}
	buy := func(buyer, key string, q int64) (ledger.Order, error) {
		return l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID(key), SKU: sku, Buyer: keys.MustID(buyer), Quantity: q,
			Gate: `[{"shards":1}]`, Req: req(buyer, key, key, ledger.OpPurchase)})
	}
	o, err := buy("ann", "p", 4)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(`INSERT INTO buyer_units (program, ticket, buyer, units) VALUES ($1, $2, 'bob', 0)`, sku.Program, sku.Ticket); err != nil {
		t.Fatal(err)
	}
	w := &lockWaiter{t: t, db: db, tx: tx}
	moved := runAsync(func() error {
		_, err := l.Transfer(ctx, o.ID, o.Buyer, keys.MustID("bob"), 0, req("ann", "xf", "transfer", ledger.OpTransfer))
		return err
	})
	w.waiting(1, moved, "the transfer")
	bought := runAsync(func() error {
		_, err := buy("cat", "c1", 2)
		return err
	})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) { // poll interval
		select {
		case err := <-bought:
			if err != nil {
				t.Errorf("a purchase while a transfer of the ticket waits: %v", err)
			}
			w.release()
			if err := <-moved; err != nil {
				t.Fatal(err)
			}
			return
		default:
		}
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err == nil && n >= 2 {
			w.release()
			t.Fatalf("a purchase of the ticket waits for a transfer of it (%d lock waits)", n)
		}
		if time.Now().After(deadline) {
			t.Fatal("the purchase neither committed nor waited in 20 s")
		}
	}
}

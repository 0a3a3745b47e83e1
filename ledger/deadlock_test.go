package ledger_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// A transfer or refund that PostgreSQL rolls back as a deadlock's victim
// runs again instead of answering 503. CI saw it: a listing (SKU row, then
// the order) and a refund (the order, then the SKU row) closed a cycle
// through a transfer that only waited for the order's row (the first
// waiter holds the row's tuple lock). Here two plain transactions play
// the listing and the refund, with deadlock checks 30 s away, so the
// operation under test (checked after 1 s) is the victim every time; the
// refund's part then gives up on its own lock timeout and the cycle is
// gone.
func TestDeadlockVictimsRunAgain(t *testing.T) {
	for _, tc := range []struct {
		name string
		// queued: the operation waits behind the order's lock holder
		// (transfer) rather than holding the order itself (refund).
		queued bool
		do     func(ctx context.Context, l *ledger.Ledger, o ledger.Order) error
	}{
		{"transfer", true, func(ctx context.Context, l *ledger.Ledger, o ledger.Order) error {
			_, err := l.Transfer(ctx, o.ID, o.Buyer, keys.MustID("zed"), 0, req("ann", "xf", "transfer", ledger.OpTransfer))
			return err
		}},
		{"refund", false, func(ctx context.Context, l *ledger.Ledger, o ledger.Order) error {
			_, _, err := l.Refund(ctx, o.ID, o.Buyer, req("ann", "rf", "refund", ledger.OpRefund))
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dsn := testenv.PostgresURL(t)
			l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: withParam(t, dsn, "deadlock_timeout", "1s")})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
			o, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("p"), SKU: sku, Buyer: keys.MustID("ann"), Quantity: 2,
				Gate: `[{"shards":1}]`, Req: req("ann", "p", "buy", ledger.OpPurchase)})
			if err != nil {
				t.Fatal(err)
			}
			db, err := sql.Open("pgx", withParam(t, dsn, "deadlock_timeout", "30s"))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			begin := func() *sql.Tx {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { tx.Rollback() })
				return tx
			}
			const lockOrder = `SELECT id FROM orders WHERE id = $1 FOR UPDATE`
			const lockSKU = `SELECT total FROM skus WHERE program = $1 AND ticket = $2 FOR UPDATE`
			waiting := func(n int) {
				t.Helper()
				for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) { // poll interval
					var got int
					err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&got)
					if err == nil && got >= n {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("%d lock waits after 20 s, want %d (%v)", got, n, err)
					}
				}
			}

			// The refund's part: the order first (it waits behind the
			// operation when that came first).
			refund := begin()
			listing := begin()
			done := make(chan error, 1)
			start := func() {
				go func() {
					ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
					defer cancel()
					done <- tc.do(ctx, l, o)
				}()
			}
			if tc.queued {
				if _, err := refund.ExecContext(ctx, lockOrder, o.ID); err != nil {
					t.Fatal(err)
				}
				start()
				waiting(1)
			} else {
				// The refund under test holds the order and waits for the
				// SKU row the listing holds.
				if _, err := listing.ExecContext(ctx, lockSKU, sku.Program, sku.Ticket); err != nil {
					t.Fatal(err)
				}
				start()
				waiting(1)
			}
			// The listing's part: the SKU row, then the order.
			listed := make(chan error, 1)
			go func() {
				if tc.queued {
					if _, err := listing.ExecContext(ctx, lockSKU, sku.Program, sku.Ticket); err != nil {
						listed <- err
						return
					}
				}
				_, err := listing.ExecContext(ctx, lockOrder, o.ID)
				if err == nil {
					err = listing.Commit()
				}
				listed <- err
			}()
			if tc.queued {
				waiting(2)
				// The refund's part asks for the SKU row: the cycle closes.
				// It gives up after 5 s (its deadlock check is 30 s away).
				if _, err := refund.ExecContext(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
					t.Fatal(err)
				}
				if _, err := refund.ExecContext(ctx, lockSKU, sku.Program, sku.Ticket); err == nil {
					t.Fatal("the refund's part got the SKU row the listing's part holds")
				}
				refund.Rollback()
			}
			if err := <-listed; err != nil {
				t.Fatalf("the listing's part: %v", err)
			}
			if err := <-done; err != nil {
				t.Fatalf("%s beside a deadlock: %v", tc.name, err)
			}
		})
	}
}

// withParam adds a run-time parameter to a PostgreSQL URL.
func withParam(t *testing.T, dsn, name, value string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// A refund that read the order as its buyer's, then waited for its row
// while the order moved to another buyer who refunded it, is ErrNotOwner:
// it answered 200 with the other buyer's refund, recorded under its key
// for good, and a platform refunding on that answer paid twice
// (helper-75 #3). PostgreSQL only: the refund must wait between its read
// and its update, which SQLite's one writer never lets it do.
func TestRefundOfAnOrderMovedMeanwhile(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	o, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("p"), SKU: sku, Buyer: keys.MustID("ann"), Quantity: 2,
		Gate: `[{"shards":1}]`, Req: req("ann", "p", "buy", ledger.OpPurchase)})
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// The other buyer's transfer and refund, played by one transaction
	// that holds the order's row while ann's refund waits for it.
	other, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback()
	if _, err := other.ExecContext(ctx, `SELECT id FROM orders WHERE id = $1 FOR UPDATE`, o.ID); err != nil {
		t.Fatal(err)
	}
	done := runAsync(func() error {
		_, _, err := l.Refund(ctx, o.ID, o.Buyer, req("ann", "rf", "refund", ledger.OpRefund))
		return err
	})
	(&lockWaiter{t: t, db: db, tx: other}).waiting(1, done, "ann's refund")
	if _, err := other.ExecContext(ctx, `UPDATE orders SET buyer = 'bob', refunded_at = $2 WHERE id = $1`, o.ID, time.Now().UnixMilli()); err != nil {
		t.Fatal(err)
	}
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ledger.ErrNotOwner) {
		t.Errorf("ann's refund of the order bob refunded meanwhile = %v, want ErrNotOwner", err)
	}
}

package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// clock is a settable time for expiry tests.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func eachDriverClock(t *testing.T, f func(t *testing.T, l *ledger.Ledger, c *clock)) {
	for _, driver := range []string{ledger.SQLite, ledger.Postgres} {
		t.Run(driver, func(t *testing.T) {
			ls, c, _ := openLedgers(t, driver, 1)
			f(t, ls[0], c)
		})
	}
}

// openLedgers opens n ledgers (replicas) of the driver on one fresh
// database, on one settable clock, and returns them with the database's
// DSN.
//
// via is a driver, or "pgbouncer" for PostgreSQL through a PgBouncer in
// transaction pooling mode (fewer server connections than the ledgers ask
// for); the returned DSN is then the database's own, for direct checks.
func openLedgers(t *testing.T, via string, n int) ([]*ledger.Ledger, *clock, string) {
	t.Helper()
	driver, dsn, open := via, testenv.SQLitePath(t), ""
	switch via {
	case ledger.Postgres:
		dsn = testenv.PostgresURL(t)
	case "pgbouncer":
		driver = ledger.Postgres
		open, dsn = testenv.PgBouncerURL(t, testenv.PgBouncerOptions{PoolSize: 6})
	}
	if open == "" {
		open = dsn
	}
	c := &clock{}
	c.ns.Store(time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC).UnixNano())
	var ls []*ledger.Ledger
	for range n {
		l, err := ledger.Open(context.Background(), ledger.Options{Driver: driver, DSN: open, Now: c.now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		ls = append(ls, l)
	}
	return ls, c, dsn
}

func hold(key, buyer string, q int64, expires time.Time) ledger.Hold {
	return ledger.Hold{IdempotencyKey: keys.MustID(key), SKU: sku, Buyer: keys.MustID(buyer), Quantity: q, ExpiresAt: expires, Gate: `[{"shards":1}]`}
}

func TestHoldConfirmCancelExpire(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		exp := c.now().Add(time.Minute)
		a, err := l.Hold(ctx, hold("h-a", "ann", 3, exp), -1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Hold(ctx, hold("h-a", "ann", 3, exp), -1); !errors.Is(err, ledger.ErrDuplicate) {
			t.Fatalf("same key again = %v, want ErrDuplicate", err)
		}
		b, _ := l.Hold(ctx, hold("h-b", "bob", 2, exp), -1)
		d, _ := l.Hold(ctx, hold("h-d", "dan", 1, exp.Add(time.Hour)), -1)
		expectSKU(t, l, 0, 6)

		if _, err := l.Confirm(ctx, a.ID, keys.MustID("bob"), ledger.Request{}); !errors.Is(err, ledger.ErrNotOwner) {
			t.Errorf("confirm by another buyer = %v, want ErrNotOwner", err)
		}
		o, err := l.Confirm(ctx, a.ID, keys.MustID("ann"), ledger.Request{})
		if err != nil || o.Quantity != 3 || o.HoldID != a.ID || o.GateRequest() != keys.MustID("h-a") {
			t.Fatalf("confirm = %+v, %v", o, err)
		}
		if again, err := l.Confirm(ctx, a.ID, keys.MustID("ann"), ledger.Request{}); err != nil || again.ID != o.ID {
			t.Errorf("confirm retry = %+v, %v; want the same order", again, err)
		}
		if _, changed, _ := l.Cancel(ctx, a.ID, keys.MustID("ann"), ledger.Request{}); changed {
			t.Error("cancel of a confirmed hold moved stock")
		}
		expectSKU(t, l, 3, 3)

		if _, changed, err := l.Cancel(ctx, b.ID, keys.MustID("bob"), ledger.Request{}); err != nil || !changed {
			t.Fatalf("cancel = %v, %v", changed, err)
		}
		if _, changed, _ := l.Cancel(ctx, b.ID, keys.MustID("bob"), ledger.Request{}); changed {
			t.Error("second cancel moved stock")
		}
		expectSKU(t, l, 3, 1)

		c.advance(2 * time.Hour)
		if _, err := l.Confirm(ctx, d.ID, keys.MustID("dan"), ledger.Request{}); !errors.Is(err, ledger.ErrHoldEnded) {
			t.Errorf("confirm past expiry (before the sweep) = %v, want ErrHoldEnded", err)
		}
		done, err := l.ExpireDue(ctx, 100)
		if err != nil || len(done) != 1 || done[0].ID != d.ID {
			t.Fatalf("ExpireDue = %v, %v; want hold d", done, err)
		}
		if done, _ := l.ExpireDue(ctx, 100); len(done) != 0 {
			t.Errorf("second sweep expired %d holds", len(done))
		}
		expectSKU(t, l, 3, 0)
		pend, err := l.PendingRestores(ctx, 0, 10)
		if err != nil || len(pend) != 2 {
			t.Fatalf("pending restores = %+v, %v; want the cancelled and the expired hold", pend, err)
		}
		// One at a time, each is listed by some sweep: a restore that keeps
		// failing does not hide the other (a random pick; the chance that
		// 64 picks miss one is 2^-63).
		seen := map[keys.ID]bool{}
		for range 64 {
			one, err := l.PendingRestores(ctx, 0, 1)
			if err != nil || len(one) != 1 {
				t.Fatalf("one pending restore = %+v, %v", one, err)
			}
			seen[one[0].ID] = true
		}
		if len(seen) != 2 {
			t.Errorf("64 sweeps of one restore listed %v, want both holds", seen)
		}
		for _, p := range pend {
			if err := l.RestoreDone(ctx, p.Kind, p.ID); err != nil {
				t.Fatal(err)
			}
		}
		if pend, _ := l.PendingRestores(ctx, 0, 10); len(pend) != 0 {
			t.Errorf("pending after done: %+v", pend)
		}
	})
}

// A confirm and an expiry racing on one hold: exactly one wins, and the
// stock ends in sold or back in the pool, never both.
func TestConfirmRacesExpiry(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 100, Shards: 1, MaxPerOrder: 1}); err != nil {
			t.Fatal(err)
		}
		exp := c.now().Add(time.Second)
		var ids []string
		for i := range 40 {
			h, err := l.Hold(ctx, hold(fmt.Sprintf("race-%d", i), "b", 1, exp), -1)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, h.ID.String())
		}
		c.advance(time.Second - time.Millisecond)
		var wg sync.WaitGroup
		var confirmed atomic.Int64
		for _, id := range ids {
			wg.Go(func() {
				if _, err := l.Confirm(ctx, keys.MustID(id), keys.MustID("b"), ledger.Request{}); err == nil {
					confirmed.Add(1)
				} else if !errors.Is(err, ledger.ErrHoldEnded) {
					t.Error(err)
				}
			})
		}
		wg.Go(func() { c.advance(time.Millisecond); _, _ = l.ExpireDue(ctx, 1000) })
		wg.Wait()
		_, _ = l.ExpireDue(ctx, 1000)
		st, _ := l.SKU(ctx, sku)
		orders, _, _ := l.OrderTotals(ctx, sku)
		if st.Held != 0 || st.Sold != confirmed.Load() || orders != confirmed.Load() {
			t.Errorf("sold %d held %d orders %d, confirmed %d", st.Sold, st.Held, orders, confirmed.Load())
		}
		t.Logf("%d confirmed, %d expired", confirmed.Load(), 40-confirmed.Load())
	})
}

func TestRefundOnce(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 5, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		o, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("r"), SKU: sku, Buyer: keys.MustID("b"), Quantity: 2, Gate: "[]"})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := l.Refund(ctx, o.ID, keys.MustID("eve"), ledger.Request{}); !errors.Is(err, ledger.ErrNotOwner) {
			t.Errorf("refund by another buyer = %v", err)
		}
		var wg sync.WaitGroup
		var changed atomic.Int64
		for range 10 {
			wg.Go(func() {
				_, ch, err := l.Refund(ctx, o.ID, keys.MustID("b"), ledger.Request{})
				if err != nil {
					t.Error(err)
				}
				if ch {
					changed.Add(1)
				}
			})
		}
		wg.Wait()
		if changed.Load() != 1 {
			t.Errorf("%d of 10 concurrent refunds moved stock, want 1", changed.Load())
		}
		expectSKU(t, l, 0, 0)
		if n, _ := l.BuyerUnits(ctx, sku, keys.MustID("b")); n != 0 {
			t.Errorf("buyer units after refund = %d", n)
		}
	})
}

func TestPerBuyerLimitAndEndSale(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 100, Shards: 1, MaxPerOrder: 4, PerBuyer: 4}); err != nil {
			t.Fatal(err)
		}
		h, err := l.Hold(ctx, hold("lim-h", "ann", 3, c.now().Add(time.Minute)), -1)
		if err != nil {
			t.Fatal(err)
		}
		buy := func(key, buyer string, q int64) error {
			_, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID(key), SKU: sku, Buyer: keys.MustID(buyer), Quantity: q})
			return err
		}
		if err := buy("lim-1", "ann", 2); !errors.Is(err, stock.ErrLimit) {
			t.Errorf("3 held + 2 = %v, want ErrLimit", err)
		}
		if err := buy("lim-2", "bob", 4); err != nil {
			t.Errorf("another buyer: %v", err)
		}
		if _, _, err := l.Cancel(ctx, h.ID, keys.MustID("ann"), ledger.Request{}); err != nil {
			t.Fatal(err)
		}
		if err := buy("lim-3", "ann", 4); err != nil {
			t.Errorf("after cancel, 4 = %v", err)
		}
		if err := buy("lim-4", "ann", 1); !errors.Is(err, stock.ErrLimit) {
			t.Errorf("5th unit = %v, want ErrLimit", err)
		}
		expectSKU(t, l, 8, 0)

		h2, _ := l.Hold(ctx, hold("end-h", "cat", 1, c.now().Add(time.Minute)), -1)
		if _, err := l.EndSale(ctx, sku); err != nil {
			t.Fatal(err)
		}
		if err := buy("end-1", "dan", 1); !errors.Is(err, stock.ErrSaleEnded) {
			t.Errorf("purchase after the end = %v, want ErrSaleEnded", err)
		}
		if _, err := l.Confirm(ctx, h2.ID, keys.MustID("cat"), ledger.Request{}); err != nil {
			t.Errorf("confirm of a hold taken before the end = %v", err)
		}
	})
}

func expectSKU(t *testing.T, l *ledger.Ledger, sold, held int64) {
	t.Helper()
	st, err := l.SKU(context.Background(), sku)
	if err != nil || st.Sold != sold || st.Held != held {
		t.Errorf("sku = sold %d held %d (%v), want sold %d held %d", st.Sold, st.Held, err, sold, held)
	}
}

func TestProgramCapAcrossTickets(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		vip := stock.SKU{Program: sku.Program, Ticket: keys.MustID("vip")}
		for _, s := range []stock.SKU{sku, vip} {
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 100, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.PutProgram(ctx, sku.Program, 5); err != nil {
			t.Fatal(err)
		}
		buy := func(key string, s stock.SKU, q int64) (ledger.Order, error) {
			return l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID(key), SKU: s, Buyer: keys.MustID("ann"), Quantity: q})
		}
		o, err := buy("p1", sku, 3)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := buy("p2", vip, 3); !errors.Is(err, stock.ErrLimit) {
			t.Errorf("3 + 3 across tickets = %v, want ErrLimit", err)
		}
		if _, err := buy("p3", vip, 2); err != nil {
			t.Errorf("3 + 2 = %v", err)
		}
		if _, _, err := l.Refund(ctx, o.ID, keys.MustID("ann"), ledger.Request{}); err != nil {
			t.Fatal(err)
		}
		if _, err := buy("p4", vip, 3); err != nil {
			t.Errorf("after the refund, 3 more = %v", err)
		}
		if n, _ := l.ProgramUnits(ctx, sku.Program, keys.MustID("ann")); n != 5 {
			t.Errorf("program units = %d, want 5", n)
		}
	})
}

// A late payment's refusal is recorded only when the ledger bears it out
// (fewer units left than asked, the buyer's cap reached), once under its
// key, and read back as refused; a key an order took first is left as
// it is and answered with that order. Both are ErrDuplicate when the key
// was taken.
func TestRefuseLateOnce(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 5, Shards: 1, MaxPerOrder: 4, PerBuyer: 3}); err != nil {
			t.Fatal(err)
		}
		buyer, other := keys.MustID("b"), keys.MustID("o")
		refusal := func(key string, who keys.ID, q int64) ledger.LateRefusal {
			return ledger.LateRefusal{Req: ledger.Request{Scope: who, Key: keys.MustID(key), Fingerprint: "f1", Op: ledger.OpConfirm},
				SKU: sku, Buyer: who, Quantity: q, Why: "gone"}
		}
		if _, err := l.RefuseLate(ctx, refusal("late-1", buyer, 2)); !errors.Is(err, ledger.ErrUnitsThere) {
			t.Fatalf("a refusal of 2 with 5 left, under the cap = %v, want ErrUnitsThere", err)
		}
		if _, err := l.RequestByKey(ctx, buyer, keys.MustID("late-1")); !errors.Is(err, ledger.ErrNotFound) {
			t.Fatalf("a refusal the ledger did not bear out left a row (%v)", err)
		}
		// The buyer's cap: 2 of 3 owned, 2 more asked.
		if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("own"), SKU: sku, Buyer: buyer, Quantity: 2, Gate: "[]"}); err != nil {
			t.Fatal(err)
		}
		rec, err := l.RefuseLate(ctx, refusal("late-1", buyer, 2))
		if err != nil || rec.Refused != "gone" {
			t.Fatalf("a refusal over the buyer's cap = %+v, %v; want it recorded", rec, err)
		}
		rec, err = l.RefuseLate(ctx, refusal("late-1", buyer, 2))
		if !errors.Is(err, ledger.ErrDuplicate) || rec.Refused != "gone" || rec.Order != nil {
			t.Fatalf("the second refusal = %+v, %v; want the first, ErrDuplicate", rec, err)
		}
		if rec, err := l.RequestByKey(ctx, buyer, keys.MustID("late-1")); err != nil || rec.Refused != "gone" {
			t.Fatalf("the refusal read back = %+v, %v", rec, err)
		}
		// Fewer left than asked: another buyer, far under the cap.
		if rec, err := l.RefuseLate(ctx, refusal("late-2", other, 4)); err != nil || rec.Refused != "gone" {
			t.Fatalf("a refusal of 4 with 3 left = %+v, %v; want it recorded", rec, err)
		}
		// A key an order took first.
		sold := ledger.Request{Scope: other, Key: keys.MustID("late-sold"), Fingerprint: "f2", Op: ledger.OpPurchase}
		o, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("late-sold"), SKU: sku, Buyer: other, Quantity: 3, Gate: "[]", Req: sold})
		if err != nil {
			t.Fatal(err)
		}
		rec, err = l.RefuseLate(ctx, refusal("late-sold", other, 1))
		if !errors.Is(err, ledger.ErrDuplicate) || rec.Order == nil || rec.Order.ID != o.ID || rec.Refused != "" {
			t.Fatalf("a refusal under a key an order took = %+v, %v; want the order %s, ErrDuplicate", rec, err, o.ID)
		}
		expectSKU(t, l, 5, 0)
	})
}

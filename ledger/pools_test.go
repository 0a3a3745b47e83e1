package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// A pool takes its allotment from the public stock and gives it back: the
// ticket's total stays whole (PutSKU's total is the ticket's, the public
// row has the rest); per-buyer caps count a ticket's units of every pool;
// a close moves what the pool has left into the public stock once, and
// stock that comes back to the closed pool later moves on at the next
// close; a closed pool takes no new allotment.
func TestPools(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, clk *clock) {
		ctx := context.Background()
		ga := stock.SKU{Program: keys.MustID("show-p"), Ticket: keys.MustID("ga")}
		fan := ga.InPool(keys.MustID("fanclub"))
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: ga, Total: 100, Shards: 1, MaxPerOrder: 4, PerBuyer: 3}); err != nil {
			t.Fatal(err)
		}
		if err := l.EnsurePool(ctx, fan); err != nil {
			t.Fatal(err)
		}
		if err := l.EnsurePool(ctx, stock.MustSKU("show-p", "nope").InPool(keys.MustID("x"))); !errors.Is(err, stock.ErrUnknownSKU) {
			t.Errorf("EnsurePool of an unknown ticket = %v, want ErrUnknownSKU", err)
		}
		rule := ledger.PoolRule{ClosesAt: clk.now().Add(time.Hour)}
		if _, err := l.PutPool(ctx, ledger.PoolConfig{SKU: fan, Allotment: 101, Shards: 1, Rule: rule}); !errors.Is(err, stock.ErrInvalid) {
			t.Errorf("an allotment over the public stock = %v, want ErrInvalid", err)
		}
		if _, err := l.PutPool(ctx, ledger.PoolConfig{SKU: fan, Allotment: 30, Shards: 2, Rule: rule}); err != nil {
			t.Fatal(err)
		}
		totals := func() string {
			ps, err := l.Pools(ctx, ga)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, p := range ps {
				out = append(out, fmt.Sprintf("%s:%d/%d/%d", p.Ticket, p.Total, p.Sold, p.Held))
			}
			return fmt.Sprint(out)
		}
		if got := totals(); got != "[ga:70/0/0 ga.fanclub:30/0/0]" {
			t.Errorf("after the allotment: %s", got)
		}
		// The whole ticket is 120 now: the public row gets 90.
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: ga, Total: 120, Shards: 1, MaxPerOrder: 4, PerBuyer: 3}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: ga, Total: 29, Shards: 1, MaxPerOrder: 4, PerBuyer: 3}); !errors.Is(err, stock.ErrInvalid) {
			t.Errorf("a total below the pools' allotments = %v, want ErrInvalid", err)
		}
		ann := keys.MustID("ann")
		buy := func(sku stock.SKU, key string, q int64) error {
			_, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID(key), SKU: sku, Buyer: ann, Quantity: q, GateEpoch: -1})
			return err
		}
		if err := buy(fan, "p1", 2); err != nil {
			t.Fatal(err)
		}
		if err := buy(ga, "p2", 2); !errors.Is(err, stock.ErrLimit) {
			t.Errorf("2 more of the ticket in public after 2 in the pool (cap 3) = %v, want ErrLimit", err)
		}
		if n, _ := l.BuyerUnits(ctx, ga, ann); n != 2 {
			t.Errorf("units after p1, p2: %d", n)
		}
		if err := buy(ga, "p3", 1); err != nil {
			t.Fatal(err)
		}
		if n, err := l.BuyerUnits(ctx, fan, ann); err != nil || n != 3 {
			t.Errorf("BuyerUnits = %d, %v; want 3 over both pools", n, err)
		}
		h, err := l.Hold(ctx, ledger.Hold{IdempotencyKey: keys.MustID("h1"), SKU: fan, Buyer: keys.MustID("bob"), Quantity: 3,
			ExpiresAt: clk.now().Add(2 * time.Hour), Gate: `[{"shards":2}]`}, -1)
		if err != nil {
			t.Fatal(err)
		}
		if got := totals(); got != "[ga:90/1/0 ga.fanclub:30/2/3]" {
			t.Errorf("after the sales: %s", got)
		}
		if due, err := l.PoolsDue(ctx, 10); err != nil || len(due) != 0 {
			t.Errorf("PoolsDue before the close = %v, %v", due, err)
		}
		// The sweeper's close of a pool that is not due (its time moved on
		// since the sweeper read it due, helper-77 #2) leaves it open.
		if moved, into, err := l.ClosePool(ctx, fan, true); err != nil || moved != 0 || !into.IsZero() {
			t.Errorf("a due close before the closing time = %d into %s, %v; want nothing", moved, into, err)
		}
		if got := totals(); got != "[ga:90/1/0 ga.fanclub:30/2/3]" {
			t.Errorf("after a due close before its time: %s", got)
		}
		clk.advance(time.Hour)
		if due, err := l.PoolsDue(ctx, 10); err != nil || len(due) != 1 || due[0] != fan {
			t.Errorf("PoolsDue at the close = %v, %v; want the fan club", due, err)
		}
		moved, into, err := l.ClosePool(ctx, fan, true)
		if err != nil || moved != 25 || into != ga {
			t.Fatalf("ClosePool = %d into %s, %v; want 25 into the public stock", moved, into, err)
		}
		if got := totals(); got != "[ga:115/1/0 ga.fanclub:5/2/3]" {
			t.Errorf("after the close: %s", got)
		}
		if moved, _, err := l.ClosePool(ctx, fan, false); err != nil || moved != 0 {
			t.Errorf("ClosePool again = %d, %v; want nothing moved", moved, err)
		}
		if due, err := l.PoolsDue(ctx, 10); err != nil || len(due) != 0 {
			t.Errorf("PoolsDue after the close = %v, %v", due, err)
		}
		if _, err := l.PutPool(ctx, ledger.PoolConfig{SKU: fan, Allotment: 10, Shards: 1, Rule: rule}); !errors.Is(err, ledger.ErrPoolClosed) {
			t.Errorf("PutPool of a closed pool = %v, want ErrPoolClosed", err)
		}
		if err := buy(fan, "p4", 1); !errors.Is(err, stock.ErrSaleEnded) {
			t.Errorf("a purchase in the closed pool = %v, want ErrSaleEnded", err)
		}
		// Bob's hold comes back to the closed pool: the next close moves it.
		if _, _, err := l.Cancel(ctx, h.ID, keys.MustID("bob"), ledger.Request{}); err != nil {
			t.Fatal(err)
		}
		if due, err := l.PoolsDue(ctx, 10); err != nil || len(due) != 1 {
			t.Errorf("PoolsDue with stock back in the closed pool = %v, %v", due, err)
		}
		if moved, _, err := l.ClosePool(ctx, fan, true); err != nil || moved != 3 {
			t.Errorf("ClosePool after the cancel = %d, %v; want 3", moved, err)
		}
		if got := totals(); got != "[ga:118/1/0 ga.fanclub:2/2/0]" {
			t.Errorf("at the end: %s", got)
		}
	})
}

// A program's stock, as its waiting room reads it, is what a buyer the
// line admits could buy now: a pool that opens later and a channel's pool
// are left out until the one opens (the other never counts), a code's
// pool counts. The room admitted five buyers for a pool opening tomorrow
// and each met sold out (helper-51).
func TestProgramStockIsWhatTheLineCanBuy(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, clk *clock) {
		ctx := context.Background()
		ga := stock.SKU{Program: keys.MustID("show-line"), Ticket: keys.MustID("ga")}
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: ga, Total: 20, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		for _, p := range []struct {
			name  string
			units int64
			rule  ledger.PoolRule
		}{
			{"later", 5, ledger.PoolRule{OpensAt: clk.now().Add(time.Hour)}},
			{"box", 3, ledger.PoolRule{Access: ledger.AccessChannel, Secret: "s"}},
			{"fans", 2, ledger.PoolRule{Access: ledger.AccessCode}},
		} {
			pool := ga.InPool(keys.MustID(p.name))
			if err := l.EnsurePool(ctx, pool); err != nil {
				t.Fatal(err)
			}
			if _, err := l.PutPool(ctx, ledger.PoolConfig{SKU: pool, Allotment: p.units, Shards: 1, Rule: p.rule}); err != nil {
				t.Fatalf("pool %s: %v", p.name, err)
			}
		}
		if st, err := l.ProgramStock(ctx, ga.Program); err != nil || st.Remaining != 10+2 || st.SKUs != 4 {
			t.Errorf("with a pool not open yet and a channel's: %+v %v, want 12 left (public 10, the code's 2) of 4 on sale", st, err)
		}
		clk.advance(time.Hour)
		if st, err := l.ProgramStock(ctx, ga.Program); err != nil || st.Remaining != 10+2+5 {
			t.Errorf("once the pool opened: %+v %v, want 17 left", st, err)
		}
	})
}

// A pool's allotment changed while another pool closes into it keeps
// every unit of the ticket: PutPool read the pool's total unlocked, and
// a close that committed its moved units between that read and its
// absolute write lost them on PostgreSQL (the public row gave the change
// for units already there; helper-67). Run as a race, many rounds.
func TestPoolPutRacingACloseIntoItKeepsTheTicketWhole(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, clk *clock) {
		ctx := context.Background()
		for round := range 30 {
			ga := stock.SKU{Program: keys.MustID(fmt.Sprintf("race%d", round)), Ticket: keys.MustID("ga")}
			pre, partner := ga.InPool(keys.MustID("presale")), ga.InPool(keys.MustID("partner"))
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: ga, Total: 100, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
			put := func(p stock.SKU, allotment int64, into keys.ID) error {
				return putPool(l, p, allotment, ledger.PoolRule{ClosesAt: clk.now().Add(time.Hour), Into: into})
			}
			if err := put(partner, 10, keys.ID{}); err != nil {
				t.Fatal(err)
			}
			if err := put(pre, 20, keys.MustID("partner")); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make([]error, 2)
			wg.Go(func() { _, _, errs[0] = l.ClosePool(ctx, pre, false) })
			wg.Go(func() { errs[1] = put(partner, 30, keys.ID{}) })
			wg.Wait()
			for _, err := range errs {
				if err != nil && !errors.Is(err, stock.ErrInvalid) {
					t.Fatalf("round %d: %v", round, err)
				}
			}
			var sum int64
			for _, s := range []stock.SKU{ga, pre, partner} {
				st, err := l.SKU(ctx, s)
				if err != nil {
					t.Fatal(err)
				}
				sum += st.Total
			}
			if sum != 100 {
				t.Fatalf("round %d: the ticket's rows add up to %d units, want its 100 (errors %v)", round, sum, errs)
			}
		}
	})
}

// A pool that closes with nothing left leaves its target's gate as it
// is: a bypass with no units moved made the next take rebuild the public
// gate for nothing, often at the public on-sale as a presale closed
// (helper-68). One with units left marks it stale.
func TestPoolClosedEmptyLeavesTheTargetGate(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, clk *clock) {
		ctx := context.Background()
		for _, left := range []int64{0, 2} {
			ga := stock.SKU{Program: keys.MustID(fmt.Sprintf("empty%d", left)), Ticket: keys.MustID("ga")}
			pre := ga.InPool(keys.MustID("presale"))
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: ga, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
			if err := putPool(l, pre, 2, ledger.PoolRule{ClosesAt: clk.now().Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
			for i := range 2 - left {
				sellOne(t, l, pre, "fan", int(i))
			}
			before, err := l.SKU(ctx, ga)
			if err != nil {
				t.Fatal(err)
			}
			moved, _, err := l.ClosePool(ctx, pre, false)
			if err != nil || moved != left {
				t.Fatalf("close with %d left = moved %d, %v", left, moved, err)
			}
			after, err := l.SKU(ctx, ga)
			if err != nil {
				t.Fatal(err)
			}
			if stale := after.BypassSeq != before.BypassSeq; stale != (left > 0) {
				t.Errorf("close with %d left: the public gate's bypass went %d -> %d; want it moved only when units came", left, before.BypassSeq, after.BypassSeq)
			}
		}
	})
}

// putPool makes pool p's row if it has none and sets its allotment (one
// shard) and rule.
func putPool(l *ledger.Ledger, p stock.SKU, allotment int64, rule ledger.PoolRule) error {
	ctx := context.Background()
	if err := l.EnsurePool(ctx, p); err != nil {
		return err
	}
	_, err := l.PutPool(ctx, ledger.PoolConfig{SKU: p, Allotment: allotment, Shards: 1, Rule: rule})
	return err
}

package ledger_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// commitOrders commits orders as one batch of single purchases.
func commitOrders(ctx context.Context, l *ledger.Ledger, orders []ledger.Order, direct bool) []ledger.TakeResult {
	takes := make([]ledger.Take, len(orders))
	for i, o := range orders {
		takes[i] = ledger.PurchaseTake(o)
	}
	return l.Commit(ctx, takes, direct)
}

// A batch commits what fits and decides each take that does not by
// itself, in the batch's order: a duplicate gets what its key stored, and
// a SKU short of stock refuses only the takes that no longer fit.
func TestCommit(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		a, b := sku, stock.SKU{Program: sku.Program, Ticket: keys.MustID("vip")}
		for _, s := range []stock.SKU{a, b} {
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 5, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
		}
		first, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("taken"), SKU: a, Buyer: keys.MustID("x"), Quantity: 1})
		if err != nil {
			t.Fatal(err)
		}
		order := func(key string, s stock.SKU, buyer string, q int64) ledger.Order {
			return ledger.Order{IdempotencyKey: keys.MustID(key), SKU: s, Buyer: keys.MustID(buyer), Quantity: q}
		}
		// a has 4 left: 3 new + 1 duplicate fit; b: 2 fit.
		res := commitOrders(ctx, l, []ledger.Order{order("a1", a, "p", 1), order("b1", b, "q", 1), order("taken", a, "x", 1),
			order("a2", a, "r", 1), order("b2", b, "s", 1), order("a3", a, "t", 1)}, false)
		for i, r := range res {
			want := error(nil)
			if i == 2 {
				want = ledger.ErrDuplicate
			}
			if !errors.Is(r.Err, want) || r.Order().ID.IsZero() {
				t.Errorf("result %d = %+v, want err %v", i, r, want)
			}
		}
		if res[2].Order().ID != first.ID {
			t.Errorf("duplicate answered %s, want the stored %s", res[2].Order().ID, first.ID)
		}
		expectSold := func(s stock.SKU, want int64) {
			t.Helper()
			st, _ := l.SKU(ctx, s)
			_, units, _ := l.OrderTotals(ctx, s)
			if st.Sold != want || units != want {
				t.Errorf("%s sold %d, order units %d, want %d", s, st.Sold, units, want)
			}
		}
		expectSold(a, 4)
		expectSold(b, 2)
		// a has 1 left: of 2, 1 and 1 the 2 is refused, the first 1 commits,
		// the second is refused; b's commits beside them.
		res = commitOrders(ctx, l, []ledger.Order{order("a4", a, "u", 2), order("b3", b, "v", 1), order("a5", a, "w", 1),
			order("a6", a, "y", 1)}, false)
		for i, want := range []error{stock.ErrSoldOut, nil, nil, stock.ErrSoldOut} {
			if !errors.Is(res[i].Err, want) {
				t.Errorf("result %d = %v, want %v", i, res[i].Err, want)
			}
		}
		for _, k := range []string{"a4", "a6"} {
			if _, err := l.OrderByKey(ctx, keys.MustID(k)); !errors.Is(err, ledger.ErrNotFound) {
				t.Errorf("a refused order %s was written: %v", k, err)
			}
		}
		expectSold(a, 5)
		expectSold(b, 3)
	})
}

// A batch of 256 takes over 100 SKUs, with refused takes spread among them
// (sold out, an ended sale, an unknown SKU, a stale gate epoch, a reused
// key, a duplicate), commits every other take in it, and only those.
func TestCommitLargeBatchWithRefusals(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		var skus []stock.SKU
		for i := range 100 {
			s := stock.SKU{Program: keys.MustID(fmt.Sprintf("p%d", i%10)), Ticket: keys.MustID(fmt.Sprintf("t%d", i))}
			skus = append(skus, s)
			total := int64(3)
			if i%10 == 3 {
				total = 1 // sells out inside the batch
			}
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: total, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.EndSale(ctx, skus[7]); err != nil {
			t.Fatal(err)
		}
		if _, err := l.AdvanceGate(ctx, skus[8]); err != nil { // takes at epoch 0 are stale
			t.Fatal(err)
		}
		if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("pre"), SKU: skus[9], Buyer: keys.MustID("b"),
			Quantity: 1, Req: req("b", "dup", "buy", ledger.OpPurchase)}); err != nil {
			t.Fatal(err)
		}
		var takes []ledger.Take
		want := map[int]error{}
		sold := map[stock.SKU]int64{}
		left := map[stock.SKU]int64{}
		for i, s := range skus {
			left[s] = 3
			if i%10 == 3 {
				left[s] = 1
			}
		}
		left[skus[9]] = 2
		for i := range 256 {
			s := skus[(i*7)%100]
			buyer := fmt.Sprintf("b%d", i)
			o := ledger.Order{IdempotencyKey: keys.MustID(fmt.Sprintf("k%d", i)), SKU: s, Buyer: keys.MustID(buyer), Quantity: 1,
				Req: req(buyer, fmt.Sprintf("r%d", i), "buy", ledger.OpPurchase)}
			switch {
			case i == 100:
				o.SKU = stock.SKU{Program: keys.MustID("nope"), Ticket: keys.MustID("none")}
				want[i] = stock.ErrUnknownSKU
			case i == 101:
				o.Req = req("b", "dup", "buy", ledger.OpPurchase) // committed before
				o.Buyer = keys.MustID("b")
				want[i] = ledger.ErrDuplicate
			case i == 102:
				o.Req = req("b", "dup", "another", ledger.OpPurchase) // the same key, another request
				o.Buyer = keys.MustID("b")
				want[i] = ledger.ErrKeyReused
			case s == skus[7]:
				want[i] = stock.ErrSaleEnded
			case s == skus[8]:
				want[i] = ledger.ErrStaleGate
			case left[s] == 0:
				want[i] = stock.ErrSoldOut
			default:
				left[s]--
				sold[s]++
			}
			takes = append(takes, ledger.PurchaseTake(o))
		}
		res := l.Commit(ctx, takes, false)
		for i, r := range res {
			if !errors.Is(r.Err, want[i]) {
				t.Errorf("take %d (%s) = %v, want %v", i, takes[i].Orders[0].SKU, r.Err, want[i])
			}
		}
		for _, s := range skus {
			st, _ := l.SKU(ctx, s)
			pre := int64(0)
			if s == skus[9] {
				pre = 1
			}
			if st.Sold != sold[s]+pre {
				t.Errorf("%s sold %d, want %d", s, st.Sold, sold[s]+pre)
			}
		}
	})
}

// Batches racing on the same SKUs, half of them direct (optimistic): no
// deadlock, never more than the total, every acknowledged order stored.
func TestCommitRacing(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		skus := []stock.SKU{sku, {Program: sku.Program, Ticket: keys.MustID("vip")}, {Program: keys.MustID("other"), Ticket: keys.MustID("ga")}}
		for _, s := range skus {
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 100, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		ok := map[stock.SKU]int64{}
		for g := range 8 {
			wg.Go(func() {
				for round := range 5 {
					var batch []ledger.Order
					for i := range 12 {
						s := skus[(g+i)%3]
						batch = append(batch, ledger.Order{IdempotencyKey: keys.MustID(fmt.Sprintf("g%d-r%d-%d", g, round, i)), SKU: s, Buyer: keys.MustID("b"), Quantity: 1})
					}
					res := commitOrders(ctx, l, batch, g%2 == 1)
					mu.Lock()
					for i, r := range res {
						switch {
						case r.Err == nil:
							ok[batch[i].SKU]++
						case !errors.Is(r.Err, stock.ErrSoldOut):
							t.Errorf("take %d: %v", i, r.Err)
						}
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		for _, s := range skus {
			st, _ := l.SKU(ctx, s)
			_, units, _ := l.OrderTotals(ctx, s)
			if st.Sold > st.Total || st.Sold != ok[s] || units != ok[s] {
				t.Errorf("%s: sold %d, order units %d, acknowledged %d, total %d", s, st.Sold, units, ok[s], st.Total)
			}
		}
	})
}

// Batches over different SKUs of one program, whose buyers come in
// different orders, never deadlock on the program's buyer rows: every row
// of the program cap is locked in one order (SKU rows first, then program
// rows, each sorted), so on PostgreSQL no batch is aborted as a deadlock
// victim and every order commits.
func TestBatchProgramRowsDeadlock(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		var skus []stock.SKU
		for _, tk := range []string{"a", "b", "c", "d"} {
			s := stock.SKU{Program: sku.Program, Ticket: keys.MustID(tk)}
			skus = append(skus, s)
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 100_000, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.PutProgram(ctx, sku.Program, 1_000_000); err != nil {
			t.Fatal(err)
		}
		buyers := []keys.ID{keys.MustID("x"), keys.MustID("y"), keys.MustID("z")}
		var wg sync.WaitGroup
		var failed atomic.Int64
		for g := range 8 {
			wg.Go(func() {
				for round := range 25 {
					// Two SKUs per batch, each SKU's buyer a different one,
					// rotating so batches meet the program rows in every order.
					var batch []ledger.Order
					for j := range 2 {
						s := skus[(g+j)%len(skus)]
						b := buyers[(g+round+2*j)%len(buyers)]
						batch = append(batch, ledger.Order{IdempotencyKey: keys.MustID(fmt.Sprintf("d%d-%d-%d", g, round, j)), SKU: s, Buyer: b, Quantity: 1})
					}
					for _, r := range commitOrders(ctx, l, batch, false) {
						if r.Err != nil {
							failed.Add(1)
							t.Logf("batch %d/%d: %v", g, round, r.Err)
						}
					}
				}
			})
		}
		wg.Wait()
		if n := failed.Load(); n > 0 {
			t.Errorf("%d of 400 takes failed (deadlock victims), want none", n)
		}
		var units int64
		for _, b := range buyers {
			n, _ := l.ProgramUnits(ctx, sku.Program, b)
			units += n
		}
		if units != 400-failed.Load() {
			t.Errorf("program rows count %d units, want %d", units, 400-failed.Load())
		}
	})
}

// A batch mixing purchases and holds over several SKUs commits them in one
// transaction: held and sold move by their sums, hold rows are live holds a
// confirm can take, retries replay what they stored, a reused key is
// refused, and a hold the SKU cannot cover (over the stock, over a buyer's
// cap, on an ended sale) is refused without failing its neighbours.
func TestCommitMixesPurchasesAndHolds(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		vip := stock.SKU{Program: sku.Program, Ticket: keys.MustID("vip")}
		tight := stock.SKU{Program: sku.Program, Ticket: keys.MustID("tight")}
		ended := stock.SKU{Program: sku.Program, Ticket: keys.MustID("ended")}
		for _, s := range []struct {
			sku      stock.SKU
			total    int64
			perBuyer int64
		}{{sku, 20, 0}, {vip, 20, 2}, {tight, 2, 0}, {ended, 5, 0}} {
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s.sku, Total: s.total, Shards: 1, MaxPerOrder: 4, PerBuyer: s.perBuyer}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.EndSale(ctx, ended); err != nil {
			t.Fatal(err)
		}
		exp := c.now().Add(time.Minute)
		h := func(s stock.SKU, key, buyer string, q int64) ledger.Take {
			return ledger.HoldTake(ledger.Hold{IdempotencyKey: keys.MustID("row-" + key), SKU: s, Buyer: keys.MustID(buyer), Quantity: q,
				ExpiresAt: exp, Gate: `[{"shards":1}]`, Req: req(buyer, key, "hold "+key, ledger.OpHold)})
		}
		p := func(s stock.SKU, key, buyer string, q int64) ledger.Take {
			return ledger.PurchaseTake(ledger.Order{IdempotencyKey: keys.MustID("row-" + key), SKU: s, Buyer: keys.MustID(buyer), Quantity: q,
				Req: req(buyer, key, "buy "+key, ledger.OpPurchase)})
		}
		takes := []ledger.Take{
			h(sku, "h1", "ann", 2), p(sku, "p1", "bob", 3), h(vip, "h2", "cat", 2), p(vip, "p2", "dan", 1),
			h(tight, "h3", "eve", 3), // over the stock
			h(ended, "h4", "fay", 1), // ended
			h(sku, "h5", "gus", 1),
		}
		res := l.Commit(ctx, takes, false)
		refused := map[int]error{4: stock.ErrSoldOut, 5: stock.ErrSaleEnded}
		for i, r := range res {
			why, no := refused[i]
			switch {
			case no && !errors.Is(r.Err, why):
				t.Errorf("take %d = %v, want %v", i, r.Err, why)
			case !no && r.Err != nil:
				t.Errorf("take %d = %v", i, r.Err)
			case !no && len(takes[i].Holds) > 0 && (r.Hold().ID.IsZero() || r.Hold().State != ledger.Held || r.Hold().TakeEpoch != 0):
				t.Errorf("hold %d = %+v", i, r.Hold())
			case !no && len(takes[i].Orders) > 0 && r.Order().ID.IsZero():
				t.Errorf("order %d = %+v", i, r.Order())
			}
		}
		for _, w := range []struct {
			sku        stock.SKU
			sold, held int64
		}{{sku, 3, 3}, {vip, 1, 2}, {tight, 0, 0}, {ended, 0, 0}} {
			if st, _ := l.SKU(ctx, w.sku); st.Sold != w.sold || st.Held != w.held {
				t.Errorf("%s: sold %d held %d, want %d %d", w.sku, st.Sold, st.Held, w.sold, w.held)
			}
		}
		if n, _ := l.BuyerUnits(ctx, vip, keys.MustID("cat")); n != 2 {
			t.Errorf("cat counts %d units of vip, want 2 (a hold counts)", n)
		}
		// A batched hold is a hold like any other: confirm it.
		if o, err := l.Confirm(ctx, res[0].Hold().ID, keys.MustID("ann"), req("ann", "c1", "confirm", ledger.OpConfirm)); err != nil || o.Quantity != 2 {
			t.Errorf("confirm of a batched hold = %+v, %v", o, err)
		}
		// Retries replay, in a batch or alone; a reused key is refused; a
		// hold over the buyer's cap is refused.
		again := l.Commit(ctx, []ledger.Take{h(sku, "h5", "gus", 1), p(sku, "p1", "bob", 3),
			ledger.HoldTake(ledger.Hold{IdempotencyKey: keys.MustID("row-h6"), SKU: sku, Buyer: keys.MustID("gus"), Quantity: 1, ExpiresAt: exp,
				Req: req("gus", "h5", "another hold", ledger.OpHold)}),
			h(vip, "h7", "cat", 1)}, false)
		if !errors.Is(again[0].Err, ledger.ErrDuplicate) || again[0].Hold().ID != res[6].Hold().ID {
			t.Errorf("retried hold = %+v, %v; want ErrDuplicate with %s", again[0].Hold(), again[0].Err, res[6].Hold().ID)
		}
		if !errors.Is(again[1].Err, ledger.ErrDuplicate) || again[1].Order().ID != res[1].Order().ID {
			t.Errorf("retried purchase = %+v, %v; want ErrDuplicate with %s", again[1].Order(), again[1].Err, res[1].Order().ID)
		}
		if !errors.Is(again[2].Err, ledger.ErrKeyReused) {
			t.Errorf("reused key = %v, want ErrKeyReused", again[2].Err)
		}
		if !errors.Is(again[3].Err, stock.ErrLimit) {
			t.Errorf("hold over the cap = %v, want ErrLimit", again[3].Err)
		}
		if st, _ := l.SKU(ctx, sku); st.Sold != 5 || st.Held != 1 {
			t.Errorf("after the retries sku sold %d held %d, want 5 and 1", st.Sold, st.Held)
		}
	})
}

// Each take a batch cannot have is refused alone, with its own answer, as
// if the batch's takes were committed one after another in order (over a
// buyer's SKU or program cap, short of stock, an ended sale, a stale
// epoch): the SKU's other buyers, and the buyer's earlier takes, commit.
func TestCommitDecidesEachRefusal(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		id := keys.MustID
		capped := stock.SKU{Program: sku.Program, Ticket: id("capped")}
		vip := stock.SKU{Program: sku.Program, Ticket: id("vip")}
		tight := stock.SKU{Program: sku.Program, Ticket: id("tight")}
		ended := stock.SKU{Program: sku.Program, Ticket: id("ended")}
		stale := stock.SKU{Program: sku.Program, Ticket: id("stale")}
		px, py := stock.SKU{Program: id("fest"), Ticket: id("x")}, stock.SKU{Program: id("fest"), Ticket: id("y")}
		for _, s := range []struct {
			sku             stock.SKU
			total, perBuyer int64
		}{{capped, 20, 2}, {vip, 20, 0}, {tight, 2, 0}, {ended, 5, 0}, {stale, 5, 0}, {px, 20, 0}, {py, 20, 0}} {
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s.sku, Total: s.total, Shards: 1, MaxPerOrder: 4, PerBuyer: s.perBuyer}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.EndSale(ctx, ended); err != nil {
			t.Fatal(err)
		}
		if _, err := l.AdvanceGate(ctx, stale); err != nil { // epoch 1
			t.Fatal(err)
		}
		if err := l.PutProgram(ctx, id("fest"), 3); err != nil {
			t.Fatal(err)
		}
		exp := c.now().Add(time.Minute)
		h := func(s stock.SKU, key, buyer string, q, epoch int64) ledger.Take {
			return ledger.HoldTake(ledger.Hold{IdempotencyKey: id("row-" + key), SKU: s, Buyer: id(buyer), Quantity: q,
				ExpiresAt: exp, Gate: `[{"shards":1}]`, GateEpoch: epoch, Req: req(buyer, key, "hold "+key, ledger.OpHold)})
		}
		p := func(s stock.SKU, key, buyer string, q int64) ledger.Take {
			return ledger.PurchaseTake(ledger.Order{IdempotencyKey: id("row-" + key), SKU: s, Buyer: id(buyer), Quantity: q,
				Req: req(buyer, key, "buy "+key, ledger.OpPurchase)})
		}
		takes := []ledger.Take{
			h(capped, "t0", "ann", 2, 0),
			h(capped, "t1", "zed", 2, 0), // zed: 3 of capped in the batch, over its cap of 2
			p(capped, "t2", "zed", 1),
			p(capped, "t3", "bob", 1),
			h(tight, "t4", "eve", 3, 0), // over the stock
			h(ended, "t5", "fay", 1, 0), // sale ended
			h(stale, "t6", "gus", 1, 0), // admitted by the gate before the rebuild
			h(stale, "t7", "hal", 1, 1),
			h(px, "t8", "ivy", 2, 0), // ivy: 4 of fest in the batch, over its cap of 3
			h(py, "t9", "ivy", 2, 0),
			h(px, "t10", "jon", 3, 0),
			h(vip, "t11", "kim", 1, 0),
		}
		res := l.Commit(ctx, takes, false)
		refused := map[int]error{2: stock.ErrLimit, 4: stock.ErrSoldOut, 5: stock.ErrSaleEnded, 6: ledger.ErrStaleGate, 9: stock.ErrLimit}
		for i, r := range res {
			if why, ok := refused[i]; ok {
				if !errors.Is(r.Err, why) {
					t.Errorf("take %d = %v, want %v", i, r.Err, why)
				}
				continue
			}
			if r.Err != nil {
				t.Errorf("take %d = %v, want it committed in the batch", i, r.Err)
			}
		}
		for _, w := range []struct {
			sku        stock.SKU
			sold, held int64
		}{{capped, 1, 4}, {tight, 0, 0}, {ended, 0, 0}, {stale, 0, 1}, {px, 0, 5}, {py, 0, 0}, {vip, 0, 1}} {
			if st, _ := l.SKU(ctx, w.sku); st.Sold != w.sold || st.Held != w.held {
				t.Errorf("%s after the batch: sold %d held %d, want %d %d", w.sku, st.Sold, st.Held, w.sold, w.held)
			}
		}
		if n, _ := l.BuyerUnits(ctx, capped, id("zed")); n != 2 {
			t.Errorf("zed counts %d units of capped, want 2", n)
		}
		if n, _ := l.ProgramUnits(ctx, id("fest"), id("ivy")); n != 2 {
			t.Errorf("ivy counts %d units of fest, want 2", n)
		}
	})
}

// A hold committed in a batch is the hold Ledger.Hold would have stored:
// the same row (state, expiry, gate record, take epoch), the same stored
// answer replayed to a retry alone or in a batch, the same refusal of a
// reused key, the same buyer counts, and the same restore owed when it is
// cancelled after a rebuild.
func TestBatchedHoldIsAHold(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 10, Shards: 2, MaxPerOrder: 4, PerBuyer: 3}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.AdvanceGate(ctx, sku); err != nil { // epoch 1
			t.Fatal(err)
		}
		mk := func(key, buyer string) ledger.Hold {
			return ledger.Hold{IdempotencyKey: keys.MustID("row-" + key), SKU: sku, Buyer: keys.MustID(buyer), Quantity: 2,
				ExpiresAt: c.now().Add(90 * time.Second), Gate: `[{"shards":2,"parts":[[0,2]]}]`, GateEpoch: 1, Req: req(buyer, key, "hold 2", ledger.OpHold)}
		}
		res := l.Commit(ctx, []ledger.Take{ledger.HoldTake(mk("kb", "ann")),
			ledger.PurchaseTake(ledger.Order{IdempotencyKey: keys.MustID("row-p"), SKU: sku, Buyer: keys.MustID("cat"), Quantity: 1, GateEpoch: 1})}, false)
		if res[0].Err != nil || res[1].Err != nil {
			t.Fatalf("Commit = %+v", res)
		}
		batched := res[0].Hold()
		alone, err := l.Hold(ctx, mk("ka", "bob"), -1)
		if err != nil {
			t.Fatal(err)
		}
		// Two holds differ in their ids, keys and buyers; nothing else.
		same := func(what string, got, want ledger.Hold) {
			t.Helper()
			opt := cmpopts.IgnoreFields(ledger.Hold{}, "ID", "IdempotencyKey", "Buyer", "Req.Scope", "Req.Key")
			if diff := cmp.Diff(want, got, opt, idEqual, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s: batched hold differs from a hold alone (-alone +batched):\n%s", what, diff)
			}
		}
		same("answer", batched, alone)
		if batched.TakeEpoch != 1 || batched.State != ledger.Held {
			t.Errorf("batched hold = %+v, want held at take epoch 1", batched)
		}
		rowB, errB := l.HoldByID(ctx, batched.ID)
		rowA, errA := l.HoldByID(ctx, alone.ID)
		if errA != nil || errB != nil {
			t.Fatal(errA, errB)
		}
		same("row", rowB, rowA)
		// Retries, alone and in a batch, replay the stored answers.
		againB, errB := l.Hold(ctx, mk("kb", "ann"), -1)
		againA, errA := l.Hold(ctx, mk("ka", "bob"), -1)
		if !errors.Is(errB, ledger.ErrDuplicate) || !errors.Is(errA, ledger.ErrDuplicate) || againB.ID != batched.ID {
			t.Errorf("retry alone = %+v, %v; of the hold alone %v; want ErrDuplicate with %s", againB, errB, errA, batched.ID)
		}
		same("replay alone", againB, againA)
		again := l.Commit(ctx, []ledger.Take{ledger.HoldTake(mk("kb", "ann")), ledger.HoldTake(mk("ka", "bob"))}, false)
		if !errors.Is(again[0].Err, ledger.ErrDuplicate) || again[0].Hold().ID != batched.ID {
			t.Fatalf("retry in a batch = %+v; want ErrDuplicate with %s", again, batched.ID)
		}
		same("replay in a batch", again[0].Hold(), again[1].Hold())
		// The key with another fingerprint moves nothing, alone or batched.
		reused := mk("kb", "ann")
		reused.IdempotencyKey, reused.Quantity, reused.Req.Fingerprint = keys.MustID("row-kb2"), 1, "hold 1"
		if _, err := l.Hold(ctx, reused, -1); !errors.Is(err, ledger.ErrKeyReused) {
			t.Errorf("reused key alone = %v, want ErrKeyReused", err)
		}
		if r := l.Commit(ctx, []ledger.Take{ledger.HoldTake(reused)}, false); !errors.Is(r[0].Err, ledger.ErrKeyReused) {
			t.Errorf("reused key in a batch = %+v; want ErrKeyReused", r)
		}
		expectSKU(t, l, 1, 4)
		for _, b := range []string{"ann", "bob"} {
			if n, _ := l.BuyerUnits(ctx, sku, keys.MustID(b)); n != 2 {
				t.Errorf("%s counts %d units, want 2", b, n)
			}
		}
		// After a rebuild, a cancel owes the new gate the units, the same
		// for both.
		if _, err := l.AdvanceGate(ctx, sku); err != nil {
			t.Fatal(err)
		}
		var owed []ledger.Restore
		for _, hd := range []ledger.Hold{alone, batched} {
			if _, changed, err := l.Cancel(ctx, hd.ID, hd.Buyer, ledger.Request{}); err != nil || !changed {
				t.Fatalf("cancel %s = %v, %v", hd.ID, changed, err)
			}
			r, ok, err := l.RestoreOwed(ctx, "hold", hd.ID)
			if err != nil || !ok || r.Epoch != 2 || r.Quantity != 2 {
				t.Errorf("restore owed for %s = %+v, %v, %v; want 2 units at epoch 2", hd.ID, r, ok, err)
			}
			owed = append(owed, r)
		}
		if diff := cmp.Diff(owed[0], owed[1], cmpopts.IgnoreFields(ledger.Restore{}, "ID", "Buyer", "RequestID"), idEqual); diff != "" {
			t.Errorf("restores differ (-alone +batched):\n%s", diff)
		}
		expectSKU(t, l, 1, 0)
		if n, _ := l.BuyerUnits(ctx, sku, keys.MustID("ann")); n != 0 {
			t.Errorf("ann counts %d units after the cancel, want 0", n)
		}
	})
}

// idEqual compares ids by value (keys.ID keeps its text unexported).
var idEqual = cmp.Comparer(func(a, b keys.ID) bool { return a == b })

// Mixed batches of purchases and holds over the SKUs of one program, from
// two ledgers on one database (through the gate and around it), race
// refunds, cancels and expiry waves. No batch fails (on PostgreSQL a
// deadlock would abort one), every acknowledged take is in the database,
// and the database itself agrees: held + sold <= total, held and sold are
// the sums of the live rows, every buyer row counts exactly its buyer's
// live holds and unrefunded orders, and no cap is exceeded.
func TestMixedBatchesRacing(t *testing.T) {
	for _, via := range []string{ledger.SQLite, ledger.Postgres, "pgbouncer"} {
		t.Run(via, func(t *testing.T) {
			ctx := context.Background()
			ls, c, dsn := openLedgers(t, via, 2)
			driver := ledger.Postgres
			if via == ledger.SQLite {
				driver = ledger.SQLite
			}
			const programCap, skuCap = 30, 6
			// Hundreds of batches where rows are locked (PostgreSQL, where
			// a lock-order slip deadlocks: 360, down from 600, which took
			// 94 s of a loaded make test); fewer through the pooler and on
			// SQLite, whose one writer cannot deadlock (90 batches each:
			// the SQLite run took 49 s of a loaded make test at 180).
			rounds := 15
			if via == ledger.Postgres {
				rounds = 60
			}
			skus := []ledger.SKUConfig{{Total: 300, PerBuyer: skuCap}, {Total: 300}, {Total: 12}, {Total: 400}}
			for i := range skus {
				skus[i].SKU = stock.SKU{Program: sku.Program, Ticket: keys.MustID(fmt.Sprintf("t%d", i))}
				skus[i].Shards, skus[i].MaxPerOrder = 1, 4
				if _, err := ls[0].PutSKU(ctx, skus[i]); err != nil {
					t.Fatal(err)
				}
			}
			if err := ls[0].PutProgram(ctx, sku.Program, programCap); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var holds []ledger.Hold
			var orders []ledger.Order
			pick := func(f func(n int) int) (ledger.Hold, ledger.Order, bool) {
				mu.Lock()
				defer mu.Unlock()
				if len(holds) == 0 || len(orders) == 0 {
					return ledger.Hold{}, ledger.Order{}, false
				}
				return holds[f(len(holds))], orders[f(len(orders))], true
			}
			refusal := func(err error) bool {
				return errors.Is(err, stock.ErrSoldOut) || errors.Is(err, stock.ErrLimit) || errors.Is(err, ledger.ErrStaleGate)
			}
			var wg sync.WaitGroup
			for g := range 6 {
				wg.Go(func() {
					l, direct := ls[g%2], g%3 == 2
					for round := range rounds {
						var batch []ledger.Take
						for i := range 2 + rand.IntN(14) {
							s := skus[rand.IntN(len(skus))].SKU
							buyer := fmt.Sprintf("b%d", rand.IntN(40))
							key := fmt.Sprintf("w%d-%d-%d", g, round, i)
							q := 1 + rand.Int64N(2)
							if rand.IntN(3) > 0 {
								batch = append(batch, ledger.HoldTake(ledger.Hold{IdempotencyKey: keys.MustID(key), SKU: s, Buyer: keys.MustID(buyer),
									Quantity: q, ExpiresAt: c.now().Add(time.Duration(1+rand.IntN(10)) * time.Second), Gate: `[{"shards":1}]`,
									Req: req(buyer, key, "hold", ledger.OpHold)}))
							} else {
								batch = append(batch, ledger.PurchaseTake(ledger.Order{IdempotencyKey: keys.MustID(key), SKU: s, Buyer: keys.MustID(buyer),
									Quantity: q, Req: req(buyer, key, "buy", ledger.OpPurchase)}))
							}
						}
						for _, r := range l.Commit(ctx, batch, direct) {
							switch {
							case r.Err == nil:
								mu.Lock()
								holds = append(holds, r.Holds...)
								orders = append(orders, r.Orders...)
								mu.Unlock()
							case !refusal(r.Err):
								t.Errorf("worker %d round %d: a take of a batch of %d: %v", g, round, len(batch), r.Err)
							}
						}
					}
				})
			}
			wg.Go(func() { // refunds and cancels, alone and batched
				for round := range 40 {
					h, o, ok := pick(rand.IntN)
					if !ok {
						continue
					}
					l := ls[round%2]
					refund := func() {
						if _, _, err := l.Refund(ctx, o.ID, o.Buyer, ledger.Request{}); err != nil {
							t.Errorf("refund: %v", err)
						}
					}
					if round%3 == 0 {
						refund()
					} else {
						key := fmt.Sprintf("refund-%d", round)
						res, err := l.RefundBatch(ctx, []ledger.OrderRequest{{OrderID: o.ID, Buyer: o.Buyer,
							Req: req(o.Buyer.String(), key, "refund", ledger.OpRefund)}})
						if err != nil {
							t.Errorf("refund batch: %v", err)
						} else if errors.Is(res[0].Err, ledger.ErrSplit) {
							refund()
						}
					}
					if round%2 == 0 {
						if _, _, err := l.Cancel(ctx, h.ID, h.Buyer, ledger.Request{}); err != nil {
							t.Errorf("cancel: %v", err)
						}
						continue
					}
					res, err := l.CancelBatch(ctx, []ledger.HoldRequest{{HoldID: h.ID, Buyer: h.Buyer}})
					if err != nil {
						t.Errorf("cancel batch: %v", err)
					} else if errors.Is(res[0].Err, ledger.ErrSplit) {
						if _, _, err := l.Cancel(ctx, h.ID, h.Buyer, ledger.Request{}); err != nil {
							t.Errorf("cancel: %v", err)
						}
					}
				}
			})
			wg.Go(func() { // the sweepers, with time moving on
				for i := range 30 {
					c.advance(500 * time.Millisecond)
					if _, err := ls[i%2].ExpireDue(ctx, 50); err != nil {
						t.Errorf("expire: %v", err)
					}
				}
			})
			wg.Wait()
			t.Logf("%s: %d batches; %d holds and %d orders acknowledged", via, 6*rounds, len(holds), len(orders))
			for _, h := range holds {
				if _, err := ls[0].HoldByID(ctx, h.ID); err != nil {
					t.Errorf("acknowledged hold %s: %v", h.ID, err)
				}
			}
			for _, o := range orders {
				if _, err := ls[1].OrderByID(ctx, o.ID); err != nil {
					t.Errorf("acknowledged order %s: %v", o.ID, err)
				}
			}
			checkLedgerFacts(t, driver, dsn, programCap, skuCap)
		})
	}
}

// checkLedgerFacts checks the invariants on the database's own rows.
func checkLedgerFacts(t *testing.T, driver, dsn string, programCap, skuCap int64) {
	t.Helper()
	name := "pgx"
	if driver == ledger.SQLite {
		name, dsn = "sqlite", "file:"+dsn
	}
	db, err := sql.Open(name, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	query := func(q string, row func(scan func(...any) error) error) {
		t.Helper()
		rows, err := db.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := row(rows.Scan); err != nil {
				t.Fatal(err)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	query(`SELECT s.program, s.ticket, s.total, s.held, s.sold, s.per_buyer,
		(SELECT COALESCE(SUM(quantity), 0) FROM holds h WHERE h.program = s.program AND h.ticket = s.ticket AND h.state = 'held'),
		(SELECT COALESCE(SUM(quantity), 0) FROM orders o WHERE o.program = s.program AND o.ticket = s.ticket AND o.refunded_at = 0)
		FROM skus s`, func(scan func(...any) error) error {
		var p, tk string
		var total, held, sold, perBuyer, liveHeld, liveSold int64
		err := scan(&p, &tk, &total, &held, &sold, &perBuyer, &liveHeld, &liveSold)
		if held+sold > total || held != liveHeld || sold != liveSold || held < 0 || sold < 0 {
			t.Errorf("%s/%s: total %d, held %d (rows %d), sold %d (rows %d)", p, tk, total, held, liveHeld, sold, liveSold)
		}
		return err
	})
	// Every buyer row against its buyer's live rows, both ways.
	live := `SELECT program, ticket, buyer, quantity FROM holds WHERE state = 'held'
		UNION ALL SELECT program, ticket, buyer, quantity FROM orders WHERE refunded_at = 0`
	query(`SELECT c.program, c.ticket, c.buyer, c.counted, COALESCE(l.units, 0) FROM
		(SELECT program, ticket, buyer, units AS counted FROM buyer_units) AS c LEFT JOIN
		(SELECT program, ticket, buyer, SUM(quantity) AS units FROM (`+live+`) AS a GROUP BY program, ticket, buyer
		 UNION ALL SELECT program, '', buyer, SUM(quantity) FROM (`+live+`) AS a GROUP BY program, buyer) AS l
		ON l.program = c.program AND l.ticket = c.ticket AND l.buyer = c.buyer`, func(scan func(...any) error) error {
		var p, tk, b string
		var counted, units int64
		err := scan(&p, &tk, &b, &counted, &units)
		limit := map[string]int64{"": programCap, "t0": skuCap}[tk] // 0: no cap
		if counted != units || (limit > 0 && counted > limit) {
			t.Errorf("buyer %s of %s/%s counts %d units, has %d live (cap %d)", b, p, tk, counted, units, limit)
		}
		return err
	})
	// Every live hold or order under a cap has its buyer's rows: the
	// ticket's when the ticket has a cap, the program's when it has one.
	var missing int
	if err := db.QueryRow(`SELECT COUNT(*) FROM (` + live + `) AS a WHERE
		(NOT EXISTS (SELECT 1 FROM buyer_units u WHERE u.program = a.program AND u.ticket = a.ticket AND u.buyer = a.buyer)
			AND (SELECT per_buyer FROM skus s WHERE s.program = a.program AND s.ticket = a.ticket) > 0)
		OR (NOT EXISTS (SELECT 1 FROM buyer_units u WHERE u.program = a.program AND u.ticket = '' AND u.buyer = a.buyer)
			AND COALESCE((SELECT per_buyer FROM programs p WHERE p.program = a.program), 0) > 0)`).Scan(&missing); err != nil {
		t.Fatal(err)
	}
	if missing > 0 {
		t.Errorf("%d live holds or orders under a cap have no buyer row", missing)
	}
}

// The ledger counts a buyer's units only where a cap applies; a cap
// switched on later counts what stands then (held holds, unrefunded
// orders, of the ticket and its pools, or of the whole program), so it
// binds from its first take: a buyer already over it buys nothing more,
// one under it buys up to it.
func TestCapSwitchedOnCountsWhatStands(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		ga := stock.SKU{Program: keys.MustID("late-cap"), Ticket: keys.MustID("ga")}
		vip := stock.SKU{Program: ga.Program, Ticket: keys.MustID("vip")}
		fan := ga.InPool(keys.MustID("fans"))
		for _, s := range []stock.SKU{ga, vip} {
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 100, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.EnsurePool(ctx, fan); err != nil {
			t.Fatal(err)
		}
		if _, err := l.PutPool(ctx, ledger.PoolConfig{SKU: fan, Allotment: 10, Shards: 1, Rule: ledger.PoolRule{ClosesAt: c.now().Add(time.Hour)}}); err != nil {
			t.Fatal(err)
		}
		n := 0
		take := func(s stock.SKU, buyer string, q int64, hold bool) error {
			t.Helper()
			n++
			key := fmt.Sprintf("k%d", n)
			if hold {
				_, err := l.Hold(ctx, ledger.Hold{IdempotencyKey: keys.MustID(key), SKU: s, Buyer: keys.MustID(buyer), Quantity: q,
					ExpiresAt: c.now().Add(time.Hour), GateEpoch: -1}, -1)
				return err
			}
			_, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID(key), SKU: s, Buyer: keys.MustID(buyer), Quantity: q, GateEpoch: -1})
			return err
		}
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		// No caps: ann buys 3 of ga, holds 2 in the fans' pool, buys 2 of
		// vip; bob buys 1 of ga. Nothing is counted.
		must(take(ga, "ann", 3, false))
		must(take(fan, "ann", 2, true))
		must(take(vip, "ann", 2, false))
		must(take(ga, "bob", 1, false))
		if u, _ := l.BuyerUnits(ctx, ga, keys.MustID("ann")); u != 0 {
			t.Errorf("ann counts %d units of an uncapped ticket, want none counted", u)
		}
		// A cap of 4 on ga counts its pools too: ann has 5 (over it), bob 1.
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: ga, Total: 100, Shards: 1, MaxPerOrder: 4, PerBuyer: 4}); err != nil {
			t.Fatal(err)
		}
		for who, want := range map[string]int64{"ann": 5, "bob": 1} {
			if u, _ := l.BuyerUnits(ctx, ga, keys.MustID(who)); u != want {
				t.Errorf("%s counts %d units of ga after its cap, want %d", who, u, want)
			}
		}
		if err := take(ga, "ann", 1, false); !errors.Is(err, stock.ErrLimit) {
			t.Errorf("ann, over the new cap, buys again = %v, want ErrLimit", err)
		}
		must(take(fan, "bob", 3, false))
		if err := take(ga, "bob", 1, false); !errors.Is(err, stock.ErrLimit) {
			t.Errorf("bob at the cap buys again = %v, want ErrLimit", err)
		}
		// A program cap of 8: ann has 7 of the program (ga 5, vip 2).
		if err := l.PutProgram(ctx, ga.Program, 8); err != nil {
			t.Fatal(err)
		}
		if u, _ := l.ProgramUnits(ctx, ga.Program, keys.MustID("ann")); u != 7 {
			t.Errorf("ann counts %d units of the program after its cap, want 7", u)
		}
		must(take(vip, "ann", 1, false))
		if err := take(vip, "ann", 1, false); !errors.Is(err, stock.ErrLimit) {
			t.Errorf("ann at the program's cap buys again = %v, want ErrLimit", err)
		}
	})
}

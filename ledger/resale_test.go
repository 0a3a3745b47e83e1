package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// A sweep's settles go to the SKUs with sales to settle: listings with
// none (a sale ended with a listing forgotten) kept their place first in
// line, and more of them than a sweep takes held up every other SKU's
// settles for good; its sellers were never told (helper-65).
func TestSettleDueSkipsQuietListings(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		program := keys.MustID(fmt.Sprintf("quiet%d", time.Now().UnixNano()))
		sell := func(s stock.SKU, buyer string, n int) ledger.Order { return sellOne(t, l, s, buyer, n) }
		listed := func(s stock.SKU, total int64) {
			listOne(t, l, s, total)
			c.advance(time.Second) // its place in line: older than the next
		}
		const perSweep = 2
		for i := range perSweep + 1 {
			listed(stock.SKU{Program: program, Ticket: keys.MustID(fmt.Sprintf("quiet%d", i))}, 10)
		}
		busy := stock.SKU{Program: program, Ticket: keys.MustID("busy")}
		listed(busy, 1) // sold out but for sam's listed ticket
		sell(busy, "bob", 1)
		c.advance(2 * ledger.ResaleHorizon)
		for sweep := range 3 {
			events, err := l.SettleDue(ctx, perSweep)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range events {
				if e.Type == ledger.EventListingSold && e.SKU == busy && e.Quantity == 1 {
					return
				}
			}
			t.Logf("sweep %d settled %d sales, none of %v", sweep, len(events), busy)
		}
		t.Fatalf("3 sweeps of %d SKUs never settled bob's purchase of the listed ticket behind %d quiet listings", perSweep, perSweep+1)
	})
}

// sellOne commits buyer's purchase of one unit of s (n tells the key).
func sellOne(t *testing.T, l *ledger.Ledger, s stock.SKU, buyer string, n int) ledger.Order {
	t.Helper()
	k := keys.MustID(strings.ReplaceAll(fmt.Sprintf("%s-%s-%d", s.Ticket, buyer, n), ".", "-")) // a pool's ticket has a dot
	o, err := l.Purchase(context.Background(), ledger.Order{IdempotencyKey: k, SKU: s, Buyer: keys.MustID(buyer), Quantity: 1,
		Req: ledger.Request{Scope: keys.MustID(buyer), Key: k, Fingerprint: "fp", Op: ledger.OpPurchase}})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// listOne makes s (total units), sells sam one and lists it.
func listOne(t *testing.T, l *ledger.Ledger, s stock.SKU, total int64) ledger.Listing {
	t.Helper()
	ctx := context.Background()
	if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: total, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	o := sellOne(t, l, s, "sam", 0)
	k := keys.MustID("list-" + s.Ticket.String())
	x, err := l.List(ctx, o.ID, o.Buyer, 1, ledger.Request{Scope: o.Buyer, Key: k, Fingerprint: "fp", Op: ledger.OpResale})
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// A listing whose buyer's sale an older settle passed by (its mark moved
// past the sale, which took the last free unit: helper-65's alongside
// share beside an earlier hold) is settled at the next sweep: its listed
// unit is nowhere (not free, not held, no sale left to count), so it was
// sold. Left, the listing could be neither withdrawn nor its order
// refunded, and its seller was never told.
func TestSettleFreesAListingAnOlderSettlePassedBy(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		sku := stock.SKU{Program: keys.MustID(fmt.Sprintf("stuck%d", time.Now().UnixNano())), Ticket: keys.MustID("t")}
		x := listOne(t, l, sku, 1)
		sellOne(t, l, sku, "bob", 1)
		// The older settle: its mark past bob's sale, nothing settled.
		if _, err := l.DB().ExecContext(ctx, `UPDATE skus SET resale_seq = (SELECT MAX(seq) FROM events) WHERE program = $1 AND ticket = $2`,
			sku.Program, sku.Ticket); err != nil {
			t.Fatal(err)
		}
		c.advance(2 * ledger.ResaleHorizon)
		events, err := l.SettleDue(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(events) != 1 || events[0].Type != ledger.EventListingSold || events[0].Subject != x.ID || events[0].Quantity != 1 {
			t.Fatalf("the sweep settled %+v; want listing.sold of 1 for %v", events, x.ID)
		}
		if st, err := l.SKU(ctx, sku); err != nil || st.Total != 1 || st.Sold != 1 || st.Listed != 0 {
			t.Errorf("SKU row %+v (%v): want total 1, sold 1 (bob's), nothing listed", st, err)
		}
	})
}

// A withdrawal that fails before its COMMIT says ErrNotCommitted: its
// caller took the listing's unsold units out of the gate first and gives
// them back only then. One whose first read failed (here the request's
// time already out) answered a bare context error, which the caller took
// for an outcome unknown: the units stayed out of Redis while the ledger
// had them on sale (helper-90 #1). The listing stands after it.
func TestWithdrawFailingBeforeItsCommitSaysSo(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		s := stock.SKU{Program: keys.MustID(fmt.Sprintf("wd%d", time.Now().UnixNano())), Ticket: keys.MustID("t")}
		x := listOne(t, l, s, 4)
		gone, cancel := context.WithCancel(context.Background())
		cancel()
		req := ledger.Request{Scope: x.Seller, Key: keys.MustID("withdraw-" + s.Program.String()), Fingerprint: "fp", Op: ledger.OpWithdraw}
		if _, _, err := l.Withdraw(gone, x.ID, x.Seller, 1, -1, req); !errors.Is(err, ledger.ErrNotCommitted) {
			t.Fatalf("a withdrawal out of time before it began = %v; want ErrNotCommitted", err)
		}
		got, err := l.ListingByID(context.Background(), x.ID)
		if err != nil || got.State != ledger.Listed || got.Withdrawn != 0 {
			t.Fatalf("the listing after it: %+v, %v; want it still listed", got, err)
		}
		// And the same request, in time, withdraws it.
		if w, _, err := l.Withdraw(context.Background(), x.ID, x.Seller, 1, -1, req); err != nil || w.State != ledger.Withdrawn {
			t.Fatalf("the withdrawal again = %+v, %v", w, err)
		}
	})
}

// A settle that counts no sale keeps an alongside share's fraction: the
// settles of a SKU add up as one settle of all its sales would. One
// whose only sale was the confirm of a hold taken before the listings
// (no resale) threw the fraction away, so the listing sold later than
// its share said (the unit model, sale/model_resale_unit_test.go).
func TestSettleOfNoSaleKeepsTheShareCarried(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		sku := stock.SKU{Program: keys.MustID(fmt.Sprintf("carry%d", time.Now().UnixNano())), Ticket: keys.MustID("t")}
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 8, Shards: 1, MaxPerOrder: 4, Resale: ledger.ResaleAlongside}); err != nil {
			t.Fatal(err)
		}
		h := hold("h-before", "bob", 1, c.now().Add(time.Hour))
		h.SKU = sku
		before, err := l.Hold(ctx, h, -1)
		if err != nil {
			t.Fatal(err)
		}
		o := sellOne(t, l, sku, "sam", 0)
		if _, err := l.List(ctx, o.ID, o.Buyer, 1, req("sam", "list", "fp", ledger.OpResale)); err != nil {
			t.Fatal(err)
		}
		carried := func() int64 { t.Helper(); return carriedOf(t, l, sku) }
		// Two sales beside 1 listed of 7 for sale: the listing's share is
		// 2/7 of a unit, carried.
		sellOne(t, l, sku, "cat", 1)
		sellOne(t, l, sku, "dan", 1)
		c.advance(2 * ledger.ResaleHorizon)
		if sold, err := l.SettleAged(ctx, sku); err != nil || len(sold) != 0 {
			t.Fatalf("first settle: %+v, %v; want nothing sold yet", sold, err)
		}
		share := carried()
		if share == 0 {
			t.Fatal("no fraction carried after the first settle")
		}
		// The hold from before the listing is confirmed: no resale.
		if _, err := l.Confirm(ctx, before.ID, before.Buyer, req("bob", "c-before", "fp", ledger.OpConfirm)); err != nil {
			t.Fatal(err)
		}
		c.advance(2 * ledger.ResaleHorizon)
		if sold, err := l.SettleAged(ctx, sku); err != nil || len(sold) != 0 {
			t.Fatalf("second settle: %+v, %v; want nothing sold", sold, err)
		}
		if got := carried(); got != share {
			t.Errorf("carried %d after a settle that counted no sale; want %d, as before it", got, share)
		}
	})
}

// A withdrawal takes its part of an alongside share's carried fraction:
// it was the listed units' as a whole. Left to the listings that stayed,
// sam's one listed ticket sold after three more sales, its own share
// about 0.40 of a unit, and he was refunded for a ticket the rule never
// gave him (helper-101).
func TestWithdrawalTakesItsPartOfTheCarry(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		r := newResaleRig(t, l, c, "wcarry", ledger.ResaleAlongside, 20)
		sku := r.sku
		buy, list, settled := r.buy, r.list, r.settled
		carried := func() int64 { t.Helper(); return carriedOf(t, l, sku) }
		samOrder, tomOrder := buy("sam", 1), buy("tom", 4)
		sam, tom := list(samOrder, 1), list(tomOrder, 4)
		for range 3 {
			buy("pub", 1)
		}
		// 3 sales of 20 for sale, 5 of them listed: 0.75 of a unit.
		if sold := settled(); len(sold) != 0 || carried() != 750_000 {
			t.Fatalf("first settle: %+v, carried %d; want nothing sold, 750000 carried", sold, carried())
		}
		if _, _, err := l.Withdraw(ctx, tom.ID, tom.Seller, 4, -1, req("tom", "withdraw", "fp", ledger.OpWithdraw)); err != nil {
			t.Fatal(err)
		}
		if got := carried(); got != 150_000 {
			t.Errorf("carried %d after 4 of the 5 listed units were withdrawn; want 150000, the 1 left's part", got)
		}
		for i := range 3 {
			buy("pub", 1)
			if sold := settled(); len(sold) != 0 {
				t.Fatalf("sale %d after the withdrawal settled %+v to sam's listing; its share is under a unit", i+1, sold)
			}
		}
		if x, err := l.ListingByID(ctx, sam.ID); err != nil || x.Sold != 0 {
			t.Errorf("sam's listing %+v (%v): want nothing sold", x, err)
		}
	})
}

// carriedOf is sku's alongside share's fraction carried, in millionths
// of a unit, as its row has it.
func carriedOf(t *testing.T, l *ledger.Ledger, sku stock.SKU) int64 {
	t.Helper()
	var v int64
	if err := l.DB().QueryRowContext(context.Background(), `SELECT resale_carry FROM skus WHERE program = $1 AND ticket = $2`,
		sku.Program, sku.Ticket).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// resaleRig is a SKU of a resale test and its moves on the ledger's clock.
type resaleRig struct {
	t   *testing.T
	l   *ledger.Ledger
	c   *clock
	sku stock.SKU
}

// newResaleRig makes a SKU of total units (name, made unique, its
// program) whose resale is mode.
func newResaleRig(t *testing.T, l *ledger.Ledger, c *clock, name, mode string, total int64) *resaleRig {
	t.Helper()
	sku := stock.SKU{Program: keys.MustID(fmt.Sprintf("%s%d", name, time.Now().UnixNano())), Ticket: keys.MustID("t")}
	if _, err := l.PutSKU(context.Background(), ledger.SKUConfig{SKU: sku, Total: total, Shards: 1, MaxPerOrder: 4, Resale: mode}); err != nil {
		t.Fatal(err)
	}
	return &resaleRig{t: t, l: l, c: c, sku: sku}
}

// buy commits buyer's purchase of q units.
func (r *resaleRig) buy(buyer string, q int64) ledger.Order {
	r.t.Helper()
	k := keys.MustID(fmt.Sprintf("%s-%d", buyer, time.Now().UnixNano()))
	o, err := r.l.Purchase(context.Background(), ledger.Order{IdempotencyKey: k, SKU: r.sku, Buyer: keys.MustID(buyer), Quantity: q,
		Req: ledger.Request{Scope: keys.MustID(buyer), Key: k, Fingerprint: "fp", Op: ledger.OpPurchase}})
	if err != nil {
		r.t.Fatal(err)
	}
	return o
}

// hold holds q units for buyer for an hour, under key.
func (r *resaleRig) hold(key, buyer string, q int64) ledger.Hold {
	r.t.Helper()
	h := hold(key, buyer, q, r.c.now().Add(time.Hour))
	h.SKU = r.sku
	got, err := r.l.Hold(context.Background(), h, -1)
	if err != nil {
		r.t.Fatal(err)
	}
	return got
}

// list lists q units of order o.
func (r *resaleRig) list(o ledger.Order, q int64) ledger.Listing {
	r.t.Helper()
	x, err := r.l.List(context.Background(), o.ID, o.Buyer, q, req(o.Buyer.String(), "list-"+o.ID.String(), "fp", ledger.OpResale))
	if err != nil {
		r.t.Fatal(err)
	}
	return x
}

// settled moves the clock past the horizon and settles the SKU.
func (r *resaleRig) settled() []ledger.Event {
	r.t.Helper()
	r.c.advance(2 * ledger.ResaleHorizon)
	sold, err := r.l.SettleAged(context.Background(), r.sku)
	if err != nil {
		r.t.Fatal(err)
	}
	return sold
}

// sold is how many of x's units the ledger has settled as sold.
func (r *resaleRig) sold(x ledger.Listing) int64 {
	r.t.Helper()
	got, err := r.l.ListingByID(context.Background(), x.ID)
	if err != nil {
		r.t.Fatal(err)
	}
	return got.Sold
}

// A listing begun beside another takes none of the sales made before it
// began: they took the public stock, and the older listing's. The next
// settle gave them to the listings oldest first, the new one included
// (helper-102: sam 1 listed, 5 public sales, tom 4 listed within the
// horizon; tom was refunded for 4 tickets nobody bought from him). The
// same for a hold held when tom's listing began, confirmed after.
func TestASecondListingTakesNoSaleBeforeIt(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		r := newResaleRig(t, l, c, "second", ledger.ResaleFirst, 20)
		sku := r.sku
		samOrder, tomOrder := r.buy("sam", 1), r.buy("tom", 4)
		sam := r.list(samOrder, 1)
		for range 5 {
			r.buy("pub", 1)
		}
		between := r.hold("h-between", "bob", 2)
		tom := r.list(tomOrder, 4)
		if _, err := l.Confirm(ctx, between.ID, between.Buyer, req("bob", "c-between", "fp", ledger.OpConfirm)); err != nil {
			t.Fatal(err)
		}
		r.settled()
		if got, gotTom := r.sold(sam), r.sold(tom); got != 1 || gotTom != 0 {
			t.Fatalf("sam's listing sold %d, tom's %d; want 1 and 0: every sale so far was made before tom's began", got, gotTom)
		}
		// A sale after tom's began is his.
		r.buy("pub", 2)
		r.settled()
		if got := r.sold(tom); got != 2 {
			t.Errorf("tom's listing sold %d after 2 more sales; want 2", got)
		}
		if st, err := l.SKU(ctx, sku); err != nil || st.Listed != 2 || st.Total != 20+5-1-2 {
			t.Errorf("SKU row %+v (%v): want 2 listed, total %d", st, err, 20+5-1-2)
		}
	})
}

// A listed unit a hold may hold stays listed until the hold ends. Bob's
// hold, taken after sam's listing began, may hold sam's unit; dan's unit,
// listed after it, was the one free unit when cat bought. The shares give
// cat's sale to sam's listing (the oldest), so the unit left listed, dan's
// by the shares, may be the one bob holds: it is sold only when bob
// confirms, and stays on sale when he cancels. A settle that looked for
// it only in holds taken after dan's listing began refunded dan while
// bob's hold could still give the unit back to public stock
// (helper-103).
func TestAListedUnitAHoldMayHoldStaysListed(t *testing.T) {
	for _, end := range []string{"confirm", "cancel"} {
		t.Run(end, func(t *testing.T) {
			eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
				ctx := context.Background()
				r := newResaleRig(t, l, c, "mayhold", ledger.ResaleAlongside, 6)
				samOrder, danOrder := r.buy("sam", 1), r.buy("dan", 1)
				sam := r.list(samOrder, 1)
				bob := r.hold("h-bob", "bob", 2)
				r.buy("pub", 3)
				dan := r.list(danOrder, 1)
				r.buy("cat", 1) // the one unit free: dan's
				r.settled()
				if got, gotDan := r.sold(sam), r.sold(dan); got != 1 || gotDan != 0 {
					t.Fatalf("sam's listing sold %d, dan's %d; want 1 and 0: bob's hold may hold the unit left", got, gotDan)
				}
				if again := r.settled(); len(again) != 0 {
					t.Fatalf("the next settle, with no sale since, settled %+v", again)
				}
				want := int64(1)
				if end == "confirm" {
					if _, err := l.Confirm(ctx, bob.ID, bob.Buyer, req("bob", "c-bob", "fp", ledger.OpConfirm)); err != nil {
						t.Fatal(err)
					}
				} else {
					if _, _, err := l.Cancel(ctx, bob.ID, bob.Buyer, req("bob", "x-bob", "fp", ledger.OpCancel)); err != nil {
						t.Fatal(err)
					}
					want = 0
				}
				r.settled()
				if got := r.sold(dan); got != want {
					t.Errorf("dan's listing sold %d after bob's %s; want %d", got, end, want)
				}
			})
		})
	}
}

// A listing an older build made (no since: schema step 11 came after
// it, or it was made beside this build during a rollout) takes its place
// from its listing.created event. Left at 0 it went first in line and
// took every sale since the mark: tom was refunded for pub's purchase,
// made while sam's listing alone was on sale (helper-104).
func TestAListingOfAnOlderBuildKeepsItsPlace(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		r := newResaleRig(t, l, c, "older", ledger.ResaleFirst, 20)
		samOrder, tomOrder := r.buy("sam", 1), r.buy("tom", 4)
		sam := r.list(samOrder, 1)
		r.buy("pub", 1)
		tom := r.list(tomOrder, 4)
		// As an older build writes it.
		if _, err := l.DB().ExecContext(ctx, `UPDATE listings SET since_seq = 0 WHERE id = $1`, tom.ID); err != nil {
			t.Fatal(err)
		}
		r.settled()
		if got, gotTom := r.sold(sam), r.sold(tom); got != 1 || gotTom != 0 {
			t.Fatalf("sam's listing sold %d, tom's %d; want 1 and 0: pub bought before tom's listing began", got, gotTom)
		}
		r.buy("cat", 2)
		r.settled()
		if got := r.sold(tom); got != 2 {
			t.Errorf("tom's listing sold %d after cat's 2; want 2", got)
		}
	})
}

// An alongside share's whole is what was for sale before the sales it
// counts, the sales made since inside the horizon included: the row's
// sold already has them, and left out they shrank the whole. Sam's one
// listed ticket beside 9 public ones: one sale, then a burst of 8 just
// before the settle; the share of the one sale is 1/10 (it was 1/2), and
// with the burst's 8/9 it stays under a unit (sam's listing sold at
// once). A burst refunded before the settle gave its units back: counted
// as sales too, the whole was 18 (helper-105).
func TestAShareCountsTheSalesInsideTheHorizonAsNotMadeYet(t *testing.T) {
	for _, refunded := range []bool{false, true} {
		t.Run(fmt.Sprintf("refunded=%v", refunded), func(t *testing.T) {
			eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
				ctx := context.Background()
				r := newResaleRig(t, l, c, "burst", ledger.ResaleAlongside, 10)
				sam := r.list(r.buy("sam", 1), 1)
				r.buy("pub", 1)
				c.advance(2 * ledger.ResaleHorizon)
				for i := range 2 {
					o := r.buy("burst", 4)
					if !refunded {
						continue
					}
					if _, _, err := l.Refund(ctx, o.ID, o.Buyer, req("burst", fmt.Sprintf("refund-%d", i), "fp", ledger.OpRefund)); err != nil {
						t.Fatal(err)
					}
				}
				if sold, err := l.SettleAged(ctx, r.sku); err != nil || len(sold) != 0 {
					t.Fatalf("the settle inside the burst: %+v, %v; want nothing sold", sold, err)
				}
				if got := carriedOf(t, l, r.sku); got != 100_000 {
					t.Errorf("carried %d after one sale of 10 for sale beside 1 listed; want 100000", got)
				}
				if sold := r.settled(); len(sold) != 0 || r.sold(sam) != 0 {
					t.Errorf("the burst's settle sold %+v; 9 sales beside 1 listed of 10 are under a unit", sold)
				}
			})
		})
	}
}

// A withdrawal settles the sales made just before it too (Settle counts
// inside the horizon; the sweeper's SettleDue does not): with "first"
// every sale made while listed is a resale. Left to the sweeper, a sale a
// moment before the withdrawal counted as public, and the seller withdrew
// every unit (helper-106 #4a); and when that buyer listed what he bought,
// the next settle found the units nowhere and sold his listing, which
// nobody had bought from, and his withdrawal was refused (#4b).
func TestAWithdrawalCountsTheSalesJustMade(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		withdraw := func(t *testing.T, r *resaleRig, x ledger.Listing) ledger.Listing {
			t.Helper()
			// As the sale layer does: settle, read what is left, withdraw it.
			if _, err := l.Settle(ctx, r.sku); err != nil {
				t.Fatal(err)
			}
			got, err := l.ListingByID(ctx, x.ID)
			if err != nil {
				t.Fatal(err)
			}
			w, _, err := l.Withdraw(ctx, x.ID, x.Seller, got.Quantity-got.Sold, -1, req(x.Seller.String(), "w-"+x.ID.String(), "fp", ledger.OpWithdraw))
			if err != nil {
				t.Fatalf("withdraw %d left: %v", got.Quantity-got.Sold, err)
			}
			return w
		}
		t.Run("a sale just made", func(t *testing.T) {
			r := newResaleRig(t, l, c, "justmade", ledger.ResaleFirst, 10)
			sel := r.list(r.buy("sel", 4), 4)
			r.buy("bea", 1)
			if w := withdraw(t, r, sel); w.Sold != 1 || w.Withdrawn != 3 {
				t.Errorf("withdrawn at once after a sale: sold %d, withdrew %d; want 1 sold (a resale), 3 withdrawn", w.Sold, w.Withdrawn)
			}
		})
		// The caller's count is stale (sales came after it read the
		// listing): the withdrawal is refused, and what its settle sold
		// stands. Rolled back with the refusal, listing-ended was told of
		// a listing that still had its units listed.
		for _, bought := range []int64{1, 2} {
			t.Run(fmt.Sprintf("refused after %d sold", bought), func(t *testing.T) {
				r := newResaleRig(t, l, c, "stale", ledger.ResaleFirst, 4)
				x := r.list(r.buy("sel", 2), 2)
				r.buy("bea", bought)
				_, settled, err := l.Withdraw(ctx, x.ID, x.Seller, 2, -1, req("sel", "w-"+x.ID.String(), "fp", ledger.OpWithdraw))
				want := ledger.ErrListingSelling
				if bought == 2 {
					want = ledger.ErrListingEnded
				}
				if !errors.Is(err, want) {
					t.Fatalf("withdraw of 2 after %d sold: %v, want %v", bought, err, want)
				}
				if got := r.sold(x); got != bought || len(settled) != 1 || settled[0].Quantity != bought {
					t.Errorf("after the refusal the listing has sold %d, the call told of %+v; want %d sold and told", got, settled, bought)
				}
			})
		}
		t.Run("listed again by its buyer", func(t *testing.T) {
			r := newResaleRig(t, l, c, "relisted", ledger.ResaleFirst, 6)
			selOrder := r.buy("sel", 4)
			r.buy("oth", 2)
			sel := r.list(selOrder, 3)
			bea := r.list(r.buy("bea", 2), 2) // the public stock was gone: sel's
			if w := withdraw(t, r, sel); w.Sold != 2 || w.Withdrawn != 1 {
				t.Errorf("sel's withdrawal: sold %d, withdrew %d; want 2 sold to bea, 1 withdrawn", w.Sold, w.Withdrawn)
			}
			if sold := r.settled(); len(sold) != 0 || r.sold(bea) != 0 {
				t.Errorf("the next settle sold %+v of bea's listing, which nobody bought from", sold)
			}
			if w := withdraw(t, r, bea); w.Sold != 0 || w.Withdrawn != 2 {
				t.Errorf("bea's withdrawal: sold %d, withdrew %d; want her 2 back", w.Sold, w.Withdrawn)
			}
		})
	})
}

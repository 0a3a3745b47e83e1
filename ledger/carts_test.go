package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

func cartOf(key string, buyer keys.ID, lines map[stock.SKU]int64, order []stock.SKU) ledger.Cart {
	c := ledger.Cart{Program: order[0].Program, Buyer: buyer,
		Req: ledger.Request{Scope: buyer, Key: keys.MustID(key), Fingerprint: "fp-" + key, Op: ledger.OpCart}}
	for i, s := range order {
		if q := lines[s]; q > 0 {
			c.Orders = append(c.Orders, ledger.Order{IdempotencyKey: keys.MustID(fmt.Sprintf("%s-l%d", key, i)), SKU: s, Buyer: buyer, Quantity: q})
		}
	}
	return c
}

// A cart commits every line or none: a line over its SKU's stock, over the
// SKU's cap or over the program's cap (counting every line) refuses the
// cart, names the line, and moves nothing; a retry of a committed cart
// gets the stored cart; the key used for a purchase is refused.
func TestPurchaseCartAllOrNothing(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		p := keys.MustID("show-c")
		adult, child, park := stock.SKU{Program: p, Ticket: keys.MustID("adult")}, stock.SKU{Program: p, Ticket: keys.MustID("child")},
			stock.SKU{Program: p, Ticket: keys.MustID("parking")}
		all := []stock.SKU{adult, child, park}
		for i, s := range all {
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: []int64{10, 10, 1}[i], Shards: 1, MaxPerOrder: 4, PerBuyer: 4}); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.PutProgram(ctx, p, 6); err != nil {
			t.Fatal(err)
		}
		alice, bob := keys.MustID("alice"), keys.MustID("bob")
		remaining := func() []int64 {
			var r []int64
			for _, s := range all {
				st, err := l.SKU(ctx, s)
				if err != nil {
					t.Fatal(err)
				}
				r = append(r, st.Remaining())
			}
			return r
		}
		c, err := l.PurchaseCart(ctx, cartOf("k1", alice, map[stock.SKU]int64{adult: 2, child: 2, park: 1}, all), false)
		if err != nil || len(c.Orders) != 3 || c.ID.IsZero() {
			t.Fatalf("cart = %+v, %v", c, err)
		}
		for _, o := range c.Orders {
			if o.CartID != c.ID {
				t.Errorf("line %s has cart %q, want %q", o.SKU, o.CartID, c.ID)
			}
		}
		if got := remaining(); fmt.Sprint(got) != "[8 8 0]" {
			t.Errorf("remaining %v after the first cart, want [8 8 0]", got)
		}
		// A retry gets the same cart, and nothing moves.
		again, err := l.PurchaseCart(ctx, cartOf("k1", alice, map[stock.SKU]int64{adult: 2, child: 2, park: 1}, all), false)
		if !errors.Is(err, ledger.ErrDuplicate) || again.ID != c.ID || len(again.Orders) != 3 || again.Orders[2].ID != c.Orders[2].ID {
			t.Errorf("retry = %+v, %v; want ErrDuplicate with cart %s", again, err, c.ID)
		}
		// Parking is sold out: bob's cart is refused on its third line.
		_, err = l.PurchaseCart(ctx, cartOf("k2", bob, map[stock.SKU]int64{adult: 1, child: 1, park: 1}, all), false)
		var le *ledger.LineError
		if !errors.As(err, &le) || le.Line != 2 || !errors.Is(err, stock.ErrSoldOut) {
			t.Errorf("cart with a sold-out line = %v, want line 2 sold out", err)
		}
		// Alice has 5 of the program's 6: a cart of 2 more is over the
		// program cap though each line fits its SKU's.
		_, err = l.PurchaseCart(ctx, cartOf("k3", alice, map[stock.SKU]int64{adult: 1, child: 1}, all), false)
		if !errors.Is(err, stock.ErrLimit) || errors.As(err, &le) {
			t.Errorf("cart over the program cap = %v, want ErrLimit for the cart", err)
		}
		// Bob's 5 adults are over the SKU's cap of 4: the line is named.
		_, err = l.PurchaseCart(ctx, cartOf("k4", bob, map[stock.SKU]int64{adult: 3, child: 1}, all), false)
		if err != nil {
			t.Fatal(err)
		}
		_, err = l.PurchaseCart(ctx, cartOf("k5", bob, map[stock.SKU]int64{adult: 2}, all), false)
		if !errors.As(err, &le) || le.Line != 0 || !errors.Is(err, stock.ErrLimit) {
			t.Errorf("cart over the SKU cap = %v, want line 0 limit", err)
		}
		if got := remaining(); fmt.Sprint(got) != "[5 7 0]" {
			t.Errorf("remaining %v after the refusals, want [5 7 0]", got)
		}
		// The key of a committed purchase is not a cart's.
		if _, err := l.Purchase(ctx, ledger.Order{IdempotencyKey: keys.MustID("p1"), SKU: child, Buyer: bob, Quantity: 1,
			Req: ledger.Request{Scope: bob, Key: keys.MustID("k6"), Fingerprint: "x", Op: ledger.OpPurchase}}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.PurchaseCart(ctx, cartOf("k6", bob, map[stock.SKU]int64{child: 1}, all), false); !errors.Is(err, ledger.ErrKeyReused) {
			t.Errorf("cart with a purchase's key = %v, want ErrKeyReused", err)
		}
		got, err := l.CartByID(ctx, c.ID)
		if err != nil || len(got.Orders) != 3 || got.Buyer != alice || got.Orders[0].SKU != adult {
			t.Errorf("CartByID = %+v, %v", got, err)
		}
		if _, err := l.CartByID(ctx, keys.MustID("nope")); !errors.Is(err, ledger.ErrNotFound) {
			t.Errorf("CartByID(unknown) = %v, want ErrNotFound", err)
		}
		// Lines out of ticket order, a ticket twice, or another program's
		// ticket are refused before anything is written.
		for _, bad := range []ledger.Cart{
			cartOf("k7", bob, map[stock.SKU]int64{adult: 1, child: 1}, []stock.SKU{child, adult}),
			cartOf("k8", bob, map[stock.SKU]int64{adult: 1}, []stock.SKU{adult, adult}),
			cartOf("k9", bob, map[stock.SKU]int64{sku: 1, adult: 1}, []stock.SKU{adult, sku}),
			{Program: p, Buyer: bob, Req: ledger.Request{Scope: bob, Key: keys.MustID("k10"), Fingerprint: "f", Op: ledger.OpCart}},
		} {
			if _, err := l.PurchaseCart(ctx, bad, false); !errors.Is(err, stock.ErrInvalid) {
				t.Errorf("PurchaseCart(%+v) = %v, want ErrInvalid", bad, err)
			}
		}
	})
}

// Carts racing each other, single purchases and direct carts over three
// SKUs of one program: no SKU oversold, every committed cart has all its
// lines, and the SKU rows agree with the order rows.
func TestPurchaseCartRacing(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		p := keys.MustID("show-r")
		all := []stock.SKU{{Program: p, Ticket: keys.MustID("a")}, {Program: p, Ticket: keys.MustID("b")}, {Program: p, Ticket: keys.MustID("c")}}
		for i, s := range all {
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: []int64{40, 60, 25}[i], Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		sold := map[stock.SKU]int64{}
		carts := 0
		for g := range 8 {
			wg.Go(func() {
				for i := range 25 {
					lines := map[stock.SKU]int64{}
					for j, s := range all {
						if (g+i+j)%3 != 0 {
							lines[s] = int64((g+i*j)%3 + 1)
						}
					}
					if len(lines) == 0 {
						continue
					}
					key := fmt.Sprintf("g%d-%d", g, i)
					c, err := l.PurchaseCart(ctx, cartOf(key, keys.MustID("b"+key), lines, all), g%3 == 2)
					var le *ledger.LineError
					switch {
					case errors.Is(err, ledger.ErrConflict), errors.As(err, &le) && errors.Is(err, stock.ErrSoldOut):
						continue
					case err != nil:
						t.Error(err)
						return
					}
					if len(c.Orders) != len(lines) {
						t.Errorf("cart %s committed %d of %d lines", key, len(c.Orders), len(lines))
					}
					mu.Lock()
					carts++
					for _, o := range c.Orders {
						sold[o.SKU] += o.Quantity
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if carts == 0 {
			t.Fatal("no cart committed")
		}
		for _, s := range all {
			st, _ := l.SKU(ctx, s)
			_, units, _ := l.OrderTotals(ctx, s)
			if st.Sold > st.Total || st.Sold != sold[s] || units != sold[s] {
				t.Errorf("%s: sold %d, order units %d, acknowledged %d, total %d", s, st.Sold, units, sold[s], st.Total)
			}
		}
	})
}

func heldCartOf(key string, buyer keys.ID, expires time.Time, lines map[stock.SKU]int64, order []stock.SKU) ledger.Cart {
	c := cartOf(key, buyer, lines, order)
	c.Req.Op = ledger.OpCartHold
	for _, o := range c.Orders {
		c.Holds = append(c.Holds, ledger.Hold{IdempotencyKey: o.IdempotencyKey, SKU: o.SKU, Buyer: buyer, Quantity: o.Quantity, ExpiresAt: expires,
			Gate: `[{"shards":1}]`})
	}
	c.Orders = nil
	return c
}

func clientReq(buyer keys.ID, key, op string) ledger.Request {
	return ledger.Request{Scope: buyer, Key: keys.MustID(key), Fingerprint: "fp-" + key, Op: op}
}

// A held cart lives whole: its lines cannot be confirmed or cancelled
// alone; a confirm makes an order per line in one transaction and a retry
// gets the same cart; a refund of the cart gives every line back once; a
// cancelled cart gives its holds back once and cannot be confirmed; an
// expired one is expired line by line by the sweeper and cannot be
// confirmed either.
func TestHeldCartLife(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, clk *clock) {
		ctx := context.Background()
		p := keys.MustID("show-h")
		adult, child := stock.SKU{Program: p, Ticket: keys.MustID("adult")}, stock.SKU{Program: p, Ticket: keys.MustID("child")}
		all := []stock.SKU{adult, child}
		for _, s := range all {
			if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 10, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
		}
		counts := func() string {
			var out []string
			for _, s := range all {
				st, err := l.SKU(ctx, s)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, fmt.Sprintf("%d/%d", st.Held, st.Sold))
			}
			return fmt.Sprint(out)
		}
		ann := keys.MustID("ann")
		exp := clk.now().Add(time.Minute)
		c, err := l.HoldCart(ctx, heldCartOf("hc1", ann, exp, map[stock.SKU]int64{adult: 2, child: 1}, all), false)
		if err != nil || len(c.Holds) != 2 || len(c.Orders) != 0 {
			t.Fatalf("HoldCart = %+v, %v", c, err)
		}
		if got := counts(); got != "[2/0 1/0]" {
			t.Errorf("held/sold %s after the hold, want [2/0 1/0]", got)
		}
		if _, err := l.Confirm(ctx, c.Holds[0].ID, ann, clientReq(ann, "line", ledger.OpConfirm)); !errors.Is(err, ledger.ErrInCart) {
			t.Errorf("Confirm of a line = %v, want ErrInCart", err)
		}
		if _, _, err := l.Cancel(ctx, c.Holds[1].ID, ann, clientReq(ann, "line2", ledger.OpCancel)); !errors.Is(err, ledger.ErrInCart) {
			t.Errorf("Cancel of a line = %v, want ErrInCart", err)
		}
		if _, err := l.ConfirmCart(ctx, c.ID, keys.MustID("bob"), clientReq(keys.MustID("bob"), "steal", ledger.OpCartConfirm)); !errors.Is(err, ledger.ErrNotOwner) {
			t.Errorf("ConfirmCart by another buyer = %v, want ErrNotOwner", err)
		}
		done, err := l.ConfirmCart(ctx, c.ID, ann, clientReq(ann, "hc1-ok", ledger.OpCartConfirm))
		if err != nil || len(done.Orders) != 2 || done.Holds[0].State != ledger.Confirmed || done.Orders[0].CartID != c.ID {
			t.Fatalf("ConfirmCart = %+v, %v", done, err)
		}
		if got := counts(); got != "[0/2 0/1]" {
			t.Errorf("held/sold %s after the confirm, want [0/2 0/1]", got)
		}
		again, err := l.ConfirmCart(ctx, c.ID, ann, clientReq(ann, "hc1-ok", ledger.OpCartConfirm))
		if !errors.Is(err, ledger.ErrDuplicate) || len(again.Orders) != 2 || again.Orders[1].ID != done.Orders[1].ID {
			t.Errorf("ConfirmCart retried = %+v, %v; want the same orders", again, err)
		}
		if _, _, err := l.CancelCart(ctx, c.ID, ann, clientReq(ann, "hc1-cancel", ledger.OpCartCancel)); !errors.Is(err, ledger.ErrHoldConfirmed) {
			t.Errorf("CancelCart of a confirmed cart = %v, want ErrHoldConfirmed", err)
		}
		refunded, changed, err := l.RefundCart(ctx, c.ID, ann, clientReq(ann, "hc1-refund", ledger.OpCartRefund))
		if err != nil || len(changed) != 2 || refunded.Orders[0].RefundedAt.IsZero() {
			t.Fatalf("RefundCart = %+v, %v, %v", refunded, changed, err)
		}
		if got := counts(); got != "[0/0 0/0]" {
			t.Errorf("held/sold %s after the refund, want [0/0 0/0]", got)
		}
		if _, changed, err := l.RefundCart(ctx, c.ID, ann, clientReq(ann, "hc1-refund2", ledger.OpCartRefund)); err != nil || len(changed) != 0 {
			t.Errorf("RefundCart again = %v, %v; want nothing changed", changed, err)
		}
		for _, id := range []keys.ID{done.Orders[0].ID, done.Orders[1].ID} {
			if _, owed, err := l.RestoreOwed(ctx, "order", id); err != nil || !owed {
				t.Errorf("RestoreOwed(order %s) = %v, %v; want owed (the gate took it)", id, owed, err)
			}
		}

		// Cancelled whole, once; then it cannot be confirmed.
		c2, err := l.HoldCart(ctx, heldCartOf("hc2", ann, exp, map[stock.SKU]int64{adult: 1, child: 1}, all), false)
		if err != nil {
			t.Fatal(err)
		}
		if _, changed, err := l.CancelCart(ctx, c2.ID, ann, clientReq(ann, "hc2-cancel", ledger.OpCartCancel)); err != nil || len(changed) != 2 {
			t.Errorf("CancelCart = %v, %v; want 2 holds ended", changed, err)
		}
		if _, changed, err := l.CancelCart(ctx, c2.ID, ann, clientReq(ann, "hc2-cancel2", ledger.OpCartCancel)); err != nil || len(changed) != 0 {
			t.Errorf("CancelCart again = %v, %v; want nothing changed", changed, err)
		}
		if _, err := l.ConfirmCart(ctx, c2.ID, ann, clientReq(ann, "hc2-ok", ledger.OpCartConfirm)); !errors.Is(err, ledger.ErrHoldEnded) {
			t.Errorf("ConfirmCart of a cancelled cart = %v, want ErrHoldEnded", err)
		}
		if got := counts(); got != "[0/0 0/0]" {
			t.Errorf("held/sold %s after the cancel, want [0/0 0/0]", got)
		}

		// Expired: past its time it cannot be confirmed, and the sweeper
		// gives every line back.
		c3, err := l.HoldCart(ctx, heldCartOf("hc3", ann, exp, map[stock.SKU]int64{adult: 1, child: 2}, all), false)
		if err != nil {
			t.Fatal(err)
		}
		clk.advance(2 * time.Minute)
		if _, err := l.ConfirmCart(ctx, c3.ID, ann, clientReq(ann, "hc3-ok", ledger.OpCartConfirm)); !errors.Is(err, ledger.ErrHoldEnded) {
			t.Errorf("ConfirmCart past its expiry = %v, want ErrHoldEnded", err)
		}
		if ended, err := l.ExpireDue(ctx, 100); err != nil || len(ended) != 2 {
			t.Errorf("ExpireDue = %d holds, %v; want the cart's 2", len(ended), err)
		}
		if got := counts(); got != "[0/0 0/0]" {
			t.Errorf("held/sold %s after the expiry, want [0/0 0/0]", got)
		}
	})
}

// A confirm and a cancel of one held cart race from several ledgers (the
// replicas): exactly one wins, whole, and the stock moves once.
func TestHeldCartConfirmRacesCancel(t *testing.T) {
	for _, driver := range []string{ledger.SQLite, ledger.Postgres} {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			ls, clk, _ := openLedgers(t, driver, 3)
			p := keys.MustID("show-r")
			a, b := twoSKUs(t, ls[0], p)
			const carts = 20
			confirmed, cancelled := 0, 0
			for i := range carts {
				buyer := keys.MustID(fmt.Sprintf("b%d", i))
				c, err := ls[0].HoldCart(ctx, heldCartOf(fmt.Sprintf("c%d", i), buyer, clk.now().Add(time.Hour),
					map[stock.SKU]int64{a: 1, b: 2}, []stock.SKU{a, b}), false)
				if err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				var okConfirm, okCancel bool
				var confirmErr, cancelErr error
				wg.Add(2)
				go func() {
					defer wg.Done()
					_, confirmErr = ls[1].ConfirmCart(ctx, c.ID, buyer, clientReq(buyer, fmt.Sprintf("ok%d", i), ledger.OpCartConfirm))
					okConfirm = confirmErr == nil
				}()
				go func() {
					defer wg.Done()
					var changed []keys.ID
					_, changed, cancelErr = ls[2].CancelCart(ctx, c.ID, buyer, clientReq(buyer, fmt.Sprintf("no%d", i), ledger.OpCartCancel))
					okCancel = cancelErr == nil && len(changed) == 2
				}()
				wg.Wait()
				if okConfirm == okCancel {
					t.Fatalf("cart %d: confirmed %v (%v), cancelled %v (%v); want exactly one", i, okConfirm, confirmErr, okCancel, cancelErr)
				}
				// The loser is told what won (helper-39): a cancel after the
				// confirm is refused, not answered 200 with nothing ended; a
				// confirm after the cancel is told the cart ended.
				if okConfirm && !errors.Is(cancelErr, ledger.ErrHoldConfirmed) {
					t.Fatalf("cart %d: confirmed, and the cancel answered %v; want ErrHoldConfirmed", i, cancelErr)
				}
				if okCancel && !errors.Is(confirmErr, ledger.ErrHoldEnded) {
					t.Fatalf("cart %d: cancelled, and the confirm answered %v; want ErrHoldEnded", i, confirmErr)
				}
				if okConfirm {
					confirmed++
				} else {
					cancelled++
				}
			}
			for i, s := range []stock.SKU{a, b} {
				st, err := ls[0].SKU(ctx, s)
				if err != nil {
					t.Fatal(err)
				}
				q := int64(i + 1)
				if st.Held != 0 || st.Sold != int64(confirmed)*q {
					t.Errorf("%s: held %d sold %d; want 0 and %d (%d confirmed, %d cancelled)", s, st.Held, st.Sold, int64(confirmed)*q, confirmed, cancelled)
				}
			}
		})
	}
}

// A cart's seat line holds (or, bought at once, sells) its seats with the
// cart, all or nothing: a taken seat refuses the cart naming the line, and
// moves neither seats nor counted stock; confirm sells a held cart's
// seats, cancel frees them, and a refund frees a bought cart's seats,
// which the seat facts show under the order's key meanwhile.
func TestCartSeatLines(t *testing.T) {
	eachDriver(t, func(t *testing.T, l *ledger.Ledger) {
		ctx := context.Background()
		stalls := putStalls(t, l, 6)
		parking := stock.SKU{Program: sku.Program, Ticket: keys.MustID("zparking")}
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: parking, Total: 5, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		ann, bob := keys.MustID("ann"), keys.MustID("bob")
		ids := func(ss ...string) []keys.ID {
			var out []keys.ID
			for _, s := range ss {
				out = append(out, keys.MustID(s))
			}
			return out
		}
		held := func(key string, buyer keys.ID, seats []keys.ID, park int64) ledger.Cart {
			c := ledger.Cart{Program: sku.Program, Buyer: buyer,
				Req: ledger.Request{Scope: buyer, Key: keys.MustID(key), Fingerprint: "fp-" + key, Op: ledger.OpCartHold}}
			exp := time.Now().Add(time.Hour)
			c.Holds = append(c.Holds, ledger.Hold{IdempotencyKey: keys.MustID(key + "-l0"), SKU: stalls, Buyer: buyer,
				Quantity: int64(len(seats)), SeatIDs: seats, GateEpoch: -1, ExpiresAt: exp})
			c.Holds = append(c.Holds, ledger.Hold{IdempotencyKey: keys.MustID(key + "-l1"), SKU: parking, Buyer: buyer,
				Quantity: park, GateEpoch: -1, ExpiresAt: exp})
			return c
		}
		state := func() string {
			all, err := l.Seats(ctx, stalls, keys.ID{})
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			for _, s := range all {
				b.WriteString(s.State[:1])
			}
			p, err := l.SKU(ctx, parking)
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprintf("%s park %d", b.String(), p.Remaining())
		}
		c, err := l.HoldCart(ctx, held("h1", ann, ids("A-01", "A-02"), 2), false)
		if err != nil {
			t.Fatal(err)
		}
		if got := state(); got != "hhffff park 3" {
			t.Errorf("after the held cart: %s, want hhffff park 3", got)
		}
		// A-02 is taken: bob's cart is refused on its seat line, and
		// neither A-03 nor parking moves.
		_, err = l.HoldCart(ctx, held("h2", bob, ids("A-02", "A-03"), 1), false)
		var le *ledger.LineError
		var te *ledger.SeatsTakenError
		if !errors.As(err, &le) || le.Line != 0 || !errors.As(err, &te) || fmt.Sprint(te.Seats) != "[A-02]" {
			t.Errorf("cart over a taken seat = %v, want line 0 with seat A-02 taken", err)
		}
		if got := state(); got != "hhffff park 3" {
			t.Errorf("after the refused cart: %s, want hhffff park 3", got)
		}
		if _, err := l.ConfirmCart(ctx, c.ID, ann, ledger.Request{}); err != nil {
			t.Fatal(err)
		}
		if got := state(); got != "ssffff park 3" {
			t.Errorf("after the confirm: %s, want ssffff park 3", got)
		}
		c2, err := l.HoldCart(ctx, held("h3", bob, ids("A-03"), 1), false)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := l.CancelCart(ctx, c2.ID, bob, ledger.Request{}); err != nil {
			t.Fatal(err)
		}
		if got := state(); got != "ssffff park 3" {
			t.Errorf("after the cancel: %s, want ssffff park 3", got)
		}
		// Bought at once: the seats are sold to the line's order.
		bought := ledger.Cart{Program: sku.Program, Buyer: bob,
			Req: ledger.Request{Scope: bob, Key: keys.MustID("p1"), Fingerprint: "fp-p1", Op: ledger.OpCart}}
		bought.Orders = append(bought.Orders, ledger.Order{IdempotencyKey: keys.MustID("p1-l0"), SKU: stalls, Buyer: bob,
			Quantity: 2, SeatIDs: ids("A-05", "A-06"), Gate: "seat-record", GateEpoch: -1})
		pc, err := l.PurchaseCart(ctx, bought, false)
		if err != nil || len(pc.Orders) != 1 || fmt.Sprint(pc.Orders[0].SeatIDs) != "[A-05 A-06]" {
			t.Fatalf("bought seat cart = %+v, %v", pc, err)
		}
		if got := state(); got != "ssffss park 3" {
			t.Errorf("after the bought cart: %s, want ssffss park 3", got)
		}
		facts, err := l.SeatFacts(ctx, stalls)
		if err != nil {
			t.Fatal(err)
		}
		if f := facts[5]; f.State != "sold" || f.HoldKey != "p1-l0" {
			t.Errorf("seat fact of A-06 = %+v, want sold under p1-l0", f)
		}
		if got, err := l.OrderByID(ctx, pc.Orders[0].ID); err != nil || fmt.Sprint(got.SeatIDs) != "[A-05 A-06]" {
			t.Errorf("order read back = %+v, %v; want its seats", got, err)
		}
		if _, changed, err := l.RefundCart(ctx, pc.ID, bob, ledger.Request{}); err != nil || len(changed) != 1 {
			t.Fatalf("refund = %v, %v", changed, err)
		}
		if got := state(); got != "ssffff park 3" {
			t.Errorf("after the refund: %s, want ssffff park 3", got)
		}
		if r, ok, err := l.RestoreOwed(ctx, "order", pc.Orders[0].ID); err != nil || !ok || r.Gate != "seat-record" || r.RequestID != keys.MustID("p1-l0") {
			t.Errorf("restore owed = %+v, %v, %v; want the seats owed to the gate under the line's key", r, ok, err)
		}
	})
}

// Two confirms of one held cart under different keys (the payment webhook
// and the browser's redirect) race from two replicas: both answer the
// cart with its orders, one set of orders (helper-39: on PostgreSQL the
// loser read the holds unlocked and answered ErrHoldEnded, 410 "nothing
// was sold", while the cart stood confirmed).
func TestHeldCartConfirmsRaceUnderTwoKeys(t *testing.T) {
	for _, driver := range []string{ledger.SQLite, ledger.Postgres} {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			ls, clk, _ := openLedgers(t, driver, 2)
			p := keys.MustID("show-k")
			a, b := twoSKUs(t, ls[0], p)
			const carts = 20
			for i := range carts {
				buyer := keys.MustID(fmt.Sprintf("k%d", i))
				c, err := ls[0].HoldCart(ctx, heldCartOf(fmt.Sprintf("kc%d", i), buyer, clk.now().Add(time.Hour),
					map[stock.SKU]int64{a: 1, b: 2}, []stock.SKU{a, b}), false)
				if err != nil {
					t.Fatal(err)
				}
				var got [2]ledger.Cart
				var errs [2]error
				var wg sync.WaitGroup
				for j := range 2 {
					wg.Go(func() {
						got[j], errs[j] = ls[j].ConfirmCart(ctx, c.ID, buyer, clientReq(buyer, fmt.Sprintf("pay%d-%d", i, j), ledger.OpCartConfirm))
					})
				}
				wg.Wait()
				for j := range 2 {
					if errs[j] != nil {
						t.Fatalf("cart %d: confirm %d answered %v; the other %v", i, j, errs[j], errs[1-j])
					}
					if len(got[j].Orders) != 2 || got[j].Orders[0].ID != got[0].Orders[0].ID {
						t.Fatalf("cart %d: confirm %d answered orders %v, the other %v", i, j, got[j].Orders, got[0].Orders)
					}
				}
			}
			for i, s := range []stock.SKU{a, b} {
				st, err := ls[0].SKU(ctx, s)
				if err != nil {
					t.Fatal(err)
				}
				if want := int64(carts * (i + 1)); st.Held != 0 || st.Sold != want {
					t.Errorf("%s: held %d sold %d; want 0 and %d", s, st.Held, st.Sold, want)
				}
			}
		})
	}
}

// A cart read while its confirm commits shows it before or after, never
// half: its holds confirmed with no orders, or orders beside held holds
// (helper-61: the orders and the holds were two reads, and a confirm
// committing between them answered a GET with a paid cart and nothing
// bought).
func TestCartReadWhileConfirming(t *testing.T) {
	for _, driver := range []string{ledger.SQLite, ledger.Postgres} {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			ls, clk, _ := openLedgers(t, driver, 2)
			p := keys.MustID("show-read")
			a, b := twoSKUs(t, ls[0], p)
			reads := 0
			for i := range 30 {
				buyer := keys.MustID(fmt.Sprintf("b%d", i))
				c, err := ls[0].HoldCart(ctx, heldCartOf(fmt.Sprintf("c%d", i), buyer, clk.now().Add(time.Hour),
					map[stock.SKU]int64{a: 1, b: 2}, []stock.SKU{a, b}), false)
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() {
					_, err := ls[0].ConfirmCart(ctx, c.ID, buyer, clientReq(buyer, fmt.Sprintf("ok%d", i), ledger.OpCartConfirm))
					done <- err
				}()
				for finished := false; !finished; {
					select {
					case err := <-done:
						if err != nil {
							t.Fatal(err)
						}
						finished = true // one more read, after it
					default:
					}
					got, err := ls[1].CartByID(ctx, c.ID)
					if err != nil {
						t.Fatal(err)
					}
					reads++
					confirmed := 0
					for _, h := range got.Holds {
						if h.State == ledger.Confirmed {
							confirmed++
						}
					}
					if (confirmed == 0) != (len(got.Orders) == 0) || (confirmed > 0 && (confirmed != 2 || len(got.Orders) != 2)) {
						t.Fatalf("cart %d read while confirming: %d of %d holds confirmed, %d orders; want all or nothing",
							i, confirmed, len(got.Holds), len(got.Orders))
					}
				}
			}
			t.Logf("%d reads", reads)
		})
	}
}

// twoSKUs puts tickets a and b of program p in l, 1,000 each: a cart's two
// lines.
func twoSKUs(t *testing.T, l *ledger.Ledger, p keys.ID) (a, b stock.SKU) {
	t.Helper()
	a, b = stock.SKU{Program: p, Ticket: keys.MustID("a")}, stock.SKU{Program: p, Ticket: keys.MustID("b")}
	for _, s := range []stock.SKU{a, b} {
		if _, err := l.PutSKU(context.Background(), ledger.SKUConfig{SKU: s, Total: 1000, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

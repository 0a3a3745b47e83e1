package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

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

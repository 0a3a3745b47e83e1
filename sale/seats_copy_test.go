package sale

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/stock"
)

// A copy of a seat hold or a seated cart (the same request sent to two
// replicas) that passed the check for a committed request before the
// other copy committed takes its seats in the gate afterwards, and the
// ledger then answers it as a replay. What it took that the committed take
// does not stand on goes back: the same seats when the hold or cart has
// ended since (they were freed, and the copy took them again), and new
// best seats when it was confirmed (its seats are sold, so the copy's best
// found others). Left held, the next buyer of them is told they are taken
// while the ledger has them free. And a copy refused on a later line, its
// refusal the cart's replay, keeps held the seats the cart stands on.
// The copy's second half is run here step by step, as take.once runs it
// after that check (a race two replicas cannot be made to lose on cue).
func TestSeatCopyAfterTheCommitGivesBackWhatItTook(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.NewCluster(t, testenv.ClusterOptions{}).Client()
	t.Cleanup(func() { rdb.Close() })
	st, err := seats.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := testService(t, rdb, st)

	then := func(first, second func(Result, Ask) (Result, error)) func(Result, Ask) (Result, error) {
		return func(r Result, a Ask) (Result, error) {
			r, err := first(r, a)
			if err != nil {
				return r, err
			}
			a.Key = keys.MustID(a.Key.String() + "-2")
			return second(r, a)
		}
	}
	cancel := func(r Result, a Ask) (Result, error) { return s.Cancel(ctx, r.Hold.ID, a) }
	confirm := func(r Result, a Ask) (Result, error) { return s.Confirm(ctx, r.Hold.ID, a) }
	refund := func(r Result, a Ask) (Result, error) { return s.Refund(ctx, r.Order.ID, a) }
	cancelCart := func(r Result, a Ask) (Result, error) { return s.CancelCart(ctx, r.Cart.ID, a) }
	confirmCart := func(r Result, a Ask) (Result, error) { return s.ConfirmCart(ctx, r.Cart.ID, a) }
	refundCart := func(r Result, a Ask) (Result, error) { return s.RefundCart(ctx, r.Cart.ID, a) }
	sellOut := func(parking stock.SKU) func(Result, Ask) (Result, error) {
		return func(_ Result, a Ask) (Result, error) {
			a.Buyer = keys.MustID("bob")
			r, err := s.Purchase(ctx, Take{Ask: a, SKU: parking, Quantity: 1})
			if err != nil {
				return r, err
			}
			// The gate rebuilt since (a resize): the cart's deduction
			// records went with the old shards, so the copy deducts afresh
			// and finds the line sold out.
			_, err = s.Resize(ctx, parking, 2)
			return r, err
		}
	}
	for i, tc := range []struct {
		name        string
		cart, given bool                              // a held cart's seat line, else a seat hold; given seats, else the best two
		end         func(Result, Ask) (Result, error) // what became of the hold or cart
		parking     bool                              // the cart has a counted line too, which end sells out
	}{
		{"given seats, the hold cancelled", false, true, cancel, false},
		{"best seats, the hold cancelled", false, false, cancel, false},
		{"best seats, the hold confirmed", false, false, confirm, false},
		{"given seats, the hold confirmed and refunded", false, true, then(confirm, refund), false},
		{"a cart's given seats, the cart cancelled", true, true, cancelCart, false},
		{"a cart's best seats, the cart confirmed", true, false, confirmCart, false},
		{"a cart's given seats, the cart confirmed and refunded", true, true, then(confirmCart, refundCart), false},
		// The cart stands, held: the copy's refusal of its sold-out line
		// is the cart's replay, and the seats the cart holds stay held.
		{"a cart's given seats and a line sold out since, the cart held", true, true, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sku := stock.SKU{Program: keys.MustID(fmt.Sprintf("copy%d", i)), Ticket: keys.MustID("stalls")}
			if _, err := s.PutSKU(ctx, SKUConfig{SKU: sku, Total: 0, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
			var m []Seat
			for n := 1; n <= 4; n++ {
				m = append(m, Seat{ID: keys.MustID(fmt.Sprintf("A-%02d", n)), Section: keys.MustID("A"), Row: "A", Number: n})
			}
			if _, err := s.LoadSeats(ctx, sku, m); err != nil {
				t.Fatal(err)
			}
			parking := stock.SKU{Program: sku.Program, Ticket: keys.MustID("zparking")}
			if _, err := s.PutSKU(ctx, SKUConfig{SKU: parking, Total: 2, Shards: 1, MaxPerOrder: 4}); err != nil {
				t.Fatal(err)
			}
			end := tc.end
			if tc.parking {
				end = sellOut(parking)
			}
			ask := Ask{Buyer: keys.MustID("ann"), Key: keys.MustID(fmt.Sprintf("sh%d", i))} // a key is the buyer's, across programs
			given := []keys.ID{keys.MustID("A-01"), keys.MustID("A-02")}
			var first Result
			var copied *take
			if tc.cart {
				ct := CartTake{Ask: ask, Program: sku.Program, TTL: time.Hour, Lines: []CartLine{{Ticket: sku.Ticket, Quantity: 2}}}
				if tc.given {
					ct.Lines[0] = CartLine{Ticket: sku.Ticket, Seats: given}
				}
				if tc.parking {
					ct.Lines = append(ct.Lines, CartLine{Ticket: parking.Ticket, Quantity: 1})
				}
				first, err = s.HoldCart(ctx, ct)
				if err != nil || first.Cart == nil {
					t.Fatalf("seat cart = %+v, %v", first, err)
				}
				if copied, _, err = s.cartTake(ct, true); err != nil {
					t.Fatal(err)
				}
			} else {
				st := SeatTake{Ask: ask, SKU: sku, TTL: time.Hour}
				var r request
				var pick seatPick
				if tc.given {
					st.Seats, pick = given, seatPick{seats: given}
					r = newRequest(ask.Buyer, ask.Key, ledger.OpSeatHold, sku.Program.String(), sku.Ticket.String(), "seats", keys.Join(given, ","), st.TTL.String()).on(sku.Program)
				} else {
					st.Quantity = 2
					r = newRequest(ask.Buyer, ask.Key, ledger.OpSeatHold, sku.Program.String(), sku.Ticket.String(), "best", "", strconv.Itoa(2), st.TTL.String()).on(sku.Program)
				}
				first, err = s.HoldSeats(ctx, st)
				if err != nil || first.Hold == nil {
					t.Fatalf("seat hold = %+v, %v", first, err)
				}
				copied = s.seatTake(st, r, 2, pick)
			}
			if _, err := end(first, Ask{Buyer: ask.Buyer, Key: keys.MustID(fmt.Sprintf("end%d", i))}); err != nil {
				t.Fatal(err)
			}

			// The copy, from after its check for a committed request.
			if _, ok, direct := copied.checkSettings(ctx); !ok || direct {
				t.Fatalf("settings: ok %v, direct %v", ok, direct)
			}
			if a, ok := copied.placeGiven(ctx); !ok {
				t.Fatalf("place given seats: %+v", a)
			}
			// Each line at the gate, as take.once takes them: a refused line
			// undoes what the others took, by what the ledger says of the
			// request.
			var a answer
			refused := false
			for i, ln := range copied.lines {
				var out gateOut
				if ln.seated() {
					a, out = copied.gateSeats(ctx, i)
				} else {
					a, out = copied.gateUnits(ctx, i)
				}
				if out != gateTook {
					if out != gateRefuse {
						t.Fatalf("the copy's line %d: %+v, %v", i, a, out)
					}
					a, refused = copied.refused(ctx, a), true
					break
				}
			}
			took := copied.lines[0].seats.ids
			if !refused {
				a, _ = copied.commit(ctx, false)
			}
			switch {
			case !a.replayed:
				t.Fatalf("the copy's commit = %+v, want a replay", a)
			case tc.cart && (a.cart == nil || a.cart.ID != first.Cart.ID):
				t.Fatalf("the copy's commit = %+v, want cart %v", a, first.Cart.ID)
			case !tc.cart && (a.hold == nil || a.hold.ID != first.Hold.ID):
				t.Fatalf("the copy's commit = %+v, want hold %v", a, first.Hold.ID)
			}
			// The gate agrees with the ledger on every seat: the check
			// repairs nothing.
			check, err := s.CheckSeats(ctx, sku)
			if err != nil {
				t.Fatal(err)
			}
			if len(check.Differed) != 0 {
				t.Errorf("the copy took %v, and the gate differs from the ledger on %v: the next buyer is told taken seats the ledger has free, or gets seats the ledger holds", took, check.Differed)
			}
		})
	}
}

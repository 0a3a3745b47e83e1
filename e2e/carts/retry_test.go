package gateway_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// Regressions TestModel found, each a minimal reproduction of one bug.

// A retry of a committed cart whose later line the gate now refuses (its
// ticket is empty on the shards the retry asks, or the buyer's count of it
// was given back by a refund of that line alone) is answered with the
// cart's replay, but the refusal used to give back first the stock and
// quota counts of the lines taken before it, which are the committed
// cart's own: Redis ended with more units than the ledger had left.
// Found on 5e4a7f8; fixed by 3098a61 (a line another attempt deducted is
// never given back); kept as a regression.
func TestModelBugCartRetryGivesBackCommittedLines(t *testing.T) {
	t.Run("later line sold out", func(t *testing.T) {
		e := newEnv(t, ledger.SQLite)
		p := keys.MustID(testenv.ID(t, "bug"))
		a := stock.SKU{Program: p, Ticket: keys.MustID("a")}
		e.putSKU(t, a, 100, 1, 4)
		// Each cart buys the only unit of a ticket of 2 shards (one of them
		// empty): about half the carts' line takes it from a shard the
		// line's request does not start at, which its retry skips as
		// empty and so finds the ticket sold out.
		for i := range 16 {
			b := stock.SKU{Program: p, Ticket: keys.MustID(fmt.Sprintf("b%02d", i))}
			e.putSKU(t, b, 1, 2, 4)
			key := fmt.Sprintf("cart-%d", i)
			body := fmt.Sprintf(`{"buyer":"ann","lines":[{"ticket":"a","quantity":1},{"ticket":%q,"quantity":1}]}`, b.Ticket)
			if r, _ := e.cart(t, p, key, body); r.status != http.StatusCreated {
				t.Fatalf("cart %d = %d %s", i, r.status, r.body)
			}
			before := e.state(t, a)
			r, _ := e.cart(t, p, key, body)
			if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry of cart %d = %d %s, want its replay", i, r.status, r.body)
			}
			if got := e.state(t, a); got != before {
				t.Fatalf("retry of cart %d moved line a: %+v, was %+v (Redis has %d more than the ledger)",
					i, got, before, got.RedisRemaining-(100-got.Sold))
			}
		}
	})
	t.Run("later line at its cap", func(t *testing.T) {
		e := newEnv(t, ledger.SQLite)
		p := keys.MustID(testenv.ID(t, "bug"))
		a := stock.SKU{Program: p, Ticket: keys.MustID("a")}
		b := stock.SKU{Program: p, Ticket: keys.MustID("b")}
		e.putSKU(t, a, 100, 1, 4)
		e.putCapped(t, b, 1, 2)
		body := `{"buyer":"ann","lines":[{"ticket":"a","quantity":1},{"ticket":"b","quantity":2}]}`
		r, c := e.cart(t, p, "cart", body)
		if r.status != http.StatusCreated || len(c.Orders) != 2 {
			t.Fatalf("cart = %d %s", r.status, r.body)
		}
		// Line b refunded alone gives its count back; the buyer buys b up
		// to the cap again. The cart's retry now passes b's cap, with its
		// key counted before: a retry, answered with the replay.
		if r := e.do(t, http.MethodPost, "/v1/orders/"+c.Orders[1].OrderID+"/refund", map[string]string{"Idempotency-Key": "refund-b"}, `{"buyer":"ann"}`); r.status != http.StatusOK {
			t.Fatalf("refund of line b = %d %s", r.status, r.body)
		}
		e.mustBuy(t, b, "buy-b", "ann", 2)
		before := e.state(t, a)
		if r, _ := e.cart(t, p, "cart", body); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry of the cart = %d %s, want its replay", r.status, r.body)
		}
		if got := e.state(t, a); got != before {
			t.Fatalf("retry of the cart moved line a: %+v, was %+v (Redis has %d more than the ledger)",
				got, before, got.RedisRemaining-(100-got.Sold))
		}
	})
}

// Stock that comes back from a ticket whose sale has ended (a refund, a
// cancel, an expiry) owes Redis no units, so its restore is skipped, and
// with it the release of the buyer's counts at the gate: the buyer's
// program-wide count stays too high, and the buyer is refused
// limit-reached for the program's other tickets while under the cap.
// Fails on 3098a61.
func TestModelBugEndedTicketKeepsBuyerCount(t *testing.T) {
	e := newEnv(t, ledger.SQLite)
	p := keys.MustID(testenv.ID(t, "bug"))
	a := stock.SKU{Program: p, Ticket: keys.MustID("a")}
	b := stock.SKU{Program: p, Ticket: keys.MustID("b")}
	e.putSKU(t, a, 10, 1, 4)
	e.putSKU(t, b, 10, 1, 4)
	if r := e.do(t, http.MethodPut, "/v1/admin/programs/"+p.String(), nil, `{"per_buyer":4}`); r.status != http.StatusOK {
		t.Fatalf("PUT program = %d %s", r.status, r.body)
	}
	o := orderID(e.mustBuy(t, a, "buy-a", "ann", 3))
	if r := e.do(t, http.MethodPost, adminPath(a)+"/end", nil, ""); r.status != http.StatusOK {
		t.Fatalf("end = %d %s", r.status, r.body)
	}
	if r := e.do(t, http.MethodPost, "/v1/orders/"+o+"/refund", map[string]string{"Idempotency-Key": "refund-a"}, `{"buyer":"ann"}`); r.status != http.StatusOK {
		t.Fatalf("refund = %d %s", r.status, r.body)
	}
	if units, err := e.ledger.ProgramUnits(t.Context(), p, keys.MustID("ann")); err != nil || units != 0 {
		t.Fatalf("ann's program units after the refund = %d, %v; want 0", units, err)
	}
	if r := e.buy(t, b, "buy-b", "ann", 3); r.status != http.StatusCreated {
		t.Errorf("ann, owning nothing of the program (cap 4), buys 3 of b = %d %s, want 201", r.status, r.body)
	}
}

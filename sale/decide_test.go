package sale

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// soldOutCache answers SoldOut as told and counts the askers.
type soldOutCache struct {
	out   bool
	asked int
}

func (c *soldOutCache) SoldOut(stock.SKU) bool { c.asked++; return c.out }

func TestSettingsRefuseInOrder(t *testing.T) {
	base := ledger.SKUState{}
	base.MaxPerOrder, base.HoldTTLMax = 4, time.Hour
	seated := base
	seated.Seated = true
	ended := base
	ended.EndedAt = time.Unix(1, 0)
	seatedEnded := seated
	seatedEnded.EndedAt = ended.EndedAt
	capped := base
	capped.PerBuyer = 2

	for _, c := range []struct {
		name    string
		ask     lineAsk
		soldOut bool
		kind    *Err // nil: no refusal
		closed  bool
		detail  string // a part of the refusal's detail
	}{
		{name: "a plain line passes", ask: lineAsk{st: base, q: 4, best: true}},
		{name: "over the maximum", ask: lineAsk{st: base, q: 5, best: true}, kind: ErrOverMax, detail: "quantity 5 over"},
		{name: "seats over the maximum", ask: lineAsk{st: seated, q: 5, seatHold: true, seating: true}, kind: ErrOverMax, detail: "5 seats over"},
		{name: "over the maximum of an ended sale", ask: lineAsk{st: ended, q: 5}, kind: ErrOverMax},
		// A late payment of part of a hold over today's maximum: refused
		// as the whole hold is, whichever part comes first (helper-106).
		{name: "a late payment's hold over the maximum", ask: lineAsk{st: base, q: 2, held: 5}, kind: ErrOverMax, detail: "hold's 5 over"},
		{name: "a late payment's hold at the maximum", ask: lineAsk{st: base, q: 2, held: 4}},
		{name: "seated, no seat store", ask: lineAsk{st: seated, q: 1, cart: true}, kind: ErrNoSeating},
		{name: "seated, bought without seats", ask: lineAsk{st: seated, q: 1, seating: true}, kind: ErrSeated},
		{name: "seated in a cart", ask: lineAsk{st: seated, q: 1, cart: true, seating: true, picked: true}},
		{name: "seats of an unseated ticket", ask: lineAsk{st: base, q: 1, picked: true, cart: true}, kind: ErrNotSeated},
		{name: "a seat hold of an unseated ticket", ask: lineAsk{st: base, q: 1, seatHold: true}, kind: ErrNotSeated},
		{name: "too many best seats", ask: lineAsk{st: func() ledger.SKUState { s := seated; s.MaxPerOrder = 100; return s }(), q: MaxBestSeats + 1, best: true, cart: true, seating: true}, kind: ErrInvalid, detail: "best seats"},
		{name: "a hold's lifetime under the floor", ask: lineAsk{st: base, q: 1, hold: true, ttl: ledger.MinHoldTTL - time.Millisecond}, kind: ErrInvalid, detail: "ttl_seconds must be in"},
		{name: "a hold's lifetime over the ticket's", ask: lineAsk{st: base, q: 1, hold: true, ttl: 2 * time.Hour}, kind: ErrInvalid, detail: "..3600"},
		{name: "a purchase's lifetime is not asked", ask: lineAsk{st: base, q: 1, ttl: 2 * time.Hour}},
		{name: "an ended sale is closed", ask: lineAsk{st: ended, q: 1}, kind: ErrSaleEnded, closed: true},
		{name: "an ended seated sale is not closed to replays", ask: lineAsk{st: seatedEnded, q: 1, seatHold: true, seating: true}, kind: ErrSaleEnded},
		{name: "ended before sold out", ask: lineAsk{st: ended, q: 1}, soldOut: true, kind: ErrSaleEnded, closed: true},
		{name: "sold out here", ask: lineAsk{st: base, q: 1}, soldOut: true, kind: ErrSoldOut, closed: true},
		{name: "a seated ticket is never sold out here", ask: lineAsk{st: seated, q: 1, seatHold: true, seating: true}, soldOut: true},
		{name: "more than the cap at once", ask: lineAsk{st: capped, q: 3}, kind: ErrLimit},
		{name: "the cap at once", ask: lineAsk{st: capped, q: 2}},
		{name: "sold out before the cap", ask: lineAsk{st: capped, q: 3}, soldOut: true, kind: ErrSoldOut, closed: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cache := &soldOutCache{out: c.soldOut}
			c.ask.soldOut = cache
			r, refused := refuseBySettings(c.ask)
			if c.kind == nil {
				if refused {
					t.Fatalf("refused %v (%q), want none", r.kind, r.detail)
				}
				return
			}
			if !refused || r.kind != c.kind || r.closed != c.closed {
				t.Fatalf("got %v refused=%v closed=%v, want %v closed=%v", r.kind, refused, r.closed, c.kind, c.closed)
			}
			if !strings.Contains(r.detail, c.detail) {
				t.Fatalf("detail %q, want it to hold %q", r.detail, c.detail)
			}
		})
	}
}

// The cache is asked only of a line nothing else refused: past its
// freshness its answer lets one asker through to find out, and a line
// refused for another reason must not take that turn.
func TestSettingsAskTheCacheLast(t *testing.T) {
	st := ledger.SKUState{}
	st.MaxPerOrder, st.HoldTTLMax = 4, time.Hour
	cache := &soldOutCache{out: true}
	if _, ok := refuseBySettings(lineAsk{st: st, q: 5, soldOut: cache}); !ok || cache.asked != 0 {
		t.Fatalf("over the maximum: refused %v, cache asked %d times, want refused and never asked", ok, cache.asked)
	}
	if r, ok := refuseBySettings(lineAsk{st: st, q: 1, soldOut: cache}); !ok || r.kind != ErrSoldOut || cache.asked != 1 {
		t.Fatalf("got %v %v after %d asks, want sold out after 1", r.kind, ok, cache.asked)
	}
}

func TestJudgeCommit(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("ledger: take: %w", err) }
	line := func(i int, err error) error { return &ledger.LineError{Line: i, Err: err} }
	seats := &ledger.SeatsTakenError{Seats: []string{"a-1", "a-2"}}
	for _, c := range []struct {
		name         string
		err          error
		direct, cart bool
		want         commitVerdict
		kind         *Err
		closed       bool
		line         int
	}{
		{name: "committed", err: nil, want: verdictSold},
		{name: "committed before", err: wrap(ledger.ErrDuplicate), want: verdictReplay},
		{name: "key of another request", err: ledger.ErrKeyReused, want: verdictKeyReused},
		{name: "gate rebuilt under it", err: line(2, ledger.ErrStaleGate), cart: true, want: verdictRetake, line: 2},
		// Around the gate there is no deduction to wipe: the ledger never
		// answers so, and if it did, nothing is known.
		{name: "gate rebuilt under a take around it", err: ledger.ErrStaleGate, direct: true, want: verdictUnknown},
		{name: "seats taken", err: line(1, seats), cart: true, want: verdictRefuse, kind: ErrSeatsTaken, line: 1},
		{name: "seated since", err: ledger.ErrSeatedTake, want: verdictRefuse, kind: ErrSeated},
		{name: "sold out", err: wrap(stock.ErrSoldOut), want: verdictRefuse, kind: ErrSoldOut},
		{name: "sold out around the gate", err: stock.ErrSoldOut, direct: true, want: verdictRefuse, kind: ErrSoldOut},
		{name: "a ticket's cap", err: stock.ErrLimit, want: verdictRefuse, kind: ErrLimit},
		{name: "a cart line's cap", err: line(3, stock.ErrLimit), cart: true, want: verdictRefuse, kind: ErrLimit, line: 3},
		{name: "the program's cap on a cart", err: wrap(stock.ErrLimit), cart: true, want: verdictCartLimit},
		{name: "code used up", err: ledger.ErrCodeUsedUp, want: verdictRefuse, kind: ErrCodeUsedUp},
		{name: "code invalid", err: ledger.ErrCodeInvalid, want: verdictRefuse, kind: ErrCodeInvalid},
		{name: "ended", err: stock.ErrSaleEnded, want: verdictRefuse, kind: ErrSaleEnded, closed: true},
		{name: "unknown", err: line(1, stock.ErrUnknownSKU), cart: true, want: verdictRefuse, kind: ErrUnknownSKU, line: 1},
		{name: "busy", err: errLedgerBusy, want: verdictBusy},
		{name: "not committed", err: fmt.Errorf("take: connect: %w", ledger.ErrNotCommitted), want: verdictNotCommitted},
		{name: "a lost COMMIT reply", err: errors.New("ledger: take: commit: EOF"), want: verdictUnknown},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := judgeCommit(c.err, c.direct, c.cart)
			if o.verdict != c.want || o.refusal.kind != c.kind || o.refusal.closed != c.closed || o.line != c.line {
				t.Fatalf("got verdict %d kind %v closed %v line %d, want %d %v %v %d",
					o.verdict, o.refusal.kind, o.refusal.closed, o.line, c.want, c.kind, c.closed, c.line)
			}
			if c.kind == ErrSeatsTaken && len(o.seats) != 2 {
				t.Fatalf("seats %v, want the two taken", o.seats)
			}
		})
	}
}

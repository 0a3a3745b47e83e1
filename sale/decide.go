package sale

import (
	"errors"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// The take's decisions that need no I/O: what a line's settings refuse
// before the gate moves anything, and what a take does with the ledger's
// answer to its commit. Each is a table read in order, tested row by row
// without a server (decide_test.go); take.checkSettings and take.commit do the
// I/O each row names.

// lineAsk is what a line's settings are checked against: the line, the
// take it is part of, and what this replica knows besides.
type lineAsk struct {
	st   ledger.SKUState
	q    int64
	hold bool          // the line is held, not bought
	ttl  time.Duration // the take's asked hold lifetime (0: the default)
	// picked: the line names seats or a section; best: it names no seats
	// (the best ones are found for it).
	picked, best bool
	// cart: the line is one of a cart's; seatHold: of a seat hold.
	cart, seatHold bool
	seating        bool // this replica has a seat map store
	// soldOut is the local cache, asked whether sku is sold out last, only
	// for a line no rule before refused: past its freshness it lets one
	// asker through to find out (cache.Cache.SoldOut). nil: the gate
	// decides (soldOutFlagged).
	soldOut interface{ SoldOut(stock.SKU) bool }
	sku     stock.SKU
	// held is a late payment's hold's quantity (0 for any other take):
	// the maximum per order must still allow the hold, whatever part of
	// it the payment names, or the answer hung on which part came first
	// (the refusal is final: helper-106 #2).
	held int64
}

// lineRefusal is a line's refusal by its settings. closed: the sale is
// over for the SKU, so a retry of a take that committed before it closed
// still gets its replay (take.no).
type lineRefusal struct {
	kind   *Err
	detail string
	closed bool
}

// settingsRule is one refusal the settings decide: kind when refuses
// holds, with detail's text (nil: the kind's own).
type settingsRule struct {
	kind    *Err
	refuses func(a lineAsk) bool
	detail  func(a lineAsk) string
	closed  func(a lineAsk) bool
}

// settingsRules are asked in order; the first that holds is the answer.
// The order is part of the contract: a line over the maximum per order is
// told so even when the sale has ended, and an ended sale says "ended",
// not "sold out".
var settingsRules = []settingsRule{
	{kind: ErrOverMax,
		refuses: func(a lineAsk) bool { return a.q > a.st.MaxPerOrder && a.seatHold },
		detail: func(a lineAsk) string {
			return fmt.Sprintf("%d seats over this ticket's maximum of %d per order", a.q, a.st.MaxPerOrder)
		}},
	{kind: ErrOverMax,
		refuses: func(a lineAsk) bool { return a.q > a.st.MaxPerOrder },
		detail: func(a lineAsk) string {
			return fmt.Sprintf("quantity %d over this ticket's maximum of %d per order", a.q, a.st.MaxPerOrder)
		}},
	{kind: ErrOverMax,
		refuses: func(a lineAsk) bool { return a.held > a.st.MaxPerOrder },
		detail: func(a lineAsk) string {
			return fmt.Sprintf("the hold's %d over this ticket's maximum of %d per order", a.held, a.st.MaxPerOrder)
		}},
	{kind: ErrNoSeating, refuses: func(a lineAsk) bool { return a.st.Seated && !a.seating }},
	{kind: ErrSeated, refuses: func(a lineAsk) bool { return a.st.Seated && !a.cart && !a.seatHold }},
	{kind: ErrNotSeated, refuses: func(a lineAsk) bool { return !a.st.Seated && (a.picked || a.seatHold) }},
	{kind: ErrInvalid,
		refuses: func(a lineAsk) bool { return a.st.Seated && a.best && a.q > MaxBestSeats },
		detail:  func(lineAsk) string { return fmt.Sprintf("at most %d best seats per line", MaxBestSeats) }},
	{kind: ErrInvalid,
		refuses: func(a lineAsk) bool {
			return a.hold && a.ttl != 0 && (a.ttl < ledger.MinHoldTTL || a.ttl > a.st.HoldTTLMax)
		},
		detail: func(a lineAsk) string {
			return fmt.Sprintf("ttl_seconds must be in %d..%d for this ticket",
				int(ledger.MinHoldTTL.Seconds()), int(a.st.HoldTTLMax.Seconds()))
		}},
	// A seated SKU's seats are each their own: one ended is answered by
	// the seats' own refusals, not as a sale closed to replays.
	{kind: ErrSaleEnded, refuses: func(a lineAsk) bool { return !a.st.EndedAt.IsZero() },
		closed: func(a lineAsk) bool { return !a.st.Seated }},
	{kind: ErrSoldOut, refuses: func(a lineAsk) bool { return !a.st.Seated && a.soldOut != nil && a.soldOut.SoldOut(a.sku) },
		closed: func(lineAsk) bool { return true }},
	// More than the cap in one request: no count is needed.
	{kind: ErrLimit, refuses: func(a lineAsk) bool { return a.st.PerBuyer > 0 && a.q > a.st.PerBuyer }},
}

// refuseBySettings is the first of settingsRules that refuses a, if any.
func refuseBySettings(a lineAsk) (lineRefusal, bool) {
	for _, r := range settingsRules {
		if !r.refuses(a) {
			continue
		}
		out := lineRefusal{kind: r.kind}
		if r.detail != nil {
			out.detail = r.detail(a)
		}
		if r.closed != nil {
			out.closed = r.closed(a)
		}
		return out, true
	}
	return lineRefusal{}, false
}

// commitVerdict is what a take does with the ledger's answer to its
// commit.
type commitVerdict int

const (
	// verdictSold: committed. The answer is the order or hold.
	verdictSold commitVerdict = iota
	// verdictReplay: another attempt of the request committed first. Its
	// rows are the answer, once they are known to be durable.
	verdictReplay
	// verdictKeyReused: the key names another request. Everything taken
	// goes back.
	verdictKeyReused
	// verdictRetake: the gate was rebuilt after it admitted a line (a
	// take through the gate only). The deduction was wiped with it; the
	// counts stay for the retake.
	verdictRetake
	// verdictRefuse: the ledger refused a line. What was taken goes back
	// and the refusal is the answer (the request's replay, if it
	// committed before).
	verdictRefuse
	// verdictCartLimit: the program's cap refused a cart as a whole.
	verdictCartLimit
	// verdictBusy: the ledger had no room for the commit; nothing was
	// written. Everything taken goes back.
	verdictBusy
	// verdictNotCommitted: the commit certainly did not land. Everything
	// taken goes back.
	verdictNotCommitted
	// verdictUnknown: the COMMIT may have landed. The stock stays taken
	// (take.commit says why).
	verdictUnknown
)

// commitOutcome is a take's verdict on its commit, with the line and the
// refusal a verdictRefuse is about.
type commitOutcome struct {
	verdict commitVerdict
	line    int // the line a refusal is about (a cart's; 0 otherwise)
	refusal lineRefusal
	seats   []string // verdictRefuse with ErrSeatsTaken: the seats
}

// ledgerRefusals are the ledger's refusals of a line, each with the
// buyer's answer, asked in order after a seat taken and before a busy or
// failed commit. The program's cap (stock.ErrLimit on no line) refuses a
// cart as a whole.
var ledgerRefusals = []struct {
	err    error
	kind   *Err
	closed bool
}{
	{ledger.ErrSeatedTake, ErrSeated, false}, // a seat map came since the settings were read
	// Redis admitted what the ledger refuses (through the gate): Redis was
	// ahead of the truth. The ledger wins.
	{stock.ErrSoldOut, ErrSoldOut, false},
	{stock.ErrLimit, ErrLimit, false},
	{ledger.ErrCodeUsedUp, ErrCodeUsedUp, false},
	{ledger.ErrCodeInvalid, ErrCodeInvalid, false},
	{stock.ErrSaleEnded, ErrSaleEnded, true},
	{stock.ErrUnknownSKU, ErrUnknownSKU, false},
}

// judgeCommit is the verdict on a take's commit that answered err. direct
// says the take went around the gate; cart that it is a cart's.
func judgeCommit(err error, direct, cart bool) commitOutcome {
	var out commitOutcome
	var le *ledger.LineError
	if errors.As(err, &le) {
		out.line = le.Line
	}
	var te *ledger.SeatsTakenError
	switch {
	case err == nil:
		out.verdict = verdictSold
	case errors.Is(err, ledger.ErrDuplicate):
		out.verdict = verdictReplay
	case errors.Is(err, ledger.ErrKeyReused):
		out.verdict = verdictKeyReused
	case errors.Is(err, ledger.ErrStaleGate) && !direct:
		out.verdict = verdictRetake
	case errors.As(err, &te):
		out.verdict, out.refusal, out.seats = verdictRefuse, lineRefusal{kind: ErrSeatsTaken}, te.Seats
	default:
		out.verdict = verdictUnknown
		for _, r := range ledgerRefusals {
			if !errors.Is(err, r.err) {
				continue
			}
			out.verdict, out.refusal = verdictRefuse, lineRefusal{kind: r.kind, closed: r.closed}
			if r.err == stock.ErrLimit && le == nil && cart {
				out.verdict, out.refusal = verdictCartLimit, lineRefusal{}
			}
			return out
		}
		switch {
		case errors.Is(err, errLedgerBusy):
			out.verdict = verdictBusy
		case errors.Is(err, ledger.ErrNotCommitted):
			out.verdict = verdictNotCommitted
		}
	}
	return out
}

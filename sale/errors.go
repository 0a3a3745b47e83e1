package sale

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// Err is a kind of refusal or failure: a stable code (the API's problem
// type and the result label of metrics) and a default message. Every error
// a flow returns is, or wraps, one of the Err values below; callers match
// them with errors.Is.
type Err struct {
	Code string
	Msg  string
}

func (e *Err) Error() string { return e.Msg }

func newErr(code, msg string) *Err { return &Err{Code: code, Msg: msg} }

// The refusals and failures of the flows.
var (
	ErrInvalid        = newErr("invalid-field", "invalid request")
	ErrUnknownSKU     = newErr("unknown-sku", "no such program/ticket")
	ErrUnknownHold    = newErr("unknown-hold", "no such hold")
	ErrUnknownOrder   = newErr("unknown-order", "no such order")
	ErrUnknownCart    = newErr("unknown-cart", "no such cart")
	ErrNotOwner       = newErr("not-owner", "this buyer does not own it")
	ErrKeyReused      = newErr("idempotency-key-reused", "this Idempotency-Key was used for a different request")
	ErrOverMax        = newErr("quantity-over-limit", "quantity over this ticket's maximum per order")
	ErrSoldOut        = newErr("sold-out", "not enough stock left for this quantity")
	ErrLimit          = newErr("limit-reached", "this buyer already holds or owns as many of this ticket as it allows")
	ErrHoldBudget     = newErr("hold-budget-reached", "this buyer or device already holds as many of this program's tickets at once as it allows: confirm or cancel a hold first")
	ErrSaleEnded      = newErr("sale-ended", "the sale of this ticket has ended")
	ErrHoldExpired    = newErr("hold-expired", "the hold expired; nothing was sold")
	ErrHoldCancelled  = newErr("hold-cancelled", "the hold was cancelled; nothing was sold")
	ErrHoldConfirmed  = newErr("hold-confirmed", "the hold became an order; refund the order instead")
	ErrInCart         = newErr("in-cart", "this hold is a line of a cart: confirm or cancel the cart")
	ErrHoldAtMax      = newErr("hold-at-max-lifetime", "the hold is at its SKU's maximum lifetime; it cannot be extended")
	ErrLateRefused    = newErr("late-payment-refused", "the hold expired and its units could not be taken again; nothing was sold")
	ErrOrderRefunded  = newErr("order-refunded", "the order was refunded; its tickets cannot move")
	ErrOrderResold    = newErr("order-resold", "every ticket of the order was resold to other buyers (its listing.sold events refund the seller); nothing is left to refund, transfer or list")
	ErrOrderListed    = newErr("order-listed", "tickets of this order are listed for resale: withdraw the listing first")
	ErrUnknownListing = newErr("unknown-listing", "no such listing")
	ErrListingEnded   = newErr("listing-ended", "the listing sold out or was withdrawn")
	ErrListingSelling = newErr("listing-selling", "the listing's tickets are held or being bought right now; withdraw again later")
	ErrCartNotBought  = newErr("cart-not-bought", "the held cart was never confirmed: nothing was bought to refund")
	ErrUnknownPool    = newErr("unknown-pool", "this ticket has no such pool")
	ErrPoolNotOpen    = newErr("pool-not-open", "the pool is not open yet")
	ErrPoolClosed     = newErr("pool-closed", "the pool has closed; its unsold stock moved to another pool")
	ErrPoolDenied     = newErr("pool-access-denied", "this pool's access rule does not let this request in")
	ErrCodeInvalid    = newErr("access-code-invalid", "this access code does not unlock this pool for this buyer")
	ErrCodeUsedUp     = newErr("access-code-used-up", "this access code has no uses left")
	ErrSeated         = newErr("seated", "this ticket sells specific seats: use seat holds")
	ErrNotSeated      = newErr("not-seated", "this ticket has no seat map; use holds or purchases")
	ErrNoSeating      = newErr("no-seats", "reserved seating is not configured")
	ErrUnknownSeats   = newErr("unknown-seats", "not in this ticket's seat map")
	ErrSeatsTaken     = newErr("seats-taken", "already held or sold")
	ErrSeatsNotInGate = newErr("seats-not-in-gate", "not in the gate's seat map (reconcile the map)")
	ErrSeatsSpan      = newErr("seats-span-sections", "a seat hold takes seats of one section")
	ErrNoAdjacent     = newErr("no-adjacent-seats", "no adjacent seats free")
	ErrSeatMapRefused = newErr("seat-map-refused", "the seat map change was refused")
	ErrBelowCommitted = newErr("total-below-committed", "the total is below what is sold and held")
	ErrRebuildBusy    = newErr("reseed-in-progress", "another replica is rebuilding this SKU's stock right now")
	ErrBusy           = newErr("overloaded", "Redis is unavailable and the ledger is at its fallback capacity; retry with the same Idempotency-Key")
	// ErrBusyShared is ErrBusy of an attempt whose request another
	// attempt may still commit: the same problem type, outcome unknown.
	ErrBusyShared        = newErr("overloaded", "the ledger is at its capacity and another attempt of this request may still commit it; retry with the same Idempotency-Key")
	ErrUnavailable       = newErr("unavailable", "stock service temporarily unavailable; retry with the same Idempotency-Key")
	ErrGateNotClosed     = newErr("unavailable", "could not close the gate for the change; nothing changed")
	ErrSeatsNotInRedis   = newErr("unavailable", "ledger updated, Redis not; repeat the request")
	ErrNotSoldOut        = newErr("not-sold-out", "stock is left: buy it instead of joining the waitlist")
	ErrNotWaiting        = newErr("not-on-waitlist", "this buyer is not on this ticket's waitlist")
	ErrWaitOffered       = newErr("waitlist-offered", "the buyer has a live offer from the waitlist: confirm or cancel its hold")
	ErrAdmissionRequired = newErr("admission-required", "this program sells through its waiting room: send the admission token")
	ErrAdmissionInvalid  = newErr("admission-invalid", "the admission token is not valid for this buyer and program")
	ErrAdmissionUsed     = newErr("admission-used", "the admission token was spent by another order")
	ErrAdmissionExpired  = newErr("admission-expired", "the admission window has passed")
	ErrQueuedProgram     = newErr("queued-program", "this program sells through its waiting room: returned tickets go back to its line, not to a waitlist")
	// The relay's: no sink of that name, no dead letter of that seq, and a
	// redelivery the sink refused (the dead letter is kept).
)

// Kinds lists every kind above, for tables that must cover them all.
func Kinds() []*Err {
	return []*Err{ErrInvalid, ErrUnknownSKU, ErrUnknownHold, ErrUnknownOrder, ErrUnknownCart, ErrNotOwner, ErrKeyReused, ErrOverMax, ErrSoldOut, ErrLimit, ErrHoldBudget, ErrSaleEnded, ErrHoldExpired, ErrHoldCancelled, ErrHoldConfirmed, ErrInCart, ErrHoldAtMax, ErrLateRefused, ErrOrderRefunded, ErrOrderResold, ErrOrderListed, ErrUnknownListing, ErrListingEnded, ErrListingSelling, ErrCartNotBought, ErrUnknownPool, ErrPoolNotOpen, ErrPoolClosed, ErrPoolDenied, ErrCodeInvalid, ErrCodeUsedUp, ErrSeated, ErrNotSeated, ErrNoSeating, ErrUnknownSeats, ErrSeatsTaken, ErrSeatsNotInGate, ErrSeatsSpan, ErrNoAdjacent, ErrSeatMapRefused, ErrBelowCommitted, ErrRebuildBusy, ErrBusy, ErrBusyShared, ErrUnavailable, ErrGateNotClosed, ErrSeatsNotInRedis,
		ErrNotSoldOut, ErrNotWaiting, ErrWaitOffered,
		ErrAdmissionRequired, ErrAdmissionInvalid, ErrAdmissionUsed, ErrAdmissionExpired, ErrQueuedProgram}
}

// refusal is an Err with a detail for this request (and the seats it
// names, when it is about seats).
type refusal struct {
	kind   *Err
	detail string
	seats  []string
	lines  []RefusedLine
}

// RefusedLine is a line of a cart that could not be had, and why (the
// code of an Err).
type RefusedLine struct {
	Ticket string
	Code   string
}

// refuseLine returns kind for the cart line of ticket.
func refuseLine(kind *Err, ticket keys.ID, detail string) error {
	if detail == "" {
		detail = kind.Msg
	}
	return &refusal{kind: kind, detail: "ticket " + ticket.String() + ": " + detail,
		lines: []RefusedLine{{Ticket: ticket.String(), Code: kind.Code}}}
}

// refuseLineSeats returns kind for the cart line of ticket, naming seats.
func refuseLineSeats(kind *Err, ticket keys.ID, ids []string) error {
	return &refusal{kind: kind, detail: fmt.Sprintf("ticket %s: %s: %s", ticket, kind.Msg, strings.Join(ids, ", ")), seats: ids,
		lines: []RefusedLine{{Ticket: ticket.String(), Code: kind.Code}}}
}

// Lines are the cart lines a refusal names, if any.
func Lines(err error) []RefusedLine {
	var r *refusal
	if errors.As(err, &r) {
		return r.lines
	}
	return nil
}

func (r *refusal) Error() string { return r.detail }
func (r *refusal) Unwrap() error { return r.kind }

// refuse returns kind with a detail of its own.
func refuse(kind *Err, detail string) error { return &refusal{kind: kind, detail: detail} }

// Refuse returns kind with a detail of its own: for what answers on
// sale's behalf (the waiting room's door, wired by app).
func Refuse(kind *Err, detail string) error { return refuse(kind, detail) }

// refuseSeats returns kind naming the seats it is about.
func refuseSeats(kind *Err, ids []string) error {
	return &refusal{kind: kind, detail: fmt.Sprintf("%s: %s", kind.Msg, strings.Join(ids, ", ")), seats: ids}
}

// Code is the code of err's kind, "" for nil, "error" for an error that is
// none of the kinds above (a bug).
func Code(err error) string {
	if err == nil {
		return ""
	}
	var e *Err
	if errors.As(err, &e) {
		return e.Code
	}
	return "error"
}

// Seats are the seats a refusal names (seats taken, unknown), if any.
func Seats(err error) []string {
	var r *refusal
	if errors.As(err, &r) {
		return r.seats
	}
	return nil
}

// Detail is what a client may read of err: a refusal's own detail, or its
// kind's message; never the text of a wrapped internal error (which may
// name hosts or SQL).
func Detail(err error) string {
	var r *refusal
	if errors.As(err, &r) {
		return r.detail
	}
	var e *Err
	if errors.As(err, &e) {
		return e.Msg
	}
	return "internal error"
}

// waitFor is an error a retry should come back with after wait: a
// breaker's next probe.
type waitFor struct {
	error
	wait time.Duration
}

func (w waitFor) Unwrap() error { return w.error }

// retryIn wraps err with the wait after which a retry may succeed.
func retryIn(err error, wait time.Duration) error { return waitFor{err, wait} }

// RetryIn is the wait err says a retry should come back after (the
// Retry-After of a 503 while a Redis master's breaker is open); ok is
// false when it says none.
func RetryIn(err error) (wait time.Duration, ok bool) {
	var w waitFor
	if errors.As(err, &w) && w.wait > 0 {
		return w.wait, true
	}
	return 0, false
}

// changedNothing reports whether a change's error says the ledger did not
// make it: it failed before its COMMIT, or the ledger refused it. Any
// other (at COMMIT, the reply lost) may have made it.
func changedNothing(err error) bool {
	if errors.Is(err, errChangeMade) {
		return false
	}
	return isAny(err, ledger.ErrNotCommitted, ledger.ErrNotFound, ledger.ErrConflict, ledger.ErrDuplicate,
		ledger.ErrPoolClosed, ledger.ErrPoolExists, stock.ErrInvalid, stock.ErrUnknownSKU, stock.ErrSaleEnded, stock.ErrSoldOut) ||
		movedNothing(err) // a refusal of the sale's own (a nested change's)
}

// errChangeMade wraps an error of what followed a change the ledger made
// (a nested rebuild's): it changed something, whatever the cause says.
var errChangeMade = errors.New("sale: the change was made")

// isAny reports whether err is any of errs (errors.Is).
func isAny(err error, errs ...error) bool {
	for _, e := range errs {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

package client

import (
	"fmt"
	"strings"
	"time"
)

// Problem is a refusal or failure the gateway answered (RFC 9457
// problem+json). Match a kind with errors.Is(err, client.ErrSoldOut), or
// read the details with errors.As(err, &p).
type Problem struct {
	Type     string `json:"type"` // https://stockgate.dev/problems/<code>
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Lines are the cart lines a cart was refused for.
	Lines []RefusedLine `json:"lines,omitempty"`
	// Seats are the seats a seat problem is about (taken, unknown).
	Seats []string `json:"seats,omitempty"`
	// Puzzle is the proof-of-work puzzle a waiting room's join was
	// refused for (ErrProofRequired, ErrProofInvalid).
	Puzzle *Puzzle `json:"puzzle,omitempty"`
	// RetryAfter is the answer's Retry-After (503 and 429).
	RetryAfter time.Duration `json:"-"`
}

// Puzzle is a waiting room's proof of work: a nonce such that
// SHA-256(Challenge + ":" + nonce) starts with Difficulty zero bits.
type Puzzle struct {
	Challenge  string    `json:"challenge"`
	Difficulty int       `json:"difficulty"`
	Algorithm  string    `json:"algorithm"`
	ExpiresAt  time.Time `json:"expires_at"`
}

// RefusedLine is a cart line a refusal names, and the code of why.
type RefusedLine struct {
	Ticket string `json:"ticket"`
	Code   string `json:"code"`
}

// problemBase prefixes every problem type the gateway answers with.
const problemBase = "https://stockgate.dev/problems/"

// Code is the problem's kind, the last part of its type ("sold-out").
func (p *Problem) Code() string { return strings.TrimPrefix(p.Type, problemBase) }

func (p *Problem) Error() string {
	if p.Detail != "" {
		return fmt.Sprintf("stockgate: %d %s: %s", p.Status, p.Code(), p.Detail)
	}
	return fmt.Sprintf("stockgate: %d %s", p.Status, p.Code())
}

// Is matches the sentinel problems by code: errors.Is(err, ErrSoldOut).
func (p *Problem) Is(target error) bool {
	t, ok := target.(*Problem)
	return ok && t.Status == 0 && t.Type != "" && t.Type == p.Type
}

func kind(code string) *Problem { return &Problem{Type: problemBase + code} }

// The kinds of problem, by code; each is documented in the OpenAPI
// document at /openapi.json.
var (
	ErrSoldOut           = kind("sold-out")                // 409: not enough stock left
	ErrLimit             = kind("limit-reached")           // 409: the buyer's cap
	ErrHoldBudget        = kind("hold-budget-reached")     // 409: the buyer's or device's hold budget
	ErrSaleEnded         = kind("sale-ended")              // 409
	ErrKeyReused         = kind("idempotency-key-reused")  // 422: the key was used for another request
	ErrOverMax           = kind("quantity-over-limit")     // 422: over the SKU's maximum per order
	ErrInvalid           = kind("invalid-field")           // 422
	ErrMalformed         = kind("malformed-json")          // 400
	ErrInvalidID         = kind("invalid-id")              // 400
	ErrInvalidKey        = kind("invalid-idempotency-key") // 400: missing or malformed Idempotency-Key
	ErrUnknownSKU        = kind("unknown-sku")             // 404
	ErrUnknownHold       = kind("unknown-hold")            // 404
	ErrUnknownOrder      = kind("unknown-order")           // 404
	ErrUnknownCart       = kind("unknown-cart")            // 404
	ErrNotOwner          = kind("not-owner")               // 403
	ErrHoldExpired       = kind("hold-expired")            // 410
	ErrHoldCancelled     = kind("hold-cancelled")          // 409
	ErrHoldConfirmed     = kind("hold-confirmed")          // 409
	ErrInCart            = kind("in-cart")                 // 409: act on the cart, not its line
	ErrHoldAtMax         = kind("hold-at-max-lifetime")    // 409: the hold cannot be extended further
	ErrLateRefused       = kind("late-payment-refused")    // 409: an expired hold's units are gone: refund
	ErrOrderRefunded     = kind("order-refunded")          // 409: a refunded order's tickets cannot move
	ErrOrderListed       = kind("order-listed")            // 409: withdraw the order's listing first
	ErrUnknownListing    = kind("unknown-listing")         // 404
	ErrListingEnded      = kind("listing-ended")           // 409: sold out or withdrawn
	ErrListingSelling    = kind("listing-selling")         // 409: its tickets are being bought; try later
	ErrCartNotBought     = kind("cart-not-bought")         // 409: a held cart never confirmed; nothing to refund
	ErrUnknownPool       = kind("unknown-pool")            // 404
	ErrPoolNotOpen       = kind("pool-not-open")           // 409
	ErrPoolClosed        = kind("pool-closed")             // 409
	ErrPoolDenied        = kind("pool-access-denied")      // 403
	ErrCodeInvalid       = kind("access-code-invalid")     // 403; wrong codes are rate limited
	ErrCodeUsedUp        = kind("access-code-used-up")     // 409
	ErrNotSoldOut        = kind("not-sold-out")            // 409: stock is left; buy it instead of waiting
	ErrNotOnWaitlist     = kind("not-on-waitlist")         // 404
	ErrNoQueue           = kind("no-queue")                // 404: the program has no waiting room
	ErrQueueNotOpen      = kind("queue-not-open")          // 409
	ErrQueueTicket       = kind("invalid-queue-ticket")    // 400
	ErrProofRequired     = kind("proof-of-work-required")  // 403: solve Problem.Puzzle (JoinQueue does)
	ErrProofInvalid      = kind("proof-of-work-invalid")   // 403: a new Problem.Puzzle to solve
	ErrAdmissionRequired = kind("admission-required")      // 403: join the waiting room
	ErrAdmissionInvalid  = kind("admission-invalid")       // 403
	ErrAdmissionUsed     = kind("admission-used")          // 409: one order per admission
	ErrAdmissionExpired  = kind("admission-expired")       // 410
	ErrWaitOffered       = kind("waitlist-offered")        // 409: a live offer; confirm or cancel its hold
	ErrSeatsTaken        = kind("seats-taken")             // 409: Detail names the seats
	ErrNoAdjacent        = kind("no-adjacent-seats")
	ErrUnknownSeats      = kind("unknown-seats")
	ErrRateLimited       = kind("rate-limited")       // 429: retried by the client
	ErrUnavailable       = kind("unavailable")        // 503: retried by the client
	ErrOverloaded        = kind("overloaded")         // 503: retried by the client
	ErrNotReady          = kind("not-ready")          // 503: starting or draining; retried
	ErrRebuildBusy       = kind("reseed-in-progress") // 409 or 503
	ErrUnauthorized      = kind("unauthorized")       // 401: admin token
	ErrNotFound          = kind("not-found")          // 404: no such route
	ErrBelowCommitted    = kind("total-below-committed")
	ErrUnknownSink       = kind("unknown-sink")        // 404: no relay sink of that name
	ErrUnknownDeadLetter = kind("unknown-dead-letter") // 404
	ErrRedeliveryFailed  = kind("redelivery-failed")   // 502: the sink refused it; kept
)

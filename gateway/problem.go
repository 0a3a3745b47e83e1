package gateway

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/waitroom"
)

// Problem is an RFC 9457 problem detail. It is a dozen lines, so it is
// written here rather than taken from a library: the maintained Go problem
// packages are either RFC 7807-era and unmaintained or pull in a framework.
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Lines are the cart lines a cart was refused for (an extension
	// member, as RFC 9457 allows).
	Lines []problemLine `json:"lines,omitempty"`
	// Seats are the seats a seat problem is about (taken, unknown).
	Seats []string `json:"seats,omitempty"`
	// Outcome, on every 5xx, says what became of the request: "unchanged"
	// (nothing moved: shed before the ledger, a read, a refusal decided
	// before any write) or "unknown" (the ledger may have committed it: the
	// same request with the same Idempotency-Key, on any replica, answers
	// what happened). A 4xx changed nothing and a 2xx stands, so neither
	// needs it.
	Outcome string `json:"outcome,omitempty"`
	// Puzzle, on a join refused for its proof of work, is the puzzle to
	// solve before joining again.
	Puzzle *problemPuzzle `json:"puzzle,omitempty"`
}

// problemPuzzle is a waiting room's proof-of-work puzzle: find a nonce
// such that SHA-256(challenge + ":" + nonce) starts with difficulty zero
// bits, and join again with both before expires_at.
type problemPuzzle struct {
	Challenge  string    `json:"challenge"`
	Difficulty int       `json:"difficulty"`
	Algorithm  string    `json:"algorithm"`
	ExpiresAt  time.Time `json:"expires_at"`
}

// Outcomes of a 5xx (Problem.Outcome).
const (
	outcomeUnchanged = "unchanged"
	outcomeUnknown   = "unknown"
)

// unchangedCodes are the problem codes of 5xx answers given before
// anything could be written.
var unchangedCodes = map[string]bool{"overloaded": true, "not-ready": true, "no-seats": true}

// kindOutcome is outcomeOf for a sale error, by its kind when the kind
// tells (outcomeKinds).
func kindOutcome(method string, status int, kind *sale.Err) string {
	unchanged, told := outcomeKinds[kind]
	if told && !unchanged && status >= 500 && method != http.MethodGet && method != http.MethodHead {
		return outcomeUnknown
	}
	return outcomeOf(method, status, kind.Code, unchanged)
}

// outcomeOf is a 5xx answer's Outcome: unchanged for a read, or a
// refusal known to have moved nothing (unchanged true, or its code one of
// unchangedCodes); unknown otherwise. "" below 500.
func outcomeOf(method string, status int, code string, unchanged bool) string {
	switch {
	case status < 500:
		return ""
	case unchanged || unchangedCodes[code] || method == http.MethodGet || method == http.MethodHead:
		return outcomeUnchanged
	}
	return outcomeUnknown
}

// outcomeKinds are the sale errors of a 5xx whose outcome the kind tells:
// moved nothing (true), or an attempt that moved nothing while another
// attempt of the request may still commit it (false: unknown, though its
// code is one of unchangedCodes).
var outcomeKinds = map[*sale.Err]bool{sale.ErrBusy: true, sale.ErrGateNotClosed: true, sale.ErrBusyShared: false}

// problemLine is a cart line a refusal names: its ticket and why (a
// problem type's last segment).
type problemLine struct {
	Ticket string `json:"ticket"`
	Code   string `json:"code"`
}

// problemBase prefixes the type URIs; they name documentation anchors.
const problemBase = "https://stockgate.dev/problems/"

// retryAfter is a Retry-After in whole seconds for an expected wait: from
// the wait (at least a second) up to twice it, uniformly. The same
// "Retry-After: 1" to every buyer refused at one instant brings the whole
// crowd back at the next second in lockstep; spread, it comes back over the
// window.
func retryAfter(wait time.Duration) int {
	base := max(int(math.Ceil(wait.Seconds())), 1)
	return base + rand.IntN(base+1)
}

// problemKey is the gin context key of a 5xx's problem code.
const problemKey = "stockgate.problem"

// writeProblem answers with a problem+json body and aborts the handler
// chain; retryAfter > 0 sets Retry-After in seconds (429 and 503).
func writeProblem(c *gin.Context, status int, kind, detail string, retryAfter int) {
	writeProblemLines(c, status, kind, detail, retryAfter, nil, nil, outcomeOf(c.Request.Method, status, kind, false))
}

// writeProblemLines is writeProblem naming the cart lines refused and the
// seats the problem is about.
func writeProblemLines(c *gin.Context, status int, kind, detail string, retryAfter int, lines []problemLine, seats []string, outcome string) {
	if retryAfter > 0 {
		c.Header("Retry-After", strconv.Itoa(retryAfter))
	}
	if status >= 500 {
		c.Set(problemKey, kind) // observe logs 5xx a line a second per route and problem
	}
	c.Header("Cache-Control", "no-store")
	c.Render(status, problemRender{Problem{
		Type:     problemBase + kind,
		Title:    http.StatusText(status),
		Status:   status,
		Detail:   detail,
		Instance: c.Request.URL.Path,
		Lines:    lines,
		Seats:    seats,
		Outcome:  outcome,
	}})
	c.Abort()
}

type problemRender struct{ p Problem }

func (r problemRender) Render(w http.ResponseWriter) error {
	r.WriteContentType(w)
	return json.NewEncoder(w).Encode(r.p)
}

func (r problemRender) WriteContentType(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/problem+json")
}

// statusOf is the HTTP status of each kind of sale error; its code is the
// problem type. A kind missing here answers 500: a bug, caught by
// TestEveryErrorHasAStatus.
var statusOf = map[*sale.Err]int{
	sale.ErrInvalid:           http.StatusUnprocessableEntity,
	sale.ErrUnknownSKU:        http.StatusNotFound,
	sale.ErrUnknownHold:       http.StatusNotFound,
	sale.ErrUnknownOrder:      http.StatusNotFound,
	sale.ErrUnknownCart:       http.StatusNotFound,
	sale.ErrNotOwner:          http.StatusForbidden,
	sale.ErrKeyReused:         http.StatusUnprocessableEntity,
	sale.ErrOverMax:           http.StatusUnprocessableEntity,
	sale.ErrSoldOut:           http.StatusConflict,
	sale.ErrLimit:             http.StatusConflict,
	sale.ErrHoldBudget:        http.StatusConflict,
	sale.ErrSaleEnded:         http.StatusConflict,
	sale.ErrHoldExpired:       http.StatusGone,
	sale.ErrHoldCancelled:     http.StatusConflict,
	sale.ErrHoldConfirmed:     http.StatusConflict,
	sale.ErrInCart:            http.StatusConflict,
	sale.ErrHoldAtMax:         http.StatusConflict,
	sale.ErrLateRefused:       http.StatusConflict,
	sale.ErrOrderRefunded:     http.StatusConflict,
	sale.ErrOrderResold:       http.StatusConflict,
	sale.ErrOrderListed:       http.StatusConflict,
	sale.ErrUnknownListing:    http.StatusNotFound,
	sale.ErrListingEnded:      http.StatusConflict,
	sale.ErrListingSelling:    http.StatusConflict,
	sale.ErrCartNotBought:     http.StatusConflict,
	sale.ErrUnknownPool:       http.StatusNotFound,
	sale.ErrPoolNotOpen:       http.StatusConflict,
	sale.ErrPoolClosed:        http.StatusConflict,
	sale.ErrPoolDenied:        http.StatusForbidden,
	sale.ErrCodeInvalid:       http.StatusForbidden,
	sale.ErrCodeUsedUp:        http.StatusConflict,
	sale.ErrSeated:            http.StatusConflict,
	sale.ErrNotSoldOut:        http.StatusConflict,
	sale.ErrQueuedProgram:     http.StatusConflict,
	sale.ErrNotWaiting:        http.StatusNotFound,
	sale.ErrWaitOffered:       http.StatusConflict,
	sale.ErrAdmissionRequired: http.StatusForbidden,
	sale.ErrAdmissionInvalid:  http.StatusForbidden,
	sale.ErrAdmissionUsed:     http.StatusConflict,
	sale.ErrAdmissionExpired:  http.StatusGone,
	sale.ErrNotSeated:         http.StatusConflict,
	sale.ErrNoSeating:         http.StatusNotImplemented,
	sale.ErrUnknownSeats:      http.StatusUnprocessableEntity,
	sale.ErrSeatsTaken:        http.StatusConflict,
	sale.ErrSeatsNotInGate:    http.StatusConflict,
	sale.ErrSeatsSpan:         http.StatusUnprocessableEntity,
	sale.ErrNoAdjacent:        http.StatusConflict,
	sale.ErrSeatMapRefused:    http.StatusConflict,
	sale.ErrBelowCommitted:    http.StatusConflict,
	sale.ErrRebuildBusy:       http.StatusConflict,
	sale.ErrBusy:              http.StatusServiceUnavailable,
	sale.ErrBusyShared:        http.StatusServiceUnavailable,
	sale.ErrUnavailable:       http.StatusServiceUnavailable,
	sale.ErrGateNotClosed:     http.StatusServiceUnavailable,
	sale.ErrSeatsNotInRedis:   http.StatusServiceUnavailable,
}

// roomStatus is the HTTP status of each kind of the waiting rooms' errors.
var roomStatus = map[*waitroom.Kind]int{
	waitroom.ErrInvalid:           http.StatusUnprocessableEntity,
	waitroom.ErrUnavailable:       http.StatusServiceUnavailable,
	waitroom.ErrNoRoom:            http.StatusNotFound,
	waitroom.ErrNotOpen:           http.StatusConflict,
	waitroom.ErrTicket:            http.StatusBadRequest,
	waitroom.ErrProofRequired:     http.StatusForbidden,
	waitroom.ErrProofInvalid:      http.StatusForbidden,
	waitroom.ErrAdmissionRequired: http.StatusForbidden,
	waitroom.ErrAdmissionInvalid:  http.StatusForbidden,
	waitroom.ErrAdmissionUsed:     http.StatusConflict,
	waitroom.ErrAdmissionExpired:  http.StatusGone,
}

// roomError answers with the problem of a waiting room's error, as
// writeError does for sale's (Retry-After on 503).
func (s *Server) roomError(c *gin.Context, err error) {
	var kind *waitroom.Kind
	status, ok := 0, errors.As(err, &kind)
	if ok {
		status, ok = roomStatus[kind]
	}
	if !ok {
		s.log.ErrorContext(c.Request.Context(), "error with no problem", "route", c.FullPath(), "err", err)
		_ = c.Error(err) // the cause, for observe's line
		writeProblem(c, http.StatusInternalServerError, "internal", "internal error", 0)
		return
	}
	retry := 0
	if status == http.StatusServiceUnavailable {
		retry = retryAfter(time.Second)
		_ = c.Error(err) // the cause, for observe's line
	}
	var pz *waitroom.PuzzleError
	if errors.As(err, &pz) {
		c.Header("Cache-Control", "no-store")
		c.Render(status, problemRender{Problem{Type: problemBase + kind.Code, Title: http.StatusText(status), Status: status,
			Detail: waitroom.Detail(err), Instance: c.Request.URL.Path, Puzzle: &problemPuzzle{Challenge: pz.Puzzle.Challenge,
				Difficulty: pz.Puzzle.Bits, Algorithm: waitroom.PowAlgorithm, ExpiresAt: pz.Puzzle.ExpiresAt.UTC()}}})
		c.Abort()
		return
	}
	writeProblem(c, status, kind.Code, waitroom.Detail(err), retry)
}

// roomCode is the problem code of a waiting room's error.
func roomCode(err error) string {
	var kind *waitroom.Kind
	if errors.As(err, &kind) {
		return kind.Code
	}
	return "internal"
}

// writeError answers with the problem of a sale error: its kind's status
// and code, its detail, and Retry-After on 503 and on a rebuild in
// progress (the kinds a retry with the same key may turn into a success).
func (s *Server) writeError(c *gin.Context, err error) {
	var kind *sale.Err
	status := http.StatusInternalServerError
	if errors.As(err, &kind) {
		if st, ok := statusOf[kind]; ok {
			status = st
		}
	}
	if status == http.StatusInternalServerError {
		s.log.ErrorContext(c.Request.Context(), "error with no problem", "route", c.FullPath(), "err", err)
		_ = c.Error(err) // the cause, for observe's line
		writeProblem(c, status, "internal", "internal error", 0)
		return
	}
	retry := 0
	if status == http.StatusServiceUnavailable || kind == sale.ErrRebuildBusy {
		// A breaker probe, a rebuild or a ledger reconnect: about a second,
		// or when the Redis master's breaker says it probes again.
		wait := time.Second
		if d, ok := sale.RetryIn(err); ok {
			wait = d
		}
		retry = retryAfter(wait)
	}
	if status >= 500 {
		_ = c.Error(err) // the cause, for observe's line
	}
	var lines []problemLine
	for _, l := range sale.Lines(err) {
		lines = append(lines, problemLine{Ticket: l.Ticket, Code: l.Code})
	}
	writeProblemLines(c, status, kind.Code, sale.Detail(err), retry, lines, sale.Seats(err),
		kindOutcome(c.Request.Method, status, kind))
}

package waitroom

import "errors"

// Kind is a kind of refusal or failure of the waiting rooms: a stable code
// (the API's problem type) and a default message. Every error Rooms
// returns is, or wraps, one of the kinds below; callers match them with
// errors.Is and read what a client may see with Detail.
type Kind struct {
	Code string
	Msg  string
}

func (k *Kind) Error() string { return k.Msg }

// The refusals and failures of the waiting rooms.
var (
	ErrInvalid     = &Kind{"invalid-field", "invalid request"}
	ErrUnavailable = &Kind{"unavailable", "Redis or the ledger is unavailable; repeat the request"}
	ErrNoRoom      = &Kind{"no-queue", "this program has no waiting room"}
	ErrNotOpen     = &Kind{"queue-not-open", "the waiting room does not take buyers yet"}
	ErrTicket      = &Kind{"invalid-queue-ticket", "not a queue ticket of this program"}
	// A join of a room that asks for proof of work (a PuzzleError carries
	// the puzzle).
	ErrProofRequired = &Kind{"proof-of-work-required", "this waiting room asks for proof of work: solve the puzzle and join again with it"}
	ErrProofInvalid  = &Kind{"proof-of-work-invalid", "the proof of work does not solve a puzzle of this waiting room for this buyer"}
	// The door's (Admit).
	ErrAdmissionRequired = &Kind{"admission-required", "this program sells through its waiting room: send the admission token"}
	ErrAdmissionInvalid  = &Kind{"admission-invalid", "the admission token is not valid for this buyer and program"}
	ErrAdmissionUsed     = &Kind{"admission-used", "the admission token was spent by another order"}
	ErrAdmissionExpired  = &Kind{"admission-expired", "the admission window has passed"}
)

// errRoomChanged: the room a replica remembered was turned off (and on
// again) since; what it was doing is done again with the room as it is
// now (restoreLine).
var errRoomChanged = errors.New("waitroom: the room was turned off since it was read")

// Kinds are every kind, for the tests that hold the API's document to them.
func Kinds() []*Kind {
	return []*Kind{ErrInvalid, ErrUnavailable, ErrNoRoom, ErrNotOpen, ErrTicket, ErrProofRequired, ErrProofInvalid,
		ErrAdmissionRequired, ErrAdmissionInvalid, ErrAdmissionUsed, ErrAdmissionExpired}
}

type refusal struct {
	kind   *Kind
	detail string
}

func (r *refusal) Error() string { return r.detail }
func (r *refusal) Unwrap() error { return r.kind }

// refuse returns kind with a detail of its own ("": the kind's message).
func refuse(kind *Kind, detail string) error {
	if detail == "" {
		detail = kind.Msg
	}
	return &refusal{kind: kind, detail: detail}
}

// Detail is what a client may read of err: a refusal's own detail, or its
// kind's message; never the text of a wrapped internal error.
func Detail(err error) string {
	var r *refusal
	if errors.As(err, &r) {
		return r.detail
	}
	var k *Kind
	if errors.As(err, &k) {
		return k.Msg
	}
	return "internal error"
}

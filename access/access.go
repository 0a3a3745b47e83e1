// Package access decides who may buy from a pool of a ticket and when: a
// pool's window and access rule, channel credentials and access codes. It
// is pure: no Redis, no ledger, no clock of its own; sale asks it, the
// ledger stores its Rule.
package access

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// Kinds of rule: who a pool sells to, within its window.
const (
	Open    = ""        // anyone
	Code    = "code"    // a buyer presenting one of the pool's access codes
	Channel = "channel" // a request carrying the channel's credential
)

// Rule is a pool's window and access rule, as the ledger stores it.
type Rule struct {
	OpensAt, ClosesAt time.Time // zero: no bound
	Access            string    // Open, Code or Channel
	// Secret is the hex SHA-256 of the channel credential (Channel only).
	Secret string
	// Into is the pool unsold stock moves into at the close (zero: the
	// public stock).
	Into keys.ID
	// ClosedAt is when the close moved the unsold stock on; zero before.
	ClosedAt time.Time
}

// Invalid is a rule, credential or code no pool may have. Its text is the
// detail alone, for the buyer or admin; errors.Is matches stock.ErrInvalid.
type Invalid struct{ Detail string }

func (e *Invalid) Error() string        { return e.Detail }
func (e *Invalid) Is(target error) bool { return target == stock.ErrInvalid }

func invalid(format string, args ...any) error { return &Invalid{Detail: fmt.Sprintf(format, args...)} }

// Equal reports whether r and o are the same rule (times to the
// instant, whatever their location).
func (r Rule) Equal(o Rule) bool {
	return r.OpensAt.Equal(o.OpensAt) && r.ClosesAt.Equal(o.ClosesAt) && r.ClosedAt.Equal(o.ClosedAt) &&
		r.Access == o.Access && r.Secret == o.Secret && r.Into == o.Into
}

// Validate reports a rule no pool may have (*Invalid).
func (r Rule) Validate() error {
	switch {
	case r.Access != Open && r.Access != Code && r.Access != Channel:
		return invalid("access %q", r.Access)
	case (r.Access == Channel) != (r.Secret != ""):
		return invalid("a channel pool, and only one, has a credential")
	case !r.OpensAt.IsZero() && r.OpensAt.UnixMilli() <= 0, !r.ClosesAt.IsZero() && r.ClosesAt.UnixMilli() <= 0:
		return invalid("pool times are after 1970")
	case !r.OpensAt.IsZero() && !r.ClosesAt.IsZero() && !r.OpensAt.Before(r.ClosesAt):
		return invalid("a pool closes after it opens")
	}
	return nil
}

// Refusals of Check. A *Refusal wraps one of them.
var (
	ErrClosed  = errors.New("access: pool closed")
	ErrNotOpen = errors.New("access: pool not open yet")
	ErrDenied  = errors.New("access: not let in")
)

// Refusal is why Check turned a request away: Err is ErrClosed, ErrNotOpen
// or ErrDenied; Reason names it for metrics ("closed", "not-open",
// "denied"); Detail says it to the buyer.
type Refusal struct {
	Err    error
	Reason string
	Detail string
}

func (r *Refusal) Error() string { return r.Err.Error() + ": " + r.Detail }
func (r *Refusal) Unwrap() error { return r.Err }

// Presented is what a request presents to a pool's rule.
type Presented struct {
	Channel string // a channel pool's credential
	Code    string // an access code (checked against the pool's codes apart: CodeLets)
}

// Check decides a request presenting p to a pool with rule r at now: nil,
// or a *Refusal. A code pool only needs a code here; whether the code is
// one of the pool's is CodeLets's to say, with the code's record.
func Check(r Rule, p Presented, now time.Time) error {
	switch {
	case !r.ClosedAt.IsZero() || !r.ClosesAt.IsZero() && !now.Before(r.ClosesAt):
		return &Refusal{Err: ErrClosed, Reason: "closed", Detail: "the pool has closed"}
	case !r.OpensAt.IsZero() && now.Before(r.OpensAt):
		return &Refusal{Err: ErrNotOpen, Reason: "not-open", Detail: "the pool opens at " + r.OpensAt.UTC().Format(time.RFC3339)}
	case r.Access == Code && p.Code == "":
		return &Refusal{Err: ErrDenied, Reason: "denied", Detail: "this pool sells to holders of its access codes: access_code is required"}
	case r.Access == Channel && subtle.ConstantTimeCompare([]byte(SecretOf(p.Channel)), []byte(r.Secret)) != 1:
		return &Refusal{Err: ErrDenied, Reason: "denied", Detail: "this pool sells to its channel only: a valid channel credential is required"}
	}
	return nil
}

// Fields adds what a request presents to the fields of its fingerprint, so
// the same idempotency key with another credential is another request;
// nothing is added when it presents nothing, so the fingerprints of public
// requests stay as they were.
func (p Presented) Fields(fields ...string) []string {
	if p.Channel != "" || p.Code != "" {
		fields = append(fields, "channel:"+SecretOf(p.Channel), "code:"+SecretOf(p.Code))
	}
	return fields
}

// SecretOf is what is stored of a credential: its hex SHA-256 ("" for none).
func SecretOf(credential string) string {
	if credential == "" {
		return ""
	}
	h := sha256.Sum256([]byte(credential))
	return hex.EncodeToString(h[:])
}

// MinChannelLen is the shortest channel credential a pool takes.
const MinChannelLen = 16

// CheckChannel validates a channel credential an admin sets.
func CheckChannel(credential string) error {
	if len(credential) < MinChannelLen {
		return invalid("a channel pool's credential has at least %d characters", MinChannelLen)
	}
	return nil
}

// Bounds of access codes.
const (
	MinCodeLen  = 6
	MaxCodeLen  = 64
	MaxCodeUses = 1_000_000
)

// CheckCode validates a code's text: [A-Za-z0-9_-], MinCodeLen to
// MaxCodeLen long (so it can never carry anything else into a key).
func CheckCode(code string) error {
	ok := len(code) >= MinCodeLen && len(code) <= MaxCodeLen
	for i := 0; ok && i < len(code); i++ {
		c := code[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
	}
	if !ok {
		return invalid("an access code matches [A-Za-z0-9_-]{%d,%d}", MinCodeLen, MaxCodeLen)
	}
	return nil
}

// CheckUses validates a code's use limit.
func CheckUses(n int64) error {
	if n < 1 || n > MaxCodeUses {
		return invalid("max_uses in 1..%d", MaxCodeUses)
	}
	return nil
}

// CodeHash names a code of a pool: the hex SHA-256 of the pool and the
// code. It is what the ledger stores; the code itself is kept nowhere, and
// one text in two pools is two codes.
func CodeHash(pool stock.SKU, code string) string {
	h := sha256.Sum256([]byte(pool.Program.String() + "\x00" + pool.Ticket.String() + "\x00" + code))
	return hex.EncodeToString(h[:])
}

// CodeLets reports whether a code with use limit maxUses (0: no such code)
// that only buyer only may use (zero: anyone holding it) lets buyer in.
// Its uses are counted apart (at the gate and in the ledger).
func CodeLets(maxUses int64, only, buyer keys.ID) bool {
	return maxUses >= 1 && (only.IsZero() || only == buyer)
}

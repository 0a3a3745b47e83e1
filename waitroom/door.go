package waitroom

import (
	"context"
	"errors"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// Admit is the door a request of program goes through: it spends buyer's
// admission (the token the line gave) on request, in Redis and in the
// ledger (one per buyer across any loss of Redis), and returns settle,
// which ends that use with the request's outcome: Committed keeps the
// admission spent; Refused (the request moved nothing) gives it back, so
// the buyer may buy with it again within its window; Unknown keeps it
// until a retry of the same request settles; Replayed (the request had
// committed: a retry) gives it back if the request had committed before
// the ledger recorded the spend (it bought before the room, or in an
// earlier one), and keeps it otherwise (it may have bought with it and
// lost its reply). key is the request's Idempotency-Key. Call settle
// exactly once.
//
// A program without a waiting room is let through: settle and err are
// nil. A refusal is ErrAdmissionRequired, ErrAdmissionInvalid,
// ErrAdmissionUsed (another request spent it), ErrAdmissionExpired, or
// ErrUnavailable; the request itself may have committed before (a retry),
// which the caller looks up.
//
// This is the two steps of gobreaker's TwoStepCircuitBreaker: ask, then
// report.
func (s *Rooms) Admit(ctx context.Context, program, buyer keys.ID, token string, request, key keys.ID) (settle func(ctx context.Context, how Outcome), err error) {
	settle, err = s.admit(ctx, program, buyer, token, request, key)
	if errors.Is(err, errRoomChanged) {
		// This replica's room was turned off and on again: the room as
		// it is now decides (a token of the old one is not its).
		settle, err = s.admit(ctx, program, buyer, token, request, key)
	}
	if errors.Is(err, errRoomChanged) {
		return nil, refuse(ErrUnavailable, "the waiting room was just turned off and on again; repeat the request")
	}
	return settle, err
}

func (s *Rooms) admit(ctx context.Context, program, buyer keys.ID, token string, request, key keys.ID) (settle func(ctx context.Context, how Outcome), err error) {
	c, err := s.config(ctx, program)
	if errors.Is(err, ErrNoRoom) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if token == "" {
		return nil, refuse(ErrAdmissionRequired, "this program sells through its waiting room: send the Admission-Token the queue gave")
	}
	pos, joined, err := c.sign.ParseAdmission(program, buyer, token)
	if err != nil {
		return nil, refuse(ErrAdmissionInvalid, "the admission token is not this buyer's for this program")
	}
	now := time.Now()
	spend := func() (time.Time, bool, error) {
		return s.store.Spend(ctx, program, c.id, pos, buyer, request, now, c.Window)
	}
	admittedAt, first, err := spend()
	if errors.Is(err, ErrLost) {
		// Redis lost the line (or has another room's): make it again, with
		// the admissions spent, and spend then.
		if err = s.restoreLine(ctx, c); err == nil {
			admittedAt, first, err = spend()
		}
	}
	switch {
	case errors.Is(err, ErrSpent):
		return nil, refuse(ErrAdmissionUsed, "")
	case errors.Is(err, ErrExpired):
		return nil, refuse(ErrAdmissionExpired, "")
	case errors.Is(err, ErrNotAdmitted):
		return nil, refuse(ErrAdmissionInvalid, "this place in line is not admitted yet")
	case errors.Is(err, errRoomChanged):
		return nil, err
	case err != nil:
		s.log.WarnContext(ctx, "spend admission", "program", program.String(), "err", err)
		return nil, refuse(ErrUnavailable, "Redis unavailable; retry with the same Idempotency-Key")
	}
	holder, before, err := s.ledger.SpendAdmission(ctx, program, c.id, ledger.Spend{Buyer: buyer, Position: pos, Request: request, Key: key})
	if err != nil || holder != request {
		s.settleAdmission(ctx, c, buyer, request, Refused, false)
		if err != nil {
			s.log.WarnContext(ctx, "spend admission", "program", program.String(), "err", err)
			return nil, refuse(ErrUnavailable, "ledger unavailable; retry with the same Idempotency-Key")
		}
		return nil, refuse(ErrAdmissionUsed, "")
	}
	if first {
		// The wait: from joining (or the opening, for an early join) to
		// admission.
		s.metrics.wait.Observe(max(admittedAt.Sub(later(joined, c.OpensAt)), 0).Seconds())
	}
	return func(ctx context.Context, how Outcome) {
		if how == Replayed {
			how = Committed
			if before {
				how = replayedBefore
			}
		}
		s.settleAdmission(ctx, c, buyer, request, how, true)
	}, nil
}

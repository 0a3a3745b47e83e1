package sale

import (
	"context"
	"errors"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// Door is a program's waiting room as a request of that program meets it
// (package waitroom; app wires it in): Admit spends the buyer's admission
// on the request and hands back settle, which the request calls once with
// its outcome (the two steps of gobreaker's TwoStepCircuitBreaker). A
// program with no room is let through (settle and err nil). Admit's
// refusals are ErrAdmissionRequired, ErrAdmissionInvalid, ErrAdmissionUsed,
// ErrAdmissionExpired and ErrUnavailable, with their details.
type Door interface {
	Admit(ctx context.Context, program, buyer keys.ID, token string, request, key keys.ID) (settle func(ctx context.Context, how DoorOutcome), err error)
	// Queued reports whether program sells through a waiting room.
	Queued(ctx context.Context, program keys.ID) (bool, error)
	// Wake tells program's room that stock came back.
	Wake(program keys.ID)
}

// DoorOutcome is how a request that went through the door ended.
type DoorOutcome int

const (
	// DoorRefused: it moved nothing; the admission comes back.
	DoorRefused DoorOutcome = iota
	// DoorCommitted: it took stock; the admission stays spent.
	DoorCommitted
	// DoorUnknown: it failed in a way a retry may still commit; the
	// admission stays spent until a retry settles.
	DoorUnknown
	// DoorReplayed: it had committed (a retry); the door gives the
	// admission back if it had committed before the admission was spent.
	DoorReplayed
)

// throughQueue runs f for a request of a queued program once the door let
// it in (the same request again: a retry); a program without a waiting
// room runs f at once. When f is refused and moved nothing (a seat taken,
// a ticket sold out, a wrong code), the admission is given back, so the
// buyer may buy with it again within its window. skus are the SKUs the
// request takes from: a request refused at the door that committed
// before (a retry without its token, after the room was turned on, after
// its admission was spent by this very request) is answered as before.
func (s *Service) throughQueue(ctx context.Context, program keys.ID, a Ask, r request, skus []stock.SKU, f func(context.Context) answer) answer {
	if s.opts.Door == nil {
		return f(ctx)
	}
	settle, err := s.opts.Door.Admit(ctx, program, a.Buyer, a.Admission, r.gateID(), r.key)
	switch {
	case errors.Is(err, ErrUnavailable):
		return fail(err)
	case errors.Is(err, ErrAdmissionUsed), errors.Is(err, ErrAdmissionExpired):
		// A token the line gave this buyer, spent or past its window: the
		// key may have committed a request of another SKU, which makes
		// this one a reuse of it (422), not a refusal of the door. Looked
		// up by key: one ledger read, as a cart's refusal costs; only a
		// token signed for this buyer gets this far.
		return s.lookupOr(ctx, r, fail(err))
	case err != nil:
		// Only a request that committed before gets past a refused door.
		return s.committedIn(ctx, r, skus, fail(err))
	case settle == nil:
		return f(ctx)
	}
	ans := f(ctx)
	switch {
	case ans.err == nil && ans.replayed:
		// A request made before the room gives back the admission its
		// retry brought (helper-51); one that bought with it and lost its
		// COMMIT's reply, answered from its row too, keeps it spent
		// (helper-52): the door tells them apart by whether its key had
		// committed when the spend was recorded.
		settle(ctx, DoorReplayed)
	case ans.err == nil:
		settle(ctx, DoorCommitted)
	case movedNothing(ans.err):
		settle(ctx, DoorRefused)
	default:
		settle(ctx, DoorUnknown)
	}
	return ans
}

// queued reports whether program sells through a waiting room.
func (s *Service) queued(ctx context.Context, program keys.ID) (bool, error) {
	if s.opts.Door == nil {
		return false, nil
	}
	return s.opts.Door.Queued(ctx, program)
}

// wakeRoom tells program's waiting room, if any, that stock came back.
func (s *Service) wakeRoom(program keys.ID) {
	if s.opts.Door != nil {
		s.opts.Door.Wake(program)
	}
}

// movedNothing: err is a refusal that took nothing (not a failure after
// which the request may still commit on a retry).
func movedNothing(err error) bool {
	switch Code(err) {
	case "", "error", ErrUnavailable.Code, ErrBusy.Code:
		return false
	}
	return true
}

// admitted takes w once its request is let through the program's waiting
// room (when the program has one).
func (s *Service) admitted(ctx context.Context, a Ask, program keys.ID, r request, w want) answer {
	take := func(ctx context.Context) answer { return s.takeOne(ctx, w) }
	if s.aroundTheLine(ctx, w) {
		return take(ctx)
	}
	return s.throughQueue(ctx, program, a, r, []stock.SKU{w.sku}, take)
}

// aroundTheLine reports whether w is a take of a channel pool that brings
// a channel credential: a partner's channel sells around the waiting
// room, whose line leaves its stock out (ledger.ProgramStock). Sent to
// the door, it was 403 admission-required, and once the public line sold
// out the line answered sold-out, so the pool never sold (helper-109).
// The credential is checked by the take as ever (403 pool-access-denied);
// a pool of any other rule, or settings not known now, goes to the door.
func (s *Service) aroundTheLine(ctx context.Context, w want) bool {
	if w.access.Channel == "" || w.sku.Pool().IsZero() {
		return false
	}
	st, err := s.settings.Get(ctx, w.sku)
	return err == nil && st.Rule.Access == AccessChannel
}

// committedIn answers a request refused at a waiting room's door: a retry
// of one that committed stock of one of skus gets its answer, any other
// the refusal. Which purchases and holds committed is known from memory
// (replays, read incrementally and once at a time for all askers), so a
// flood of them without a token costs no ledger read each; a cart is
// looked up by its key. A key the memory lacks is read again (unless its
// set is sealed), never taken as absent as of the row version the cached
// settings show: a retry may come right after its request committed on
// another replica, after that version was cached.
func (s *Service) committedIn(ctx context.Context, r request, skus []stock.SKU, refusal answer) answer {
	switch r.op {
	case ledger.OpPurchase, ledger.OpHold, ledger.OpSeatHold:
	default:
		// A SKU's set holds only the requests of that one SKU (a cart's
		// request row is its program's): one read by its key, as every
		// refusal of a cart costs.
		return s.lookupOr(ctx, r, refusal)
	}
	for _, sku := range skus {
		switch _, err := s.settings.Get(ctx, sku); {
		case errors.Is(err, stock.ErrUnknownSKU):
			continue // no such SKU: nothing of it committed
		case err != nil:
			// Not known: a committed request's retry told the door's
			// refusal (a 4xx, "nothing moved") would lose its 201
			// (helper-51).
			s.log.WarnContext(ctx, "committed keys: settings", "sku", sku.String(), "err", err)
			return ansUnavailable
		}
		committed, err := s.replays.committed(ctx, sku, r.scope, r.key)
		if err != nil {
			s.log.WarnContext(ctx, "committed keys", "sku", sku.String(), "err", err)
			return ansUnavailable
		}
		if committed {
			return s.lookupOr(ctx, r, refusal)
		}
	}
	return refusal
}

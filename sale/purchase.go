package sale

import (
	"context"
	"errors"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// answer is the outcome of one write, shared by joined duplicates: an order
// or a hold, or err (one of the kinds in errors.go).
type answer struct {
	order    ledger.Order
	hold     *ledger.Hold
	cart     *ledger.Cart
	listing  *ledger.Listing
	replayed bool
	// durable: a replay whose request row is known to be on the
	// synchronous standby (ledger.RequestDurable); run checks the others.
	durable bool
	err     error
}

func fail(err error) answer { return answer{err: err} }

// program is the program of what a answers (zero: none).
func (a answer) program() keys.ID {
	switch {
	case a.hold != nil:
		return a.hold.SKU.Program
	case a.cart != nil:
		return a.cart.Program
	case a.listing != nil:
		return a.listing.SKU.Program
	}
	return a.order.SKU.Program
}

var (
	ansKeyReused   = fail(ErrKeyReused)
	ansUnknownSKU  = fail(ErrUnknownSKU)
	ansLimit       = fail(ErrLimit)
	ansUnavailable = fail(ErrUnavailable)
)

// want is one request for stock: a purchase, or a hold when hold is set.
type want struct {
	sku   stock.SKU
	req   request
	buyer keys.ID
	q     int64
	hold  bool
	ttl   time.Duration // a hold's lifetime; 0 for the SKU's default
	// device is a hold's device fingerprint (Ask.Device), for its
	// program's device hold budget.
	device string
	// channel is an organizer's order's channel (comp, box office); "" for
	// a buyer's purchase.
	channel string
	// access is what the request presents to its pool's rule (sku is the
	// pool's stock); code is its access code as the gate counts it.
	access Access
	code   *codeUse
	// held is a late payment's hold's quantity (lineAsk.held).
	held int64
}

// codeHash is the ledger's name of the request's access code ("" for none).
func (w want) codeHash() string {
	if w.code == nil {
		return ""
	}
	return w.code.hash
}

// recorded is the answer a committed request got, from the ledger's
// requests table: the replay of a retry from any replica, at any time.
// ok is false when the key has no committed request; a key used for
// another request answers 422.
func (s *Service) recorded(ctx context.Context, r request) (answer, bool, error) {
	rec, err := s.ledger.RequestByKey(ctx, r.program, r.scope, r.key)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return answer{}, false, nil
	case err != nil:
		return answer{}, false, err
	case rec.Fingerprint != r.ledger().Fingerprint:
		return ansKeyReused, true, nil
	}
	// Never replay a row a failover can take back (ledger.RequestDurable).
	if err := s.ledger.RequestDurable(ctx, r.program, r.scope, r.key); err != nil && !errors.Is(err, ledger.ErrNotFound) {
		return answer{}, false, err
	}
	a := replayed(rec)
	a.durable = true
	return a, true, nil
}

// replayed is the answer of a committed request, replayed.
func replayed(rec ledger.Recorded) answer {
	a := answer{replayed: true, hold: rec.Hold, cart: rec.Cart}
	if rec.Order != nil {
		a.order = *rec.Order
	}
	if a.hold == nil && rec.Order == nil && rec.Cart == nil {
		return ansUnavailable // a row without its answer: a bug, never a guess
	}
	return a
}

// committedOr answers a request the gate refused in bulk (its SKU sold out
// or ended): a retry of a request that committed gets
// its answer, from any replica, without a ledger call per request (see
// replays); any other request gets the refusal.
func (s *Service) committedOr(ctx context.Context, w want, refusal answer) answer {
	return s.committedAt(ctx, w, refusal, 0)
}

// soldOutFlagged decides a take (a single one, or a cart's line) that the
// SKU's sold-out flag (this replica's memory of an empty gate) refuses: a
// retry of a committed
// request gets its replay, and any other request the refusal once the
// SKU's committed keys are sealed (the ledger had nothing left: no
// attempt can still commit). Unsealed, and within an attempt's time to
// commit of the sell-out (replays.lookup's open), the request may be a
// retry whose first attempt holds its units at the gate and is still
// committing (a slow ledger, a client that gave up on it): refusing it
// would answer sold out for a sale that then stands (helper-74). gate is
// then true: the take goes on to the gate, whose deduction record finds
// the other attempt (a replay), or whose count of the stock refuses it.
// Past that time, units the ledger has and the gate lacks are lost or
// stranded there (a replica that died mid-take): the storm is refused
// from memory until the drift check gives them back (helper-76). found
// says the committed keys have the request's (the caller answers its
// replay); neither found nor gate, the caller refuses.
func (s *Service) soldOutFlagged(ctx context.Context, w want) (found, gate bool, err error) {
	found, open, err := s.replays.lookup(ctx, w.sku, w.req.scope, w.req.key, 0, true)
	if err != nil {
		s.log.WarnContext(ctx, "committed keys", "sku", w.sku.String(), "err", err)
	}
	return found, err == nil && !found && open, err
}

// committedAt is committedOr for a caller that knows the SKU row's version
// was at most known a moment ago (see replays.committedAt).
func (s *Service) committedAt(ctx context.Context, w want, refusal answer, known int64) answer {
	committed, err := s.replays.committedAt(ctx, w.sku, w.req.scope, w.req.key, known)
	if err != nil {
		s.log.WarnContext(ctx, "committed keys", "sku", w.sku.String(), "err", err)
		return ansUnavailable
	}
	if !committed {
		return refusal
	}
	return s.lookupOr(ctx, w.req, refusal)
}

// lookupOr answers with the committed request's replay if there is one,
// else with refusal.
func (s *Service) lookupOr(ctx context.Context, r request, refusal answer) answer {
	a, ok, err := s.recorded(ctx, r)
	switch {
	case err != nil:
		s.log.ErrorContext(ctx, "lookup request", "err", err)
		return ansUnavailable
	case ok:
		return a
	}
	return refusal
}

// giveBackUnused lets holder (this attempt) go of its deduction, and
// returns the parts of it that the committed row of the same request does
// not stand on. Two attempts of one request share its deduction records:
// the first to deduct and the one to commit may differ, and the loser
// must not give back the winner's stock. Letting go is always safe: the
// attempt that committed holds what its row stands on for good, and a
// request recorded as a refusal stands on nothing (its other attempts
// let go too, and the last one returns the units).
func (s *Service) giveBackUnused(ctx context.Context, w want, holder string, parts []shard.Part) {
	s.giveBack(ctx, w.sku, w.req.gateID(), holder, parts)
	var gate string
	if w.hold {
		h, err := s.ledger.HoldByKey(ctx, w.req.gateID())
		if err != nil {
			s.log.WarnContext(ctx, "committed hold of a duplicate", "err", err)
			return // keep the units: under-selling is the safe side
		}
		gate = h.Gate
	} else {
		o, err := s.ledger.OrderByKey(ctx, w.req.gateID())
		if err != nil {
			s.log.WarnContext(ctx, "committed order of a duplicate", "err", err)
			return
		}
		gate = o.Gate
	}
	used := map[shard.Part]bool{}
	if gate != "" {
		stored, err := shard.DecodeParts(gate)
		if err != nil {
			s.log.ErrorContext(ctx, "committed gate record", "err", err)
			return
		}
		for _, p := range stored {
			used[p] = true
		}
	}
	var unused []shard.Part
	for _, p := range parts {
		if !used[p] {
			unused = append(unused, p)
		}
	}
	if len(unused) > 0 {
		// The request committed: no attempt may commit on these.
		s.giveBack(ctx, w.sku, w.req.gateID(), shard.AllHolders, unused)
	}
}

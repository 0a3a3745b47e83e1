package sale

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/stockgate/stockgate/client/webhook"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// MaxEventsPage is the most events one read returns.
const MaxEventsPage = 1000

// Events reads up to limit events after seq, in order (of one program's
// when program is given): the outbox as it is, for a platform that pulls
// rather than receives.
func (s *Service) Events(ctx context.Context, program keys.ID, after int64, limit int) ([]webhook.Event, error) {
	if after < 0 || limit < 1 || limit > MaxEventsPage {
		return nil, refuse(ErrInvalid, fmt.Sprintf("after >= 0 and limit in 1..%d", MaxEventsPage))
	}
	got, err := s.ledger.Events(ctx, program, after, limit)
	if errors.Is(err, stock.ErrInvalid) {
		// The feed of every program, of a ledger over several primaries.
		return nil, refuse(ErrInvalid, "name a program (?program=): the ledger is split over several primaries, each numbering its own events")
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	out := make([]webhook.Event, len(got))
	for i, e := range got {
		out[i] = e.Wire()
	}
	return out, nil
}

// MaxEventIDs is the most event ids MissingEvents checks at once.
const MaxEventIDs = ledger.MaxKnownEvents

// MissingEvents are those of ids no primary of the ledger has: events a
// sink delivered whose change a failover lost (the ledger's outbox keeps
// every event it commits). Its platform was told of a change that is not
// in the ledger, so the operator makes it good (a buyer answered 201
// whose order is gone; OPERATIONS.md). At most ledger.MaxKnownEvents ids,
// each a valid id.
func (s *Service) MissingEvents(ctx context.Context, ids []keys.ID) ([]keys.ID, error) {
	if len(ids) > MaxEventIDs {
		return nil, refuse(ErrInvalid, fmt.Sprintf("at most %d event ids at once", MaxEventIDs))
	}
	missing := slices.Compact(slices.SortedFunc(slices.Values(ids), keys.ID.Compare))
	// Twice: the primaries are asked at once, and a program moving
	// between two of them meanwhile may have had its events read from
	// neither (the new one asked before the copy committed, the old one
	// after the move deleted them). An event the first pass missed that
	// way is on the new primary by the second, so only what neither pass
	// found is called missing: an operator makes good each one.
	for range 2 {
		if len(missing) == 0 {
			break
		}
		known, err := s.ledger.KnownEvents(ctx, missing)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		has := make(map[keys.ID]bool, len(known))
		for _, id := range known {
			has[id] = true
		}
		missing = slices.DeleteFunc(missing, func(id keys.ID) bool { return has[id] })
	}
	if missing == nil {
		missing = []keys.ID{}
	}
	return missing, nil
}

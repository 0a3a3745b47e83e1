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
	ids = slices.Compact(slices.SortedFunc(slices.Values(ids), keys.ID.Compare))
	known, err := s.ledger.KnownEvents(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	has := make(map[keys.ID]bool, len(known))
	for _, id := range known {
		has[id] = true
	}
	missing := []keys.ID{}
	for _, id := range ids {
		if !has[id] {
			missing = append(missing, id)
		}
	}
	return missing, nil
}

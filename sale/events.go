package sale

import (
	"context"
	"errors"
	"fmt"

	"github.com/stockgate/stockgate/client/webhook"
	"github.com/stockgate/stockgate/keys"
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

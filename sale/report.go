package sale

import (
	"context"
	"fmt"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// StockReport is one SKU's (or pool's) line of a program's reconciliation
// report: the ledger's rows added up, and the gate's count beside them.
type StockReport struct {
	ledger.StockReport
	// GateRemaining is what Redis says is left (counted stock only);
	// GateRead false when it could not be read (Redis away, not seeded,
	// or seated stock, whose seats are counted by the seat map) or is not
	// the SKU's count (an ended sale's gate is emptied).
	GateRemaining int64
	GateRead      bool
}

// GateDifference is the gate's count less the ledger's open stock: 0 on an
// idle SKU; requests in flight, or a drift the drift check repairs,
// otherwise.
func (r StockReport) GateDifference() int64 {
	if !r.GateRead {
		return 0
	}
	return r.GateRemaining - r.Open
}

// Report is program's reconciliation report: every SKU and pool, from the
// ledger's rows (the SKU row beside its orders and holds), checked against
// the gate. Read only; it moves nothing.
func (s *Service) Report(ctx context.Context, program keys.ID) ([]StockReport, error) {
	if program.IsZero() {
		return nil, refuse(ErrInvalid, "program ids match [A-Za-z0-9_-]{1,64}")
	}
	rows, err := s.ledger.Report(ctx, program)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	out := make([]StockReport, len(rows))
	for i, r := range rows {
		out[i] = StockReport{StockReport: r}
		// Seats are counted by the seat map, and an ended sale's gate is
		// emptied on purpose: neither count is comparable with open, so
		// neither is read (a difference would report drift that is not).
		if r.Seated || r.Ended {
			continue
		}
		st, err := s.settings.Get(ctx, r.SKU)
		if err != nil {
			continue
		}
		var left int64
		var seeded bool
		if err := s.redis(ctx, "gate.remaining", func(ctx context.Context) (err error) {
			left, seeded, err = s.gate.Remaining(ctx, r.SKU, st.Shards)
			return err
		}); err == nil && seeded && !st.GateStale() {
			out[i].GateRemaining, out[i].GateRead = left, true
		}
	}
	return out, nil
}

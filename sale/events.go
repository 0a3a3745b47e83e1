package sale

import (
	"context"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
	"github.com/stockgate/stockgate/webhook"
)

// Event is one change of state from the ledger's outbox (see
// ledger.Event): written in the transaction that made the change.
type Event struct {
	Seq      int64
	ID       keys.ID
	Type     string
	SKU      stock.SKU // a pool's stock for a pool's event
	Subject  keys.ID   // the order's or hold's id
	Order    keys.ID   // a confirm's order
	Buyer    keys.ID
	Cart     keys.ID
	Quantity int64
	To       stock.SKU // where a pool's stock moved
	At       time.Time
}

// MaxEventsPage is the most events one read returns.
const MaxEventsPage = 1000

// Events reads up to limit events after seq, in order (of one program's
// when program is given): the outbox as it is, for a platform that pulls
// rather than receives.
func (s *Service) Events(ctx context.Context, program keys.ID, after int64, limit int) ([]Event, error) {
	if after < 0 || limit < 1 || limit > MaxEventsPage {
		return nil, refuse(ErrInvalid, fmt.Sprintf("after >= 0 and limit in 1..%d", MaxEventsPage))
	}
	got, err := s.ledger.Events(ctx, program, after, limit)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	out := make([]Event, len(got))
	for i, e := range got {
		out[i] = EventOf(e)
	}
	return out, nil
}

// EventOf is the ledger's event e.
func EventOf(e ledger.Event) Event {
	return Event{Seq: e.Seq, ID: e.ID, Type: e.Type, SKU: e.SKU, Subject: e.Subject, Order: e.Order, Buyer: e.Buyer,
		Cart: e.Cart, Quantity: e.Quantity, To: e.To, At: e.At}
}

// Wire is e as deliveries and the events API carry it.
func (e Event) Wire() webhook.Event {
	v := webhook.Event{Seq: e.Seq, ID: e.ID.String(), Type: e.Type, Program: e.SKU.Program.String(), Ticket: e.SKU.Base().Ticket.String(),
		Pool: e.SKU.Pool().String(), Subject: e.Subject.String(), OrderID: e.Order.String(), Buyer: e.Buyer.String(),
		CartID: e.Cart.String(), Quantity: e.Quantity, At: e.At}
	if !e.To.IsZero() {
		v.ToPool = e.To.Pool().String()
		if v.ToPool == "" {
			v.ToPool = PublicPool.String()
		}
	}
	return v
}

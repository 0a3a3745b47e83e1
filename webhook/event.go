package webhook

import (
	"github.com/stockgate/stockgate/client"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// Event is an event as a delivery's body carries it: the client's type,
// the one wire shape of an event (relay streams and GET /v1/admin/events
// carry it too). A receiver decodes the body into it after Verify.
type Event = client.Event

// EventOf is the ledger's outbox event e on the wire.
func EventOf(e ledger.Event) Event {
	v := Event{Seq: e.Seq, ID: e.ID.String(), Type: e.Type, Program: e.SKU.Program.String(), Ticket: e.SKU.Base().Ticket.String(),
		Pool: e.SKU.Pool().String(), Subject: e.Subject.String(), OrderID: e.Order.String(), Buyer: e.Buyer.String(),
		CartID: e.Cart.String(), Quantity: e.Quantity, At: e.At}
	if !e.To.IsZero() {
		v.ToPool = e.To.Pool().String()
		if v.ToPool == "" {
			v.ToPool = stock.PublicPool.String()
		}
	}
	return v
}

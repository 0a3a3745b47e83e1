package ledger

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/stockgate/stockgate/client"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
	"github.com/stockgate/stockgate/tracing"
)

// Events are the ledger's outbox: every change of state a platform acts on
// (an order made or refunded, a hold made, confirmed, cancelled or expired,
// a sale sold out or ended, a pool's stock moved) is written as a row of
// the events table in the same transaction as the change. A change that
// commits has its event; one that rolls back has none. A relay delivers
// them from there (at least once: receivers de-duplicate by ID).

// Event types.
const (
	EventOrderCreated  = "order.created"
	EventOrderRefunded = "order.refunded"
	EventHoldCreated   = "hold.created"
	EventHoldConfirmed = "hold.confirmed"
	EventHoldCancelled = "hold.cancelled"
	EventHoldExpired   = "hold.expired"
	EventHoldExtended  = "hold.extended"
	// EventHoldReleased: the units of a hold confirmed in part that came
	// back (its Quantity; Order names the order that kept the rest).
	EventHoldReleased = "hold.released"
	EventSaleSoldOut  = "sale.sold_out"
	EventSaleEnded    = "sale.ended"
	EventPoolMoved    = "pool.moved"
	// A waitlist offer is a hold: offer_made is its hold.created, and
	// offer_expired its hold.expired (a confirmed or cancelled offer has
	// the hold's events).
	EventOfferMade      = "waitlist.offer_made"
	EventOfferExpired   = "waitlist.offer_expired"
	EventWaitlistJoined = "waitlist.joined"
	EventWaitlistLeft   = "waitlist.left"
	eventPartitionCount = 64
)

// Event is one change of state, as the outbox keeps it.
type Event struct {
	// Seq orders events: within one SKU, in the order their transactions
	// committed (each event is written after its SKU row is locked, so a
	// later change of the SKU takes a later number). Across SKUs it is
	// not a commit order.
	Seq int64
	// ID is the event's stable id, for receivers to de-duplicate by.
	ID   keys.ID
	Type string
	// SKU is the stock the change is about (a pool's stock for a pool's
	// sale); Partition is the relay partition it is delivered in, derived
	// from its ticket, so every event of a ticket and its pools keeps
	// their order.
	SKU       stock.SKU
	Partition int
	// Subject is the order's or hold's id (zero for a sale's event); Hold
	// names a confirmed hold's order's hold, Order a confirm's order.
	Subject keys.ID
	Order   keys.ID
	Buyer   keys.ID
	Cart    keys.ID
	// Quantity is the units the change moved (for pool.moved, the units
	// moved into To).
	Quantity int64
	// Channel is how the organizer gave the order the event names
	// (ChannelComp, ChannelBoxOffice), "" for a buyer's own purchase:
	// a comp's units were never paid for, and owe no money back.
	Channel string
	To      stock.SKU
	At      time.Time
	// Trace is the W3C traceparent of the span of the request whose change
	// wrote the event ("" for a sweeper's or an untraced one): its
	// deliveries are spans of that trace.
	Trace string
}

// partitionOf is the relay partition of a ticket's events.
func partitionOf(sku stock.SKU) int {
	h := fnv.New32a()
	h.Write([]byte(sku.Program.String()))
	h.Write([]byte{0})
	h.Write([]byte(sku.Base().Ticket.String()))
	return int(h.Sum32() % eventPartitionCount)
}

// orderEvent is the event of an order's change.
func orderEvent(typ string, o Order) Event {
	return Event{Type: typ, SKU: o.SKU, Subject: o.ID, Buyer: o.Buyer, Cart: o.CartID, Quantity: o.Quantity, Trace: o.Req.Trace}
}

// holdEvent is the event of a hold's change (Order: a confirm's order).
func holdEvent(typ string, h Hold) Event {
	return Event{Type: typ, SKU: h.SKU, Subject: h.ID, Order: h.OrderID, Buyer: h.Buyer, Cart: h.CartID, Quantity: h.Quantity, Trace: h.Req.Trace}
}

// confirmEvent is the event of the confirm that made order o of its hold.
func confirmEvent(o Order) Event {
	return Event{Type: EventHoldConfirmed, SKU: o.SKU, Subject: o.HoldID, Order: o.ID, Buyer: o.Buyer, Cart: o.CartID, Quantity: o.Quantity, Trace: o.Req.Trace}
}

// endEvent is the event type of hold h ended into state.
func endEvent(state string, h Hold) string {
	switch {
	case state == Expired && h.IsOffer():
		return EventOfferExpired
	case state == Expired:
		return EventHoldExpired
	}
	return EventHoldCancelled
}

// emitCommit emits events in tx and commits it: the end of every
// transaction that moves stock and says so. step names the work in the
// commit's error.
func emitCommit(ctx context.Context, tx *sql.Tx, now time.Time, step string, events ...Event) error {
	if err := emit(ctx, tx, now, events...); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("ledger: %s: commit: %w", step, err)
	}
	return nil
}

// emit writes events inside tx, after the rows of the change they are
// about, in multi-row statements. Coming after the change's own writes,
// it runs in a transaction that already has its PostgreSQL transaction id
// when the events take their seq: the relay's horizon (SettledSeq)
// relies on that order.
//
// An event without a Trace takes ctx's span's: the request whose change
// it is (none for a sweeper's).
func emit(ctx context.Context, tx *sql.Tx, now time.Time, events ...Event) error {
	trace := tracing.Traceparent(ctx)
	for chunk := range slices.Chunk(events, rowsPerStatement) {
		var vals []string
		var args []any
		for _, e := range chunk {
			vals = append(vals, placeholders(len(args), 13))
			args = append(args, NewID(), e.Type, e.SKU.Program, e.SKU.Ticket, partitionOf(e.SKU), e.Subject, e.Order,
				e.Buyer, e.Cart, e.Quantity, e.To.Ticket, now.UnixMilli(), cmp.Or(e.Trace, trace))
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO events (event_id, type, program, ticket, partition, subject, order_id,
			buyer, cart_id, quantity, to_ticket, created_at, traceparent) VALUES `+strings.Join(vals, ", "), args...); err != nil {
			return notCommitted("events", err)
		}
	}
	return nil
}

// Events reads up to limit events with Seq > after, in Seq order; program
// narrows them to one program's when given. It reads only settled events
// (SettledSeq): on PostgreSQL a seq is taken at insert, and transactions
// commit in any order, so an event visible now may have one below it
// still committing, which a reader moving on from the last seq it read
// would skip for good. A read that reaches the settled tip with room
// left waits (waitSettled) for the seqs handed out before it, so a
// reader sees what committed before it asked, as soon as nothing below
// is open.
func (l *Ledger) Events(ctx context.Context, program keys.ID, after int64, limit int) ([]Event, error) {
	if limit < 1 || limit > 1000 {
		return nil, fmt.Errorf("%w: limit %d out of 1..1000", stock.ErrInvalid, limit)
	}
	settled, last, err := l.settledSeq(ctx)
	if err != nil {
		return nil, fmt.Errorf("ledger: events: %w", err)
	}
	out, err := l.events(ctx, program, after, settled, limit)
	if err != nil || len(out) == limit || settled >= last {
		return out, err
	}
	from := max(after, settled) // every settled event past after was read
	if settled, err = l.waitSettled(ctx, settled, last); err != nil {
		return nil, fmt.Errorf("ledger: events: %w", err)
	}
	if settled <= from {
		return out, nil
	}
	more, err := l.events(ctx, program, from, settled, limit-len(out))
	return append(out, more...), err
}

// events reads up to limit events with after < Seq <= upTo.
func (l *Ledger) events(ctx context.Context, program keys.ID, after, upTo int64, limit int) ([]Event, error) {
	rows, err := l.db.QueryContext(ctx, `SELECT `+eventColumns+` FROM events WHERE seq > $1 AND seq <= $2 AND ($3 = '' OR program = $3) ORDER BY seq LIMIT $4`,
		after, upTo, program, limit)
	if err != nil {
		return nil, fmt.Errorf("ledger: events: %w", err)
	}
	defer rows.Close()
	return scanEvents(rows)
}

// eventColumns are the columns scanEvents reads, in its order.
// The channel is not a column of events: it is read from the order the
// event names (order_channels, set when an organizer gave the order and
// copied to what a transfer splits off it), so events written before it
// tell it too.
const eventColumns = `seq, event_id, type, program, ticket, partition, subject, order_id, buyer, cart_id, quantity, to_ticket, created_at, traceparent,
	COALESCE((SELECT MAX(c.channel) FROM order_channels c WHERE c.order_id IN (events.subject, events.order_id)), '')`

// scanEvents reads rows of eventColumns.
func scanEvents(rows *sql.Rows) ([]Event, error) {
	var out []Event
	for rows.Next() {
		var e Event
		var to keys.ID
		var at int64
		if err := rows.Scan(&e.Seq, &e.ID, &e.Type, &e.SKU.Program, &e.SKU.Ticket, &e.Partition, &e.Subject, &e.Order,
			&e.Buyer, &e.Cart, &e.Quantity, &to, &at, &e.Trace, &e.Channel); err != nil {
			return nil, fmt.Errorf("ledger: events: %w", err)
		}
		if !to.IsZero() {
			e.To = stock.SKU{Program: e.SKU.Program, Ticket: to}
		}
		e.At = time.UnixMilli(at).UTC()
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: events: %w", err)
	}
	return out, nil
}

// Wire is e in its one shape on the wire (client.Event): a webhook
// delivery's body, a relay stream's entry, GET /v1/admin/events.
func (e Event) Wire() client.Event {
	v := client.Event{Seq: e.Seq, ID: e.ID.String(), Type: e.Type, Program: e.SKU.Program.String(), Ticket: e.SKU.Base().Ticket.String(),
		Pool: e.SKU.Pool().String(), Subject: e.Subject.String(), OrderID: e.Order.String(), Buyer: e.Buyer.String(),
		CartID: e.Cart.String(), Quantity: e.Quantity, Channel: e.Channel, At: e.At}
	if !e.To.IsZero() {
		v.ToPool = e.To.Pool().String()
		if v.ToPool == "" {
			v.ToPool = stock.PublicPool.String()
		}
	}
	return v
}

// MaxKnownEvents is the most event ids KnownEvents checks at once.
const MaxKnownEvents = 1000

// KnownEvents are those of ids this ledger has an event of. A sink's
// delivered events that no primary knows are the changes a failover lost
// (an asynchronous standby promoted without the old primary's last
// commits): what the platform was told and must make good (OPERATIONS.md,
// "A primary that fails over"). Events are never deleted, so an id absent
// here was never committed on this primary or was lost with it.
func (l *Ledger) KnownEvents(ctx context.Context, ids []keys.ID) ([]keys.ID, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	if len(ids) > MaxKnownEvents {
		return nil, fmt.Errorf("%w: %d event ids, at most %d", stock.ErrInvalid, len(ids), MaxKnownEvents)
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id.String()
	}
	rows, err := l.db.QueryContext(ctx, `SELECT event_id FROM events WHERE event_id IN `+placeholders(0, len(ids)), args...)
	if err != nil {
		return nil, fmt.Errorf("ledger: known events: %w", err)
	}
	defer rows.Close()
	var out []keys.ID
	for rows.Next() {
		var id keys.ID
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("ledger: known events: %w", err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: known events: %w", err)
	}
	return out, nil
}

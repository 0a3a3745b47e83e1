package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// Order is a confirmed sale.
type Order struct {
	ID keys.ID `json:"order_id"`
	// IdempotencyKey is the order row's own unique key, derived by the
	// service (a purchase's gate request id, or "confirm-" and the hold id):
	// never a client's key, so no client can take it.
	IdempotencyKey keys.ID   `json:"-"`
	RequestHash    string    `json:"-"`
	SKU            stock.SKU `json:"sku"`
	Buyer          keys.ID   `json:"buyer"`
	Quantity       int64     `json:"quantity"`
	// Gate is the gate's own record of where the stock came from (which
	// Redis shards), kept so a later refund can give it back there. The
	// ledger stores it as it is; empty for a sale around the gate.
	Gate string `json:"-"`
	// GateKey is the request id of the Redis records behind Gate: the
	// order's own, or the one of the hold it confirmed. Empty means
	// IdempotencyKey.
	GateKey keys.ID `json:"-"`
	HoldID  keys.ID `json:"hold_id,omitzero"`
	CartID  keys.ID `json:"cart_id,omitzero"` // the cart it is a line of
	// SeatIDs are the seats sold (reserved seating): through its hold, or
	// for a cart's seat line bought at once, held in the seats table under
	// the order's own id.
	SeatIDs    []keys.ID `json:"seats,omitempty"`
	RefundedAt time.Time `json:"refunded_at,omitzero"`
	// Units says where the order's units went (OrderByID fills it in).
	Units Units `json:"-"`
	// CodeHash is the access code the order used (see CodeHash); "" for
	// none. The order is one use of it while it stands.
	CodeHash  string    `json:"-"`
	CreatedAt time.Time `json:"created_at"`
	// Req is the client request that creates the order (zero for an
	// internal write): its row in the requests table is written in the
	// same transaction.
	Req Request `json:"-"`
	// GateEpoch is the gate epoch a gate-admitted order was admitted
	// under; it commits only while the ledger is still at that epoch.
	GateEpoch int64 `json:"-"`
	// TakeEpoch is the epoch its stock was taken under, as stored.
	TakeEpoch int64 `json:"-"`
	// Channel is how the organizer gave the order when not sold online:
	// ChannelComp, ChannelBoxOffice ("" for a buyer's own purchase). It is
	// written with the order, for the reconciliation report.
	Channel string `json:"-"`
}

// Channels an organizer gives orders through, besides buyers' purchases.
const (
	ChannelComp      = "comp"       // complimentary tickets
	ChannelBoxOffice = "box_office" // sold at the venue's box office
)

// channelsUp (an expand step) adds order_channels: the channel of each
// order an organizer gave (Order.Channel). A table of its own, not a
// column of orders (see resaleUp).
func (l *Ledger) channelsUp(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS order_channels (
	order_id TEXT PRIMARY KEY,
	channel  TEXT NOT NULL
)`)
	return err
}

func (l *Ledger) channelsDown(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `DROP TABLE IF EXISTS order_channels`)
	return err
}

// ValidChannel reports an organizer's channel.
func ValidChannel(c string) bool { return c == ChannelComp || c == ChannelBoxOffice }

// ConfirmKey is the row key of the order a confirm of hold makes: derived
// by the service, never a client's key.
func ConfirmKey(hold keys.ID) keys.ID { return keys.MustID("confirm-" + hold.String()) }

// GateRequest is the request id the order's Redis stock was deducted under.
func (o Order) GateRequest() keys.ID {
	if !o.GateKey.IsZero() {
		return o.GateKey
	}
	return o.IdempotencyKey
}

// orderReplay answers a purchase whose request was committed before.
func (l *Ledger) orderReplay(ctx context.Context, r Request) (Order, error) {
	rec, err := l.replayOf(ctx, r)
	if errors.Is(err, ErrDuplicate) && rec.Order == nil {
		return Order{}, fmt.Errorf("%w: key was used for a %s", ErrKeyReused, rec.Op)
	}
	if rec.Order == nil {
		return Order{}, err
	}
	return *rec.Order, err
}

func notCommitted(step string, err error) error {
	return fmt.Errorf("ledger: %s: %w: %w", step, ErrNotCommitted, err)
}

func insertOrder(ctx context.Context, tx *sql.Tx, o Order) (bool, error) {
	res, err := tx.ExecContext(ctx, `
		INSERT INTO orders (id, idem_key, request_hash, program, ticket, buyer, quantity, gate, gate_key, hold_id, created_at, take_epoch, cart_id, code_hash, seat_ids)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
		ON CONFLICT (idem_key) DO NOTHING`,
		o.ID, o.IdempotencyKey, o.RequestHash, o.SKU.Program, o.SKU.Ticket, o.Buyer, o.Quantity, o.Gate, o.GateKey,
		o.HoldID, o.CreatedAt.UnixMilli(), o.TakeEpoch, o.CartID, o.CodeHash, keys.Join(o.SeatIDs, ","))
	if err != nil {
		return false, notCommitted("insert order", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// OrderByKey returns the order stored under an idempotency key, or
// ErrNotFound.
func (l *Ledger) OrderByKey(ctx context.Context, key keys.ID) (Order, error) {
	return scanOrder(l.db.QueryRowContext(ctx, selectOrder+` WHERE idem_key = $1`, key))
}

// Units are where an order's units went besides its buyer: every unit
// it began with (sold to its buyer, or moved to it by a transfer) is now
// standing (its buyer's, Listed of them on sale again), resold to other
// buyers through its listings (a listing.sold event each), refunded (its
// order.refunded event) or transferred to other buyers' orders. So
// Began = Standing + Resold + Refunded + Transferred, always (Order.Told).
type Units struct {
	Listed, Resold, Transferred int64
	// ResoldOut: every unit was resold; the order's RefundedAt is when the
	// last one went, and no refund took place.
	ResoldOut bool
}

// Told is the order's units as its money is told (see Units). A row
// given up keeps a quantity (orders.quantity > 0): the last units resold,
// or the units refunded.
func (o Order) Told() (standing, refunded, began int64) {
	switch {
	case o.Units.ResoldOut:
	case !o.RefundedAt.IsZero():
		refunded = o.Quantity
	default:
		standing = o.Quantity
	}
	return standing, refunded, standing + refunded + o.Units.Resold + o.Units.Transferred
}

// OrderByID returns an order by its id, with its Units, or ErrNotFound.
func (l *Ledger) OrderByID(ctx context.Context, id keys.ID) (Order, error) {
	return orderWithUnits(ctx, l.db, id)
}

// rowQueryer is a *sql.DB or a *sql.Tx.
type rowQueryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// orderWithUnits reads an order with its Units through q: inside a
// transaction, what an answer it records must show (a confirm's or a
// transfer's answer built from the bare row told a resold order as
// refunded, and a transfer's began without its resold units).
func orderWithUnits(ctx context.Context, q rowQueryer, id keys.ID) (Order, error) {
	// One statement: the order and its units at one instant.
	var out int64
	var u Units
	o, err := scanOrder(unitsScanner{q.QueryRowContext(ctx, `SELECT o.id, o.idem_key, o.request_hash, o.program, o.ticket, o.buyer,
		o.quantity, o.gate, o.gate_key, o.hold_id, o.refunded_at, o.created_at, o.take_epoch, o.cart_id, o.code_hash, o.seat_ids,
		COALESCE(u.listed, 0), COALESCE(u.resold, 0), COALESCE(u.transferred, 0), COALESCE(u.resold_out, 0)
		FROM orders o LEFT JOIN order_listings u ON u.order_id = o.id WHERE o.id = $1`, id), []any{&u.Listed, &u.Resold, &u.Transferred, &out}})
	if err != nil {
		return o, err
	}
	u.ResoldOut = out != 0
	o.Units = u
	return o, nil
}

// unitsScanner scans a row of an order's columns and then extra.
type unitsScanner struct {
	r     rowScanner
	extra []any
}

func (s unitsScanner) Scan(dest ...any) error { return s.r.Scan(append(dest, s.extra...)...) }

const selectOrder = `SELECT id, idem_key, request_hash, program, ticket, buyer, quantity, gate, gate_key, hold_id,
	refunded_at, created_at, take_epoch, cart_id, code_hash, seat_ids FROM orders`

// selectOrderFrom is selectOrder with the table named alias, to join.
func selectOrderFrom(alias string) string {
	return `SELECT ` + qualify(alias, `id, idem_key, request_hash, program, ticket, buyer, quantity, gate, gate_key, hold_id,
	refunded_at, created_at, take_epoch, cart_id, code_hash, seat_ids`) + ` FROM orders ` + alias
}

func scanOrder(r rowScanner) (Order, error) {
	var o Order
	var created, refunded int64
	var seatIDs string
	err := r.Scan(&o.ID, &o.IdempotencyKey, &o.RequestHash, &o.SKU.Program, &o.SKU.Ticket, &o.Buyer, &o.Quantity,
		&o.Gate, &o.GateKey, &o.HoldID, &refunded, &created, &o.TakeEpoch, &o.CartID, &o.CodeHash, &seatIDs)
	if errors.Is(err, sql.ErrNoRows) {
		return o, ErrNotFound
	}
	if err == nil {
		o.SeatIDs, err = splitIDs(seatIDs)
	}
	if err != nil {
		return o, fmt.Errorf("ledger: order: %w", err)
	}
	o.CreatedAt = time.UnixMilli(created).UTC()
	if refunded > 0 {
		o.RefundedAt = time.UnixMilli(refunded).UTC()
	}
	return o, nil
}

// OrderTotals counts a SKU's orders that stand (not refunded) and their
// units, straight from the order rows (not from the SKU row), for audits.
func (l *Ledger) OrderTotals(ctx context.Context, sku stock.SKU) (orders, units int64, err error) {
	err = l.db.QueryRowContext(ctx, `
		SELECT COUNT(*), COALESCE(SUM(quantity), 0) FROM orders WHERE program = $1 AND ticket = $2 AND refunded_at = 0`,
		sku.Program, sku.Ticket).Scan(&orders, &units)
	if err != nil {
		return 0, 0, fmt.Errorf("ledger: order totals: %w", err)
	}
	return orders, units, nil
}

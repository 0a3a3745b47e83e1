package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// MaxCartLines bounds the lines of one cart: a checkout, not a bulk load.
const MaxCartLines = 10

// Cart is one checkout of several tickets of one program, committed all or
// nothing: an order per line, in one transaction with the cart's request.
type Cart struct {
	ID      keys.ID `json:"cart_id"`
	Program keys.ID `json:"program"`
	Buyer   keys.ID `json:"buyer"`
	// Orders are the lines, one SKU each (no SKU twice), in ticket order.
	// Each carries its own row key (IdempotencyKey), and for a line the
	// gate admitted, its gate record and the gate epoch it was admitted
	// under.
	Orders    []Order   `json:"orders"`
	CreatedAt time.Time `json:"created_at"`
	Req       Request   `json:"-"`
}

// LineError is a cart refused because of one of its lines: Err is why
// (stock.ErrSoldOut, stock.ErrSaleEnded, stock.ErrUnknownSKU,
// stock.ErrLimit for the SKU's own cap, ErrStaleGate). Line indexes
// Cart.Orders. Nothing was written.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("ledger: cart line %d: %v", e.Line, e.Err) }
func (e *LineError) Unwrap() error { return e.Err }

func (c *Cart) validate() error {
	if c.Program.IsZero() || c.Buyer.IsZero() || len(c.Orders) == 0 || len(c.Orders) > MaxCartLines {
		return fmt.Errorf("%w: cart of %d lines", stock.ErrInvalid, len(c.Orders))
	}
	if err := c.Req.validate(); err != nil {
		return err
	}
	for i, o := range c.Orders {
		if o.SKU.Program != c.Program || o.Buyer != c.Buyer || o.Quantity < 1 || o.IdempotencyKey.IsZero() {
			return fmt.Errorf("%w: cart line %d", stock.ErrInvalid, i)
		}
		if i > 0 && c.Orders[i-1].SKU.Compare(o.SKU) >= 0 {
			return fmt.Errorf("%w: cart lines not in ticket order, or a ticket twice", stock.ErrInvalid)
		}
	}
	return nil
}

// PurchaseCart commits a cart: the request's row, every line's conditional
// update (sold + q where sold + held + q <= total, at the line's gate epoch
// or, when direct, at the row version read in this transaction, bumping
// bypass_seq), the buyer's counts under the SKU and program caps (the
// program's counting every line), and the order rows, in one transaction.
// A refusal is a *LineError, or stock.ErrLimit for the program's cap, and
// writes nothing. ErrDuplicate returns the cart already stored for the
// request; ErrKeyReused says the key was used for another request. Around
// the gate, ErrConflict says a row moved between the read and the update:
// call again.
func (l *Ledger) PurchaseCart(ctx context.Context, c Cart, direct bool) (_ Cart, err error) {
	defer l.observe("cart", time.Now(), &err)
	if err := c.validate(); err != nil {
		return Cart{}, err
	}
	if c.ID.IsZero() {
		c.ID = NewID()
	}
	c.CreatedAt = l.now().UTC().Truncate(time.Millisecond)
	c.Orders = slices.Clone(c.Orders)
	for i := range c.Orders {
		o := &c.Orders[i]
		if o.ID.IsZero() {
			o.ID = NewID()
		}
		o.CartID, o.CreatedAt, o.Req = c.ID, c.CreatedAt, Request{}
	}
	now := c.CreatedAt.UnixMilli()
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return Cart{}, notCommitted("cart: begin", err)
	}
	defer tx.Rollback()
	if err := claim(ctx, tx, c.Req, stock.SKU{Program: c.Program}, encodeCart(&c), now); err != nil {
		if !errors.Is(err, errTaken) {
			return Cart{}, err
		}
		tx.Rollback()
		return l.cartReplay(ctx, c.Req)
	}
	// SKU rows in ticket order (the lines' order), then the buyer's rows:
	// the order every write that moves stock takes them in.
	versions := make([]int64, len(c.Orders))
	for i := range c.Orders {
		o := &c.Orders[i]
		version, epoch := int64(-1), o.GateEpoch
		if direct {
			st, err := scanSKU(tx.QueryRowContext(ctx, selectSKU, o.SKU.Program, o.SKU.Ticket))
			if errors.Is(err, stock.ErrUnknownSKU) {
				return Cart{}, &LineError{Line: i, Err: err}
			}
			if err != nil {
				return Cart{}, notCommitted("cart: read sku", err)
			}
			version, epoch = st.Version, -1
		}
		v, e, err := updateSKU(ctx, tx, o.SKU, o.Quantity, "sold", version, epoch, now)
		switch {
		case errors.Is(err, ErrConflict):
			return Cart{}, err
		case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrSaleEnded), errors.Is(err, stock.ErrUnknownSKU),
			errors.Is(err, ErrStaleGate):
			return Cart{}, &LineError{Line: i, Err: err}
		case err != nil:
			return Cart{}, err
		}
		versions[i], o.TakeEpoch = v, e
	}
	buyers := make(map[stock.SKU]map[keys.ID]int64, len(c.Orders))
	for _, o := range c.Orders {
		buyers[o.SKU] = map[keys.ID]int64{o.Buyer: o.Quantity}
	}
	refused, err := countBatchBuyers(ctx, tx, buyers)
	if err != nil {
		return Cart{}, err
	}
	if refused != nil {
		if refused.sku.Ticket.IsZero() {
			return Cart{}, stock.ErrLimit // the program's cap: the cart as a whole
		}
		return Cart{}, &LineError{Line: slices.IndexFunc(c.Orders, func(o Order) bool { return o.SKU == refused.sku }), Err: stock.ErrLimit}
	}
	inserted, err := insertOrders(ctx, tx, c.Orders)
	if err != nil {
		return Cart{}, err
	}
	for _, o := range c.Orders {
		if !inserted[o.IdempotencyKey] {
			// Line keys derive from the cart's request, whose row this
			// transaction holds: only a bug gets here.
			return Cart{}, notCommitted("cart: insert orders", fmt.Errorf("line key %s taken", o.IdempotencyKey))
		}
	}
	for i, o := range c.Orders {
		if err := stamp(ctx, tx, o.SKU, versions[i]); err != nil {
			return Cart{}, err
		}
	}
	if err := tx.Commit(); err != nil {
		return Cart{}, fmt.Errorf("ledger: cart: commit: %w", err)
	}
	c.Req = Request{}
	return c, nil
}

// cartReplay answers a cart whose request was committed before.
func (l *Ledger) cartReplay(ctx context.Context, r Request) (Cart, error) {
	rec, err := l.replayOf(ctx, r)
	if errors.Is(err, ErrDuplicate) && rec.Cart == nil {
		return Cart{}, fmt.Errorf("%w: key was used for a %s", ErrKeyReused, rec.Op)
	}
	if rec.Cart == nil {
		return Cart{}, err
	}
	return *rec.Cart, err
}

// CartByID returns a cart with its orders as they are now (refunds
// included), or ErrNotFound.
func (l *Ledger) CartByID(ctx context.Context, id keys.ID) (Cart, error) {
	rows, err := l.db.QueryContext(ctx, selectOrder+` WHERE cart_id = $1 ORDER BY ticket`, id)
	if err != nil {
		return Cart{}, fmt.Errorf("ledger: cart: %w", err)
	}
	defer rows.Close()
	c := Cart{ID: id}
	for rows.Next() {
		o, err := scanOrder(rows)
		if err != nil {
			return Cart{}, err
		}
		c.Program, c.Buyer, c.CreatedAt = o.SKU.Program, o.Buyer, o.CreatedAt
		c.Orders = append(c.Orders, o)
	}
	if err := rows.Err(); err != nil {
		return Cart{}, fmt.Errorf("ledger: cart: %w", err)
	}
	if len(c.Orders) == 0 {
		return Cart{}, ErrNotFound
	}
	return c, nil
}

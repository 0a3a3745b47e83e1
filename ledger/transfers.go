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

// ErrRefunded: the order was refunded; its tickets cannot move.
var ErrRefunded = errors.New("ledger: order refunded")

// EventOrderTransferred: q of an order's tickets (Subject) moved to a
// buyer (Buyer), as the order Order (the same order when all moved).
const EventOrderTransferred = "order.transferred"

// Transfer moves q of an order's tickets (0: all) from its buyer to
// another, once per request: all of them re-owns the order; some of them
// split it (the sender's order keeps the rest, the receiver gets an order
// of its own, refunded on its own later). The receiver's caps apply (the
// SKU's and the program's: stock.ErrLimit, nothing moved); the sender's
// counts go down. The order's row is the one place it is decided, so a
// transfer racing a refund or another transfer moves each ticket once. A
// cart's line is ErrInCart (a cart is refunded whole by its buyer); a
// refunded order ErrRefunded; a seat order moves whole (ErrSeatedTake).
// It returns the receiver's order; a retry answers it again
// (ErrDuplicate).
//
// On PostgreSQL a transfer waiting for the order's row can be the one a
// deadlock check rolls back, though it holds no other row: the first
// waiter holds the row's tuple lock, so a listing (SKU row, then the
// order) queued behind it and a refund (the order, then the SKU row) close
// a cycle through it. It runs again then, as a listing does.
func (l *Ledger) Transfer(ctx context.Context, orderID, from, to keys.ID, q int64, req Request) (Order, error) {
	return retried(func() (Order, error) { return l.transfer(ctx, orderID, from, to, q, req) })
}

func (l *Ledger) transfer(ctx context.Context, orderID, from, to keys.ID, q int64, req Request) (_ Order, err error) {
	defer l.observe("transfer", time.Now(), &err)
	if to.IsZero() || to == from || q < 0 {
		return Order{}, fmt.Errorf("%w: transfer to %q of %d", stock.ErrInvalid, to, q)
	}
	now := l.now().UTC().Truncate(time.Millisecond)
	o, err := l.OrderByID(ctx, orderID)
	if err != nil {
		return Order{}, err
	}
	tx, taken, err := l.begin(ctx, req, o.SKU, now, "transfer")
	if taken {
		got, err := l.orderReplay(ctx, req)
		if errors.Is(err, ErrKeyReused) && o.Buyer != from {
			// Not a retry, and not the sender's order (any more): told as
			// such, as a confirm of another's hold is before its key. A
			// former owner's retry of its own transfer still replays.
			return Order{}, ErrNotOwner
		}
		return got, err
	}
	if err != nil {
		return Order{}, err
	}
	defer tx.Rollback()
	// The caps' scopes are shared before the counts move (capLock): a
	// cap switched on meanwhile either waits for this commit, or this
	// waits for the cap and counts under it. Before the order's row (an
	// order's SKU never changes): a cap switch holds its lock while it
	// waits for the SKU row, which a listing or a resale settle holds
	// while it waits for this order's row (helper-38).
	for _, scope := range []stock.SKU{o.SKU.Base(), {Program: o.SKU.Program}} {
		if err := l.capLock(ctx, tx, scope, false); err != nil {
			return Order{}, err
		}
	}
	// Locked first (on PostgreSQL; SQLite's transaction has the file), so
	// transfers and refunds of one order take turns instead of failing.
	if err := l.lockRows(ctx, tx, l.sql.lockOrders, []keys.ID{orderID}); err != nil {
		return Order{}, err
	}
	if o, err = orderWithUnits(ctx, tx, orderID); err != nil {
		return Order{}, err
	}
	if q == 0 {
		q = o.Quantity
	}
	listed, err := orderListed(ctx, tx, orderID)
	if err != nil {
		return Order{}, err
	}
	if err := checkTransfer(ctx, tx, o, from, q, listed); err != nil {
		return Order{}, err
	}
	moved, err := moveUnits(ctx, tx, o, from, to, q, now)
	if err != nil {
		return Order{}, err
	}
	if err := moveBuyerCounts(ctx, tx, o.SKU, from, to, q); err != nil {
		return Order{}, err
	}
	if err := emit(ctx, tx, now, Event{Type: EventOrderTransferred, SKU: o.SKU, Subject: o.ID, Order: moved.ID, Buyer: to, Quantity: q}); err != nil {
		return Order{}, err
	}
	if err := finish(ctx, tx, req, &moved, nil); err != nil {
		return Order{}, err
	}
	if err := tx.Commit(); err != nil {
		return Order{}, fmt.Errorf("ledger: transfer: commit: %w", err)
	}
	return moved, nil
}

// checkTransfer refuses a transfer of q units of o from from that the
// order as read under its lock does not allow; listed is how many of its
// units are listed for resale.
func checkTransfer(ctx context.Context, tx *sql.Tx, o Order, from keys.ID, q, listed int64) error {
	switch {
	case o.Buyer != from:
		return ErrNotOwner
	case o.RefundedAt.IsZero() && q <= o.Quantity && q > o.Quantity-listed:
		return ErrListed
	case !o.CartID.IsZero():
		return ErrInCart
	case !o.RefundedAt.IsZero():
		return endedAs(ctx, tx, o.ID)
	case q > o.Quantity:
		return overStanding(o, q, o.Quantity-listed) // listed ones stand but are not free to move
	case q < o.Quantity && len(o.SeatIDs) > 0:
		return fmt.Errorf("%w: a seat order moves whole", ErrSeatedTake)
	}
	return nil
}

// moveUnits moves q units of o from from to to and returns the order the
// receiver holds them by: o itself with a new buyer when it moves whole,
// a new order split off it otherwise. The order's row decides: a refund
// or another transfer since the read changes no row here.
func moveUnits(ctx context.Context, tx *sql.Tx, o Order, from, to keys.ID, q int64, now time.Time) (Order, error) {
	moved := o
	var res sql.Result
	var err error
	if q == o.Quantity {
		res, err = tx.ExecContext(ctx, `UPDATE orders SET buyer = $3 WHERE id = $1 AND buyer = $2 AND refunded_at = 0`, o.ID, from, to)
		moved.Buyer = to
	} else {
		res, err = tx.ExecContext(ctx, `UPDATE orders SET quantity = quantity - $3 WHERE id = $1 AND buyer = $2 AND refunded_at = 0
			AND quantity > $3`,
			o.ID, from, q)
		moved = Order{ID: NewIDOf(o.SKU), IdempotencyKey: keys.MustID("xfer-" + NewID().String()), RequestHash: o.RequestHash,
			SKU: o.SKU, Buyer: to, Quantity: q, Gate: o.Gate, GateKey: o.GateRequest(), CreatedAt: now, TakeEpoch: o.TakeEpoch,
			// The code's one use stands while any part of its purchase
			// does: split off without it, the sender's refund of the rest
			// gave the use back with the receiver's part still standing,
			// and one single-use code bought again and again.
			CodeHash: o.CodeHash}
		// Not its hold: a split is no hold's order (the hold names the
		// parent, and a hold id on it would name the sender's hold to the
		// receiver, and free the parent's seats with the split's refund
		// on an order confirmed before seat_ids were kept). The report
		// counts a split of a confirmed order as ordered without a hold.
	}
	if err != nil {
		return Order{}, notCommitted("transfer", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return Order{}, fmt.Errorf("%w: the order changed meanwhile; ask again", ErrNotCommitted)
	}
	if moved.ID == o.ID {
		return moved, nil
	}
	if inserted, err := insertOrder(ctx, tx, moved); err != nil || !inserted {
		return Order{}, fmt.Errorf("ledger: transfer: the receiver's order: inserted %v: %w", inserted, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO order_channels (order_id, channel)
		SELECT $2, channel FROM order_channels WHERE order_id = $1`, o.ID, moved.ID); err != nil {
		return Order{}, notCommitted("transfer: order channel", err)
	}
	// The sender's order tells where its q units went.
	if _, err := tx.ExecContext(ctx, `INSERT INTO order_listings (order_id, listed, transferred) VALUES ($1, 0, $2)
		ON CONFLICT (order_id) DO UPDATE SET transferred = order_listings.transferred + excluded.transferred`, o.ID, q); err != nil {
		return Order{}, notCommitted("transfer: order units", err)
	}
	return moved, nil
}

// moveBuyerCounts moves q units of sku from from's per-buyer counts to
// to's, for the ticket and the program, refusing past the receiver's cap.
func moveBuyerCounts(ctx context.Context, tx *sql.Tx, sku stock.SKU, from, to keys.ID, q int64) error {
	if err := uncountBuyer(ctx, tx, sku, from, q); err != nil {
		return err
	}
	base := sku.Base()
	refused, err := countBuyers(ctx, tx, []buyerRow{{sku: base, buyer: to, units: q}, {sku: stock.SKU{Program: base.Program}, buyer: to, units: q}})
	if err != nil {
		return err
	}
	if refused != nil {
		return fmt.Errorf("%w: the receiver's cap", stock.ErrLimit)
	}
	return nil
}

// overStanding refuses q of order o's tickets where only free of them
// may go: as resold (ErrResold, naming the count) when q is more than
// stand and its resold tickets would make up the rest, which is the state
// the buyer must hear; else as more than it may move (stock.ErrInvalid).
func overStanding(o Order, q, free int64) error {
	// Past what stands, not merely past what is free: listed tickets
	// stand (a listing of more than the unlisted is refused as invalid,
	// and withdrawing makes it possible), resold ones do not.
	if o.Units.Resold > 0 && q > o.Quantity && q <= o.Quantity+o.Units.Resold {
		return fmt.Errorf("%w: %d of the order's tickets were resold to other buyers; %d are free to move", ErrResold, o.Units.Resold, free)
	}
	return fmt.Errorf("%w: %d of an order of %d (%d free)", stock.ErrInvalid, q, o.Quantity, free)
}

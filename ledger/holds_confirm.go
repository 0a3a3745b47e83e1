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

// A hold's confirm as a single change: whole or in part (ConfirmPart),
// and its replay. The batched confirms of the lanes are confirms.go.

// Confirm turns a live hold into an order, once: held - q, sold + q, in the
// same transaction as the hold's state change. A hold already confirmed
// returns its order (a retry); one cancelled, expired, or past its expiry
// returns ErrHoldEnded and sells nothing. buyer must be the hold's. req
// (when not zero) is the client's confirm request, remembered with the
// order it got.
func (l *Ledger) Confirm(ctx context.Context, holdID, buyer keys.ID, req Request) (_ Order, err error) {
	return l.ConfirmPart(ctx, holdID, buyer, 0, req)
}

// ConfirmPart is Confirm of keep of the hold's units (0: all): the order
// has keep, and the rest come back in the same transaction, as a cancel
// gives them back (held - rest, the buyer's count - rest, a waitlist
// offered first, restore_pending set when Redis is owed them), exactly
// once whatever races it: the hold's state change decides. keep over the
// hold's quantity is stock.ErrInvalid; a seat hold is confirmed whole
// (ErrSeatedTake) unless keep is 0 or all its seats.
func (l *Ledger) ConfirmPart(ctx context.Context, holdID, buyer keys.ID, keep int64, req Request) (_ Order, err error) {
	defer l.observe("confirm", time.Now(), &err)
	now := l.now().UTC().Truncate(time.Millisecond)
	h, err := l.HoldByID(ctx, holdID)
	if err != nil {
		return Order{}, err
	}
	if keep < 0 {
		return Order{}, fmt.Errorf("%w: keep %d", stock.ErrInvalid, keep)
	}
	if h.Buyer != buyer {
		// Before the key is looked up, as API.md says: a hold never
		// changes buyer, so no retry of this buyer's can be refused by it
		// (a key of another request said 422, helper-69 #5).
		return Order{}, ErrNotOwner
	}
	tx, taken, err := l.begin(ctx, req, h.SKU, now, "confirm")
	if taken {
		return l.orderReplay(ctx, req)
	}
	if err != nil {
		return Order{}, err
	}
	defer tx.Rollback()
	h, err = scanHold(tx.QueryRowContext(ctx, selectHold+` WHERE id = $1`, holdID))
	if err != nil {
		return Order{}, err
	}
	if h.State == Confirmed && h.Buyer == buyer && h.CartID.IsZero() {
		return confirmedAgain(ctx, tx, h, keep, req)
	}
	if err := checkConfirm(h, buyer, keep, now); err != nil {
		return Order{}, err
	}
	if keep == 0 {
		keep = h.Quantity
	}
	rest := h.Quantity - keep
	o := confirmOrder(h, req, now)
	o.Quantity = keep
	if claimed, answer, err := claimHold(ctx, tx, h, o.ID, keep, req, now); !claimed {
		return answer, err
	}
	v, err := sellHeld(ctx, tx, h.SKU, keep, now)
	if err != nil {
		return Order{}, err
	}
	var events []Event
	if rest > 0 {
		if v, events, err = releaseRest(ctx, tx, h, o.ID, rest, now); err != nil {
			return Order{}, err
		}
	}
	if inserted, err := insertOrder(ctx, tx, o); err != nil || !inserted {
		return Order{}, fmt.Errorf("ledger: confirm: order row of hold %s: inserted %v: %w", h.ID, inserted, err)
	}
	if err := moveSeats(ctx, tx, h.ID, seatHeld, seatSold); err != nil {
		return Order{}, err
	}
	h.OrderID = o.ID
	confirmed := holdEvent(EventHoldConfirmed, h)
	confirmed.Quantity = keep
	if err := emit(ctx, tx, now, append([]Event{confirmed}, events...)...); err != nil {
		return Order{}, err
	}
	if err := finish(ctx, tx, req, &o, nil); err != nil {
		return Order{}, err
	}
	if err := stamp(ctx, tx, h.SKU, v); err != nil {
		return Order{}, err
	}
	if err := tx.Commit(); err != nil {
		return Order{}, fmt.Errorf("ledger: confirm: commit: %w", err)
	}
	return o, nil
}

// checkConfirm refuses a confirm by buyer of keep units of the hold h,
// as read under its lock, that the hold does not allow (h confirmed and
// buyer's is confirmedAgain's to answer).
func checkConfirm(h Hold, buyer keys.ID, keep int64, now time.Time) error {
	switch {
	case h.Buyer != buyer:
		return ErrNotOwner
	case !h.CartID.IsZero():
		return ErrInCart
	case h.State != Held || !now.Before(h.ExpiresAt):
		return fmt.Errorf("%w: %s", ErrHoldEnded, h.stateAt(now))
	case keep > h.Quantity:
		return fmt.Errorf("%w: keep %d of a hold of %d", stock.ErrInvalid, keep, h.Quantity)
	case keep > 0 && keep < h.Quantity && len(h.SeatIDs) > 0:
		return fmt.Errorf("%w: a seat hold is confirmed whole", ErrSeatedTake)
	}
	return nil
}

// claimHold moves the held h to confirmed, as order orderID. The state
// change is the one place a hold's fate is decided: a sweeper expiring it
// at this instant changes zero rows here, or we change zero rows there.
// When it changes none (claimed false), answer and err are the confirm's
// answer.
func claimHold(ctx context.Context, tx *sql.Tx, h Hold, orderID keys.ID, keep int64, req Request, now time.Time) (claimed bool, answer Order, err error) {
	res, err := tx.ExecContext(ctx, `UPDATE holds SET state = $2, order_id = $3, ended_at = $4
		WHERE id = $1 AND state = $5 AND expires_at > $4`, h.ID, Confirmed, orderID, now.UnixMilli(), Held)
	if err != nil {
		return false, Order{}, notCommitted("confirm hold", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return true, Order{}, nil
	}
	// Another confirm (or a sweeper, or a cancel) changed the row while
	// this one waited for it. On PostgreSQL's READ COMMITTED the
	// conditional update then sees the row as that one left it and
	// changes nothing; this is no expiry: read what the hold is now, in
	// this transaction (a new statement sees the winner's commit), and
	// answer that.
	cur, err := scanHold(tx.QueryRowContext(ctx, selectHold+` WHERE id = $1`, h.ID))
	switch {
	case err != nil:
		return false, Order{}, err
	case cur.State == Confirmed:
		answer, err = confirmedAgain(ctx, tx, cur, keep, req)
		return false, answer, err
	}
	return false, Order{}, fmt.Errorf("%w: %s while confirming", ErrHoldEnded, cur.stateAt(now))
}

// sellHeld moves keep of sku's held units to sold and returns the SKU's
// new version.
func sellHeld(ctx context.Context, tx *sql.Tx, sku stock.SKU, keep int64, now time.Time) (int64, error) {
	var v int64
	err := tx.QueryRowContext(ctx, `UPDATE skus SET held = held - $3, sold = sold + $3, version = version + 1, updated_at = $4
		WHERE program = $1 AND ticket = $2 AND held >= $3 RETURNING version`,
		sku.Program, sku.Ticket, keep, now.UnixMilli()).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("ledger: confirm: %s holds fewer than %d", sku, keep)
	}
	if err != nil {
		return 0, notCommitted("confirm stock", err)
	}
	return v, nil
}

// releaseRest gives back the rest of the hold h that its order orderID
// does not keep, as a cancel's units come back; Redis is owed them
// (RestoreOwed: the hold's quantity less its order's and what a waitlist
// was offered). It returns the SKU's new version and the events to emit.
func releaseRest(ctx context.Context, tx *sql.Tx, h Hold, orderID keys.ID, rest int64, now time.Time) (int64, []Event, error) {
	r, err := returnStock(ctx, tx, h.SKU, h.Buyer, rest, "held", now.UnixMilli())
	if err != nil {
		return 0, nil, err
	}
	pending, err := owed(ctx, tx, "holds", h.ID, h.Gate, h.TakeEpoch, false, r)
	if err != nil {
		return 0, nil, err
	}
	offers, err := offerBack(ctx, tx, h.SKU, rest, []backRow{{"holds", h.ID, rest, pending}}, now)
	if err != nil {
		return 0, nil, err
	}
	released := holdEvent(EventHoldReleased, h)
	released.Order, released.Quantity = orderID, rest
	return r.version, append([]Event{released}, offers...), nil
}

// confirmedAgain answers a confirm of a hold already confirmed (a retry
// under a new key, or the loser of a race): the hold's order, recorded as
// req's answer, when the confirm names no quantity or the order's; any
// other quantity is ErrHoldConfirmed and records nothing (the order stands
// as it is, and a 4xx moves nothing).
func confirmedAgain(ctx context.Context, tx *sql.Tx, h Hold, keep int64, req Request) (Order, error) {
	// The order with the units moved out of it, in one statement: under
	// READ COMMITTED two statements see two snapshots, and a transfer
	// committing between them counted its units twice (3 + 2 moved:
	// "confirmed as 5, not 3", a 409 for the order's own quantity;
	// TestModelConcurrent/two-primaries). The answer recorded shows them
	// too: built from the bare row, a resold order read as refunded.
	o, err := orderWithUnits(ctx, tx, h.OrderID)
	if err != nil {
		return Order{}, err
	}
	// The quantity the hold was confirmed for, not what the order has now
	// (a transfer or a resale since takes units out of it).
	moved := o.Units.Resold + o.Units.Transferred
	confirmed := o.Quantity + moved
	if o.Units.ResoldOut {
		confirmed = moved // the row's quantity is its last units resold, counted in moved
	}
	if keep > 0 && keep != confirmed {
		return o, fmt.Errorf("%w: as order %s of %d, not %d", ErrHoldConfirmed, o.ID, confirmed, keep)
	}
	if err := finish(ctx, tx, req, &o, nil); err != nil {
		return Order{}, err
	}
	if err := tx.Commit(); err != nil {
		return Order{}, fmt.Errorf("ledger: confirm: commit: %w", err)
	}
	return o, nil
}

package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// ExpireHold expires one hold whose expiry has passed, as the sweeper
// would (its stock back, restore_pending set when Redis is owed it):
// changed is false when it had ended already (by the sweeper, a cancel or
// a confirm) or is not due. A late payment ends the hold this way before
// taking its units again, so they are never counted twice.
func (l *Ledger) ExpireHold(ctx context.Context, id keys.ID) (Hold, bool, error) {
	h, err := l.HoldByID(ctx, id)
	if err != nil {
		return h, false, err
	}
	if h.State != Held {
		return h, false, nil
	}
	return l.endHold(ctx, h, Expired, true, Request{})
}

// ErrUnitsThere is RefuseLate's answer when the ledger does not bear the
// refusal out: the units are there and the buyer's caps allow them (the
// gate that refused was behind). Nothing was recorded.
var ErrUnitsThere = errors.New("ledger: the units are there for the buyer")

// LateRefusal is a late payment refused because its units are gone.
type LateRefusal struct {
	Req      Request   // the late payment's row: under the key derived from its hold
	SKU      stock.SKU // the hold's
	Buyer    keys.ID
	Quantity int64  // what the payment asked for
	Why      string // the reason told, and told again
	// Final: the hold's units are never taken again by a late payment
	// (a seat, pool, access-code or waitlist-offer hold), so the refusal
	// needs nothing borne out by the SKU's row.
	Final bool
}

// RefuseLate records a late payment of a hold as refused, when the
// ledger bears the refusal out in the same transaction (the SKU row
// locked: the sale ended, fewer than Quantity left, or the buyer's
// ticket or program cap reached): the hold's later late payments, under
// any key and on any replica, are answered the same, and nothing sells
// after the platform refunded. ErrUnitsThere when it does not (unless
// the refusal is Final). A key
// taken already (a late payment that sold, on another replica) is left
// as it is, and answered from (ErrDuplicate with the row).
func (l *Ledger) RefuseLate(ctx context.Context, r LateRefusal) (Recorded, error) {
	tx, taken, err := l.begin(ctx, r.Req, r.SKU, l.now(), "late refusal")
	if taken {
		rec, err := l.RequestByKey(ctx, r.Req.Scope, r.Req.Key)
		if err != nil {
			return rec, fmt.Errorf("ledger: key taken, row unreadable: %w", err)
		}
		return rec, ErrDuplicate
	}
	if err != nil {
		return Recorded{}, err
	}
	defer tx.Rollback()
	// Not on a primary its program is moving from: the move's copy may
	// have read the requests already (ErrMoving; the caller answers 503).
	if err := l.fenceMoved(ctx, tx, r.SKU.Program); err != nil {
		return Recorded{}, err
	}
	var left, ended, ticketCap, ticketUnits, programCap, programUnits int64
	err = tx.QueryRowContext(ctx, `SELECT total - sold - held, ended_at, per_buyer,
		COALESCE((SELECT units FROM buyer_units b WHERE b.program = s.program AND b.ticket = s.ticket AND b.buyer = $3), 0),
		COALESCE((SELECT per_buyer FROM programs p WHERE p.program = s.program), 0),
		COALESCE((SELECT units FROM buyer_units b WHERE b.program = s.program AND b.ticket = '' AND b.buyer = $3), 0)
		FROM skus s WHERE s.program = $1 AND s.ticket = $2`+l.forUpdate(), r.SKU.Program, r.SKU.Ticket, r.Buyer).
		Scan(&left, &ended, &ticketCap, &ticketUnits, &programCap, &programUnits)
	if errors.Is(err, sql.ErrNoRows) {
		return Recorded{}, stock.ErrUnknownSKU
	}
	if err != nil {
		return Recorded{}, notCommitted("late refusal: read the SKU", err)
	}
	gone := ended > 0 || left < r.Quantity ||
		ticketCap > 0 && ticketUnits+r.Quantity > ticketCap ||
		programCap > 0 && programUnits+r.Quantity > programCap
	if !gone && !r.Final {
		return Recorded{}, ErrUnitsThere
	}
	if _, err := tx.ExecContext(ctx, `UPDATE requests SET result = $3 WHERE scope = $1 AND idem_key = $2`,
		r.Req.Scope, r.Req.Key, encodeRefusal(r.Why)); err != nil {
		return Recorded{}, notCommitted("late refusal", err)
	}
	if err := tx.Commit(); err != nil {
		return Recorded{}, fmt.Errorf("ledger: late refusal: %w", err)
	}
	return Recorded{Request: r.Req, SKU: r.SKU, Refused: r.Why}, nil
}

package ledger

import (
	"context"
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

// RefuseLate records req, a late payment of a hold refused because its
// units are gone, as refused (why, the reason given): the hold's later
// late payments, under any key and on any replica, are answered the
// same, not sold after the platform refunded. A key taken already (a
// late payment that sold, on another replica) is left as it is, and
// answered from (ErrDuplicate with the row, or ErrKeyReused).
func (l *Ledger) RefuseLate(ctx context.Context, req Request, sku stock.SKU, why string) (Recorded, error) {
	tx, taken, err := l.begin(ctx, req, sku, l.now(), "late refusal")
	if taken {
		rec, err := l.RequestByKey(ctx, req.Scope, req.Key)
		if err != nil {
			return rec, fmt.Errorf("ledger: key taken, row unreadable: %w", err)
		}
		return rec, ErrDuplicate
	}
	if err != nil {
		return Recorded{}, err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `UPDATE requests SET result = $3 WHERE scope = $1 AND idem_key = $2`,
		req.Scope, req.Key, encodeRefusal(why)); err != nil {
		return Recorded{}, notCommitted("late refusal", err)
	}
	if err := tx.Commit(); err != nil {
		return Recorded{}, fmt.Errorf("ledger: late refusal: %w", err)
	}
	return Recorded{Request: req, SKU: sku, Refused: why}, nil
}

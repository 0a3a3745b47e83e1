package ledger

import (
	"context"

	"github.com/stockgate/stockgate/keys"
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

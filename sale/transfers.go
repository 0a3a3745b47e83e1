package sale

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// Transfer moves q of an order's tickets (0: all) from its buyer (a.Buyer)
// to another buyer, once: all of them re-own the order, some of them split
// it. The receiver's caps apply (ErrLimit, nothing moved); a seat order
// moves whole; a cart's line does not move alone (ErrInCart). A retry, on
// any replica, answers the receiver's order.
func (s *Service) Transfer(ctx context.Context, orderID keys.ID, a Ask, to keys.ID, q int64) (Result, error) {
	switch {
	case to.IsZero():
		return Result{}, refuse(ErrInvalid, "to must match [A-Za-z0-9_-]{1,64}")
	case to == a.Buyer:
		return Result{}, refuse(ErrInvalid, "to must be another buyer")
	case q < 0 || q > stock.MaxPerOrderCap:
		return Result{}, refuse(ErrInvalid, fmt.Sprintf("quantity must be in 1..%d", stock.MaxPerOrderCap))
	}
	return s.ownerAction(ctx, ledger.OpTransfer, orderID, a, func(ctx context.Context, id, buyer keys.ID, r request) answer {
		return s.transfer(ctx, id, buyer, to, q, r)
	}, to.String(), strconv.FormatInt(q, 10))
}

func (s *Service) transfer(ctx context.Context, id, from, to keys.ID, q int64, r request) answer {
	o, err := s.ledger.Transfer(ctx, id, from, to, q, r.ledger())
	// The sender's counts at the gate for the order's request go: the
	// gate under-counts what it keeps of a split order, never over (the
	// ledger checks the caps at every commit). A replay lets them go too
	// (once: a second time is a no-op): the first attempt's reply may
	// have been lost before it did.
	release := func() {
		s.releaseQuota(ctx, []quotaScope{{o.SKU.Base(), from}, {o.SKU.Whole(), from}}, o.GateRequest(), keys.ID{})
	}
	switch {
	case err == nil:
		release()
		s.metrics.afterSale.WithLabelValues("transferred").Add(float64(o.Quantity))
		return answer{order: o}
	case errors.Is(err, ledger.ErrDuplicate):
		release()
		return answer{order: o, replayed: true}
	case errors.Is(err, ledger.ErrRefunded):
		return fail(ErrOrderRefunded)
	case errors.Is(err, ledger.ErrResold):
		return fail(resoldRefusal(err))
	case errors.Is(err, ledger.ErrListed):
		return fail(ErrOrderListed)
	case errors.Is(err, stock.ErrLimit):
		return fail(refuse(ErrLimit, "the receiver is at its cap"))
	case errors.Is(err, ledger.ErrSeatedTake):
		return fail(refuse(ErrInvalid, "a seat order moves whole: leave quantity out"))
	case errors.Is(err, stock.ErrInvalid):
		return fail(refuse(ErrInvalid, "quantity is more than the order has"))
	case errors.Is(err, ledger.ErrNotCommitted):
		return ansUnavailable
	}
	return s.ownerError(ctx, err, ansNoOrder)
}

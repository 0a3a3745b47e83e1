package sale

import (
	"context"
	"errors"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// lateConfirm answers the confirm of a hold whose expiry has passed: within
// Options.LatePayment of it (the buyer paid while the hold ran out), its
// units are taken again for its buyer, through the gate and the ledger as
// a purchase is, under a request key derived from the hold (so a retry,
// on any replica, buys once and answers that order); if they are gone,
// ErrLateRefused, a refusal the platform refunds against. Past the window,
// or with late payments off, the hold is simply expired (ErrHoldExpired).
func (s *Service) lateConfirm(ctx context.Context, h ledger.Hold) answer {
	if s.opts.LatePayment <= 0 || time.Since(h.ExpiresAt) > s.opts.LatePayment {
		return ansHoldExpired
	}
	switch {
	case h.IsOffer():
		// Its units went to the next buyer in the waitlist's line.
		return fail(refuse(ErrLateRefused, "a waitlist offer that expired passed to the next buyer: refund the payment"))
	case len(h.SeatIDs) > 0:
		return fail(refuse(ErrLateRefused, "a seat hold's seats are not taken again: refund the payment"))
	case !h.SKU.Pool().IsZero() || h.CodeHash != "":
		return fail(refuse(ErrLateRefused, "a pool's or an access code's hold is not taken again (its access rule applies): refund the payment"))
	}
	if h.State == ledger.Held {
		// Past its expiry, not swept yet: expire it first, so its units
		// are back (and counted once) before they are taken again.
		if _, changed, err := s.ledger.ExpireHold(ctx, h.ID); err != nil {
			return s.ownerError(ctx, err, ansNoHold)
		} else if changed {
			s.metrics.expired.Inc()
			s.holdEnded(ctx, h.SKU.Program, h.Buyer, h.IdempotencyKey)
			s.returnOwed(ctx, "hold", h.ID)
		}
		cur, err := s.ledger.HoldByID(ctx, h.ID)
		if err != nil {
			return s.ownerError(ctx, err, ansNoHold)
		}
		switch cur.State {
		case ledger.Cancelled:
			return ansHoldCancelled
		case ledger.Confirmed:
			return ansHoldConfirmed
		}
	}
	key := keys.MustID("late-" + h.ID.String())
	w := want{sku: h.SKU, buyer: h.Buyer, q: h.Quantity, req: newRequest(h.Buyer, key, ledger.OpPurchase, "late", h.ID.String())}
	a := s.takeOne(ctx, w)
	if a.err != nil && (errors.Is(a.err, stock.ErrSoldOut) || errors.Is(a.err, ErrSoldOut) || errors.Is(a.err, ErrLimit) ||
		errors.Is(a.err, ErrSaleEnded) || errors.Is(a.err, stock.ErrLimit) || errors.Is(a.err, stock.ErrSaleEnded)) {
		s.metrics.latePayments.WithLabelValues("refused").Inc()
		return fail(refuse(ErrLateRefused, "the hold expired and its units are gone: nothing was sold; refund the payment"))
	}
	if a.err == nil && !a.replayed {
		s.metrics.latePayments.WithLabelValues("sold").Inc()
	}
	return a
}

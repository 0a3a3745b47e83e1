package sale

import (
	"context"
	"errors"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/tracing"
)

// traced is req with ctx's span as its trace: a batch's events keep it
// for their deliveries (a single change's take it from ctx).
func traced(ctx context.Context, req ledger.Request) ledger.Request {
	req.Trace = tracing.Traceparent(ctx)
	return req
}

// confirmOut is one confirm's outcome, as Ledger.Confirm gives it.
type confirmOut struct {
	order ledger.Order
	err   error
}

// confirmLedger confirms a hold through the group committer of confirms:
// under load, the confirms that queue together commit in one transaction.
// It answers as Ledger.Confirm does.
func (s *Service) confirmLedger(ctx context.Context, id, buyer keys.ID, req ledger.Request) (ledger.Order, error) {
	// Confirms fill the first lane that keeps up (batcher.pick): one
	// SKU's confirms are batched together, and its row has one writer per
	// replica, until that lane can't keep up.
	out, err := s.confirms.do(ctx, ledger.HoldRequest{HoldID: id, Buyer: buyer, Req: traced(ctx, req)})
	if err != nil {
		return ledger.Order{}, err
	}
	return out.order, out.err
}

// flushConfirms commits a batch of confirms together, then decides alone
// those the batch split out (a retry, an ended hold, ...),
// after the batch's own answers are out. A batch that failed as a whole
// is decided alone too: Confirm replays whatever did commit.
func (s *Service) flushConfirms(ctx context.Context, cs []ledger.HoldRequest, answer func(int, confirmOut)) {
	flushSplit(ctx, s, "confirm", cs, s.ledger.ConfirmBatch,
		func(r ledger.BatchResult) (confirmOut, bool) {
			return confirmOut{r.Order, r.Err}, !errors.Is(r.Err, ledger.ErrSplit)
		},
		func(c ledger.HoldRequest) confirmOut {
			o, err := s.ledger.Confirm(ctx, c.HoldID, c.Buyer, c.Req)
			return confirmOut{o, err}
		}, answer)
}

// flushSplit commits items through batch and answers each the batch
// decided (decided says which, and with what); then it decides alone, with
// alone, those the batch split out, after the batch's own answers are out.
// A batch that failed as a whole is decided alone too: every single-item
// call replays whatever did commit.
func flushSplit[T, B, R any](ctx context.Context, s *Service, what string, items []T,
	batch func(context.Context, []T) ([]B, error), decided func(B) (R, bool), alone func(T) R, answer func(int, R)) {
	res, err := batch(ctx, items)
	var rest []int
	for i := range items {
		if err != nil {
			rest = append(rest, i)
			continue
		}
		r, ok := decided(res[i])
		if !ok {
			rest = append(rest, i)
			continue
		}
		answer(i, r)
	}
	if err != nil {
		s.log.WarnContext(ctx, what+" batch failed; deciding each alone", "items", len(items), "err", err)
	}
	eachAlone(rest, func(i int) { answer(i, alone(items[i])) })
}

// cancelOut is one cancel's outcome, as Ledger.Cancel gives it.
type cancelOut struct {
	hold    ledger.Hold
	changed bool
	err     error
}

// cancelLedger cancels a hold through the group committer of cancels. It
// answers as Ledger.Cancel does.
func (s *Service) cancelLedger(ctx context.Context, id, buyer keys.ID, req ledger.Request) (ledger.Hold, bool, error) {
	out, err := s.cancels.do(ctx, ledger.HoldRequest{HoldID: id, Buyer: buyer, Req: traced(ctx, req)})
	if err != nil {
		return ledger.Hold{}, false, err
	}
	return out.hold, out.changed, out.err
}

// flushCancels ends a batch of cancels together, then decides alone those
// the batch split out, as flushConfirms does.
func (s *Service) flushCancels(ctx context.Context, cs []ledger.HoldRequest, answer func(int, cancelOut)) {
	flushSplit(ctx, s, "cancel", cs, s.ledger.CancelBatch,
		func(r ledger.HoldResult) (cancelOut, bool) {
			return cancelOut{hold: r.Hold, changed: true}, !errors.Is(r.Err, ledger.ErrSplit)
		},
		func(c ledger.HoldRequest) cancelOut {
			h, changed, err := s.ledger.Cancel(ctx, c.HoldID, c.Buyer, c.Req)
			return cancelOut{h, changed, err}
		}, answer)
}

// refundOut is one refund's outcome, as Ledger.Refund gives it.
type refundOut struct {
	order   ledger.Order
	changed bool
	err     error
}

// refundLedger refunds an order through the group committer of refunds. It
// answers as Ledger.Refund does.
func (s *Service) refundLedger(ctx context.Context, id, buyer keys.ID, req ledger.Request) (ledger.Order, bool, error) {
	out, err := s.refunds.do(ctx, ledger.OrderRequest{OrderID: id, Buyer: buyer, Req: traced(ctx, req)})
	if err != nil {
		return ledger.Order{}, false, err
	}
	return out.order, out.changed, out.err
}

// flushRefunds refunds a batch together, then decides alone those the
// batch split out, as flushConfirms does.
func (s *Service) flushRefunds(ctx context.Context, rs []ledger.OrderRequest, answer func(int, refundOut)) {
	flushSplit(ctx, s, "refund", rs, s.ledger.RefundBatch,
		func(r ledger.OrderResult) (refundOut, bool) {
			return refundOut{order: r.Order, changed: true}, !errors.Is(r.Err, ledger.ErrSplit)
		},
		func(r ledger.OrderRequest) refundOut {
			o, changed, err := s.ledger.Refund(ctx, r.OrderID, r.Buyer, r.Req)
			return refundOut{o, changed, err}
		}, answer)
}

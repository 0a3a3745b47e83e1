package sale

import (
	"context"
	"errors"
	"hash/crc32"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// confirmOut is one confirm's outcome, as Ledger.Confirm gives it.
type confirmOut struct {
	order ledger.Order
	err   error
}

// confirmLedger confirms a hold through the group committer of confirms:
// under load, the confirms that queue together commit in one transaction.
// It answers as Ledger.Confirm does.
func (s *Service) confirmLedger(id, buyer keys.ID, req ledger.Request) (ledger.Order, error) {
	// A confirm's SKU is not known until its hold is read, so confirms
	// queue by hold: a retry of one meets the first in the same partition.
	out, ok := s.confirms.do(crc32.ChecksumIEEE([]byte(id.String())), ledger.HoldRequest{HoldID: id, Buyer: buyer, Req: req})
	if !ok {
		return ledger.Order{}, errClosing
	}
	return out.order, out.err
}

// flushConfirms commits a batch of confirms together, then decides alone
// those the batch split out (a retry, an ended hold, a seat hold, ...),
// after the batch's own answers are out. A batch that failed as a whole
// is decided alone too: Confirm replays whatever did commit.
func (s *Service) flushConfirms(ctx context.Context, cs []ledger.HoldRequest, answer func(int, confirmOut)) {
	res, err := s.ledger.ConfirmBatch(ctx, cs)
	var alone []int
	for i := range cs {
		if err != nil || errors.Is(res[i].Err, ledger.ErrSplit) {
			alone = append(alone, i)
			continue
		}
		answer(i, confirmOut{res[i].Order, res[i].Err})
	}
	if err != nil {
		s.log.WarnContext(ctx, "confirm batch failed; deciding each alone", "confirms", len(cs), "err", err)
	}
	eachAlone(alone, func(i int) {
		o, err := s.ledger.Confirm(ctx, cs[i].HoldID, cs[i].Buyer, cs[i].Req)
		answer(i, confirmOut{o, err})
	})
}

// cancelOut is one cancel's outcome, as Ledger.Cancel gives it.
type cancelOut struct {
	hold    ledger.Hold
	changed bool
	err     error
}

// cancelLedger cancels a hold through the group committer of cancels. It
// answers as Ledger.Cancel does.
func (s *Service) cancelLedger(id, buyer keys.ID, req ledger.Request) (ledger.Hold, bool, error) {
	out, ok := s.cancels.do(crc32.ChecksumIEEE([]byte(id.String())), ledger.HoldRequest{HoldID: id, Buyer: buyer, Req: req})
	if !ok {
		return ledger.Hold{}, false, errClosing
	}
	return out.hold, out.changed, out.err
}

// flushCancels ends a batch of cancels together, then decides alone those
// the batch split out, as flushConfirms does.
func (s *Service) flushCancels(ctx context.Context, cs []ledger.HoldRequest, answer func(int, cancelOut)) {
	res, err := s.ledger.CancelBatch(ctx, cs)
	var alone []int
	for i := range cs {
		if err != nil || errors.Is(res[i].Err, ledger.ErrSplit) {
			alone = append(alone, i)
			continue
		}
		answer(i, cancelOut{hold: res[i].Hold, changed: true})
	}
	if err != nil {
		s.log.WarnContext(ctx, "cancel batch failed; deciding each alone", "cancels", len(cs), "err", err)
	}
	eachAlone(alone, func(i int) {
		h, changed, err := s.ledger.Cancel(ctx, cs[i].HoldID, cs[i].Buyer, cs[i].Req)
		answer(i, cancelOut{h, changed, err})
	})
}

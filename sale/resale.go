package sale

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// Resale (see ledger/resale.go): a buyer lists some of an order's
// tickets, which go back on sale at the gate; a withdrawal takes the
// unsold ones back; the sweeper settles which sales took them, and each
// settled listing.sold event is the platform's cue to refund the seller.

// Resales are the ledger's listings.
type Resales interface {
	List(ctx context.Context, orderID, seller keys.ID, q int64, req ledger.Request) (ledger.Listing, error)
	// Withdraw also returns the sales it settled on its way (Settle's).
	Withdraw(ctx context.Context, listingID, seller keys.ID, expect, epoch int64, req ledger.Request) (ledger.Listing, []ledger.Event, error)
	ListingByID(ctx context.Context, id keys.ID) (ledger.Listing, error)
	SettleDue(ctx context.Context, limit int) ([]ledger.Event, error)
	Settle(ctx context.Context, sku stock.SKU) ([]ledger.Event, error)
}

// ListForResale lists q of an order's tickets for resale, once: they are
// for sale again at once, and the seller's order gives them up only when
// a buyer's sale takes them. A retry, on any replica, answers the same
// listing.
func (s *Service) ListForResale(ctx context.Context, orderID keys.ID, a Ask, q int64) (Result, error) {
	if q < 1 || q > stock.MaxPerOrderCap {
		return Result{}, refuse(ErrInvalid, fmt.Sprintf("quantity must be in 1..%d", stock.MaxPerOrderCap))
	}
	return s.ownerAction(ctx, ledger.OpResale, orderID, a, func(ctx context.Context, id, seller keys.ID, r request) answer {
		x, err := s.ledger.List(ctx, id, seller, q, r.ledger())
		switch {
		case err == nil:
			s.metrics.listings.WithLabelValues("listed").Add(float64(q))
			s.returnOwed(ctx, "listing", x.ID) // the units go back on sale at the gate
			return answer{listing: &x}
		case errors.Is(err, ledger.ErrDuplicate):
			// The first answer may never have been given (its COMMIT
			// reply lost): the units go on sale now, not at a sweep.
			if !s.returnFound(ctx, "listing", x.ID) {
				return ansUnavailable
			}
			return answer{listing: &x, replayed: true}
		case errors.Is(err, ledger.ErrRefunded):
			return fail(ErrOrderRefunded)
		case errors.Is(err, ledger.ErrResold):
			return fail(resoldRefusal(err))
		case errors.Is(err, ledger.ErrSeatedTake):
			return fail(refuse(ErrInvalid, "seat orders are not listed for resale"))
		case errors.Is(err, ledger.ErrPoolResale):
			return fail(refuse(ErrInvalid, "a pool's tickets are not listed for resale"))
		case errors.Is(err, stock.ErrSaleEnded):
			return fail(ErrSaleEnded)
		case errors.Is(err, stock.ErrInvalid):
			return fail(refuse(ErrInvalid, "quantity is more than the order has that is not listed already"))
		case errors.Is(err, ledger.ErrNotCommitted):
			return ansUnavailable
		}
		return s.ownerError(ctx, err, ansNoOrder)
	}, strconv.FormatInt(q, 10))
}

// WithdrawListing takes a listing's unsold tickets off sale, once: out of
// the gate first (so no buyer is admitted for them meanwhile), then out
// of the ledger. Units held or being bought right now cannot be taken
// back (ErrListingSelling: try again later).
func (s *Service) WithdrawListing(ctx context.Context, listingID keys.ID, a Ask) (Result, error) {
	return s.ownerAction(ctx, ledger.OpWithdraw, listingID, a, s.withdraw)
}

// withdrawable is listing id as seller's withdrawal first reads it, or
// the answer that refuses the withdrawal (ok false).
func (s *Service) withdrawable(ctx context.Context, id, seller keys.ID) (_ ledger.Listing, _ answer, ok bool) {
	x, err := s.ledger.ListingByID(ctx, id)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return x, fail(ErrUnknownListing), false
	case err != nil:
		return x, ansUnavailable, false
	case x.Seller != seller:
		return x, ansNotOwner, false
	}
	// Behind a waiting room, listed tickets are the line's: the room
	// admitted a buyer for each, and a withdrawal took them back from
	// under those buyers, who met sold out (helper-109), as a late payment
	// would (it is refused there too). Withdrawn once the room is gone.
	switch queued, err := s.queued(ctx, x.SKU.Program); {
	case err != nil:
		return x, ansUnavailable, false
	case queued && x.State == ledger.Listed:
		return x, fail(refuse(ErrListingSelling,
			"the program sells through its waiting room, which admitted buyers for the listed tickets: withdraw them once the room is removed")), false
	}
	return x, answer{}, true
}

func (s *Service) withdraw(ctx context.Context, id, seller keys.ID, r request) answer {
	x, no, ok := s.withdrawable(ctx, id, seller)
	if !ok {
		return no
	}
	// What sold settles first, so the units left are what a withdrawal
	// takes back (and the sellers' counts at the gate go with the sales).
	// Read again whatever this settle did: the sweeper's may have settled
	// the listing since the read above, and a withdrawal of the count
	// read then took public units out of the gate meanwhile (buyers told
	// sold out) to be refused with the wrong problem (helper-65).
	sold, err := s.ledger.Settle(ctx, x.SKU)
	if err != nil {
		return ansUnavailable
	}
	s.resold(ctx, sold)
	if x, err = s.ledger.ListingByID(ctx, id); err != nil {
		return ansUnavailable
	}
	left := x.Quantity - x.Sold
	sku := x.SKU
	// The deduction is this request's own (as a purchase's is): a retry
	// meets it again, another withdrawal of the listing makes its own.
	// Its record is named by the count this copy read too: two copies
	// that read different counts (a resale settled between them) each
	// take their own, so the one that commits stands on exactly the
	// units it withdraws and the refused one gives all of its own back.
	// Sharing one record, the committing copy (4 units) stood on the
	// refused copy's 5, and the fifth stayed out of Redis.
	var taken []shard.Part
	holder := newHolder()
	epoch := int64(-1) // no units taken out of a gate
	gateID := withdrawGateID(r.gateID(), left)
	if x.State == ledger.Listed && left > 0 && !s.keyRecorded(ctx, sku, r) {
		st, err := s.ledger.SKU(ctx, sku)
		if err != nil {
			return ansUnavailable
		}
		// An ended sale's gate is empty and admits no one: nothing to take
		// the units out of.
		if st.EndedAt.IsZero() {
			d, err := s.deduct(ctx, shard.Request{SKU: sku, Shards: st.Shards, RequestID: gateID, Quantity: left, MaxQuantity: left, Holder: holder})
			switch {
			case errors.Is(err, stock.ErrSoldOut):
				return fail(ErrListingSelling)
			case err != nil:
				return ansUnavailable
			}
			// Found (Replayed) or taken, they are this call's to let go
			// of when it withdraws nothing: a found deduction's units go
			// back only once its other holder lets go too.
			taken = d.Parts
			// The ledger takes them out only under the gate they came out
			// of: a gate rebuilt meanwhile counts them again.
			for i, p := range d.Parts {
				if i > 0 && p.Epoch != epoch {
					s.giveBack(ctx, sku, gateID, holder, taken)
					return fail(ErrListingSelling)
				}
				epoch = p.Epoch
			}
		}
	}
	x, sold, err = s.ledger.Withdraw(ctx, id, seller, left, epoch, r.ledger())
	s.resold(ctx, sold)
	if err != nil && len(taken) > 0 && withdrawRefused(err) {
		// Nothing withdrawn: the units this call took stay on sale. Units
		// a copy of this request took (Replayed) go back once that copy
		// lets go of them too; a withdrawal that committed keeps them
		// out, and so does one whose COMMIT's outcome is unknown (its
		// reply lost): a retry with the same key finds out, and the drift
		// check puts the units back if it did not commit.
		s.giveBack(ctx, sku, gateID, holder, taken)
	}
	switch {
	case err == nil:
		s.metrics.listings.WithLabelValues("withdrawn").Add(float64(x.Withdrawn))
		s.clearSoldOut(x.SKU)
		s.stockChanged(x.SKU)
		return answer{listing: &x}
	case errors.Is(err, ledger.ErrDuplicate):
		// A copy of this request withdrew. It stands on its own record,
		// which it holds for good, so letting go of what this call took
		// moves units only when they are not the ones it stands on: a
		// record of this call's own, made after the gate was rebuilt.
		if len(taken) > 0 {
			s.giveBack(ctx, sku, gateID, holder, taken)
		}
		return answer{listing: &x, replayed: true}
	case errors.Is(err, ledger.ErrListingEnded):
		return fail(ErrListingEnded)
	case errors.Is(err, ledger.ErrListingSelling):
		return fail(ErrListingSelling)
	case errors.Is(err, ledger.ErrNotCommitted):
		// Rolled back, its units given back above: a retry with the same
		// key withdraws afresh.
		return ansUnavailable
	}
	return s.ownerError(ctx, err, fail(ErrUnknownListing))
}

// keyRecorded reports whether r's key is on record in the ledger (a
// reused key, or this request's copy): the ledger answers it from the
// record, so a withdrawal takes no units out of the gate for it. Taken,
// they were out until the ledger's 422, buyers told sold out meanwhile
// (helper-90 #2). Not known (the read failed) counts as not recorded:
// the ledger's answer stands either way, the units given back on a
// refusal.
func (s *Service) keyRecorded(ctx context.Context, sku stock.SKU, r request) bool {
	_, err := s.ledger.RequestByKey(ctx, sku.Program, r.scope, r.key)
	return err == nil
}

// withdrawGateID names a withdrawal's deduction by its request and the
// count it takes.
func withdrawGateID(id keys.ID, left int64) keys.ID {
	h := sha256.Sum256([]byte(id.String() + "\x00withdraw\x00" + strconv.FormatInt(left, 10)))
	return keys.MustID(hex.EncodeToString(h[:16]))
}

// withdrawRefused reports whether a withdrawal's error says that nothing
// was written: the ledger refused it, or it failed before COMMIT. Any
// other failure (at COMMIT, the reply lost) may have withdrawn.
func withdrawRefused(err error) bool {
	return isAny(err, ledger.ErrNotCommitted, ledger.ErrListingEnded, ledger.ErrListingSelling,
		ledger.ErrNotFound, ledger.ErrNotOwner, ledger.ErrInCart, ledger.ErrKeyReused, errLedgerBusy)
}

// ListingByID reads a listing.
func (s *Service) ListingByID(ctx context.Context, id keys.ID) (Listing, error) {
	x, err := s.ledger.ListingByID(ctx, id)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return x, ErrUnknownListing
	case err != nil:
		return x, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return x, nil
}

// settleResales settles the sales of listed units (run by the sweeper):
// each listing.sold gives up its units from the seller's order, and the
// seller's counts at the gate go with them.
func (s *Service) settleResales(ctx context.Context) {
	sold, err := s.ledger.SettleDue(ctx, 100)
	if err != nil {
		s.log.WarnContext(ctx, "settle resales", "err", err)
	}
	s.resold(ctx, sold)
}

// resold follows the listings' sales the ledger settled: each seller's
// counts at the gate for the order's request go.
func (s *Service) resold(ctx context.Context, sold []ledger.Event) {
	for _, e := range sold {
		s.metrics.listings.WithLabelValues("sold").Add(float64(e.Quantity))
		o, err := s.ledger.OrderByID(ctx, e.Order)
		if err != nil {
			continue
		}
		// The seller's counts for the order's request go, as for a
		// transfer: the gate under-counts what it keeps, never over.
		s.releaseQuota(ctx, []quotaScope{{o.SKU.Base(), o.Buyer}, {o.SKU.Whole(), o.Buyer}}, o.GateRequest(), keys.ID{})
	}
}

// resoldRefusal is a refusal for resold tickets: the order's last (the
// kind's own words), or some of them, which the ledger counts.
func resoldRefusal(err error) error {
	if detail := strings.TrimPrefix(err.Error(), ledger.ErrResold.Error()+": "); detail != err.Error() {
		return refuse(ErrOrderResold, detail)
	}
	return ErrOrderResold
}

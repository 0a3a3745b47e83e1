package sale

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// The waitlist's states as buyers see them: waiting in line, offered (a
// live offer: confirm its hold to buy), and what became of an offer or an
// entry.
const (
	WaitWaiting  = "waiting"
	WaitOffered  = "offered"
	WaitBought   = "bought"   // the offer's hold was confirmed
	WaitLapsed   = "lapsed"   // the offer expired; it passed on
	WaitDeclined = "declined" // the buyer cancelled the offer's hold
	WaitLeft     = "left"
	WaitClosed   = "closed" // still in line, but no offer will come: the sale ended, the pool closed or changed its rule, seats or a waiting room came
)

// WaitEntry is a buyer's place on a ticket's (or a pool's) waitlist.
type WaitEntry struct {
	SKU      stock.SKU
	Buyer    keys.ID
	Quantity int64
	State    string
	// Ahead is how many buyers wait before this one (waiting only).
	Ahead    int64
	OfferTTL time.Duration
	JoinedAt time.Time
	// Offer is the hold offered to the buyer, once offered.
	Offer *Hold
}

func waitEntryOf(e ledger.WaitEntry, now time.Time) WaitEntry {
	w := WaitEntry{SKU: e.SKU, Buyer: e.Buyer, Quantity: e.Quantity, State: WaitWaiting, Ahead: e.Ahead,
		OfferTTL: e.OfferTTL, JoinedAt: e.JoinedAt}
	switch e.State {
	case ledger.Waiting:
		if e.Closed {
			w.State = WaitClosed
		}
	case ledger.Left:
		w.State = WaitLeft
	case ledger.Offered:
		if e.Offer == nil {
			break
		}
		h := holdOf(*e.Offer, now)
		w.Offer = &h
		w.State = map[string]string{ledger.Held: WaitOffered, ledger.Confirmed: WaitBought,
			ledger.Expired: WaitLapsed, ledger.Cancelled: WaitDeclined}[h.State]
	}
	return w
}

// JoinWaitlist puts buyer in the line of sku (in pool; zero or public for
// the public stock) for q units. Joining is for a sold-out ticket, once
// per buyer: a buyer already waiting, or holding a live offer, gets the
// entry as it is (created false). Stock that comes back is offered in
// line order as a hold for OfferTTL. A pool whose access rule asks for a
// code or a channel has no waitlist (an offer would pass the rule by).
func (s *Service) JoinWaitlist(ctx context.Context, sku stock.SKU, pool, buyer keys.ID, q int64) (WaitEntry, bool, error) {
	p, err := s.waitSKU(ctx, sku, pool, buyer, true)
	if err != nil {
		return WaitEntry{}, false, err
	}
	if q < 1 {
		return WaitEntry{}, false, refuse(ErrInvalid, "quantity must be at least 1")
	}
	// A queued program's returns go back to its line (the pacer lets the
	// next buyers in): a waitlist would pass the room by.
	switch queued, err := s.queued(ctx, sku.Program); {
	case err != nil:
		return WaitEntry{}, false, err
	case queued:
		return WaitEntry{}, false, ErrQueuedProgram
	}
	ctx, cancel := s.detach(ctx)
	defer cancel()
	e, created, err := s.ledger.JoinWaitlist(ctx, p, buyer, q, s.opts.OfferTTL)
	switch {
	case err == nil:
		if created {
			s.metrics.waitJoins.Inc()
		}
		return waitEntryOf(e, s.now()), created, nil
	case errors.Is(err, ledger.ErrNotSoldOut):
		return WaitEntry{}, false, refuse(ErrNotSoldOut, fmt.Sprintf("%s has %d or more left: buy instead", p, q))
	case errors.Is(err, ledger.ErrSeatedWait):
		return WaitEntry{}, false, refuse(ErrSeated, "a seated ticket has no waitlist")
	case errors.Is(err, ledger.ErrQueuedWait):
		return WaitEntry{}, false, ErrQueuedProgram
	case errors.Is(err, ledger.ErrPoolClosed):
		return WaitEntry{}, false, ErrPoolClosed
	case errors.Is(err, stock.ErrSaleEnded):
		return WaitEntry{}, false, ErrSaleEnded
	case errors.Is(err, stock.ErrLimit):
		return WaitEntry{}, false, refuse(ErrLimit, "the quantity is over this buyer's cap of the ticket")
	case errors.Is(err, stock.ErrInvalid):
		return WaitEntry{}, false, refuse(ErrOverMax, "quantity over this ticket's maximum per order")
	}
	return WaitEntry{}, false, s.waitFailed(ctx, "join waitlist", p, err)
}

// LeaveWaitlist takes a waiting buyer out of the line. Leaving twice
// answers the entry; an entry with a live offer is refused (cancel the
// offer's hold to decline it).
func (s *Service) LeaveWaitlist(ctx context.Context, sku stock.SKU, pool, buyer keys.ID) (WaitEntry, error) {
	p, err := s.waitSKU(ctx, sku, pool, buyer, false)
	if err != nil {
		return WaitEntry{}, err
	}
	ctx, cancel := s.detach(ctx)
	defer cancel()
	e, err := s.ledger.LeaveWaitlist(ctx, p, buyer)
	switch {
	case err == nil:
		return waitEntryOf(e, s.now()), nil
	case errors.Is(err, ledger.ErrOffered):
		return waitEntryOf(e, s.now()), refuse(ErrWaitOffered, "the buyer has a live offer: confirm or cancel its hold "+e.HoldID.String())
	case errors.Is(err, ledger.ErrNotFound):
		return WaitEntry{}, ErrNotWaiting
	}
	return WaitEntry{}, s.waitFailed(ctx, "leave waitlist", p, err)
}

// WaitEntry reads buyer's place in sku's line (in pool).
func (s *Service) WaitEntry(ctx context.Context, sku stock.SKU, pool, buyer keys.ID) (WaitEntry, error) {
	p, err := s.waitSKU(ctx, sku, pool, buyer, false)
	if err != nil {
		return WaitEntry{}, err
	}
	e, err := s.ledger.WaitEntryOf(ctx, p, buyer)
	switch {
	case err == nil:
		return waitEntryOf(e, s.now()), nil
	case errors.Is(err, ledger.ErrNotFound):
		return WaitEntry{}, ErrNotWaiting
	}
	return WaitEntry{}, s.waitFailed(ctx, "read waitlist", p, err)
}

// waitSKU is the stock a waitlist request is about, refused when unknown,
// and a join when in a pool that is not open to all. A read or a leave of
// an entry made while the pool was open still works after its rule
// changed: the entry keeps its place (API.md), and a buyer must be able
// to leave it, or to find a live offer's hold (helper-68).
func (s *Service) waitSKU(ctx context.Context, sku stock.SKU, pool, buyer keys.ID, join bool) (stock.SKU, error) {
	if sku.IsZero() || buyer.IsZero() {
		return sku, refuse(ErrInvalid, "ids match [A-Za-z0-9_-]{1,64}")
	}
	p := poolOf(sku, pool)
	st, err := s.settings.Get(ctx, p)
	switch {
	case errors.Is(err, stock.ErrUnknownSKU) && p != sku:
		return p, ErrUnknownPool
	case errors.Is(err, stock.ErrUnknownSKU):
		return p, ErrUnknownSKU
	case err != nil:
		return p, fmt.Errorf("%w: %w", ErrUnavailable, err)
	case join && st.Rule.Access != ledger.AccessOpen:
		return p, refuse(ErrPoolDenied, "a pool sold by code or channel has no waitlist")
	}
	return p, nil
}

func (s *Service) waitFailed(ctx context.Context, what string, sku stock.SKU, err error) error {
	if errors.Is(err, stock.ErrUnknownSKU) {
		return ErrUnknownSKU
	}
	s.log.ErrorContext(ctx, what, "sku", sku.String(), "err", err)
	return refuse(ErrUnavailable, "ledger unavailable; repeat the request")
}

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

// Resale. A buyer lists some of an order's tickets; they go back on sale
// beside the SKU's public stock, and the seller's order gives them up (the
// platform refunds the seller) only once a buyer's sale takes them.
//
// A listing of q adds q to the SKU row's total and listed: the units are
// for sale again (Redis is owed them, as after a refund) while the
// seller's order still counts them in sold. A sale never needs to know
// whose units it took: total - sold - held is what is free either way.
// Which sales took listed units is settled afterwards (Settle): of the
// units sold since the settle before (the order.created and
// hold.confirmed events of the SKU), each of which can have taken only
// the units of listings begun before it, a SKU whose resale is "first"
// gives every one to its listings, oldest first; "alongside" gives them
// the share listed / (listed + public stock left). Each unit settled leaves
// total, sold and listed, the listing and the seller's order in one
// transaction, with a listing.sold event to refund the seller by. So a
// seller is refunded only for units a buyer's committed sale took, each
// once. A withdrawal takes the unsold units back off sale while the
// SKU's free stock still has them (not while held or being bought).

// Resale modes of a SKU.
const (
	ResaleFirst     = "first"     // listings sell before public stock
	ResaleAlongside = "alongside" // listings sell beside it, by their share
)

// Listing states.
const (
	Listed    = "listed"
	Sold      = "sold"
	Withdrawn = "withdrawn"
)

// Events of listings.
const (
	EventListingCreated   = "listing.created"   // Subject listing, Order the seller's order
	EventListingSold      = "listing.sold"      // Quantity of the listing sold: refund the seller
	EventListingWithdrawn = "listing.withdrawn" // Quantity taken off sale
)

var (
	// ErrListed: the order has tickets listed for resale; withdraw the
	// listing first (a refund, a transfer of them).
	ErrListed = errors.New("ledger: order has tickets listed for resale")
	// ErrListingEnded: the listing sold out or was withdrawn.
	ErrListingEnded = errors.New("ledger: listing ended")
	// ErrListingSelling: the listing's units are held or being bought
	// right now; withdraw again later.
	ErrListingSelling = errors.New("ledger: listing's units are being sold")
	// ErrResold: every ticket of the order was resold to other buyers
	// (listing.sold events tell the seller's money): nothing is left to
	// refund, transfer or list.
	ErrResold = errors.New("ledger: order resold")
	// ErrPoolResale: a pool's tickets are not listed (a pool's total moves
	// at every change of its allotment and at its close).
	ErrPoolResale = errors.New("ledger: a pool's tickets are not listed for resale")
)

// Listing is tickets of an order on sale again.
type Listing struct {
	ID       keys.ID
	SKU      stock.SKU
	OrderID  keys.ID
	Seller   keys.ID
	Quantity int64
	Sold     int64 // settled to buyers' sales so far
	State    string
	// Withdrawn is the units taken off sale by a withdrawal.
	Withdrawn int64
	CreatedAt time.Time
	EndedAt   time.Time
}

const selectListing = `SELECT id, program, ticket, order_id, seller, quantity, sold, withdrawn, state, created_at, ended_at FROM listings`

func scanListing(r rowScanner) (Listing, error) {
	var x Listing
	var created, ended int64
	err := r.Scan(&x.ID, &x.SKU.Program, &x.SKU.Ticket, &x.OrderID, &x.Seller, &x.Quantity, &x.Sold, &x.Withdrawn, &x.State, &created, &ended)
	if errors.Is(err, sql.ErrNoRows) {
		return x, ErrNotFound
	}
	x.CreatedAt, x.EndedAt = fromMS(created), fromMS(ended)
	return x, err
}

// ListingByID reads a listing, or ErrNotFound.
func (l *Ledger) ListingByID(ctx context.Context, id keys.ID) (Listing, error) {
	x, err := scanListing(l.db.QueryRowContext(ctx, selectListing+` WHERE id = $1`, id))
	if err != nil && !errors.Is(err, ErrNotFound) {
		return x, fmt.Errorf("ledger: listing: %w", err)
	}
	return x, err
}

// retried runs f again when PostgreSQL rolled it back for a deadlock or a
// serialization failure (resale locks a SKU row before orders; refunds
// lock an order before its SKU row).
func retried[T any](f func() (T, error)) (T, error) {
	for i := 0; ; i++ {
		v, err := f()
		if err == nil || i == 2 || !isRetryable(err) {
			return v, err
		}
	}
}

// List puts q of an order's tickets on sale again, once per request: the
// SKU's total and listed grow by q, and Redis is owed the units (the
// listing's restore). The order must be the seller's, not refunded, not a
// cart's line (ErrInCart), not of seats (ErrSeatedTake), with q of its
// tickets not listed already (stock.ErrInvalid), not a pool's
// (ErrPoolResale); an ended sale refuses
// (stock.ErrSaleEnded). A retry answers the same listing (ErrDuplicate).
func (l *Ledger) List(ctx context.Context, orderID, seller keys.ID, q int64, req Request) (Listing, error) {
	return retried(func() (Listing, error) { return l.list(ctx, orderID, seller, q, req) })
}

func (l *Ledger) list(ctx context.Context, orderID, seller keys.ID, q int64, req Request) (_ Listing, err error) {
	defer l.observe("list", time.Now(), &err)
	if q < 1 {
		return Listing{}, fmt.Errorf("%w: list %d", stock.ErrInvalid, q)
	}
	now := l.now().UTC().Truncate(time.Millisecond)
	o, err := l.OrderByID(ctx, orderID)
	if err != nil {
		return Listing{}, err
	}
	tx, taken, err := l.begin(ctx, req, o.SKU, now, "list")
	if taken {
		x, err := l.listingReplay(ctx, req)
		if errors.Is(err, ErrKeyReused) && o.Buyer != seller {
			// As a transfer's (Ledger.transfer): another's order is told
			// as such.
			return Listing{}, ErrNotOwner
		}
		return x, err
	}
	if err != nil {
		return Listing{}, err
	}
	defer tx.Rollback()
	// The SKU row first, as a sale locks it, then the order.
	var total, ended, seated, epoch, skuListed int64
	var shards int
	if err := tx.QueryRowContext(ctx, `SELECT total, ended_at, seated, gate_epoch, shards, listed FROM skus WHERE program = $1 AND ticket = $2`+l.forUpdate(),
		o.SKU.Program, o.SKU.Ticket).Scan(&total, &ended, &seated, &epoch, &shards, &skuListed); err != nil {
		return Listing{}, notCommitted("list: sku", err)
	}
	if err := l.lockRows(ctx, tx, l.sql.lockOrders, []keys.ID{orderID}); err != nil {
		return Listing{}, err
	}
	listed, err := orderListed(ctx, tx, orderID)
	if err != nil {
		return Listing{}, err
	}
	if o, err = orderWithUnits(ctx, tx, orderID); err != nil {
		return Listing{}, err
	}
	if err := listRefusal(ctx, tx, o, seller, q, listed, seated != 0, ended != 0); err != nil {
		return Listing{}, err
	}
	x := Listing{ID: NewIDOf(o.SKU), SKU: o.SKU, OrderID: o.ID, Seller: seller, Quantity: q, State: Listed, CreatedAt: now}
	// The listing begins at the newest event (the SKU's sales wait on its
	// row, locked above): the sales after it may take its units, none
	// before (settleIn).
	var since int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) FROM events`).Scan(&since); err != nil {
		return Listing{}, notCommitted("list: since", err)
	}
	if err := priorHolds(ctx, tx, o.SKU, since, skuListed == 0); err != nil {
		return Listing{}, err
	}
	// The settle mark starts at the listing when the SKU had nothing
	// listed: sales before it are not resales.
	if _, err := tx.ExecContext(ctx, `UPDATE skus SET total = total + $3, listed = listed + $3, version = version + 1, updated_at = $4,
		resale_seq = CASE WHEN listed = 0 THEN $5 ELSE resale_seq END,
		resale_carry = CASE WHEN listed = 0 THEN 0 ELSE resale_carry END
		WHERE program = $1 AND ticket = $2`, o.SKU.Program, o.SKU.Ticket, q, now.UnixMilli(), since); err != nil {
		return Listing{}, notCommitted("list: sku", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO order_listings (order_id, listed) VALUES ($1, $2)
		ON CONFLICT (order_id) DO UPDATE SET listed = order_listings.listed + excluded.listed`, o.ID, q); err != nil {
		return Listing{}, notCommitted("list: order", err)
	}
	// Redis is owed the units, at the gate of this epoch (a gate rebuilt
	// later counts them from the row's total).
	if _, err := tx.ExecContext(ctx, `INSERT INTO listings (id, program, ticket, order_id, seller, quantity, state, created_at,
		restore_pending, restore_epoch, restore_shards, since_seq) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		x.ID, o.SKU.Program, o.SKU.Ticket, o.ID, seller, q, Listed, now.UnixMilli(), owedUnits, epoch, shards, since); err != nil {
		return Listing{}, notCommitted("list", err)
	}
	if err := emit(ctx, tx, now, Event{Type: EventListingCreated, SKU: o.SKU, Subject: x.ID, Order: o.ID, Buyer: seller, Quantity: q}); err != nil {
		return Listing{}, err
	}
	if err := finishListing(ctx, tx, req, x); err != nil {
		return Listing{}, err
	}
	if err := tx.Commit(); err != nil {
		return Listing{}, fmt.Errorf("ledger: list: commit: %w", err)
	}
	return x, nil
}

// priorHolds records, in tx, the holds of sku held now as held when a
// listing began at since: their units were taken before, so a confirm
// later sells none of this listing's, nor a later one's (settleIn). At
// the first listing (the SKU had nothing listed) they are held from
// before every listing (resale_prior_holds, as builds before step 11
// record them), and those of the listings before, all ended, are
// cleared; at a later one, the first listing begun while each was held
// stays (resale_listing_holds, ON CONFLICT keeps it).
func priorHolds(ctx context.Context, tx *sql.Tx, sku stock.SKU, since int64, first bool) error {
	if first {
		for _, q := range []string{`DELETE FROM resale_prior_holds WHERE program = $1 AND ticket = $2`,
			`DELETE FROM resale_listing_holds WHERE program = $1 AND ticket = $2`} {
			if _, err := tx.ExecContext(ctx, q, sku.Program, sku.Ticket); err != nil {
				return notCommitted("list: prior holds", err)
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO resale_prior_holds (hold_id, program, ticket)
			SELECT id, program, ticket FROM holds WHERE program = $1 AND ticket = $2 AND state = $3`, sku.Program, sku.Ticket, Held); err != nil {
			return notCommitted("list: prior holds", err)
		}
		return nil
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO resale_listing_holds (hold_id, program, ticket, since_seq)
		SELECT id, program, ticket, $4 FROM holds WHERE program = $1 AND ticket = $2 AND state = $3
			AND NOT EXISTS (SELECT 1 FROM resale_prior_holds p WHERE p.hold_id = holds.id)
		ON CONFLICT (hold_id) DO NOTHING`, sku.Program, sku.Ticket, Held, since); err != nil {
		return notCommitted("list: prior holds", err)
	}
	return nil
}

// listRefusal is why order o (locked, listed units already on sale)
// cannot have q more listed by seller, or nil.
func listRefusal(ctx context.Context, tx *sql.Tx, o Order, seller keys.ID, q, listed int64, seated, ended bool) error {
	switch {
	case o.Buyer != seller:
		return ErrNotOwner
	case !o.CartID.IsZero():
		return ErrInCart
	case !o.RefundedAt.IsZero():
		return endedAs(ctx, tx, o.ID)
	case len(o.SeatIDs) > 0 || seated:
		return fmt.Errorf("%w: seats are not listed for resale", ErrSeatedTake)
	case !o.SKU.Pool().IsZero():
		return ErrPoolResale
	case ended:
		return stock.ErrSaleEnded
	case q > o.Quantity-listed:
		return overStanding(o, q, o.Quantity-listed)
	}
	return nil
}

// finishListing records a listing request's answer: the listing x as
// answered, which a replay answers again.
func finishListing(ctx context.Context, tx *sql.Tx, r Request, x Listing) error {
	if r.IsZero() {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE requests SET result = $3 WHERE scope = $1 AND idem_key = $2`,
		r.Scope, r.Key, encodeListing(x)); err != nil {
		return notCommitted("request answer", err)
	}
	return nil
}

// listingReplay answers a listing request committed before: the listing
// as it is now, with ErrDuplicate.
func (l *Ledger) listingReplay(ctx context.Context, r Request) (Listing, error) {
	rec, err := l.replayOf(ctx, r)
	if errors.Is(err, ErrDuplicate) && rec.Listing.IsZero() {
		return Listing{}, fmt.Errorf("%w: key was used for a %s", ErrKeyReused, rec.Op)
	}
	if rec.Listing.IsZero() {
		return Listing{}, err
	}
	if rec.ListingAt != nil {
		return *rec.ListingAt, err // same key, same answer
	}
	x, lerr := l.ListingByID(ctx, rec.Listing)
	if lerr != nil {
		return x, lerr
	}
	return x, err
}

// Withdraw takes a listing's unsold units off sale, once per request:
// the sales so far are settled first, then total and listed lose the rest
// while the SKU's free stock has them (ErrListingSelling when they are
// held or bought right now, nothing changed). expect is the unsold units
// the caller took out of Redis for it: a withdrawal that finds another
// count (sold meanwhile) changes nothing and says so (ErrListingSelling).
// epoch is the gate epoch the caller took them out under (-1: none, the
// sale ended): a gate rebuilt since counts them again from this ledger,
// so the withdrawal changes nothing then either (ErrListingSelling).
// A listing sold out or withdrawn is ErrListingEnded; a retry answers the
// same listing (ErrDuplicate).
//
// settled are the sales of the SKU's listings the call settled on its
// way (whatever it answers): the caller follows them as it does
// Settle's, or their sellers' counts at the gate never went (helper-49).
func (l *Ledger) Withdraw(ctx context.Context, listingID, seller keys.ID, expect, epoch int64, req Request) (_ Listing, settled []Event, _ error) {
	x, err := retried(func() (Listing, error) { return l.withdraw(ctx, listingID, seller, expect, epoch, req, &settled) })
	return x, settled, err
}

func (l *Ledger) withdraw(ctx context.Context, listingID, seller keys.ID, expect, epoch int64, req Request, settled *[]Event) (_ Listing, err error) {
	defer l.observe("withdraw", time.Now(), &err)
	now := l.now().UTC().Truncate(time.Millisecond)
	// Every failure before its COMMIT says ErrNotCommitted, unless it is a
	// refusal: the caller took the unsold units out of the gate first,
	// and gives them back only when it knows nothing was withdrawn. A read
	// or settle that failed before the withdrawal began (a link reset, the
	// request's time out) kept them out of Redis while the ledger still
	// had them on sale (helper-90 #1).
	x, err := l.ListingByID(ctx, listingID)
	if err != nil {
		return x, beforeCommit("withdraw: listing", err)
	}
	tx, taken, err := l.begin(ctx, req, x.SKU, now, "withdraw")
	if taken {
		return l.listingReplay(ctx, req)
	}
	if err != nil {
		return x, err
	}
	defer tx.Rollback()
	// Every sale so far settles first, under the withdrawal's lock; they
	// stand whatever the withdrawal answers (refuse).
	inTx, err := l.settleIn(ctx, tx, x.SKU, now, 0)
	if err != nil {
		return x, beforeCommit("withdraw: settle", err)
	}
	if x, err = scanListing(tx.QueryRowContext(ctx, selectListing+` WHERE id = $1`, listingID)); err != nil {
		return x, beforeCommit("withdraw: listing", err)
	}
	// A refusal rolls back the settle above with it; what that settle sold
	// (the listing sold out, or fewer left than the caller took out of
	// the gate) is settled again on its own before the answer goes, or
	// the answer told of sales the ledger did not have yet: listing-ended
	// while a unit was still listed (the concurrent model, once this
	// settle counted the sales of the last moment too).
	// That settle may not come out the same (a hold from before the
	// listings ended meanwhile grows an alongside share's whole), so the
	// answer is read from what it committed (helper-108): sold out or
	// withdrawn, ended; else selling, to try again.
	refuse := func(why error) (Listing, error) {
		if len(inTx) == 0 || errors.Is(why, ErrNotOwner) {
			return x, why
		}
		_ = tx.Rollback()
		again, err := l.settle(ctx, x.SKU, 0)
		*settled = append(*settled, again...)
		if err != nil {
			return x, beforeCommit("withdraw: settle", err)
		}
		if x, err = l.ListingByID(ctx, listingID); err != nil {
			return x, beforeCommit("withdraw: listing", err)
		}
		if x.State != Listed {
			return x, ErrListingEnded
		}
		return x, fmt.Errorf("%w: %d unsold, not %d", ErrListingSelling, x.Quantity-x.Sold, expect)
	}
	left := x.Quantity - x.Sold
	switch {
	case x.Seller != seller:
		return refuse(ErrNotOwner)
	case x.State != Listed:
		return refuse(ErrListingEnded)
	case left != expect:
		return refuse(fmt.Errorf("%w: %d unsold, not %d", ErrListingSelling, left, expect))
	}
	// An alongside share's carried fraction was the listed units' as a
	// whole: the withdrawn ones take their part of it with them. Left,
	// it went to the listings that stay, which sold sooner than their
	// share (helper-101).
	res, err := tx.ExecContext(ctx, `UPDATE skus SET total = total - $3, listed = listed - $3, version = version + 1, updated_at = $4,
		resale_carry = CASE WHEN listed > $3 THEN resale_carry * (listed - $3) / listed ELSE 0 END
		WHERE program = $1 AND ticket = $2 AND total - $3 - sold - held >= 0 AND listed >= $3 AND ($5 < 0 OR gate_epoch = $5)`,
		x.SKU.Program, x.SKU.Ticket, left, now.UnixMilli(), epoch)
	if err != nil {
		return x, notCommitted("withdraw: sku", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return refuse(ErrListingSelling)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE listings SET state = $2, withdrawn = $3, ended_at = $4 WHERE id = $1`,
		x.ID, Withdrawn, left, now.UnixMilli()); err != nil {
		return x, notCommitted("withdraw", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE order_listings SET listed = listed - $2 WHERE order_id = $1`, x.OrderID, left); err != nil {
		return x, notCommitted("withdraw: order", err)
	}
	if err := emit(ctx, tx, now, Event{Type: EventListingWithdrawn, SKU: x.SKU, Subject: x.ID, Order: x.OrderID, Buyer: seller, Quantity: left}); err != nil {
		return x, err
	}
	x.State, x.Withdrawn, x.EndedAt = Withdrawn, left, now
	if err := finishListing(ctx, tx, req, x); err != nil {
		return x, err
	}
	if err := tx.Commit(); err != nil {
		return x, fmt.Errorf("ledger: withdraw: commit: %w", err)
	}
	*settled = append(*settled, inTx...)
	return x, nil
}

// beforeCommit is err, of step, from before a transaction's COMMIT: a
// refusal as it is, anything else ErrNotCommitted.
func beforeCommit(step string, err error) error {
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotCommitted) {
		return err
	}
	return notCommitted(step, err)
}

// endedAs is the error for an order that no longer stands, read in tx
// (which holds the order's row): ErrResold when its last units were
// resold, else ErrRefunded.
func endedAs(ctx context.Context, tx *sql.Tx, orderID keys.ID) error {
	var out int64
	err := tx.QueryRowContext(ctx, `SELECT COALESCE((SELECT resold_out FROM order_listings WHERE order_id = $1), 0)`, orderID).Scan(&out)
	switch {
	case err != nil:
		return notCommitted("order units", err)
	case out != 0:
		return ErrResold
	}
	return ErrRefunded
}

// orderListed is what an order has listed and not sold, read in tx (which
// holds the order's row: whoever changes it holds that row too).
func orderListed(ctx context.Context, tx *sql.Tx, orderID keys.ID) (int64, error) {
	var n int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE((SELECT listed FROM order_listings WHERE order_id = $1), 0)`, orderID).Scan(&n); err != nil {
		return 0, notCommitted("listed units", err)
	}
	return n, nil
}

// ResaleHorizon is how old a sale's event must be before the sweeper's
// settle (SettleDue) counts it: on PostgreSQL an event's seq is taken
// before its transaction commits, so one with a lower seq than the newest
// may still appear for a moment. That settle counts the sales below the
// first one inside the horizon, never one above it (the mark would pass
// it by). Every writer of a sale's event locks the SKU's row first, as a
// settle does, so this is a margin: a withdrawal's settle (Settle)
// counts every sale, the newest too.
const ResaleHorizon = 2 * time.Second

// ValidResale reports a resale mode a SKU takes ("" keeps the current).
func ValidResale(mode string) bool {
	return mode == "" || mode == ResaleFirst || mode == ResaleAlongside
}

package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"sync"
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
// hold.confirmed events of the SKU), a SKU whose resale is "first" gives
// every one to its listings, oldest first; "alongside" gives them the
// share listed / (listed + public stock left). Each unit settled leaves
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
	if skuListed == 0 {
		// The holds live now took public stock before any listing: their
		// confirms later are no resales (settleIn).
		if _, err := tx.ExecContext(ctx, `DELETE FROM resale_prior_holds WHERE program = $1 AND ticket = $2`, o.SKU.Program, o.SKU.Ticket); err != nil {
			return Listing{}, notCommitted("list: prior holds", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO resale_prior_holds (hold_id, program, ticket)
			SELECT id, program, ticket FROM holds WHERE program = $1 AND ticket = $2 AND state = $3`, o.SKU.Program, o.SKU.Ticket, Held); err != nil {
			return Listing{}, notCommitted("list: prior holds", err)
		}
	}
	// The settle mark starts at the newest event when the SKU had nothing
	// listed: sales before the listing are not resales.
	if _, err := tx.ExecContext(ctx, `UPDATE skus SET total = total + $3, listed = listed + $3, version = version + 1, updated_at = $4,
		resale_seq = CASE WHEN listed = 0 THEN COALESCE((SELECT MAX(seq) FROM events), 0) ELSE resale_seq END,
		resale_carry = CASE WHEN listed = 0 THEN 0 ELSE resale_carry END
		WHERE program = $1 AND ticket = $2`, o.SKU.Program, o.SKU.Ticket, q, now.UnixMilli()); err != nil {
		return Listing{}, notCommitted("list: sku", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO order_listings (order_id, listed) VALUES ($1, $2)
		ON CONFLICT (order_id) DO UPDATE SET listed = order_listings.listed + excluded.listed`, o.ID, q); err != nil {
		return Listing{}, notCommitted("list: order", err)
	}
	// Redis is owed the units, at the gate of this epoch (a gate rebuilt
	// later counts them from the row's total).
	if _, err := tx.ExecContext(ctx, `INSERT INTO listings (id, program, ticket, order_id, seller, quantity, state, created_at,
		restore_pending, restore_epoch, restore_shards) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		x.ID, o.SKU.Program, o.SKU.Ticket, o.ID, seller, q, Listed, now.UnixMilli(), owedUnits, epoch, shards); err != nil {
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
	// The sales so far settle in a transaction of their own, so they stand
	// whatever the withdrawal answers (it settles again under its own lock
	// for any that came of age meanwhile).
	sold, err := l.settle(ctx, x.SKU)
	*settled = append(*settled, sold...)
	if err != nil {
		return x, beforeCommit("withdraw: settle", err)
	}
	tx, taken, err := l.begin(ctx, req, x.SKU, now, "withdraw")
	if taken {
		return l.listingReplay(ctx, req)
	}
	if err != nil {
		return x, err
	}
	defer tx.Rollback()
	inTx, err := l.settleIn(ctx, tx, x.SKU, now)
	if err != nil {
		return x, beforeCommit("withdraw: settle", err)
	}
	if x, err = scanListing(tx.QueryRowContext(ctx, selectListing+` WHERE id = $1`, listingID)); err != nil {
		return x, beforeCommit("withdraw: listing", err)
	}
	left := x.Quantity - x.Sold
	switch {
	case x.Seller != seller:
		return x, ErrNotOwner
	case x.State != Listed:
		return x, ErrListingEnded
	case left != expect:
		return x, fmt.Errorf("%w: %d unsold, not %d", ErrListingSelling, left, expect)
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
		return x, ErrListingSelling
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

// ResaleHorizon is how old a sale's event must be before a settle counts
// it: on PostgreSQL an event's seq is taken before its transaction
// commits, so one with a lower seq than the newest may still appear for a
// moment. A settle counts the sales below the first one inside the
// horizon, never one above it (the mark would pass it by).
const ResaleHorizon = 2 * time.Second

// SettleDue settles the sales of up to limit SKUs with units listed (see
// the top of this file), and returns the listings' sales it settled. The
// SKUs are taken in turn, each call going on from where the one before
// stopped: by last change, the SKUs with nothing to settle (a quiet
// listing leaves its row as it was) stayed first in line, and more of
// them than a call takes held up every other SKU's settles for good
// (helper-65).
func (l *Ledger) SettleDue(ctx context.Context, limit int) ([]Event, error) {
	skus, err := l.settled.next(ctx, l.db, limit)
	if err != nil {
		return nil, err
	}
	// A SKU that fails does not hold up the others behind it.
	var out []Event
	var errs []error
	for _, sku := range skus {
		got, err := retried(func() ([]Event, error) { return l.settle(ctx, sku) })
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", sku, err))
			continue
		}
		out = append(out, got...)
	}
	return out, errors.Join(errs...)
}

// settleCursor is the SKU a round of SettleDue calls last took (zero: the
// round starts over).
type settleCursor struct {
	mu    sync.Mutex
	after stock.SKU
}

// next is the next up to limit SKUs with units listed, after c's in the
// order of their keys and then from the first, and moves c past them.
func (c *settleCursor) next(ctx context.Context, db *sql.DB, limit int) ([]stock.SKU, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	skus, err := listedSKUs(ctx, db, `AND (program > $2 OR program = $2 AND ticket > $3)`, limit, c.after)
	if err != nil {
		return nil, err
	}
	if len(skus) < limit && !c.after.Program.IsZero() {
		// Round the end: the first ones again, up to where this call began.
		first, err := listedSKUs(ctx, db, `AND (program < $2 OR program = $2 AND ticket <= $3)`, limit-len(skus), c.after)
		if err != nil {
			return nil, err
		}
		skus = append(skus, first...)
	}
	c.after = stock.SKU{}
	if len(skus) > 0 {
		c.after = skus[len(skus)-1]
	}
	return skus, nil
}

// listedSKUs is up to limit SKUs with units listed, in key order, that
// also meet where (of $2, $3: from's program and ticket).
func listedSKUs(ctx context.Context, db *sql.DB, where string, limit int, from stock.SKU) ([]stock.SKU, error) {
	rows, err := db.QueryContext(ctx, `SELECT program, ticket FROM skus WHERE listed > 0 `+where+` ORDER BY program, ticket LIMIT $1`,
		limit, from.Program.String(), from.Ticket.String())
	if err != nil {
		return nil, fmt.Errorf("ledger: listed skus: %w", err)
	}
	defer rows.Close()
	var skus []stock.SKU
	for rows.Next() {
		var s stock.SKU
		if err := rows.Scan(&s.Program, &s.Ticket); err != nil {
			return nil, fmt.Errorf("ledger: listed skus: %w", err)
		}
		skus = append(skus, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: listed skus: %w", err)
	}
	return skus, nil
}

// Settle settles sku's sales to its listings now, as SettleDue does for
// every SKU with units listed, and returns the listings' sales it settled.
func (l *Ledger) Settle(ctx context.Context, sku stock.SKU) ([]Event, error) {
	return retried(func() ([]Event, error) { return l.settle(ctx, sku) })
}

func (l *Ledger) settle(ctx context.Context, sku stock.SKU) (_ []Event, err error) {
	defer l.observe("settle", time.Now(), &err)
	now := l.now().UTC().Truncate(time.Millisecond)
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, notCommitted("settle: begin", err)
	}
	defer tx.Rollback()
	// Committed even when no listing sold: the mark (and an alongside
	// share's fraction) moves past the sales counted.
	events, err := l.settleIn(ctx, tx, sku, now)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("ledger: settle: commit: %w", err)
	}
	return events, nil
}

// settleIn settles sku's sales to its listings inside tx (its SKU row
// locked first): the units the SKU sold since its mark, older than
// ResaleHorizon, go to the open listings oldest first, as its resale mode
// says; each leaves total, sold and listed, and its seller's order.
func (l *Ledger) settleIn(ctx context.Context, tx *sql.Tx, sku stock.SKU, now time.Time) ([]Event, error) {
	var total, sold, held, listed, mark, carry int64
	var mode string
	err := tx.QueryRowContext(ctx, `SELECT total, sold, held, listed, resale_seq, resale, resale_carry FROM skus WHERE program = $1 AND ticket = $2`+l.forUpdate(),
		sku.Program, sku.Ticket).Scan(&total, &sold, &held, &listed, &mark, &mode, &carry)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, notCommitted("settle: sku", err)
	}
	if listed == 0 {
		return nil, nil
	}
	// A hold's confirm is a sale of the listings only when the hold was
	// taken while they were listed: one taken before took public stock.
	// Only the sales below the first one inside the horizon count: seq
	// and created_at (each replica's clock, taken before the commit) are
	// not in the same order, and the mark moves past every sale counted.
	var units, last int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(SUM(CASE WHEN type = $3 OR NOT EXISTS (SELECT 1 FROM resale_prior_holds p
		WHERE p.hold_id = events.subject) THEN quantity ELSE 0 END), 0), COALESCE(MAX(seq), $4) FROM events
		WHERE program = $1 AND ticket = $2 AND seq > $4 AND type IN ($3, $6) AND seq < COALESCE((SELECT MIN(n.seq) FROM events n
			WHERE n.program = $1 AND n.ticket = $2 AND n.seq > $4 AND n.type IN ($3, $6) AND n.created_at > $5), $7)`,
		sku.Program, sku.Ticket, EventOrderCreated, mark, now.Add(-ResaleHorizon).UnixMilli(), EventHoldConfirmed, int64(math.MaxInt64)).Scan(&units, &last); err != nil {
		return nil, notCommitted("settle: sales", err)
	}
	// What was for sale before those sales leaves out the units of holds
	// taken before the listings: their confirms are never counted above,
	// so counted in the share's whole they shrank it for good (an
	// "alongside" listing whose units a buyer took was never settled,
	// helper-65).
	var prior int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(SUM(h.quantity), 0) FROM resale_prior_holds p JOIN holds h ON h.id = p.hold_id
		WHERE p.program = $1 AND p.ticket = $2 AND h.state = $3`, sku.Program, sku.Ticket, Held).Scan(&prior); err != nil {
		return nil, notCommitted("settle: prior holds", err)
	}
	n, carry := resold(mode, units, listed, total-sold+units-prior, carry)
	// The listed units left unsold must be somewhere: in the free stock,
	// in a hold taken since the listings, or taken by a sale not counted
	// yet (inside the horizon). Those that are nowhere were sold: a
	// share's rounding, or a listing stuck by an older settle, never
	// leaves them listed (withdraw needs them free, so it refused them
	// for good).
	if free := total - sold - held; listed-n > free {
		recent, err := recentSales(ctx, tx, sku, last)
		if err != nil {
			return nil, err
		}
		heldSince := held - prior
		if least := min(listed, listed-free-heldSince-recent); least > n {
			n, carry = least, 0
		}
	}
	if n == 0 && last == mark {
		return nil, nil
	}
	rows, err := tx.QueryContext(ctx, selectListing+` WHERE program = $1 AND ticket = $2 AND state = $3 ORDER BY created_at, id`,
		sku.Program, sku.Ticket, Listed)
	if err != nil {
		return nil, notCommitted("settle: listings", err)
	}
	var open []Listing
	for rows.Next() {
		x, err := scanListing(rows)
		if err != nil {
			rows.Close()
			return nil, notCommitted("settle: listings", err)
		}
		open = append(open, x)
	}
	rows.Close()
	var events []Event
	var done int64
	for _, x := range open {
		y := min(n-done, x.Quantity-x.Sold)
		if y <= 0 {
			break
		}
		done += y
		state, ended := Listed, int64(0)
		if x.Sold+y == x.Quantity {
			state, ended = Sold, now.UnixMilli()
		}
		if _, err := tx.ExecContext(ctx, `UPDATE listings SET sold = sold + $2, state = $3, ended_at = $4 WHERE id = $1`,
			x.ID, y, state, ended); err != nil {
			return nil, notCommitted("settle: listing", err)
		}
		// An order keeps at least one ticket (quantity > 0): one whose
		// every ticket is resold is given up whole, as refunded (its
		// listing.sold events are the refund; no stock comes back).
		if _, err := tx.ExecContext(ctx, `UPDATE orders SET quantity = CASE WHEN quantity > $2 THEN quantity - $2 ELSE quantity END,
			refunded_at = CASE WHEN quantity > $2 THEN refunded_at ELSE $3 END WHERE id = $1`, x.OrderID, y, now.UnixMilli()); err != nil {
			return nil, notCommitted("settle: order", err)
		}
		// The order's units: y leave listed for resold; an order given up
		// whole is resold out, so its refunded_at is told as no refund.
		if _, err := tx.ExecContext(ctx, `UPDATE order_listings SET listed = listed - $2, resold = resold + $2,
			resold_out = CASE WHEN (SELECT refunded_at FROM orders WHERE id = $1) > 0 THEN 1 ELSE resold_out END
			WHERE order_id = $1`, x.OrderID, y); err != nil {
			return nil, notCommitted("settle: order", err)
		}
		if err := uncountBuyer(ctx, tx, sku, x.Seller, y); err != nil {
			return nil, err
		}
		events = append(events, Event{Type: EventListingSold, SKU: sku, Subject: x.ID, Order: x.OrderID, Buyer: x.Seller, Quantity: y})
	}
	if _, err := tx.ExecContext(ctx, `UPDATE skus SET total = total - $3, sold = sold - $3, listed = listed - $3, resale_seq = $4,
		resale_carry = $6, version = version + 1, updated_at = $5 WHERE program = $1 AND ticket = $2`,
		sku.Program, sku.Ticket, done, last, now.UnixMilli(), carry); err != nil {
		return nil, notCommitted("settle: sku", err)
	}
	if err := emit(ctx, tx, now, events...); err != nil {
		return nil, err
	}
	return events, nil
}

// recentSales is the units of sku's sales above seq after (inside the
// horizon, not counted yet), read in tx (which holds the SKU row); a
// confirm of a hold taken before the listings is none.
func recentSales(ctx context.Context, tx *sql.Tx, sku stock.SKU, after int64) (int64, error) {
	var recent int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(SUM(quantity), 0) FROM events WHERE program = $1 AND ticket = $2 AND seq > $3
		AND (type = $4 OR type = $5 AND NOT EXISTS (SELECT 1 FROM resale_prior_holds p WHERE p.hold_id = events.subject))`,
		sku.Program, sku.Ticket, after, EventOrderCreated, EventHoldConfirmed).Scan(&recent); err != nil {
		return 0, notCommitted("settle: recent sales", err)
	}
	return recent, nil
}

// resold is how many of units sold go to listings of listed units, free
// being what was for sale before those sales (the listed units with the
// public stock, holds included): "first" all of them; "alongside" their
// share listed / free in whole units, the fraction left over (carry, in
// carryUnit parts of a unit) added to the next settle's share, so that
// settles of a sale or two each add up as one settle of them all would.
// Never more than is listed. No sale counted keeps the fraction as it
// was: a settle that counted only the confirm of a hold from before the
// listings threw it away, and the listing sold later than its share.
func resold(mode string, units, listed, free, carry int64) (n, left int64) {
	if units <= 0 {
		return 0, carry
	}
	most := min(units, listed)
	if mode != ResaleAlongside || free <= 0 {
		return most, 0
	}
	share := float64(units)*float64(listed)/float64(free) + float64(carry)/carryUnit
	n = int64(share)
	left = int64(math.Round((share - float64(n)) * carryUnit))
	if left >= carryUnit {
		n, left = n+1, left-carryUnit
	}
	if n >= most {
		return most, 0
	}
	return n, left
}

// carryUnit is the parts of a unit an alongside share's fraction is kept
// in between settles.
const carryUnit = 1_000_000

// ValidResale reports a resale mode a SKU takes ("" keeps the current).
func ValidResale(mode string) bool {
	return mode == "" || mode == ResaleFirst || mode == ResaleAlongside
}

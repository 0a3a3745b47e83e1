package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/stockgate/stockgate/stock"
)

// Settling resale: which buyers' sales took listed units (see resale.go).

// SettleDue settles the sales of up to limit SKUs with units listed (see
// the top of resale.go), and returns the listings' sales it settled. The
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
		got, err := retried(func() ([]Event, error) { return l.settle(ctx, sku, ResaleHorizon) })
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
// every SKU with units listed, and returns the listings' sales it
// settled. It counts every sale committed, the newest ResaleHorizon's
// too: a withdrawal's settle, it tells the seller what sold before the
// rest comes off sale. Left to the sweeper, a sale made just before a
// withdrawal counted as public ("first" says every one made while
// listed is a resale), and one a buyer then listed again sold that
// buyer's listing (helper-106 #4).
func (l *Ledger) Settle(ctx context.Context, sku stock.SKU) ([]Event, error) {
	return retried(func() ([]Event, error) { return l.settle(ctx, sku, 0) })
}

// settle settles sku's sales older than horizon, in a transaction of its
// own (settleIn).
func (l *Ledger) settle(ctx context.Context, sku stock.SKU, horizon time.Duration) (_ []Event, err error) {
	defer l.observe("settle", time.Now(), &err)
	now := l.now().UTC().Truncate(time.Millisecond)
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, notCommitted("settle: begin", err)
	}
	defer tx.Rollback()
	// Committed even when no listing sold: the mark (and an alongside
	// share's fraction) moves past the sales counted.
	events, err := l.settleIn(ctx, tx, sku, now, horizon)
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
// horizon, go to the open listings begun before them, oldest first,
// as its resale mode says (resaleShares); each leaves total, sold and
// listed, and its seller's order. With the row locked, every sale of
// the SKU whose event exists has committed (each writer of one locks the
// row first), so a horizon of 0 skips none.
func (l *Ledger) settleIn(ctx context.Context, tx *sql.Tx, sku stock.SKU, now time.Time, horizon time.Duration) ([]Event, error) {
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
	open, err := openListings(ctx, tx, sku)
	if err != nil || len(open) == 0 {
		return nil, err
	}
	sales, last, err := settleSales(ctx, tx, sku, mark, now, horizon)
	if err != nil {
		return nil, err
	}
	// What was for sale before those sales leaves out the units of holds
	// taken before every open listing: their confirms are never counted,
	// so counted in the share's whole they shrank it for good (an
	// "alongside" listing whose units a buyer took was never settled,
	// helper-65).
	prior, err := priorHeld(ctx, tx, sku, open[0].since)
	if err != nil {
		return nil, err
	}
	// Nor had the sales inside the horizon been made (sold counts them,
	// no settle has yet), nor the refunds since given units back: left
	// out, a burst of sales just before a settle shrank the share's
	// whole, and an alongside listing sold at once what its share of the
	// counted sales never reached (helper-104); a sale refunded inside
	// the horizon counted twice (helper-105).
	var later int64
	if mode == ResaleAlongside && len(sales) > 0 {
		if later, err = notMadeYet(ctx, tx, sku, last, open[0].since); err != nil {
			return nil, err
		}
	}
	shares := make([]openListing, len(open))
	for i, x := range open {
		shares[i] = openListing{since: x.since, left: x.Quantity - x.Sold}
	}
	got, carry := resaleShares(mode, sales, shares, total-sold-prior+later, carry)
	var n int64
	for _, y := range got {
		n += y
	}
	// The listed units left unsold must be somewhere: in the free stock,
	// in a hold taken since the listings began, or taken by a sale not
	// counted yet (inside the horizon). Those that are nowhere were sold:
	// a share's rounding, or a listing stuck by an older settle, never
	// leaves them listed (withdraw needs them free, so it refused them
	// for good). They go to the oldest listings first. Any hold taken
	// since the first listing may hold a listed unit, whichever listing's
	// it is by the shares: a unit one listing sold may be the one a later
	// listing put on sale (helper-103: counted as not, a seller was
	// refunded while the hold that had his unit could still give it back).
	if free := total - sold - held; listed-n > free {
		before, err := priorHeld(ctx, tx, sku, -1)
		if err != nil {
			return nil, err
		}
		recent, err := recentSales(ctx, tx, sku, last, -1)
		if err != nil {
			return nil, err
		}
		if least := min(listed, listed-free-(held-before)-recent); least > n {
			for i := range got {
				y := min(least-n, shares[i].left-got[i])
				got[i] += y
				n += y
			}
			carry = 0
		}
	}
	if n == 0 && last == mark {
		return nil, nil
	}
	var events []Event
	for i, x := range open {
		if got[i] == 0 {
			continue
		}
		ev, err := settleListing(ctx, tx, x.Listing, got[i], now)
		if err != nil {
			return nil, err
		}
		events = append(events, ev)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE skus SET total = total - $3, sold = sold - $3, listed = listed - $3, resale_seq = $4,
		resale_carry = $6, version = version + 1, updated_at = $5 WHERE program = $1 AND ticket = $2`,
		sku.Program, sku.Ticket, n, last, now.UnixMilli(), carry); err != nil {
		return nil, notCommitted("settle: sku", err)
	}
	if err := emit(ctx, tx, now, events...); err != nil {
		return nil, err
	}
	return events, nil
}

// priorHeld is the units held by sku's holds taken before the listing
// begun at since, and so before every later one, read in tx: none of
// them can be those listings' units. since < 0 is those taken before the
// first listing (resale_prior_holds) alone.
func priorHeld(ctx context.Context, tx *sql.Tx, sku stock.SKU, since int64) (int64, error) {
	var prior int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(SUM(h.quantity), 0) FROM holds h WHERE h.state = $3 AND h.id IN (
		SELECT hold_id FROM resale_prior_holds WHERE program = $1 AND ticket = $2
		UNION ALL SELECT hold_id FROM resale_listing_holds WHERE program = $1 AND ticket = $2 AND since_seq <= $4)`,
		sku.Program, sku.Ticket, Held, since).Scan(&prior); err != nil {
		return 0, notCommitted("settle: prior holds", err)
	}
	return prior, nil
}

// sinceListing is an open listing and where it began.
type sinceListing struct {
	Listing
	since int64
}

// openListings is sku's open listings, read in tx, in the order they
// began (oldest first). A listing with no since (made by a build before
// schema step 11, before the upgrade or beside this build during its
// rollout) is given the seq of its own listing.created event, once:
// left at 0 it counted every sale since the mark as its own and went
// first in line, ahead of older listings (helper-104).
func openListings(ctx context.Context, tx *sql.Tx, sku stock.SKU) ([]sinceListing, error) {
	rows, err := tx.QueryContext(ctx, `SELECT id, order_id, seller, quantity, sold, since_seq FROM listings
		WHERE program = $1 AND ticket = $2 AND state = $3 ORDER BY created_at, id`, sku.Program, sku.Ticket, Listed)
	if err != nil {
		return nil, notCommitted("settle: listings", err)
	}
	var open []sinceListing
	for rows.Next() {
		x := sinceListing{Listing: Listing{SKU: sku, State: Listed}}
		if err := rows.Scan(&x.ID, &x.OrderID, &x.Seller, &x.Quantity, &x.Sold, &x.since); err != nil {
			rows.Close()
			return nil, notCommitted("settle: listings", err)
		}
		open = append(open, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, notCommitted("settle: listings", err)
	}
	for i := range open {
		if open[i].since != 0 {
			continue
		}
		var seq sql.NullInt64
		if err := tx.QueryRowContext(ctx, `SELECT MIN(seq) FROM events WHERE program = $1 AND ticket = $2 AND type = $3 AND subject = $4`,
			sku.Program, sku.Ticket, EventListingCreated, open[i].ID).Scan(&seq); err != nil {
			return nil, notCommitted("settle: listing since", err)
		}
		if !seq.Valid {
			continue // no event to tell: every sale since the mark, as before
		}
		open[i].since = seq.Int64
		if _, err := tx.ExecContext(ctx, `UPDATE listings SET since_seq = $2 WHERE id = $1`, open[i].ID, seq.Int64); err != nil {
			return nil, notCommitted("settle: listing since", err)
		}
	}
	sort.SliceStable(open, func(a, b int) bool { return open[a].since < open[b].since })
	return open, nil
}

// settleSales is sku's sales a settle counts, read in tx: those above the
// mark and below the first one made within horizon of now (seq and
// created_at, each replica's clock taken before the commit, are not in
// the same order), each keyed by where it sold (resaleSale); and last,
// the seq the mark moves to (the mark when none).
func settleSales(ctx context.Context, tx *sql.Tx, sku stock.SKU, mark int64, now time.Time, horizon time.Duration) (_ []resaleSale, last int64, _ error) {
	// A horizon of 0 cuts at no time at all: an event's created_at is its
	// replica's clock, which may run ahead of this one's.
	upTo := int64(math.MaxInt64)
	if horizon > 0 {
		upTo = now.Add(-horizon).UnixMilli()
	}
	rows, err := tx.QueryContext(ctx, `SELECT e.seq, e.quantity, p.hold_id IS NOT NULL, q.since_seq FROM events e
		LEFT JOIN resale_prior_holds p ON e.type = $6 AND p.hold_id = e.subject
		LEFT JOIN resale_listing_holds q ON e.type = $6 AND q.hold_id = e.subject
		WHERE e.program = $1 AND e.ticket = $2 AND e.seq > $4 AND e.type IN ($3, $6) AND e.seq < COALESCE((SELECT MIN(n.seq) FROM events n
			WHERE n.program = $1 AND n.ticket = $2 AND n.seq > $4 AND n.type IN ($3, $6) AND n.created_at > $5), $7)`,
		sku.Program, sku.Ticket, EventOrderCreated, mark, upTo, EventHoldConfirmed, int64(math.MaxInt64))
	if err != nil {
		return nil, 0, notCommitted("settle: sales", err)
	}
	defer rows.Close()
	var sales []resaleSale
	last = mark
	for rows.Next() {
		var s resaleSale
		var first bool // a confirm of a hold from before every listing
		var listing sql.NullInt64
		if err := rows.Scan(&s.key, &s.units, &first, &listing); err != nil {
			return nil, 0, notCommitted("settle: sales", err)
		}
		last = max(last, s.key)
		switch {
		case first:
			s.key = 0 // no listing's: before them all
		case listing.Valid:
			s.key = min(s.key, listing.Int64)
		}
		sales = append(sales, s)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, notCommitted("settle: sales", err)
	}
	return sales, last, nil
}

// settleListing settles y more units of open listing x to buyers' sales,
// in tx: the listing, the seller's order and what the seller bought.
func settleListing(ctx context.Context, tx *sql.Tx, x Listing, y int64, now time.Time) (Event, error) {
	state, ended := Listed, int64(0)
	if x.Sold+y == x.Quantity {
		state, ended = Sold, now.UnixMilli()
	}
	if _, err := tx.ExecContext(ctx, `UPDATE listings SET sold = sold + $2, state = $3, ended_at = $4 WHERE id = $1`,
		x.ID, y, state, ended); err != nil {
		return Event{}, notCommitted("settle: listing", err)
	}
	// An order keeps at least one ticket (quantity > 0): one whose
	// every ticket is resold is given up whole, as refunded (its
	// listing.sold events are the refund; no stock comes back).
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET quantity = CASE WHEN quantity > $2 THEN quantity - $2 ELSE quantity END,
		refunded_at = CASE WHEN quantity > $2 THEN refunded_at ELSE $3 END WHERE id = $1`, x.OrderID, y, now.UnixMilli()); err != nil {
		return Event{}, notCommitted("settle: order", err)
	}
	// The order's units: y leave listed for resold; an order given up
	// whole is resold out, so its refunded_at is told as no refund.
	if _, err := tx.ExecContext(ctx, `UPDATE order_listings SET listed = listed - $2, resold = resold + $2,
		resold_out = CASE WHEN (SELECT refunded_at FROM orders WHERE id = $1) > 0 THEN 1 ELSE resold_out END
		WHERE order_id = $1`, x.OrderID, y); err != nil {
		return Event{}, notCommitted("settle: order", err)
	}
	if err := uncountBuyer(ctx, tx, x.SKU, x.Seller, y); err != nil {
		return Event{}, err
	}
	return Event{Type: EventListingSold, SKU: x.SKU, Subject: x.ID, Order: x.OrderID, Buyer: x.Seller, Quantity: y}, nil
}

// recentSales is the units of sku's sales above seq after (inside the
// horizon, not counted yet), read in tx (which holds the SKU row); a
// confirm of a hold taken before the listing begun at since (and every
// later one; since < 0: before the first listing) is none.
func recentSales(ctx context.Context, tx *sql.Tx, sku stock.SKU, after, since int64) (int64, error) {
	var recent int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(SUM(quantity), 0) FROM events WHERE program = $1 AND ticket = $2 AND seq > $3
		AND (type = $4 OR type = $5 AND NOT EXISTS (SELECT 1 FROM resale_prior_holds p WHERE p.hold_id = events.subject)
			AND NOT EXISTS (SELECT 1 FROM resale_listing_holds q WHERE q.hold_id = events.subject AND q.since_seq <= $6))`,
		sku.Program, sku.Ticket, after, EventOrderCreated, EventHoldConfirmed, since).Scan(&recent); err != nil {
		return 0, notCommitted("settle: recent sales", err)
	}
	return recent, nil
}

// notMadeYet is what sku's stock for sale has lost since seq after, read
// in tx: the sales above it (recentSales, since as there) less the units
// refunds above it gave back.
func notMadeYet(ctx context.Context, tx *sql.Tx, sku stock.SKU, after, since int64) (int64, error) {
	sales, err := recentSales(ctx, tx, sku, after, since)
	if err != nil {
		return 0, err
	}
	var back int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(SUM(quantity), 0) FROM events WHERE program = $1 AND ticket = $2 AND seq > $3 AND type = $4`,
		sku.Program, sku.Ticket, after, EventOrderRefunded).Scan(&back); err != nil {
		return 0, notCommitted("settle: recent refunds", err)
	}
	return sales - back, nil
}

// Which of a settle's sales each listing takes: pure, so the rule reads
// (and is tested) apart from the SQL that gathers the sales.

// resaleSale is units a settle counts, sold at key: a sale can have taken
// the units of the listings begun before it (since < key). A purchase's
// key is its event's seq; a hold's confirm's the lower of its seq and the
// since of the first listing begun while the hold was held: it took its
// units before that listing (or any later) was on sale; 0 (no listing's)
// for one held when its SKU's first listing began.
type resaleSale struct{ key, units int64 }

// openListing is an open listing to a settle: where it began (its since)
// and its units unsold.
type openListing struct{ since, left int64 }

// resaleShares gives a settle's sales to the open listings (in order of
// since, oldest first). The sales are grouped by the listings begun
// before them; group by group, oldest listings first, each group's units
// go to the listings it could have taken (resold: "first" every unit,
// "alongside" their share of what was for sale before the group, the
// fraction carried on). base is the SKU's total less sold and less the
// units of holds from before every open listing, as the settle reads it;
// for a group, what was for sale before it is base, plus the group's and
// later groups' units (not sold yet then), less the listings begun after
// it (not on sale yet). A sale made before a listing began took none of
// its units (helper-102: the sales before a second listing went to it).
func resaleShares(mode string, sales []resaleSale, open []openListing, base, carry int64) (got []int64, _ int64) {
	units := make([]int64, len(open)+1) // units[c]: sold while the first c listings were on sale
	var after int64
	for _, s := range sales {
		c := sort.Search(len(open), func(i int) bool { return open[i].since >= s.key })
		units[c] += s.units
		after += s.units
	}
	got = make([]int64, len(open))
	var notYet int64 // the unsold units of listings not on sale before group c
	for _, x := range open {
		notYet += x.left
	}
	for c, u := range units {
		if c > 0 && u > 0 {
			var listed int64
			for i := range c {
				listed += open[i].left - got[i]
			}
			var n int64
			n, carry = resold(mode, u, listed, base+after-notYet, carry)
			for i := 0; i < c && n > 0; i++ {
				y := min(n, open[i].left-got[i])
				got[i] += y
				n -= y
			}
		}
		after -= u
		if c < len(open) {
			notYet -= open[c].left
		}
	}
	return got, carry
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

package ledger

import (
	"context"
	"fmt"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// StockReport is one SKU's (or pool's) stock as the ledger's rows add it
// up, for reconciliation: the SKU row's counts beside what its order and
// hold rows say, so a platform can check one against the other and both
// against its own books.
type StockReport struct {
	SKU stock.SKU
	// Total is the organizer's (listed units apart); Sold the units sold
	// and standing with their buyers, not on sale again; Held the live
	// holds'; Open what is still for sale: the public stock and the listed
	// units. Sold + Held + Open = Total, always.
	Total, Sold, Held, Open int64
	// Listed: units of orders listed for resale and not sold yet (for sale
	// in Open, their sellers' in Sold). Resold: listed units sold to other
	// buyers, given up by their sellers' orders. Transferred: units moved
	// from one buyer to another.
	Listed, Resold, Transferred int64
	// ListedUnits is Listed as the sellers' orders keep it
	// (order_listings), written beside the SKU row: Balanced holds the
	// two to each other. (Their resold counts are not: builds before
	// schema step 6, which may serve beside this one, settle without
	// them.)
	ListedUnits int64
	// Of PurchasedUnits: the organizer's comps and box-office sales
	// (Order.Channel), standing.
	CompUnits, BoxOfficeUnits int64
	OrderUnits, Orders        int64 // standing orders (not refunded)
	// Of OrderUnits: bought at once (purchases), confirmed from holds
	// (single holds and seat holds), and as lines of carts.
	PurchasedUnits, ConfirmedUnits, CartUnits int64
	RefundedUnits, Refunds                    int64 // orders refunded
	HeldUnits                                 int64 // live holds' rows
	ExpiredUnits, CancelledUnits              int64 // holds that ended without a sale
	Seated                                    bool
	// Ended: an admin ended the sale; its gate is emptied on purpose and
	// admits no one, so Redis's count is not the SKU's open stock.
	Ended bool
}

// Balanced says the SKU row agrees with its order, hold and listing rows:
// the standing orders' units are Sold and the units listed again, the live
// holds' are Held, and what the SKU row says is listed is what the
// sellers' orders say. (Sold + Held + Open = Total holds
// by how Open is counted, and the order units split into purchased,
// confirmed and cart units by their rows: both are said, not checked.)
func (r StockReport) Balanced() bool {
	return r.Sold+r.Listed == r.OrderUnits && r.Held == r.HeldUnits &&
		r.Listed == r.ListedUnits
}

// notResoldOut keeps an order whose every unit was resold out of the
// refunds: its refunded_at is when the last one went, not a refund.
const notResoldOut = ` AND NOT EXISTS (SELECT 1 FROM order_listings ol WHERE ol.order_id = o.id AND ol.resold_out <> 0)`

// Report adds up every SKU and pool of program from the ledger's rows, in
// ticket order: one statement, read at one instant on PostgreSQL
// (REPEATABLE READ is not needed: a single statement sees one snapshot).
func (l *Ledger) Report(ctx context.Context, program keys.ID) ([]StockReport, error) {
	rows, err := l.db.QueryContext(ctx, `SELECT s.ticket, s.total, s.sold, s.held, s.seated, s.ended_at,
		(SELECT COUNT(*) FROM orders o WHERE o.program = s.program AND o.ticket = s.ticket AND o.refunded_at = 0),
		(SELECT COALESCE(SUM(o.quantity), 0) FROM orders o WHERE o.program = s.program AND o.ticket = s.ticket AND o.refunded_at = 0),
		(SELECT COALESCE(SUM(o.quantity), 0) FROM orders o WHERE o.program = s.program AND o.ticket = s.ticket AND o.refunded_at = 0
			AND o.hold_id = '' AND o.cart_id = ''),
		(SELECT COALESCE(SUM(o.quantity), 0) FROM orders o WHERE o.program = s.program AND o.ticket = s.ticket AND o.refunded_at = 0
			AND o.hold_id <> '' AND o.cart_id = ''),
		(SELECT COALESCE(SUM(o.quantity), 0) FROM orders o WHERE o.program = s.program AND o.ticket = s.ticket AND o.refunded_at = 0
			AND o.cart_id <> ''),
		(SELECT COUNT(*) FROM orders o WHERE o.program = s.program AND o.ticket = s.ticket AND o.refunded_at > 0`+notResoldOut+`),
		(SELECT COALESCE(SUM(o.quantity), 0) FROM orders o WHERE o.program = s.program AND o.ticket = s.ticket AND o.refunded_at > 0`+notResoldOut+`),
		(SELECT COALESCE(SUM(h.quantity), 0) FROM holds h WHERE h.program = s.program AND h.ticket = s.ticket AND h.state = $2),
		(SELECT COALESCE(SUM(h.quantity), 0) FROM holds h WHERE h.program = s.program AND h.ticket = s.ticket AND h.state = $3),
		(SELECT COALESCE(SUM(h.quantity), 0) FROM holds h WHERE h.program = s.program AND h.ticket = s.ticket AND h.state = $4),
		s.listed,
		(SELECT COALESCE(SUM(x.sold), 0) FROM listings x WHERE x.program = s.program AND x.ticket = s.ticket),
		(SELECT COALESCE(SUM(e.quantity), 0) FROM events e WHERE e.program = s.program AND e.ticket = s.ticket AND e.type = $5),
		(SELECT COALESCE(SUM(o.quantity), 0) FROM orders o JOIN order_channels c ON c.order_id = o.id
			WHERE o.program = s.program AND o.ticket = s.ticket AND o.refunded_at = 0 AND c.channel = $6),
		(SELECT COALESCE(SUM(o.quantity), 0) FROM orders o JOIN order_channels c ON c.order_id = o.id
			WHERE o.program = s.program AND o.ticket = s.ticket AND o.refunded_at = 0 AND c.channel = $7),
		(SELECT COALESCE(SUM(ol.listed), 0) FROM order_listings ol JOIN orders o ON o.id = ol.order_id
			WHERE o.program = s.program AND o.ticket = s.ticket)
		FROM skus s WHERE s.program = $1 ORDER BY s.ticket`, program, Held, Expired, Cancelled, EventOrderTransferred,
		ChannelComp, ChannelBoxOffice)
	if err != nil {
		return nil, fmt.Errorf("ledger: report: %w", err)
	}
	defer rows.Close()
	var out []StockReport
	for rows.Next() {
		r := StockReport{SKU: stock.SKU{Program: program}}
		var seated, ended int64
		if err := rows.Scan(&r.SKU.Ticket, &r.Total, &r.Sold, &r.Held, &seated, &ended, &r.Orders, &r.OrderUnits, &r.PurchasedUnits,
			&r.ConfirmedUnits, &r.CartUnits, &r.Refunds, &r.RefundedUnits, &r.HeldUnits, &r.ExpiredUnits, &r.CancelledUnits,
			&r.Listed, &r.Resold, &r.Transferred, &r.CompUnits, &r.BoxOfficeUnits, &r.ListedUnits); err != nil {
			return nil, fmt.Errorf("ledger: report: %w", err)
		}
		r.Open, r.Seated, r.Ended = r.Total-r.Sold-r.Held, seated != 0, ended > 0
		// The listed units are on sale again (in Open), not the sellers'
		// sold ones any more: the organizer's total is told once.
		r.Total -= r.Listed
		r.Sold -= r.Listed
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: report: %w", err)
	}
	return out, nil
}

package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// MaxCartLines bounds the lines of one cart: a checkout, not a bulk load.
const MaxCartLines = 10

// Cart is one checkout of several tickets of one program, committed all or
// nothing: an order per line (a purchase), or a hold per line (a held
// cart, which is confirmed, cancelled and expires whole), in one
// transaction with the cart's request.
type Cart struct {
	ID      keys.ID `json:"cart_id"`
	Program keys.ID `json:"program"`
	Buyer   keys.ID `json:"buyer"`
	// Orders are a purchased cart's lines, or a held cart's once confirmed:
	// one SKU each (no SKU twice), in ticket order. Each carries its own
	// row key (IdempotencyKey), and for a line the gate admitted, its gate
	// record and the gate epoch it was admitted under.
	Orders []Order `json:"orders"`
	// Holds are a held cart's lines, as Orders are a purchase's; all share
	// one expiry.
	Holds     []Hold    `json:"holds,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	Req       Request   `json:"-"`
}

// LineError is a cart refused because of one of its lines: Err is why
// (stock.ErrSoldOut, stock.ErrSaleEnded, stock.ErrUnknownSKU,
// stock.ErrLimit for the SKU's own cap, ErrStaleGate). Line indexes
// the cart's lines. Nothing was written.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("ledger: cart line %d: %v", e.Line, e.Err) }
func (e *LineError) Unwrap() error { return e.Err }

// cartLine is what taking stock needs of one line, an order's or a hold's.
type cartLine struct {
	sku       stock.SKU
	buyer     keys.ID
	q         int64
	key       keys.ID
	gateEpoch int64
	take      *int64 // where the epoch the stock was taken under goes
	// A seat line's seats, held (or sold) under the line's row id.
	seats []keys.ID
	id    keys.ID
}

// lines are the cart's lines: its holds when it has any, else its orders.
func (c *Cart) lines() []cartLine {
	var out []cartLine
	for i := range c.Holds {
		h := &c.Holds[i]
		out = append(out, cartLine{h.SKU, h.Buyer, h.Quantity, h.IdempotencyKey, h.GateEpoch, &h.TakeEpoch, h.SeatIDs, h.ID})
	}
	for i := range c.Orders {
		o := &c.Orders[i]
		out = append(out, cartLine{o.SKU, o.Buyer, o.Quantity, o.IdempotencyKey, o.GateEpoch, &o.TakeEpoch, o.SeatIDs, o.ID})
	}
	return out
}

func (c *Cart) validate() error {
	lines := c.lines()
	if c.Program.IsZero() || c.Buyer.IsZero() || len(lines) == 0 || len(lines) > MaxCartLines ||
		(len(c.Holds) > 0 && len(c.Orders) > 0) {
		return fmt.Errorf("%w: cart of %d lines", stock.ErrInvalid, len(lines))
	}
	if err := c.Req.validate(); err != nil {
		return err
	}
	for i, l := range lines {
		if l.sku.Program != c.Program || l.buyer != c.Buyer || l.q < 1 || l.key.IsZero() {
			return fmt.Errorf("%w: cart line %d", stock.ErrInvalid, i)
		}
		if i > 0 && lines[i-1].sku.Compare(l.sku) >= 0 {
			return fmt.Errorf("%w: cart lines not in ticket order, or a ticket twice", stock.ErrInvalid)
		}
		if len(l.seats) > 0 && (int64(len(l.seats)) != l.q || !distinct(l.seats)) {
			return fmt.Errorf("%w: cart line %d: %d distinct seats for quantity %d", stock.ErrInvalid, i, len(l.seats), l.q)
		}
	}
	for _, h := range c.Holds {
		if h.ExpiresAt.IsZero() {
			return fmt.Errorf("%w: a cart hold line has an expiry", stock.ErrInvalid)
		}
	}
	return nil
}

// cartTx opens a transaction for a client's action on a whole cart
// (confirm, cancel, refund), claims its request and reads the cart's
// holds and orders in it, checking the buyer. taken reports a request
// committed before: the caller answers from cartReplay.
func (l *Ledger) cartTx(ctx context.Context, id, buyer keys.ID, req Request, now time.Time, step string) (_ *sql.Tx, _ Cart, taken bool, err error) {
	c, err := l.CartByID(ctx, id)
	if err != nil {
		return nil, c, false, err
	}
	if c.Buyer != buyer {
		return nil, c, false, ErrNotOwner
	}
	tx, taken, err := l.begin(ctx, req, stock.SKU{Program: c.Program}, now, step)
	if taken || err != nil {
		return nil, c, taken, err
	}
	// Read again inside the transaction, the cart's rows locked first
	// (holds before orders, as a batch locks them): a concurrent action on
	// the cart (a confirm or cancel under another key, a line's refund,
	// the sweeper) has committed, and is read, or waits for this one. Read
	// unlocked, a confirm losing to another key's answered 410 "nothing
	// was sold", and a cancel losing to a confirm answered 200.
	if l.driver == Postgres {
		for _, t := range []string{"holds", "orders"} {
			if _, err := tx.ExecContext(ctx, `SELECT id FROM `+t+` WHERE cart_id = $1 AND cart_id <> '' ORDER BY id FOR UPDATE`, id); err != nil {
				tx.Rollback()
				return nil, c, false, notCommitted("lock cart", err)
			}
		}
	}
	c, err = cartIn(ctx, tx, id)
	if errors.Is(err, ErrNotFound) {
		// Read a moment ago, gone now: only a program's move deletes a
		// cart's rows (it was on the primary the move left).
		err = fmt.Errorf("%w: %w: cart %s", ErrNotCommitted, ErrMoving, id)
	}
	if err != nil {
		tx.Rollback()
		return nil, c, false, err
	}
	return tx, c, false, nil
}

// ConfirmCart turns every hold of a held cart into an order, all or none,
// once: the cart's holds change state, each SKU row moves held to sold,
// and an order per line is inserted (a line of the cart), in one
// transaction. A cart already confirmed returns its orders (a retry); a
// cart with any hold ended or past its expiry returns ErrHoldEnded and
// sells nothing. buyer must be the cart's.
func (l *Ledger) ConfirmCart(ctx context.Context, id, buyer keys.ID, req Request) (_ Cart, err error) {
	defer l.observe("cart_confirm", time.Now(), &err)
	now := l.now().UTC().Truncate(time.Millisecond)
	tx, c, taken, err := l.cartTx(ctx, id, buyer, req, now, "cart confirm")
	if taken {
		return l.cartReplay(ctx, req)
	}
	if err != nil {
		return c, err
	}
	defer tx.Rollback()
	if len(c.Holds) == 0 {
		return c, fmt.Errorf("%w: a purchased cart has nothing to confirm", ErrHoldConfirmed)
	}
	if len(c.Orders) == 0 {
		for _, h := range c.Holds {
			if h.State != Held || !now.Before(h.ExpiresAt) {
				return c, fmt.Errorf("%w: %s", ErrHoldEnded, h.stateAt(now))
			}
		}
		for _, h := range c.Holds {
			c.Orders = append(c.Orders, confirmOrder(h, Request{}, now))
			c.Orders[len(c.Orders)-1].CartID = c.ID
		}
		// Holds first (they decide against a sweeper), then SKU rows in
		// ticket order: the order every stock write takes rows in.
		for i, h := range c.Holds {
			res, err := tx.ExecContext(ctx, `UPDATE holds SET state = $2, order_id = $3, ended_at = $4
				WHERE id = $1 AND state = $5 AND expires_at > $4`, h.ID, Confirmed, c.Orders[i].ID, now.UnixMilli(), Held)
			if err != nil {
				return c, notCommitted("confirm cart hold", err)
			}
			if n, _ := res.RowsAffected(); n != 1 {
				return c, fmt.Errorf("%w: ended while confirming", ErrHoldEnded)
			}
			c.Holds[i].State, c.Holds[i].OrderID, c.Holds[i].EndedAt = Confirmed, c.Orders[i].ID, now
		}
		for _, h := range c.Holds {
			var v int64
			err := tx.QueryRowContext(ctx, `UPDATE skus SET held = held - $3, sold = sold + $3, version = version + 1, updated_at = $4
				WHERE program = $1 AND ticket = $2 AND held >= $3 RETURNING version`,
				h.SKU.Program, h.SKU.Ticket, h.Quantity, now.UnixMilli()).Scan(&v)
			if errors.Is(err, sql.ErrNoRows) {
				return c, fmt.Errorf("ledger: confirm cart: %s holds fewer than %d", h.SKU, h.Quantity)
			}
			if err != nil {
				return c, notCommitted("confirm cart stock", err)
			}
			if err := stamp(ctx, tx, h.SKU, v); err != nil {
				return c, err
			}
		}
		inserted, err := insertOrders(ctx, tx, c.Orders)
		if err != nil {
			return c, err
		}
		if len(inserted) != len(c.Orders) {
			return c, notCommitted("confirm cart", fmt.Errorf("%d of %d order rows inserted", len(inserted), len(c.Orders)))
		}
		// Seats after the SKU rows, as a single confirm sells them.
		for _, h := range c.Holds {
			if len(h.SeatIDs) > 0 {
				if err := moveSeats(ctx, tx, h.ID, seatHeld, seatSold); err != nil {
					return c, err
				}
			}
		}
		events := make([]Event, 0, len(c.Orders))
		for _, o := range c.Orders {
			events = append(events, confirmEvent(o))
		}
		if err := emit(ctx, tx, now, events...); err != nil {
			return c, err
		}
	}
	// Confirmed now or before: the request is answered with the cart.
	if err := finishCart(ctx, tx, req, &c); err != nil {
		return c, err
	}
	if err := tx.Commit(); err != nil {
		return c, fmt.Errorf("ledger: confirm cart: commit: %w", err)
	}
	return c, nil
}

// CancelCart ends every live hold of a held cart at its buyer's request
// and returns their stock, in one transaction, as Cancel does one hold's.
// changed lists the holds it ended (each may owe Redis a restore: see
// RestoreOwed); none for a cart already cancelled or expired (a retry). A
// confirmed cart is refused with ErrHoldConfirmed.
func (l *Ledger) CancelCart(ctx context.Context, id, buyer keys.ID, req Request) (_ Cart, changed []keys.ID, err error) {
	defer l.observe("cart_cancel", time.Now(), &err)
	now := l.now().UTC().Truncate(time.Millisecond)
	tx, c, taken, err := l.cartTx(ctx, id, buyer, req, now, "cart cancel")
	if taken {
		c, err := l.cartReplay(ctx, req)
		return c, nil, err
	}
	if err != nil {
		return c, nil, err
	}
	defer tx.Rollback()
	if len(c.Holds) == 0 || len(c.Orders) > 0 {
		return c, nil, ErrHoldConfirmed
	}
	var ended []int
	for i, h := range c.Holds {
		if h.State != Held {
			continue
		}
		// A line past its expiry ends expired, as a single hold's cancel
		// after its expiry does (the sweeper's fate, and what a read said).
		var state string
		err := tx.QueryRowContext(ctx, `UPDATE holds SET state = CASE WHEN expires_at <= $4 THEN '`+Expired+`' ELSE $2 END, ended_at = $4
			WHERE id = $1 AND state = $3 RETURNING state`, h.ID, Cancelled, Held, now.UnixMilli()).Scan(&state)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			continue
		case err != nil:
			return c, nil, notCommitted("cancel cart hold", err)
		}
		ended = append(ended, i)
		c.Holds[i].State, c.Holds[i].EndedAt = state, now
	}
	lines := make([]returnLine, len(ended))
	for k, i := range ended {
		h := c.Holds[i]
		seated := len(h.SeatIDs) > 0
		if seated {
			if err := moveSeats(ctx, tx, h.ID, seatHeld, seatFree); err != nil {
				return c, nil, err
			}
		}
		lines[k] = returnLine{table: "holds", id: h.ID, sku: h.SKU, buyer: h.Buyer, q: h.Quantity, gate: h.Gate, takeEpoch: h.TakeEpoch, seats: seated}
	}
	offers, err := returnLines(ctx, tx, lines, "held", now)
	if err != nil {
		return c, nil, err
	}
	var events []Event
	for _, i := range ended {
		changed = append(changed, c.Holds[i].ID)
		kind := EventHoldCancelled
		if c.Holds[i].State == Expired {
			kind = EventHoldExpired
		}
		events = append(events, holdEvent(kind, c.Holds[i]))
	}
	if err := emit(ctx, tx, now, append(events, offers...)...); err != nil {
		return c, nil, err
	}
	if err := finishCart(ctx, tx, req, &c); err != nil {
		return c, nil, err
	}
	if err := tx.Commit(); err != nil {
		return c, nil, fmt.Errorf("ledger: cancel cart: commit: %w", err)
	}
	return c, changed, nil
}

// ErrNotBought: a held cart never confirmed (held, cancelled or expired)
// has no orders to refund. It is an ErrNotFound (of the cart's orders) for
// the callers that do not tell it apart.
var ErrNotBought = fmt.Errorf("%w: the cart was never bought", ErrNotFound)

// RefundCart refunds every order of a cart not refunded yet, in one
// transaction, as Refund does one order's. changed lists the orders it
// refunded (each may owe Redis a restore); none for a cart refunded
// before (a retry). A held cart not confirmed has no orders: ErrNotBought,
// with the cart (its holds say why).
func (l *Ledger) RefundCart(ctx context.Context, id, buyer keys.ID, req Request) (_ Cart, changed []keys.ID, err error) {
	defer l.observe("cart_refund", time.Now(), &err)
	now := l.now().UTC().Truncate(time.Millisecond)
	tx, c, taken, err := l.cartTx(ctx, id, buyer, req, now, "cart refund")
	if taken {
		c, err := l.cartReplay(ctx, req)
		return c, nil, err
	}
	if err != nil {
		return c, nil, err
	}
	defer tx.Rollback()
	if len(c.Orders) == 0 {
		return c, nil, ErrNotBought
	}
	var lines []returnLine
	for i, o := range c.Orders {
		if !o.RefundedAt.IsZero() {
			continue
		}
		res, err := tx.ExecContext(ctx, `UPDATE orders SET refunded_at = $2 WHERE id = $1 AND refunded_at = 0`, o.ID, now.UnixMilli())
		if err != nil {
			return c, nil, notCommitted("refund cart order", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			continue
		}
		c.Orders[i].RefundedAt = now
		seated, err := releaseOrderSeats(ctx, tx, o)
		if err != nil {
			return c, nil, err
		}
		lines = append(lines, returnLine{table: "orders", id: o.ID, sku: o.SKU, buyer: o.Buyer, q: o.Quantity, gate: o.Gate, takeEpoch: o.TakeEpoch, seats: seated})
		changed = append(changed, o.ID)
	}
	offers, err := returnLines(ctx, tx, lines, "sold", now)
	if err != nil {
		return c, nil, err
	}
	var events []Event
	for _, o := range c.Orders {
		if slices.Contains(changed, o.ID) {
			events = append(events, orderEvent(EventOrderRefunded, o))
		}
	}
	if err := emit(ctx, tx, now, append(events, offers...)...); err != nil {
		return c, nil, err
	}
	if err := finishCart(ctx, tx, req, &c); err != nil {
		return c, nil, err
	}
	if err := tx.Commit(); err != nil {
		return c, nil, fmt.Errorf("ledger: refund cart: commit: %w", err)
	}
	return c, changed, nil
}

// returnLine is one line of a cart whose stock comes back.
type returnLine struct {
	table, gate string // holds or orders; the line's gate record
	id, buyer   keys.ID
	sku         stock.SKU
	q           int64
	takeEpoch   int64
	seats       bool // seats came back with it (always owed to the gate)
}

// returnLines gives back the lines' units of column: every SKU row first
// (the lines are in ticket order), then the buyers' rows, the order every
// write that moves stock takes rows in (SKU by SKU with its buyers, two
// carts over the same program would meet at its buyer rows in a cycle);
// then records on each line's row what Redis is owed, and offers the
// units to each SKU's waitlist (returning the offers' events).
func returnLines(ctx context.Context, tx *sql.Tx, lines []returnLine, column string, now time.Time) ([]Event, error) {
	got := make([]returned, len(lines))
	for i, ln := range lines {
		r, err := returnSKU(ctx, tx, ln.sku, ln.q, column, now.UnixMilli())
		if err != nil {
			return nil, err
		}
		got[i] = r
	}
	for _, ln := range lines {
		if err := uncountBuyer(ctx, tx, ln.sku, ln.buyer, ln.q); err != nil {
			return nil, err
		}
	}
	var skus []stock.SKU
	bySKU := map[stock.SKU][]backRow{}
	units := map[stock.SKU]int64{}
	for i, ln := range lines {
		pending, err := owed(ctx, tx, ln.table, ln.id, ln.gate, ln.takeEpoch, ln.seats, got[i])
		if err != nil {
			return nil, err
		}
		if err := stamp(ctx, tx, ln.sku, got[i].version); err != nil {
			return nil, err
		}
		if _, ok := bySKU[ln.sku]; !ok {
			skus = append(skus, ln.sku)
		}
		bySKU[ln.sku] = append(bySKU[ln.sku], backRow{ln.table, ln.id, ln.q, pending})
		units[ln.sku] += ln.q
	}
	var events []Event
	for _, sku := range skus {
		offers, err := offerBack(ctx, tx, sku, units[sku], bySKU[sku], now)
		if err != nil {
			return nil, err
		}
		events = append(events, offers...)
	}
	return events, nil
}

// finishCart writes the answer of a cart action: the cart as it is now.
func finishCart(ctx context.Context, tx *sql.Tx, r Request, c *Cart) error {
	if r.IsZero() {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE requests SET result = $3 WHERE scope = $1 AND idem_key = $2`,
		r.Scope, r.Key, encodeCart(c)); err != nil {
		return notCommitted("request answer", err)
	}
	return nil
}

// cartReplay answers a cart whose request was committed before.
func (l *Ledger) cartReplay(ctx context.Context, r Request) (Cart, error) {
	rec, err := l.replayOf(ctx, r)
	if errors.Is(err, ErrDuplicate) && rec.Cart == nil {
		return Cart{}, fmt.Errorf("%w: key was used for a %s", ErrKeyReused, rec.Op)
	}
	if rec.Cart == nil {
		return Cart{}, err
	}
	return *rec.Cart, err
}

// CartByID returns a cart with its orders and holds as they are now
// (refunds included), or ErrNotFound. Both are read in one snapshot: read
// apart, a confirm committing between the two reads showed its holds
// confirmed and no order (helper-61).
func (l *Ledger) CartByID(ctx context.Context, id keys.ID) (Cart, error) {
	var opts *sql.TxOptions
	if l.driver == Postgres {
		// SQLite's read transaction is one snapshot already (WAL).
		opts = &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}
	}
	tx, err := l.db.BeginTx(ctx, opts)
	if err != nil {
		return Cart{}, fmt.Errorf("ledger: cart: %w", err)
	}
	defer tx.Rollback()
	return cartIn(ctx, tx, id)
}

// querier is what cartIn reads with: the database, or a transaction.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func cartIn(ctx context.Context, db querier, id keys.ID) (Cart, error) {
	c := Cart{ID: id}
	err := scanAll(ctx, db, selectOrder+` WHERE cart_id = $1 AND cart_id <> '' ORDER BY ticket`, id, scanOrder, func(o Order) {
		c.Program, c.Buyer, c.CreatedAt = o.SKU.Program, o.Buyer, o.CreatedAt
		c.Orders = append(c.Orders, o)
	})
	if err == nil {
		err = scanAll(ctx, db, selectHold+` WHERE cart_id = $1 AND cart_id <> '' ORDER BY ticket`, id, scanHold, func(h Hold) {
			c.Program, c.Buyer, c.CreatedAt = h.SKU.Program, h.Buyer, h.CreatedAt
			c.Holds = append(c.Holds, h)
		})
	}
	if err != nil {
		return Cart{}, fmt.Errorf("ledger: cart: %w", err)
	}
	if len(c.Orders) == 0 && len(c.Holds) == 0 {
		return Cart{}, ErrNotFound
	}
	return c, nil
}

func scanAll[T any](ctx context.Context, db querier, query string, arg any, scan func(rowScanner) (T, error), add func(T)) error {
	rows, err := db.QueryContext(ctx, query, arg)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return err
		}
		add(v)
	}
	return rows.Err()
}

// distinct reports whether no id is in ids twice.
func distinct(ids []keys.ID) bool {
	sorted := slices.SortedFunc(slices.Values(ids), keys.ID.Compare)
	return len(slices.CompactFunc(sorted, func(a, b keys.ID) bool { return a == b })) == len(ids)
}

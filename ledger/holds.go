package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// Hold states.
const (
	Held      = "held"
	Confirmed = "confirmed"
	Cancelled = "cancelled"
	Expired   = "expired"
)

// Errors of holds and refunds.
var (
	// ErrHoldEnded: the hold was cancelled or expired (or its expiry has
	// passed and the sweeper has not got to it yet); it cannot be confirmed.
	ErrHoldEnded = errors.New("ledger: hold ended")
	// ErrHoldConfirmed: the hold became an order; it cannot be cancelled
	// (refund the order instead).
	ErrHoldConfirmed = errors.New("ledger: hold confirmed")
	// ErrNotOwner: the buyer named is not the hold's or the order's.
	ErrNotOwner = errors.New("ledger: not the owner")
	// ErrInCart: the hold is a line of a cart, which is confirmed or
	// cancelled whole.
	ErrInCart = errors.New("ledger: hold is a cart line")
)

// Hold is stock set aside for a buyer until ExpiresAt.
type Hold struct {
	ID keys.ID
	// IdempotencyKey is the hold row's unique key, derived by the service
	// (the hold's gate request id), and the id of its Redis records.
	IdempotencyKey keys.ID
	RequestHash    string
	SKU            stock.SKU
	Buyer          keys.ID
	Quantity       int64
	// Gate is the gate's record of the Redis stock behind the hold (its
	// deduction parts, or its seats); empty for a hold taken straight from
	// the ledger.
	Gate      string
	State     string
	ExpiresAt time.Time
	OrderID   keys.ID
	CreatedAt time.Time
	EndedAt   time.Time
	// SeatIDs are the seats of a seat hold (reserved seating); empty for
	// counted stock.
	SeatIDs []keys.ID
	// Req is the client request that creates the hold (zero for an
	// internal write).
	Req Request
	// GateEpoch is the gate epoch a gate-admitted hold was admitted under;
	// -1 checks none (seats, which have no gate epochs).
	GateEpoch int64
	// TakeEpoch is the epoch its stock was taken under, as stored.
	TakeEpoch int64
	// CartID is the cart the hold is a line of (zero for a single hold):
	// it is confirmed and cancelled with its cart, never alone.
	CartID keys.ID
	// CodeHash is the access code the hold used ("" for none): one use
	// while held, passed on to its order.
	CodeHash string
}

// holdReplay answers a hold whose request was committed before.
func (l *Ledger) holdReplay(ctx context.Context, r Request) (Hold, error) {
	rec, err := l.replayOf(ctx, r)
	if errors.Is(err, ErrDuplicate) && rec.Hold == nil {
		return Hold{}, fmt.Errorf("%w: key was used for a %s", ErrKeyReused, rec.Op)
	}
	if rec.Hold == nil {
		return Hold{}, err
	}
	return *rec.Hold, err
}

const selectHold = `SELECT id, idem_key, request_hash, program, ticket, buyer, quantity, gate, state, expires_at,
	order_id, created_at, ended_at, seat_ids, take_epoch, cart_id, code_hash FROM holds`

// selectHoldFrom is selectHold with the table named alias, to join.
func selectHoldFrom(alias string) string {
	return `SELECT ` + qualify(alias, `id, idem_key, request_hash, program, ticket, buyer, quantity, gate, state, expires_at,
	order_id, created_at, ended_at, seat_ids, take_epoch, cart_id, code_hash`) + ` FROM holds ` + alias
}

// qualify prefixes each column of a comma-separated list with alias.
func qualify(alias, cols string) string {
	parts := strings.Split(cols, ",")
	for i, c := range parts {
		parts[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}

func scanHold(r rowScanner) (Hold, error) {
	var h Hold
	var expires, created, ended int64
	var seatIDs string
	err := r.Scan(&h.ID, &h.IdempotencyKey, &h.RequestHash, &h.SKU.Program, &h.SKU.Ticket, &h.Buyer, &h.Quantity,
		&h.Gate, &h.State, &expires, &h.OrderID, &created, &ended, &seatIDs, &h.TakeEpoch, &h.CartID, &h.CodeHash)
	if err == nil {
		h.SeatIDs, err = splitIDs(seatIDs)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return h, ErrNotFound
	}
	if err != nil {
		return h, fmt.Errorf("ledger: hold: %w", err)
	}
	h.ExpiresAt, h.CreatedAt = time.UnixMilli(expires).UTC(), time.UnixMilli(created).UTC()
	if ended > 0 {
		h.EndedAt = time.UnixMilli(ended).UTC()
	}
	return h, nil
}

// HoldByID returns a hold, or ErrNotFound.
func (l *Ledger) HoldByID(ctx context.Context, id keys.ID) (Hold, error) {
	return scanHold(l.db.QueryRowContext(ctx, selectHold+` WHERE id = $1`, id))
}

// HoldByKey returns the hold stored under its row key, or ErrNotFound.
func (l *Ledger) HoldByKey(ctx context.Context, key keys.ID) (Hold, error) {
	return scanHold(l.db.QueryRowContext(ctx, selectHold+` WHERE idem_key = $1`, key))
}

// begin opens a transaction and claims req in it (when req is not zero).
// taken reports a key already used: the transaction is rolled back and the
// caller answers from replayOf.
func (l *Ledger) begin(ctx context.Context, req Request, sku stock.SKU, now time.Time, step string) (tx *sql.Tx, taken bool, err error) {
	tx, err = l.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, false, notCommitted(step+": begin", err)
	}
	if req.IsZero() {
		return tx, false, nil
	}
	if err := claim(ctx, tx, req, sku, "", now.UnixMilli()); err != nil {
		tx.Rollback()
		if errors.Is(err, errTaken) {
			return nil, true, nil
		}
		return nil, false, err
	}
	return tx, false, nil
}

func (h Hold) stateAt(now time.Time) string {
	if h.State == Held && !now.Before(h.ExpiresAt) {
		return Expired
	}
	return h.State
}

// Cancel ends a live hold at its buyer's request and returns its stock to
// the ledger. changed is false when the hold had already been cancelled or
// had expired (a retry): nothing moved. A confirmed hold is refused with
// ErrHoldConfirmed. buyer must be the hold's; req (when not zero) is the
// client's cancel request, remembered with the hold it got.
func (l *Ledger) Cancel(ctx context.Context, holdID, buyer keys.ID, req Request) (h Hold, changed bool, err error) {
	h, err = l.HoldByID(ctx, holdID)
	if err != nil {
		return h, false, err
	}
	if h.Buyer != buyer {
		return h, false, ErrNotOwner
	}
	if !h.CartID.IsZero() {
		return h, false, ErrInCart
	}
	return l.endHold(ctx, h, Cancelled, false, req)
}

// owed decides whether Redis must get returned units back, and records the
// return's epoch and layout on the row (table holds or orders). Units taken
// through the gate are always owed to the gate of the return's epoch (that
// gate either took them, or was rebuilt while they were out and so does not
// count them). Units taken around the gate in the very epoch they come back
// in were never taken from that gate: nothing is owed. An ended sale's
// gate is owed no units (it admits no one), only the counts it made. Seats
// taken through the gate are always owed: their release is by owner, and
// a no-op when not held.
func owed(ctx context.Context, tx *sql.Tx, table string, id keys.ID, gate string, takeEpoch int64, seats bool, r returned) (int, error) {
	pending := isOwed(gate, takeEpoch, seats, r)
	if _, err := tx.ExecContext(ctx, `UPDATE `+table+` SET restore_pending = $2, restore_epoch = $3, restore_shards = $4
		WHERE id = $1`, id, pending, r.epoch, r.shards); err != nil {
		return 0, notCommitted("restore owed", err)
	}
	return pending, nil
}

// endHold moves a live hold to state (cancelled or expired) and returns its
// stock: held - q, the buyer's count - q, and restore_pending set when Redis
// is owed the units. dueOnly refuses holds whose expiry has not passed.
func (l *Ledger) endHold(ctx context.Context, h Hold, state string, dueOnly bool, req Request) (_ Hold, _ bool, err error) {
	defer l.observe(state, time.Now(), &err)
	now := l.now().UTC().Truncate(time.Millisecond)
	tx, taken, err := l.begin(ctx, req, h.SKU, now, "end hold")
	if taken {
		h, err := l.holdReplay(ctx, req)
		return h, false, err
	}
	if err != nil {
		return h, false, err
	}
	defer tx.Rollback()
	cond := ""
	if dueOnly {
		cond = " AND expires_at <= $4"
	}
	set := "$2"
	if state == Cancelled {
		// A hold past its expiry has that fate, whoever ends it: a cancel
		// after the expiry (before the sweeper) ends it expired, as the
		// sweeper would and as a read of it already said, not cancelled.
		set = "CASE WHEN expires_at <= $4 THEN '" + Expired + "' ELSE $2 END"
	}
	var ended string
	err = tx.QueryRowContext(ctx, `UPDATE holds SET state = `+set+`, ended_at = $4
		WHERE id = $1 AND state = $3`+cond+` RETURNING state`, h.ID, state, Held, now.UnixMilli()).Scan(&ended)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return h, false, notCommitted("end hold", err)
	default:
		state = ended
	}
	if errors.Is(err, sql.ErrNoRows) {
		cur, err := scanHold(tx.QueryRowContext(ctx, selectHold+` WHERE id = $1`, h.ID))
		if err != nil {
			return cur, false, err
		}
		if cur.State == Confirmed {
			return cur, false, ErrHoldConfirmed
		}
		if req.IsZero() {
			return cur, false, nil
		}
		// Already ended: the request is answered with the hold as it is.
		if err := finish(ctx, tx, req, nil, &cur); err != nil {
			return cur, false, err
		}
		return cur, false, tx.Commit()
	}
	if err := moveSeats(ctx, tx, h.ID, seatHeld, seatFree); err != nil {
		return h, false, err
	}
	r, err := returnStock(ctx, tx, h.SKU, h.Buyer, h.Quantity, "held", now.UnixMilli())
	if err != nil {
		return h, false, err
	}
	pending, err := owed(ctx, tx, "holds", h.ID, h.Gate, h.TakeEpoch, len(h.SeatIDs) > 0, r)
	if err != nil {
		return h, false, err
	}
	offers, err := offerBack(ctx, tx, h.SKU, h.Quantity, []backRow{{"holds", h.ID, h.Quantity, pending}}, now)
	if err != nil {
		return h, false, err
	}
	h.State, h.EndedAt = state, now
	if err := emit(ctx, tx, now, append([]Event{holdEvent(endEvent(state, h), h)}, offers...)...); err != nil {
		return h, false, err
	}
	if err := finish(ctx, tx, req, nil, &h); err != nil {
		return h, false, err
	}
	if err := stamp(ctx, tx, h.SKU, r.version); err != nil {
		return h, false, err
	}
	if err := tx.Commit(); err != nil {
		return h, false, fmt.Errorf("ledger: end hold: commit: %w", err)
	}
	return h, true, nil
}

// Refund undoes an order once: refunded_at set, sold - q, the buyer's count
// - q, restore_pending set when Redis is owed the units. changed is false
// for an order already refunded: nothing moved. buyer must be the order's;
// req (when not zero) is the client's refund request. A refund rolled back
// by a deadlock check (a listing locks the SKU row before the order) runs
// again, as the listing does.
func (l *Ledger) Refund(ctx context.Context, orderID, buyer keys.ID, req Request) (Order, bool, error) {
	type refunded struct {
		o       Order
		changed bool
	}
	r, err := retried(func() (refunded, error) {
		o, changed, err := l.refund(ctx, orderID, buyer, req)
		return refunded{o, changed}, err
	})
	return r.o, r.changed, err
}

func (l *Ledger) refund(ctx context.Context, orderID, buyer keys.ID, req Request) (o Order, changed bool, err error) {
	defer l.observe("refund", time.Now(), &err)
	o, err = l.OrderByID(ctx, orderID)
	if err != nil {
		return o, false, err
	}
	if o.Buyer != buyer {
		return o, false, ErrNotOwner
	}
	now := l.now().UTC().Truncate(time.Millisecond)
	tx, taken, err := l.begin(ctx, req, o.SKU, now, "refund")
	if taken {
		o, err := l.orderReplay(ctx, req)
		return o, false, err
	}
	if err != nil {
		return o, false, err
	}
	defer tx.Rollback()
	// The order row decides (a concurrent refund changes zero rows); then
	// the SKU row, then buyer rows, the order every write that moves stock
	// takes rows in, so no two of them wait on each other in a cycle.
	// Tickets listed for resale are not refunded (the listing is
	// withdrawn first): the order's row says so under the same lock.
	res, err := tx.ExecContext(ctx, `UPDATE orders SET refunded_at = $2 WHERE id = $1 AND refunded_at = 0`, o.ID, now.UnixMilli())
	if err != nil {
		return o, false, notCommitted("refund", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		if listed, err := orderListed(ctx, tx, o.ID); err != nil {
			return o, false, err
		} else if listed > 0 {
			return o, false, ErrListed
		}
	} else {
		// Refunded before: answer with the order as it is. One whose every
		// ticket was resold was never refunded: its money went back by its
		// listing.sold events, and a refund's 200 would tell it twice.
		if err := endedAs(ctx, tx, o.ID); errors.Is(err, ErrResold) || !errors.Is(err, ErrRefunded) {
			return o, false, err
		}
		tx.Rollback()
		cur, err := l.OrderByID(ctx, o.ID)
		if err != nil {
			return cur, false, err
		}
		if cur.Buyer != buyer {
			// Moved to another buyer, who refunded it, since it was read
			// above: not this buyer's refund to be told (helper-75 #3).
			return cur, false, ErrNotOwner
		}
		if req.IsZero() {
			return cur, false, nil
		}
		return l.answerAgain(ctx, req, o.SKU, cur)
	}
	// Its tickets may have moved since it was read (Transfer changes its
	// buyer, or its quantity when some moved): refund what it is now,
	// under the lock the update took.
	cur, err := scanOrder(tx.QueryRowContext(ctx, selectOrder+` WHERE id = $1`, o.ID))
	if err != nil {
		return o, false, err
	}
	if cur.Buyer != buyer {
		return cur, false, ErrNotOwner
	}
	o.Quantity = cur.Quantity
	r, err := returnStock(ctx, tx, o.SKU, o.Buyer, o.Quantity, "sold", now.UnixMilli())
	if err != nil {
		return o, false, err
	}
	seated, err := releaseOrderSeats(ctx, tx, o)
	if err != nil {
		return o, false, err
	}
	pending, err := owed(ctx, tx, "orders", o.ID, o.Gate, o.TakeEpoch, seated, r)
	if err != nil {
		return o, false, err
	}
	offers, err := offerBack(ctx, tx, o.SKU, o.Quantity, []backRow{{"orders", o.ID, o.Quantity, pending}}, now)
	if err != nil {
		return o, false, err
	}
	o.RefundedAt = now
	if err := emit(ctx, tx, now, append([]Event{orderEvent(EventOrderRefunded, o)}, offers...)...); err != nil {
		return o, false, err
	}
	if err := finish(ctx, tx, req, &o, nil); err != nil {
		return o, false, err
	}
	if err := stamp(ctx, tx, o.SKU, r.version); err != nil {
		return o, false, err
	}
	if err := tx.Commit(); err != nil {
		return o, false, fmt.Errorf("ledger: refund: commit: %w", err)
	}
	return o, true, nil
}

// AnswerWith records req (a client's request, not yet committed) as
// answered by o, an order that stands already: a late payment commits
// under a key derived from its hold (one order per hold), and its
// client's own key then remembers that order, so a retry under it gets
// the order from any replica, whenever, and the key can't be reused for
// another request. A key taken already answers what it recorded
// (ErrDuplicate), or ErrKeyReused for another request.
func (l *Ledger) AnswerWith(ctx context.Context, req Request, o Order) (Order, error) {
	got, _, err := l.answerAgain(ctx, req, o.SKU, o)
	return got, err
}

// answerAgain records req as answered by an order already refunded.
func (l *Ledger) answerAgain(ctx context.Context, req Request, sku stock.SKU, o Order) (Order, bool, error) {
	tx, taken, err := l.begin(ctx, req, sku, l.now(), "refund")
	if taken {
		o, err := l.orderReplay(ctx, req)
		return o, false, err
	}
	if err != nil {
		return o, false, err
	}
	defer tx.Rollback()
	if err := finish(ctx, tx, req, &o, nil); err != nil {
		return o, false, err
	}
	return o, false, tx.Commit()
}

// BuyerUnits is what a buyer holds + owns of a SKU's ticket (in every
// pool).
func (l *Ledger) BuyerUnits(ctx context.Context, sku stock.SKU, buyer keys.ID) (int64, error) {
	var n int64
	err := l.db.QueryRowContext(ctx, `SELECT units FROM buyer_units WHERE program = $1 AND ticket = $2 AND buyer = $3`,
		sku.Program, sku.Base().Ticket, buyer).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("ledger: buyer units: %w", err)
	}
	return n, nil
}

// EndSale stops all further holds and purchases of a SKU (they get
// stock.ErrSaleEnded); holds already taken may still be confirmed. Ending
// an ended sale changes nothing.
func (l *Ledger) EndSale(ctx context.Context, sku stock.SKU) (SKUState, error) {
	now := l.now()
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: end sale: %w", err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `UPDATE skus SET ended_at = $3, version = version + 1, bypass_seq = bypass_seq + 1,
		updated_at = $3 WHERE program = $1 AND ticket = $2 AND ended_at = 0`, sku.Program, sku.Ticket, now.UnixMilli())
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: end sale: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		if err := emit(ctx, tx, now, Event{Type: EventSaleEnded, SKU: sku}); err != nil {
			return SKUState{}, err
		}
	}
	if err := tx.Commit(); err != nil {
		return SKUState{}, fmt.Errorf("ledger: end sale: commit: %w", err)
	}
	return l.SKU(ctx, sku)
}

// SetShards changes only a SKU's Redis shard count (the gate collapsing a
// sale's tail onto fewer shards). Like any change Redis must follow, it
// marks the gate stale.
func (l *Ledger) SetShards(ctx context.Context, sku stock.SKU, n int) error {
	if n < 1 || n > stock.MaxShards {
		return fmt.Errorf("%w: shards %d", stock.ErrInvalid, n)
	}
	_, err := l.db.ExecContext(ctx, `UPDATE skus SET shards = $3, version = version + 1, bypass_seq = bypass_seq + 1,
		updated_at = $4 WHERE program = $1 AND ticket = $2`, sku.Program, sku.Ticket, n, l.now().UnixMilli())
	if err != nil {
		return fmt.Errorf("ledger: set shards: %w", err)
	}
	return nil
}

// ErrAtMaxLifetime: a hold cannot be extended past its SKU's maximum
// lifetime (hold_ttl_max from the hold's creation), and it is there.
var ErrAtMaxLifetime = errors.New("ledger: hold at its maximum lifetime")

// Extend moves a live hold's expiry to ttl from now, capped at its SKU's
// maximum lifetime counted from the hold's creation; it never brings the
// expiry nearer (an extension to less than the hold has answers the hold
// as it is). The conditional update of the hold's row decides it against
// a sweeper, a confirm or a cancel at the same instant, as Confirm's does:
// a hold whose expiry has passed is ErrHoldEnded, even before the sweeper
// has ended it. A confirmed hold is ErrHoldConfirmed; a cart's line
// ErrInCart (a cart is extended whole, never a line). A hold already at
// its maximum lifetime (a waitlist offer's is its offer window) asked for
// more is ErrAtMaxLifetime (with the hold), so a client learns it gets
// none. req (when not zero) is the client's request: a
// retry answers the hold as that request left it.
func (l *Ledger) Extend(ctx context.Context, holdID, buyer keys.ID, ttl time.Duration, req Request) (_ Hold, err error) {
	defer l.observe("extend", time.Now(), &err)
	if ttl < MinHoldTTL || ttl > MaxHoldTTL {
		return Hold{}, fmt.Errorf("%w: ttl %v not in %v..%v", stock.ErrInvalid, ttl, MinHoldTTL, MaxHoldTTL)
	}
	now := l.now().UTC().Truncate(time.Millisecond)
	h, err := l.HoldByID(ctx, holdID)
	if err != nil {
		return Hold{}, err
	}
	if h.Buyer != buyer {
		return Hold{}, ErrNotOwner // before the key, as ConfirmPart
	}
	tx, taken, err := l.begin(ctx, req, h.SKU, now, "extend")
	if taken {
		return l.holdReplay(ctx, req)
	}
	if err != nil {
		return Hold{}, err
	}
	defer tx.Rollback()
	h, err = scanHold(tx.QueryRowContext(ctx, selectHold+` WHERE id = $1`, holdID))
	if err != nil {
		return Hold{}, err
	}
	if err := h.extendRefusal(buyer, now); err != nil {
		return Hold{}, err
	}
	var maxMS int64
	if err := tx.QueryRowContext(ctx, `SELECT hold_ttl_max_ms FROM skus WHERE program = $1 AND ticket = $2`,
		h.SKU.Program, h.SKU.Ticket).Scan(&maxMS); err != nil {
		return Hold{}, notCommitted("extend: sku", err)
	}
	asked := now.Add(ttl)
	until := h.extendedTo(asked, time.Duration(maxMS)*time.Millisecond)
	if !until.After(h.ExpiresAt) {
		if asked.After(h.ExpiresAt) {
			return h, fmt.Errorf("%w: it expires at %s", ErrAtMaxLifetime, h.ExpiresAt.Format(time.RFC3339))
		}
		// Asked for less than it has: answered as it is, and remembered so.
		if err := finish(ctx, tx, req, nil, &h); err != nil {
			return Hold{}, err
		}
		return h, tx.Commit()
	}
	res, err := tx.ExecContext(ctx, `UPDATE holds SET expires_at = $2
		WHERE id = $1 AND state = $3 AND expires_at > $4 AND expires_at < $2`, h.ID, until.UnixMilli(), Held, now.UnixMilli())
	if err != nil {
		return Hold{}, notCommitted("extend hold", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		// Changed since it was read: ended, or extended further by another
		// request (PostgreSQL re-reads the row the update waited for).
		cur, err := scanHold(tx.QueryRowContext(ctx, selectHold+` WHERE id = $1`, h.ID))
		switch {
		case err != nil:
			return Hold{}, err
		case cur.State == Confirmed:
			return Hold{}, ErrHoldConfirmed
		case cur.State != Held || !now.Before(cur.ExpiresAt):
			return Hold{}, fmt.Errorf("%w: ended while extending", ErrHoldEnded)
		}
		if err := finish(ctx, tx, req, nil, &cur); err != nil {
			return Hold{}, err
		}
		return cur, tx.Commit()
	}
	h.ExpiresAt = until
	if err := emit(ctx, tx, now, holdEvent(EventHoldExtended, h)); err != nil {
		return Hold{}, err
	}
	if err := finish(ctx, tx, req, nil, &h); err != nil {
		return Hold{}, err
	}
	if err := tx.Commit(); err != nil {
		return Hold{}, fmt.Errorf("ledger: extend: commit: %w", err)
	}
	return h, nil
}

// extendRefusal is why buyer cannot extend h at now, or nil.
func (h Hold) extendRefusal(buyer keys.ID, now time.Time) error {
	switch {
	case h.Buyer != buyer:
		return ErrNotOwner
	case !h.CartID.IsZero():
		return ErrInCart
	case h.State == Confirmed:
		return ErrHoldConfirmed
	case h.State != Held || !now.Before(h.ExpiresAt):
		return fmt.Errorf("%w: %s", ErrHoldEnded, h.stateAt(now))
	}
	return nil
}

// extendedTo is the expiry h gets when asked to last until asked: at
// most maxLife after its creation, and a waitlist offer lasts its offer
// window (the next buyer in line waits for it).
func (h Hold) extendedTo(asked time.Time, maxLife time.Duration) time.Time {
	limit := h.CreatedAt.Add(maxLife)
	if h.IsOffer() {
		limit = h.ExpiresAt
	}
	if asked.After(limit) {
		return limit
	}
	return asked
}

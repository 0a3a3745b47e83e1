package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

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
	// ErrNotOwner: the buyer named is not the hold's or the order's.
	ErrNotOwner = errors.New("ledger: not the owner")
)

// Hold is stock set aside for a buyer until ExpiresAt.
type Hold struct {
	ID             string
	IdempotencyKey string
	RequestHash    string
	SKU            stock.SKU
	Buyer          string
	Quantity       int64
	// Gate is the gate's record of the Redis stock behind the hold (its
	// deduction parts, under IdempotencyKey); empty for a hold taken
	// straight from the ledger.
	Gate      string
	State     string
	ExpiresAt time.Time
	OrderID   string
	CreatedAt time.Time
	EndedAt   time.Time
	// SeatIDs are the seats of a seat hold (reserved seating); empty for
	// counted stock.
	SeatIDs []string
}

// Hold sets stock aside: the hold row and held + q under the same checks as
// a purchase (stock, per-buyer cap, sale not ended). version >= 0 takes it
// around the Redis gate with optimistic locking, as PurchaseDirect. It
// returns ErrDuplicate with the hold already stored under the key.
func (l *Ledger) Hold(ctx context.Context, h Hold, version int64) (_ Hold, err error) {
	defer l.observe("hold", time.Now(), &err)
	if h.Quantity < 1 || h.IdempotencyKey == "" || h.ExpiresAt.IsZero() {
		return Hold{}, fmt.Errorf("%w: hold quantity %d key %q", stock.ErrInvalid, h.Quantity, h.IdempotencyKey)
	}
	if h.ID == "" {
		h.ID = NewID()
	}
	h.State = Held
	h.CreatedAt = l.now().UTC().Truncate(time.Millisecond)
	h.ExpiresAt = h.ExpiresAt.UTC().Truncate(time.Millisecond)
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return Hold{}, notCommitted("hold: begin", err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `
		INSERT INTO holds (id, idem_key, request_hash, program, ticket, buyer, quantity, gate, state, expires_at, created_at, seat_ids)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
		ON CONFLICT (idem_key) DO NOTHING`,
		h.ID, h.IdempotencyKey, h.RequestHash, h.SKU.Program, h.SKU.Ticket, h.Buyer, h.Quantity, h.Gate, Held,
		h.ExpiresAt.UnixMilli(), h.CreatedAt.UnixMilli(), strings.Join(h.SeatIDs, ","))
	if err != nil {
		return Hold{}, notCommitted("insert hold", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		tx.Rollback()
		prev, err := l.HoldByKey(ctx, h.IdempotencyKey)
		if err != nil {
			return Hold{}, fmt.Errorf("ledger: hold: duplicate key: %w", err)
		}
		return prev, ErrDuplicate
	}
	if len(h.SeatIDs) > 0 {
		if int64(len(h.SeatIDs)) != h.Quantity {
			return Hold{}, fmt.Errorf("%w: %d seats for quantity %d", stock.ErrInvalid, len(h.SeatIDs), h.Quantity)
		}
		if err := takeSeats(ctx, tx, h.SKU, h.ID, h.SeatIDs); err != nil {
			return Hold{}, err
		}
	}
	if err := l.takeStock(ctx, tx, h.SKU, h.Buyer, h.Quantity, "held", version, h.CreatedAt.UnixMilli()); err != nil {
		return Hold{}, err
	}
	if err := tx.Commit(); err != nil {
		return Hold{}, fmt.Errorf("ledger: hold: commit: %w", err)
	}
	return h, nil
}

const selectHold = `SELECT id, idem_key, request_hash, program, ticket, buyer, quantity, gate, state, expires_at,
	order_id, created_at, ended_at, seat_ids FROM holds`

func scanHold(r rowScanner) (Hold, error) {
	var h Hold
	var expires, created, ended int64
	var seatIDs string
	err := r.Scan(&h.ID, &h.IdempotencyKey, &h.RequestHash, &h.SKU.Program, &h.SKU.Ticket, &h.Buyer, &h.Quantity,
		&h.Gate, &h.State, &expires, &h.OrderID, &created, &ended, &seatIDs)
	if seatIDs != "" {
		h.SeatIDs = strings.Split(seatIDs, ",")
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
func (l *Ledger) HoldByID(ctx context.Context, id string) (Hold, error) {
	return scanHold(l.db.QueryRowContext(ctx, selectHold+` WHERE id = $1`, id))
}

// HoldByKey returns the hold stored under an idempotency key, or ErrNotFound.
func (l *Ledger) HoldByKey(ctx context.Context, key string) (Hold, error) {
	return scanHold(l.db.QueryRowContext(ctx, selectHold+` WHERE idem_key = $1`, key))
}

// Confirm turns a live hold into an order, once: held - q, sold + q, in the
// same transaction as the hold's state change. A hold already confirmed
// returns its order (a retry); one cancelled, expired, or past its expiry
// returns ErrHoldEnded and sells nothing. buyer must be the hold's.
func (l *Ledger) Confirm(ctx context.Context, holdID, buyer string) (_ Order, err error) {
	defer l.observe("confirm", time.Now(), &err)
	now := l.now().UTC().Truncate(time.Millisecond)
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return Order{}, notCommitted("confirm: begin", err)
	}
	defer tx.Rollback()
	h, err := scanHold(tx.QueryRowContext(ctx, selectHold+` WHERE id = $1`, holdID))
	switch {
	case err != nil:
		return Order{}, err
	case h.Buyer != buyer:
		return Order{}, ErrNotOwner
	case h.State == Confirmed:
		tx.Rollback()
		return l.OrderByID(ctx, h.OrderID)
	case h.State != Held || !now.Before(h.ExpiresAt):
		return Order{}, fmt.Errorf("%w: %s", ErrHoldEnded, h.stateAt(now))
	}
	o := Order{ID: NewID(), IdempotencyKey: "hold-" + h.ID, RequestHash: h.RequestHash, SKU: h.SKU, Buyer: h.Buyer,
		Quantity: h.Quantity, Gate: h.Gate, GateKey: h.IdempotencyKey, HoldID: h.ID, CreatedAt: now}
	// The state change is the one place a hold's fate is decided: a sweeper
	// expiring it at this instant changes zero rows here, or we change zero
	// rows there.
	res, err := tx.ExecContext(ctx, `UPDATE holds SET state = $2, order_id = $3, ended_at = $4
		WHERE id = $1 AND state = $5 AND expires_at > $4`, h.ID, Confirmed, o.ID, now.UnixMilli(), Held)
	if err != nil {
		return Order{}, notCommitted("confirm hold", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return Order{}, fmt.Errorf("%w: ended while confirming", ErrHoldEnded)
	}
	if _, err := insertOrder(ctx, tx, o); err != nil {
		return Order{}, err
	}
	if err := moveSeats(ctx, tx, h.ID, seatHeld, seatSold); err != nil {
		return Order{}, err
	}
	res, err = tx.ExecContext(ctx, `UPDATE skus SET held = held - $3, sold = sold + $3, version = version + 1, updated_at = $4
		WHERE program = $1 AND ticket = $2 AND held >= $3`, h.SKU.Program, h.SKU.Ticket, h.Quantity, now.UnixMilli())
	if err != nil {
		return Order{}, notCommitted("confirm stock", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return Order{}, fmt.Errorf("ledger: confirm: %s holds fewer than %d", h.SKU, h.Quantity)
	}
	if err := tx.Commit(); err != nil {
		return Order{}, fmt.Errorf("ledger: confirm: commit: %w", err)
	}
	return o, nil
}

func (h Hold) stateAt(now time.Time) string {
	if h.State == Held && !now.Before(h.ExpiresAt) {
		return Expired
	}
	return h.State
}

// Cancel ends a live hold at its buyer's request and returns its stock to
// the ledger. changed is false when the hold had already ended (a retry, or
// it expired): nothing moved. buyer must be the hold's.
func (l *Ledger) Cancel(ctx context.Context, holdID, buyer string) (h Hold, changed bool, err error) {
	h, err = l.HoldByID(ctx, holdID)
	if err != nil {
		return h, false, err
	}
	if h.Buyer != buyer {
		return h, false, ErrNotOwner
	}
	return l.endHold(ctx, h, Cancelled, false)
}

// ExpireDue expires up to limit live holds whose expiry has passed, each in
// its own transaction, and returns those this call expired. Any number of
// sweepers may run it at once: each hold's state changes once, so its stock
// comes back once.
func (l *Ledger) ExpireDue(ctx context.Context, limit int) ([]Hold, error) {
	now := l.now().UnixMilli()
	rows, err := l.db.QueryContext(ctx, selectHold+` WHERE state = $1 AND expires_at <= $2 ORDER BY expires_at LIMIT $3`,
		Held, now, limit)
	if err != nil {
		return nil, fmt.Errorf("ledger: expire: %w", err)
	}
	var due []Hold
	for rows.Next() {
		h, err := scanHold(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		due = append(due, h)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: expire: %w", err)
	}
	var done []Hold
	for _, h := range due {
		h, changed, err := l.endHold(ctx, h, Expired, true)
		if err != nil {
			return done, err
		}
		if changed {
			done = append(done, h)
		}
	}
	return done, nil
}

// endHold moves a live hold to state (cancelled or expired) and returns its
// stock: held - q, the buyer's count - q, and restore_pending set when Redis
// holds stock for it. dueOnly refuses holds whose expiry has not passed.
func (l *Ledger) endHold(ctx context.Context, h Hold, state string, dueOnly bool) (_ Hold, _ bool, err error) {
	defer l.observe(state, time.Now(), &err)
	now := l.now().UTC().Truncate(time.Millisecond)
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return h, false, notCommitted("end hold: begin", err)
	}
	defer tx.Rollback()
	cond := ""
	if dueOnly {
		cond = " AND expires_at <= $4"
	}
	pending := 0
	if h.Gate != "" {
		pending = 1
	}
	res, err := tx.ExecContext(ctx, `UPDATE holds SET state = $2, ended_at = $4, restore_pending = $5
		WHERE id = $1 AND state = $3`+cond, h.ID, state, Held, now.UnixMilli(), pending)
	if err != nil {
		return h, false, notCommitted("end hold", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		tx.Rollback()
		cur, err := l.HoldByID(ctx, h.ID)
		return cur, false, err
	}
	if err := moveSeats(ctx, tx, h.ID, seatHeld, seatFree); err != nil {
		return h, false, err
	}
	if err := returnStock(ctx, tx, h.SKU, h.Buyer, h.Quantity, "held", h.Gate == "", now.UnixMilli()); err != nil {
		return h, false, err
	}
	if err := tx.Commit(); err != nil {
		return h, false, fmt.Errorf("ledger: end hold: commit: %w", err)
	}
	h.State, h.EndedAt = state, now
	return h, true, nil
}

// Refund undoes an order once: refunded_at set, sold - q, the buyer's count
// - q, restore_pending set when Redis holds stock for it. changed is false
// for an order already refunded: nothing moved. buyer must be the order's.
func (l *Ledger) Refund(ctx context.Context, orderID, buyer string) (o Order, changed bool, err error) {
	defer l.observe("refund", time.Now(), &err)
	o, err = l.OrderByID(ctx, orderID)
	if err != nil {
		return o, false, err
	}
	if o.Buyer != buyer {
		return o, false, ErrNotOwner
	}
	now := l.now().UTC().Truncate(time.Millisecond)
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return o, false, notCommitted("refund: begin", err)
	}
	defer tx.Rollback()
	pending := 0
	if o.Gate != "" {
		pending = 1
	}
	res, err := tx.ExecContext(ctx, `UPDATE orders SET refunded_at = $2, restore_pending = $3
		WHERE id = $1 AND refunded_at = 0`, o.ID, now.UnixMilli(), pending)
	if err != nil {
		return o, false, notCommitted("refund", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		tx.Rollback()
		cur, err := l.OrderByID(ctx, o.ID)
		return cur, false, err
	}
	if o.HoldID != "" {
		if err := moveSeats(ctx, tx, o.HoldID, seatSold, seatFree); err != nil {
			return o, false, err
		}
	}
	if err := returnStock(ctx, tx, o.SKU, o.Buyer, o.Quantity, "sold", o.Gate == "", now.UnixMilli()); err != nil {
		return o, false, err
	}
	if err := tx.Commit(); err != nil {
		return o, false, fmt.Errorf("ledger: refund: commit: %w", err)
	}
	o.RefundedAt = now
	return o, true, nil
}

// Restore is stock the ledger took back (a cancelled or expired hold, a
// refunded order) that still has to be given back in Redis.
type Restore struct {
	Kind      string // "hold" or "order"
	ID        string
	SKU       stock.SKU
	Buyer     string
	RequestID string // the request id of the Redis deduction records
	Gate      string
}

// PendingRestores lists up to limit restores whose ledger side ended at
// least olderThan ago: work a sweeper left unfinished when it died.
func (l *Ledger) PendingRestores(ctx context.Context, olderThan time.Duration, limit int) ([]Restore, error) {
	before := l.now().Add(-olderThan).UnixMilli()
	rows, err := l.db.QueryContext(ctx, `
		SELECT 'hold', id, program, ticket, buyer, idem_key, gate FROM holds WHERE restore_pending = 1 AND ended_at <= $1
		UNION ALL
		SELECT 'order', id, program, ticket, buyer, CASE WHEN gate_key = '' THEN idem_key ELSE gate_key END, gate
		FROM orders WHERE restore_pending = 1 AND refunded_at <= $1
		LIMIT $2`, before, limit)
	if err != nil {
		return nil, fmt.Errorf("ledger: pending restores: %w", err)
	}
	defer rows.Close()
	var out []Restore
	for rows.Next() {
		var r Restore
		if err := rows.Scan(&r.Kind, &r.ID, &r.SKU.Program, &r.SKU.Ticket, &r.Buyer, &r.RequestID, &r.Gate); err != nil {
			return nil, fmt.Errorf("ledger: pending restores: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// RestoreDone records that a restore reached Redis (or was refused there
// for good: no record, stale).
func (l *Ledger) RestoreDone(ctx context.Context, kind, id string) error {
	table := "holds"
	if kind == "order" {
		table = "orders"
	}
	if _, err := l.db.ExecContext(ctx, `UPDATE `+table+` SET restore_pending = 0 WHERE id = $1`, id); err != nil {
		return fmt.Errorf("ledger: restore done: %w", err)
	}
	return nil
}

// BuyerUnits is what a buyer holds + owns of a SKU.
func (l *Ledger) BuyerUnits(ctx context.Context, sku stock.SKU, buyer string) (int64, error) {
	var n int64
	err := l.db.QueryRowContext(ctx, `SELECT units FROM buyer_units WHERE program = $1 AND ticket = $2 AND buyer = $3`,
		sku.Program, sku.Ticket, buyer).Scan(&n)
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
	now := l.now().UnixMilli()
	if _, err := l.db.ExecContext(ctx, `UPDATE skus SET ended_at = $3, version = version + 1, bypass_seq = bypass_seq + 1,
		updated_at = $3 WHERE program = $1 AND ticket = $2 AND ended_at = 0`, sku.Program, sku.Ticket, now); err != nil {
		return SKUState{}, fmt.Errorf("ledger: end sale: %w", err)
	}
	return l.SKU(ctx, sku)
}

// RestoreOf is the Redis restore a cancelled or expired hold owes.
func (h Hold) RestoreOf() Restore {
	return Restore{Kind: "hold", ID: h.ID, SKU: h.SKU, Buyer: h.Buyer, RequestID: h.IdempotencyKey, Gate: h.Gate}
}

// RestoreOf is the Redis restore a refunded order owes.
func (o Order) RestoreOf() Restore {
	return Restore{Kind: "order", ID: o.ID, SKU: o.SKU, Buyer: o.Buyer, RequestID: o.GateRequest(), Gate: o.Gate}
}

// PutProgram sets the cap on what one buyer may hold + own of all of a
// program's tickets together; 0 removes it.
func (l *Ledger) PutProgram(ctx context.Context, program string, perBuyer int64) error {
	if err := (stock.SKU{Program: program, Ticket: "x"}).Validate(); err != nil {
		return err
	}
	if perBuyer < 0 || perBuyer > stock.MaxTotal {
		return fmt.Errorf("%w: per_buyer %d", stock.ErrInvalid, perBuyer)
	}
	_, err := l.db.ExecContext(ctx, `INSERT INTO programs (program, per_buyer) VALUES ($1, $2)
		ON CONFLICT (program) DO UPDATE SET per_buyer = excluded.per_buyer`, program, perBuyer)
	if err != nil {
		return fmt.Errorf("ledger: put program: %w", err)
	}
	return nil
}

// ProgramCap is a program's per-buyer cap; 0 when it has none.
func (l *Ledger) ProgramCap(ctx context.Context, program string) (int64, error) {
	var n int64
	err := l.db.QueryRowContext(ctx, `SELECT per_buyer FROM programs WHERE program = $1`, program).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("ledger: program cap: %w", err)
	}
	return n, nil
}

// ProgramUnits is what a buyer holds + owns of all of a program's tickets.
func (l *Ledger) ProgramUnits(ctx context.Context, program, buyer string) (int64, error) {
	return l.BuyerUnits(ctx, stock.SKU{Program: program, Ticket: ""}, buyer)
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

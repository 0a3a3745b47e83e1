package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/access"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// Pools (allocations): a ticket's stock may be split into named pools
// (a fan-club presale, a partner channel, accessible seats), each a SKU
// row of its own (stock.SKU.InPool) with its own total, gate and shards,
// its own window and access rule. The ticket's own row is the public
// pool: its total is the ticket's whole stock less every pool's. So
// held + sold <= total holds for the ticket because it holds for every
// row, and moving units between pools is one transaction over two rows.

// Access rules of a pool (package access decides them).
const (
	AccessOpen    = access.Open
	AccessCode    = access.Code
	AccessChannel = access.Channel
)

// ErrPoolClosed: the pool has closed (its unsold stock moved on); it takes
// no new allotment.
var ErrPoolClosed = errors.New("ledger: pool closed")

// ErrPoolExists: a change meant to make a pool found its row made already.
var ErrPoolExists = errors.New("ledger: pool exists")

// PoolRule is a pool's window and access rule.
type PoolRule = access.Rule

// PoolConfig is what an admin sets on a pool: its allotment (taken from or
// given back to the public stock) and its rule.
type PoolConfig struct {
	SKU       stock.SKU // the pool's stock: the ticket's SKU InPool(name)
	Allotment int64
	Shards    int
	Rule      PoolRule
	// Create makes the pool: PutPool inserts its row in the change's own
	// transaction, so a refused change leaves no pool behind.
	Create bool
}

// Validate reports stock.ErrInvalid for a pool config no pool may have.
func (c PoolConfig) Validate() error {
	switch {
	case c.SKU.Pool().IsZero():
		return fmt.Errorf("%w: not a pool's sku", stock.ErrInvalid)
	case c.Allotment < 0 || c.Allotment > stock.MaxTotal:
		return fmt.Errorf("%w: allotment %d not in 0..%d", stock.ErrInvalid, c.Allotment, stock.MaxTotal)
	case c.Shards < 1 || c.Shards > stock.MaxShards:
		return fmt.Errorf("%w: shards %d not in 1..%d", stock.ErrInvalid, c.Shards, stock.MaxShards)
	case c.Rule.Validate() != nil:
		return fmt.Errorf("%w: %v", stock.ErrInvalid, c.Rule.Validate())
	case c.Rule.Into == c.SKU.Pool():
		return fmt.Errorf("%w: a pool's stock moves into another pool", stock.ErrInvalid)
	}
	return nil
}

// pooledRange is the condition on ticket that selects the pools of the
// ticket $2 (their tickets are "<ticket>.<pool>"): a prefix compared for
// equality, which no collation bends (a range would, on PostgreSQL with a
// non-C collation: "GA.x" sorts between "ga." and "ga/").
const pooledRange = `substr(ticket, 1, length($2) + 1) = $2 || '.'`

// insertPool makes a pool's row ($3) of a ticket ($1, $2) that is not
// seated, with no stock and the ticket's settings, if it has none.
const insertPool = `
		INSERT INTO skus (program, ticket, total, shards, max_per_order, per_buyer, hold_ttl_ms, hold_ttl_max_ms, updated_at)
		SELECT program, $3, 0, 1, max_per_order, per_buyer, hold_ttl_ms, hold_ttl_max_ms, $4
		FROM skus WHERE program = $1 AND ticket = $2 AND seated = 0
		ON CONFLICT (program, ticket) DO NOTHING`

// PutPool sets a pool's allotment and rule: units move between the public
// stock and the pool in one transaction (the public stock must have them
// left; the pool may not shrink below what it sold and holds), and both
// rows are marked for a gate rebuild. The pool's row must exist
// (EnsurePool), unless c.Create: then the transaction makes it, and
// ErrPoolExists says it was there already. A closed pool is refused with
// ErrPoolClosed.
func (l *Ledger) PutPool(ctx context.Context, c PoolConfig) (SKUState, error) {
	if err := c.Validate(); err != nil {
		return SKUState{}, err
	}
	now := l.now().UnixMilli()
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return SKUState{}, notCommitted("put pool: begin", err)
	}
	defer tx.Rollback()
	base := c.SKU.Base()
	if c.Create {
		res, err := tx.ExecContext(ctx, insertPool, base.Program, base.Ticket, c.SKU.Ticket, now)
		if err != nil {
			return SKUState{}, notCommitted("put pool: create", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			if _, err := scanSKU(tx.QueryRowContext(ctx, selectSKU, c.SKU.Program, c.SKU.Ticket)); err == nil {
				return SKUState{}, ErrPoolExists
			}
			return SKUState{}, fmt.Errorf("%w: no ticket to make a pool of (or a seated one)", stock.ErrUnknownSKU)
		}
	}
	// The public row first (its ticket sorts before its pools'): the order
	// every write that moves stock takes rows in. Both are locked before
	// the pool's total is read: a close of another pool into this one
	// commits its units into the total between an unlocked read and the
	// absolute write below, which then lost them, and the public row gave
	// delta for units that were already there (helper-67: the ticket's
	// total shrank by the moved units on PostgreSQL).
	if b, err := scanSKU(tx.QueryRowContext(ctx, selectSKU+l.forUpdate(), base.Program, base.Ticket)); err != nil {
		return SKUState{}, err
	} else if !b.EndedAt.IsZero() {
		return SKUState{}, stock.ErrSaleEnded
	}
	cur, err := scanSKU(tx.QueryRowContext(ctx, selectSKU+l.forUpdate(), c.SKU.Program, c.SKU.Ticket))
	if err != nil {
		return SKUState{}, err
	}
	if !cur.Rule.ClosedAt.IsZero() {
		return SKUState{}, ErrPoolClosed
	}
	delta := c.Allotment - cur.Total
	// Units listed for resale are free in the public row but their
	// sellers': a pool is never allotted them. seated = 0 is checked again
	// here, under the row's lock: a seat map loaded since insertPool read
	// the row (LoadSeats locks it first) made the ticket seated, and a
	// seated ticket sells seats, not counted pool units.
	res, err := tx.ExecContext(ctx, `UPDATE skus SET total = total - $3, version = version + 1, bypass_seq = bypass_seq + 1,
		updated_at = $4 WHERE program = $1 AND ticket = $2 AND seated = 0 AND ($3 <= 0 OR total - sold - held - listed >= $3)`,
		base.Program, base.Ticket, delta, now)
	if err != nil {
		return SKUState{}, notCommitted("put pool: public stock", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return SKUState{}, fmt.Errorf("%w: the public stock has fewer than %d units left, or the ticket is seated", stock.ErrInvalid, delta)
	}
	res, err = tx.ExecContext(ctx, `UPDATE skus SET total = $3, shards = $4, pool_opens_at = $5, pool_closes_at = $6,
		pool_access = $7, pool_secret = $8, pool_into = $9, version = version + 1, bypass_seq = bypass_seq + 1, updated_at = $10
		WHERE program = $1 AND ticket = $2 AND sold + held <= $3 AND pool_closed_at = 0`,
		c.SKU.Program, c.SKU.Ticket, c.Allotment, c.Shards, ms(c.Rule.OpensAt), ms(c.Rule.ClosesAt), c.Rule.Access, c.Rule.Secret,
		c.Rule.Into, now)
	if err != nil {
		return SKUState{}, notCommitted("put pool", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return SKUState{}, fmt.Errorf("%w: allotment %d below what the pool sold and holds", stock.ErrInvalid, c.Allotment)
	}
	st, err := scanSKU(tx.QueryRowContext(ctx, selectSKU, c.SKU.Program, c.SKU.Ticket))
	if err != nil {
		return SKUState{}, notCommitted("put pool: read", err)
	}
	if err := tx.Commit(); err != nil {
		return SKUState{}, fmt.Errorf("ledger: put pool: commit: %w", err)
	}
	return st, nil
}

// ClosePool moves what a pool has left (total - sold - held) into the pool
// its rule names (the public stock when none, or when that one is closed
// or ended), ends the pool's sale and records its close, in one
// transaction; the target is marked for a gate rebuild. It may be called
// again at any time: stock that came back to the closed pool since
// (expired holds, refunds) moves on then; nothing left moves nothing.
// due is the sweeper's close at the pool's closing time: a pool not
// closed whose closing time, read under its row's lock, is not yet (an
// admin moved it on since the sweeper read it due, helper-77 #2) is left
// open, nothing moved and into zero.
func (l *Ledger) ClosePool(ctx context.Context, pool stock.SKU, due bool) (moved int64, into stock.SKU, err error) {
	defer l.observe("close_pool", time.Now(), &err)
	now := l.now().UnixMilli()
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, into, notCommitted("close pool: begin", err)
	}
	defer tx.Rollback()
	// The sweeper closes pools on every primary: not on a copy a move is
	// making or has left (helper-72 #2), whose event would be a second
	// one of this close, or one Finish deletes.
	if err := l.fenceMoved(ctx, tx, pool.Program); err != nil {
		return 0, into, err
	}
	st, err := scanSKU(tx.QueryRowContext(ctx, selectSKU, pool.Program, pool.Ticket))
	if err != nil {
		return 0, into, err
	}
	if st.Pool().IsZero() {
		return 0, into, fmt.Errorf("%w: not a pool's sku", stock.ErrInvalid)
	}
	if into, err = closeTarget(ctx, tx, pool, st.Rule); err != nil {
		return 0, into, err
	}
	// Lock both rows in SKU order, as every stock write takes them, reading
	// the pool's remaining under its lock: a commit admitted before the
	// fence may still land until then.
	first, second := pool, into
	if into.Compare(pool) < 0 {
		first, second = into, pool
	}
	intoEnded := false
	for _, sku := range []stock.SKU{first, second} {
		var left, closesAt, closedAt, endedAt int64
		if err := tx.QueryRowContext(ctx, `UPDATE skus SET version = version + 1, updated_at = $3 WHERE program = $1 AND ticket = $2
			RETURNING total - sold - held, pool_closes_at, pool_closed_at, ended_at`, sku.Program, sku.Ticket, now).Scan(&left, &closesAt, &closedAt, &endedAt); err != nil {
			return 0, into, notCommitted("close pool: lock "+sku.String(), err)
		}
		if sku == pool {
			if due && closedAt == 0 && (closesAt == 0 || closesAt > now) {
				return 0, stock.SKU{}, nil // not due (rolled back)
			}
			moved = left
		} else {
			intoEnded = endedAt != 0
		}
	}
	if intoEnded {
		// The ticket's sale has ended: its leftover sells nowhere, so it
		// stays the pool's, unsold. Moved, it was a pool.moved after the
		// sale.ended and a rebuild of an ended gate (helper-90 #3).
		moved = 0
	}
	if moved == 0 && !st.Rule.ClosedAt.IsZero() {
		return 0, into, nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE skus SET total = total - $3, bypass_seq = bypass_seq + 1,
		ended_at = CASE WHEN ended_at = 0 THEN $4 ELSE ended_at END,
		pool_closed_at = CASE WHEN pool_closed_at = 0 THEN $4 ELSE pool_closed_at END,
		pool_closes_at = CASE WHEN pool_closes_at = 0 OR pool_closes_at > $4 THEN $4 ELSE pool_closes_at END
		WHERE program = $1 AND ticket = $2`, pool.Program, pool.Ticket, moved, now); err != nil {
		return 0, into, notCommitted("close pool", err)
	}
	// The target's gate is stale only when units came to it: a bypass
	// with none rebuilt the public gate for nothing, often at the public
	// on-sale as a presale closed (helper-68).
	if moved > 0 {
		if _, err := tx.ExecContext(ctx, `UPDATE skus SET total = total + $3, bypass_seq = bypass_seq + 1
			WHERE program = $1 AND ticket = $2`, into.Program, into.Ticket, moved); err != nil {
			return 0, into, notCommitted("close pool: target", err)
		}
	}
	if moved > 0 {
		// The moved units are the target's waitlist's first: they are in
		// no gate yet (the target's is rebuilt from the ledger).
		offers, err := offerBack(ctx, tx, into, moved, nil, time.UnixMilli(now))
		if err != nil {
			return 0, into, err
		}
		events := append([]Event{{Type: EventPoolMoved, SKU: pool, To: into, Quantity: moved}}, offers...)
		if err := emit(ctx, tx, time.UnixMilli(now), events...); err != nil {
			return 0, into, err
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, into, fmt.Errorf("ledger: close pool: commit: %w", err)
	}
	return moved, into, nil
}

// Pools lists a ticket's rows: its public stock first, then its pools in
// name order. stock.ErrUnknownSKU when the ticket has no row.
func (l *Ledger) Pools(ctx context.Context, ticket stock.SKU) ([]SKUState, error) {
	base := ticket.Base()
	rows, err := l.db.QueryContext(ctx, `SELECT `+skuColumns+` FROM skus WHERE program = $1 AND (ticket = $2 OR `+pooledRange+`)
		ORDER BY ticket`, base.Program, base.Ticket)
	if err != nil {
		return nil, fmt.Errorf("ledger: pools: %w", err)
	}
	defer rows.Close()
	var out []SKUState
	for rows.Next() {
		st, err := scanSKU(rows)
		if err != nil {
			return nil, fmt.Errorf("ledger: pools: %w", err)
		}
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: pools: %w", err)
	}
	if len(out) == 0 || out[0].SKU != base {
		return nil, stock.ErrUnknownSKU
	}
	return out, nil
}

// PoolsDue lists up to limit pools whose closing time has passed and that
// still have stock to move on: not closed yet, or given stock back since
// while their ticket's sale is on. A closed pool of an ended ticket keeps
// what it has (ClosePool moves nothing into an ended sale): listed, it
// was closed again at every sweep, and a hundred of them filled the list
// and kept every other pool from closing (helper-93 #1).
func (l *Ledger) PoolsDue(ctx context.Context, limit int) ([]stock.SKU, error) {
	rows, err := l.queryRepeated(ctx, `SELECT p.program, p.ticket FROM skus p
		WHERE p.pool_closes_at > 0 AND p.pool_closes_at <= $1 AND (p.pool_closed_at = 0 OR (p.total - p.sold - p.held > 0 AND
			NOT EXISTS (SELECT 1 FROM skus b WHERE b.program = p.program AND b.ended_at <> 0 AND
				substr(p.ticket, 1, length(b.ticket) + 1) = b.ticket || '.')))
		ORDER BY p.pool_closes_at LIMIT $2`, l.now().UnixMilli(), limit)
	if err != nil {
		return nil, fmt.Errorf("ledger: pools due: %w", err)
	}
	defer rows.Close()
	var out []stock.SKU
	for rows.Next() {
		var s stock.SKU
		if err := rows.Scan(&s.Program, &s.Ticket); err != nil {
			return nil, fmt.Errorf("ledger: pools due: %w", err)
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// closeTarget is the pool a closing pool's stock moves into: the one
// its rule names while that one sells, else the public stock.
func closeTarget(ctx context.Context, tx *sql.Tx, pool stock.SKU, rule PoolRule) (stock.SKU, error) {
	into := pool.Base()
	if p := rule.Into; !p.IsZero() {
		if t, err := scanSKU(tx.QueryRowContext(ctx, selectSKU, pool.Program, keys.Pooled(into.Ticket, p))); err == nil &&
			t.Rule.ClosedAt.IsZero() && t.EndedAt.IsZero() {
			into = into.InPool(p)
		} else if err != nil && !errors.Is(err, stock.ErrUnknownSKU) {
			return into, notCommitted("close pool: read target", err)
		}
	}
	return into, nil
}

// pooledTotal is what a ticket's pools are allotted, inside tx.
func pooledTotal(ctx context.Context, tx *sql.Tx, base stock.SKU) (int64, error) {
	var n int64
	err := tx.QueryRowContext(ctx, `SELECT COALESCE(SUM(total), 0) FROM skus WHERE program = $1 AND `+pooledRange,
		base.Program, base.Ticket).Scan(&n)
	if err != nil {
		return 0, notCommitted("pooled total", err)
	}
	return n, nil
}

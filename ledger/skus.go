package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/stock"
)

// SKUConfig is what an admin sets on a SKU.
type SKUConfig struct {
	stock.SKU
	Total       int64 `json:"total"`
	Shards      int   `json:"shards"`
	MaxPerOrder int64 `json:"max_per_order"`
	// PerBuyer caps what one buyer may hold + own of the SKU; 0 is no cap.
	PerBuyer int64 `json:"per_buyer"`
	// HoldTTL is a hold's life unless the buyer asks for another, which
	// may not exceed HoldTTLMax. Defaults 15m and 1h.
	HoldTTL    time.Duration `json:"-"`
	HoldTTLMax time.Duration `json:"-"`
	// Resale is how listed tickets sell (ResaleFirst, ResaleAlongside);
	// "" keeps the SKU's (first for a new one).
	Resale string `json:"-"`
}

// Hold lifetimes a SKU may be configured with.
const (
	MinHoldTTL = time.Second
	MaxHoldTTL = 24 * time.Hour
)

// Validate reports stock.ErrInvalid for a config no SKU may have.
func (c SKUConfig) Validate() error {
	if c.SKU.Program.IsZero() || c.SKU.Ticket.IsZero() {
		return fmt.Errorf("%w: missing sku", stock.ErrInvalid)
	}
	switch {
	case !ValidResale(c.Resale):
		return fmt.Errorf("%w: resale %q is not first or alongside", stock.ErrInvalid, c.Resale)
	case c.Total < 0 || c.Total > stock.MaxTotal:
		return fmt.Errorf("%w: total %d not in 0..%d", stock.ErrInvalid, c.Total, stock.MaxTotal)
	case c.Shards < 1 || c.Shards > stock.MaxShards:
		return fmt.Errorf("%w: shards %d not in 1..%d", stock.ErrInvalid, c.Shards, stock.MaxShards)
	case c.MaxPerOrder < 1 || c.MaxPerOrder > stock.MaxPerOrderCap:
		return fmt.Errorf("%w: max_per_order %d not in 1..%d", stock.ErrInvalid, c.MaxPerOrder, stock.MaxPerOrderCap)
	case c.PerBuyer < 0 || c.PerBuyer > stock.MaxTotal:
		return fmt.Errorf("%w: per_buyer %d not in 0..%d", stock.ErrInvalid, c.PerBuyer, stock.MaxTotal)
	case c.HoldTTL != 0 && (c.HoldTTL < MinHoldTTL || c.HoldTTL > MaxHoldTTL):
		return fmt.Errorf("%w: hold ttl %v not in %v..%v", stock.ErrInvalid, c.HoldTTL, MinHoldTTL, MaxHoldTTL)
	case c.HoldTTLMax != 0 && (c.HoldTTLMax < max(c.WithDefaults().HoldTTL, MinHoldTTL) || c.HoldTTLMax > MaxHoldTTL):
		// Against the default lifetime too: a maximum below it would let
		// holds without a lifetime of their own outlive the maximum.
		return fmt.Errorf("%w: hold ttl max %v not in %v..%v", stock.ErrInvalid, c.HoldTTLMax, max(c.WithDefaults().HoldTTL, MinHoldTTL), MaxHoldTTL)
	}
	return nil
}

// WithDefaults is c with the hold lifetimes it leaves to the defaults
// filled in, as PutSKU stores it.
func (c SKUConfig) WithDefaults() SKUConfig {
	if c.HoldTTL == 0 {
		c.HoldTTL = 15 * time.Minute
	}
	if c.HoldTTLMax == 0 {
		c.HoldTTLMax = max(time.Hour, c.HoldTTL)
	}
	return c
}

// SKUState is a SKU row.
type SKUState struct {
	SKUConfig
	Sold      int64 `json:"sold"`
	Held      int64 `json:"held"`
	Version   int64 `json:"version"`
	BypassSeq int64 `json:"-"`
	GateSeq   int64 `json:"-"`
	// GateEpoch is the Redis gate's generation (see AdvanceGate).
	GateEpoch int64 `json:"-"`
	// EndedAt is when an admin ended the sale; zero while it runs.
	EndedAt time.Time `json:"-"`
	// Seated: the SKU sells specific seats (a seat map), not counted stock.
	Seated bool `json:"-"`
	// Listed is what orders have listed for resale and not sold yet: in
	// Total (for sale again) and in Sold (their sellers' still).
	Listed    int64     `json:"-"`
	UpdatedAt time.Time `json:"updated_at"`
	// Rule is a pool's window and access rule (zero for a ticket's public
	// stock).
	Rule PoolRule `json:"-"`
}

// Remaining is what may still be held or sold.
func (s SKUState) Remaining() int64 { return s.Total - s.Sold - s.Held }

// GateStale reports whether the ledger sold around the Redis gate since it
// was last rebuilt, so Redis must be re-seeded before it serves the SKU.
func (s SKUState) GateStale() bool { return s.BypassSeq > s.GateSeq }

// PutSKU creates a SKU or changes its settings. A total below what is sold
// and held is refused with stock.ErrInvalid and changes nothing. A seated
// SKU's total is its seat map's size and is left alone. Like a sale
// around the gate, it marks the gate stale: Redis must be rebuilt from the
// new row before it serves the SKU.
func (l *Ledger) PutSKU(ctx context.Context, c SKUConfig) (SKUState, error) {
	if err := c.Validate(); err != nil {
		return SKUState{}, err
	}
	c = c.WithDefaults()
	now := l.now().UnixMilli()
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: %w", err)
	}
	defer tx.Rollback()
	// First, before any row: a transfer waiting for it holds its order.
	if err := l.capLock(ctx, tx, c.SKU.Base(), true); err != nil {
		return SKUState{}, err
	}
	if err := l.fenceMoved(ctx, tx, c.Program); err != nil {
		return SKUState{}, err
	}
	_, err = tx.ExecContext(ctx, `
		INSERT INTO skus (program, ticket, total, shards, max_per_order, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (program, ticket) DO NOTHING`,
		c.Program, c.Ticket, c.Total, c.Shards, c.MaxPerOrder, now)
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: %w", err)
	}
	var wasCapped int64
	if err := tx.QueryRowContext(ctx, `SELECT per_buyer FROM skus WHERE program = $1 AND ticket = $2`+l.forUpdate(),
		c.Program, c.Ticket).Scan(&wasCapped); err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: %w", err)
	}
	_, err = tx.ExecContext(ctx, `
		UPDATE skus SET per_buyer = $3, hold_ttl_ms = $4, hold_ttl_max_ms = $5 WHERE program = $1 AND ticket = $2`,
		c.Program, c.Ticket, c.PerBuyer, c.HoldTTL.Milliseconds(), c.HoldTTLMax.Milliseconds())
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: %w", err)
	}
	// The total is the ticket's whole stock: the public row has what its
	// pools were not allotted. Units listed for resale are in the row's
	// total too but are their sellers' (and in sold): the organizer's
	// total may grow, or shrink while it still covers what is sold and
	// held, so the listed units stay for sale.
	pooled, err := pooledTotal(ctx, tx, c.SKU)
	if err != nil {
		return SKUState{}, err
	}
	res, err := tx.ExecContext(ctx, `
		UPDATE skus SET total = CASE WHEN seated = 1 THEN total ELSE $3 + listed END, shards = $4, max_per_order = $5,
			updated_at = $6, version = version + 1, bypass_seq = bypass_seq + 1
		WHERE program = $1 AND ticket = $2 AND (seated = 1 OR sold + held <= $3 OR $3 + listed >= total)`,
		c.Program, c.Ticket, c.Total-pooled, c.Shards, c.MaxPerOrder, now)
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return SKUState{}, fmt.Errorf("%w: total %d below sold + held + listed for resale (listed tickets are still their sellers'; and %d allotted to pools)", stock.ErrInvalid, c.Total, pooled)
	}
	if c.Resale != "" {
		if _, err := tx.ExecContext(ctx, `UPDATE skus SET resale = $3 WHERE program = $1 AND ticket = $2`, c.Program, c.Ticket, c.Resale); err != nil {
			return SKUState{}, fmt.Errorf("ledger: put sku: resale: %w", err)
		}
	}
	// A ticket's pools sell under its settings.
	if _, err := tx.ExecContext(ctx, `UPDATE skus SET max_per_order = $3, per_buyer = $4, hold_ttl_ms = $5, hold_ttl_max_ms = $6,
		version = version + 1 WHERE program = $1 AND `+pooledRange, c.Program, c.Ticket, c.MaxPerOrder, c.PerBuyer,
		c.HoldTTL.Milliseconds(), c.HoldTTLMax.Milliseconds()); err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: pools: %w", err)
	}
	// A cap switched on counts from the holds and orders standing now: the
	// ticket's row and its pools' are held by this transaction.
	if c.PerBuyer > 0 && wasCapped == 0 {
		if err := recountBuyers(ctx, tx, c.SKU); err != nil {
			return SKUState{}, err
		}
	}
	st, err := scanSKU(tx.QueryRowContext(ctx, selectSKU, c.Program, c.Ticket))
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return SKUState{}, fmt.Errorf("ledger: put sku: commit: %w", err)
	}
	return st, nil
}

const skuColumns = `program, ticket, total, sold, held, version, shards, max_per_order, bypass_seq, gate_seq,
	per_buyer, ended_at, hold_ttl_ms, hold_ttl_max_ms, seated, updated_at, gate_epoch,
	pool_opens_at, pool_closes_at, pool_access, pool_secret, pool_into, pool_closed_at, listed, resale`

const selectSKU = `SELECT ` + skuColumns + ` FROM skus WHERE program = $1 AND ticket = $2`

type rowScanner interface{ Scan(dest ...any) error }

func scanSKU(r rowScanner) (SKUState, error) {
	var s SKUState
	var updated, ended, ttl, ttlMax, seated, opens, closes, closed int64
	err := r.Scan(&s.Program, &s.Ticket, &s.Total, &s.Sold, &s.Held, &s.Version, &s.Shards, &s.MaxPerOrder,
		&s.BypassSeq, &s.GateSeq, &s.PerBuyer, &ended, &ttl, &ttlMax, &seated, &updated, &s.GateEpoch,
		&opens, &closes, &s.Rule.Access, &s.Rule.Secret, &s.Rule.Into, &closed, &s.Listed, &s.Resale)
	s.Seated = seated == 1
	s.Rule.OpensAt, s.Rule.ClosesAt, s.Rule.ClosedAt = fromMS(opens), fromMS(closes), fromMS(closed)
	if errors.Is(err, sql.ErrNoRows) {
		return s, stock.ErrUnknownSKU
	}
	s.UpdatedAt = time.UnixMilli(updated).UTC()
	s.HoldTTL, s.HoldTTLMax = time.Duration(ttl)*time.Millisecond, time.Duration(ttlMax)*time.Millisecond
	if ended > 0 {
		s.EndedAt = time.UnixMilli(ended).UTC()
	}
	return s, err
}

// SKU reads one SKU row; stock.ErrUnknownSKU when there is none.
func (l *Ledger) SKU(ctx context.Context, sku stock.SKU) (SKUState, error) {
	st, err := scanSKU(l.queryRowRepeated(ctx, selectSKU, sku.Program, sku.Ticket))
	if err != nil && !errors.Is(err, stock.ErrUnknownSKU) {
		return st, fmt.Errorf("ledger: sku: %w", err)
	}
	return st, err
}

// AdvanceGate moves a SKU's gate epoch on and returns the row as of that
// instant, in one transaction: the fence of a rebuild. The update waits for
// every transaction holding the row, and from its commit on, no request
// admitted under an older epoch can commit (ErrStaleGate), so the facts
// returned are everything the old gate admitted. The caller seeds Redis at
// the returned GateEpoch.
func (l *Ledger) AdvanceGate(ctx context.Context, sku stock.SKU) (SKUState, error) {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: advance gate: %w", err)
	}
	defer tx.Rollback()
	// The version moves too, so a sale around the gate that read the row
	// before cannot commit at the old epoch.
	res, err := tx.ExecContext(ctx, `UPDATE skus SET gate_epoch = gate_epoch + 1, version = version + 1
		WHERE program = $1 AND ticket = $2`,
		sku.Program, sku.Ticket)
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: advance gate: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return SKUState{}, stock.ErrUnknownSKU
	}
	st, err := scanSKU(tx.QueryRowContext(ctx, selectSKU, sku.Program, sku.Ticket))
	if err != nil {
		return SKUState{}, fmt.Errorf("ledger: advance gate: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return SKUState{}, fmt.Errorf("ledger: advance gate: commit: %w", err)
	}
	return st, nil
}

// MarkGateSeeded records that the Redis gate was rebuilt from ledger facts
// that included every bypass sale up to seq. It never moves gate_seq back.
func (l *Ledger) MarkGateSeeded(ctx context.Context, sku stock.SKU, seq int64) error {
	_, err := l.db.ExecContext(ctx, `
		UPDATE skus SET gate_seq = $3 WHERE program = $1 AND ticket = $2 AND gate_seq < $3`,
		sku.Program, sku.Ticket, seq)
	if err != nil {
		return fmt.Errorf("ledger: mark gate seeded: %w", err)
	}
	return nil
}

// SKUs lists SKU rows in (program, ticket) order, starting after the given
// SKU (the zero SKU starts at the beginning), at most limit of them.
func (l *Ledger) SKUs(ctx context.Context, after stock.SKU, limit int) ([]SKUState, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%w: limit %d", stock.ErrInvalid, limit)
	}
	rows, err := l.db.QueryContext(ctx, `SELECT `+skuColumns+` FROM skus
		WHERE program > $1 OR (program = $1 AND ticket > $2)
		ORDER BY program, ticket LIMIT $3`, after.Program, after.Ticket, limit)
	if err != nil {
		return nil, fmt.Errorf("ledger: skus: %w", err)
	}
	defer rows.Close()
	var out []SKUState
	for rows.Next() {
		st, err := scanSKU(rows)
		if err != nil {
			return nil, fmt.Errorf("ledger: skus: %w", err)
		}
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: skus: %w", err)
	}
	return out, nil
}

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

// What the ledger owes Redis: the units of ended holds, refunds and
// withdrawn listings not yet given back to the gate, found and marked
// done by the restore sweeper.

// Restore is stock the ledger took back (a cancelled or expired hold, a
// refunded order) that is still owed to Redis.
type Restore struct {
	Kind      string // "hold", "order" or "listing"
	ID        keys.ID
	SKU       stock.SKU
	Buyer     keys.ID
	RequestID keys.ID // the request id of the Redis records (deduction, quota, seats)
	Gate      string
	Quantity  int64
	// Epoch is the gate epoch the units came back under: only the gate of
	// that epoch is owed them (a later one was rebuilt from facts that
	// count them already). Shards is that gate's layout.
	Epoch  int64
	Shards int
	// CodeHash is the access code whose use comes back with the units.
	CodeHash string
	// CountsOnly: the ticket's gate has ended; only the counts the gate
	// made (the buyer's, a code's use) are owed back, not the units.
	CountsOnly bool
}

// PendingRestores lists up to limit restores whose ledger side ended at
// least olderThan ago: work a sweeper left unfinished when it died, or
// found too early (Redis not yet at the return's epoch). A random sample
// when there are more: restores that keep failing (their Redis master
// down) must not hide the others from every sweep (helper-55).
func (l *Ledger) PendingRestores(ctx context.Context, olderThan time.Duration, limit int) ([]Restore, error) {
	before := l.now().Add(-olderThan).UnixMilli()
	rows, err := l.queryRepeated(ctx, `SELECT * FROM (
		SELECT 'hold' AS kind, id, program, ticket, buyer, idem_key, gate, `+holdOwedUnits+` AS units, restore_epoch, restore_shards,
			`+holdOwedCode+` AS code, restore_pending
		FROM holds WHERE restore_pending > 0 AND ended_at <= $1
		UNION ALL
		SELECT 'order', id, program, ticket, buyer, CASE WHEN gate_key = '' THEN idem_key ELSE gate_key END, gate,
			quantity - offered, restore_epoch, restore_shards, `+orderOwedCode+`, restore_pending
		FROM orders WHERE restore_pending > 0 AND refunded_at <= $1
		UNION ALL
		SELECT 'listing', `+listingOwed+` FROM listings WHERE restore_pending > 0 AND created_at <= $1
		) pending ORDER BY random() LIMIT $2`, before, limit)
	if err != nil {
		return nil, fmt.Errorf("ledger: pending restores: %w", err)
	}
	defer rows.Close()
	var out []Restore
	for rows.Next() {
		var r Restore
		var pending int
		if err := rows.Scan(&r.Kind, &r.ID, &r.SKU.Program, &r.SKU.Ticket, &r.Buyer, &r.RequestID, &r.Gate,
			&r.Quantity, &r.Epoch, &r.Shards, &r.CodeHash, &pending); err != nil {
			return nil, fmt.Errorf("ledger: pending restores: %w", err)
		}
		r.CountsOnly = pending == owedCounts
		out = append(out, r)
	}
	return out, rows.Err()
}

// listingOwed are a listing's restore columns: its units, owed to the gate
// of the epoch it was made in, under its own id (which counted nothing at
// the gate, so no buyer's count goes back with them).
const listingOwed = `id, program, ticket, seller, id, '', quantity, restore_epoch, restore_shards, '', restore_pending`

// RestoreOwed returns the restore a hold or order owes Redis, if it still
// owes one (ok false otherwise): what the ledger recorded when it took the
// units back.
func (l *Ledger) RestoreOwed(ctx context.Context, kind string, id keys.ID) (Restore, bool, error) {
	q := `SELECT 'hold', id, program, ticket, buyer, idem_key, gate, ` + holdOwedUnits + `, restore_epoch, restore_shards, ` + holdOwedCode + `,
		restore_pending FROM holds WHERE id = $1 AND restore_pending > 0`
	switch kind {
	case "order":
		q = `SELECT 'order', id, program, ticket, buyer, CASE WHEN gate_key = '' THEN idem_key ELSE gate_key END, gate,
			quantity - offered, restore_epoch, restore_shards, ` + orderOwedCode + `, restore_pending FROM orders WHERE id = $1 AND restore_pending > 0`
	case "listing":
		q = `SELECT 'listing', ` + listingOwed + ` FROM listings WHERE id = $1 AND restore_pending > 0`
	}
	var r Restore
	var pending int
	err := l.db.QueryRowContext(ctx, q, id).Scan(&r.Kind, &r.ID, &r.SKU.Program, &r.SKU.Ticket, &r.Buyer, &r.RequestID,
		&r.Gate, &r.Quantity, &r.Epoch, &r.Shards, &r.CodeHash, &pending)
	r.CountsOnly = pending == owedCounts
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("ledger: restore owed: %w", err)
	}
	return r, true, nil
}

// RestoreDurable returns once the restore a hold, order or listing owes
// Redis is known to be on the synchronous standby, or fails; nil when it
// owes none. A restore found by reading (a replay's, the sweeper's, a
// late payment's) may stand on a COMMIT that applied on the primary alone
// (its backend ended while it waited for the standby, its reply lost): a
// failover takes it back, and units given to Redis for it are units the
// ledger does not have. Rewriting the row as it is writes WAL, so that
// COMMIT waits until the standby has the row's own commit too (as
// RequestDurable). Without a synchronous standby it is a local commit;
// SQLite has no standby.
func (l *Ledger) RestoreDurable(ctx context.Context, kind string, id keys.ID) error {
	if l.driver != Postgres {
		return nil
	}
	if _, err := l.db.ExecContext(ctx, `UPDATE `+restoreTable(kind)+` SET restore_pending = restore_pending WHERE id = $1 AND restore_pending > 0`,
		id); err != nil {
		return fmt.Errorf("ledger: restore: not known to be on the standby: %w", err)
	}
	return nil
}

// restoreTable is the table of a restore's kind.
func restoreTable(kind string) string {
	switch kind {
	case "order":
		return "orders"
	case "listing":
		return "listings"
	}
	return "holds"
}

// RestoreDone records that a restore reached Redis, or that Redis does not
// need it (a later rebuild counted it).
func (l *Ledger) RestoreDone(ctx context.Context, kind string, id keys.ID) error {
	if _, err := l.db.ExecContext(ctx, `UPDATE `+restoreTable(kind)+` SET restore_pending = 0 WHERE id = $1`, id); err != nil {
		return fmt.Errorf("ledger: restore done: %w", err)
	}
	return nil
}

// holdOwedUnits is what a hold's return owes Redis: its units less those a
// waitlist was offered, and less those its order kept when it was
// confirmed in part (a hold confirmed whole owes nothing). holdOwedCode is
// the access code whose use comes back: none when an order keeps it.
//
// What the order kept is the quantity it was confirmed for, not what it
// has now: a transfer or a resale since moved units out of it (counted in
// its order_listings rows), and reading its quantity now gave Redis back
// the moved units too, one more unit in Redis than the ledger for good
// (a partial confirm whose COMMIT reply was lost, a transfer, then the
// confirm's retry or the sweeper). As confirmedAgain reads it.
const (
	holdOwedUnits = `quantity - offered - CASE WHEN state = 'confirmed'
		THEN COALESCE((SELECT CASE WHEN COALESCE(SUM(l.resold_out), 0) <> 0 THEN COALESCE(SUM(l.resold + l.transferred), 0)
				ELSE o.quantity + COALESCE(SUM(l.resold + l.transferred), 0) END
			FROM orders o LEFT JOIN order_listings l ON l.order_id = o.id WHERE o.id = holds.order_id GROUP BY o.quantity), quantity)
		ELSE 0 END`
	holdOwedCode = `CASE WHEN state = 'confirmed' THEN '' ELSE code_hash END`
)

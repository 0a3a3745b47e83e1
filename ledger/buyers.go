package ledger

// What each buyer holds and owns, for the per-buyer caps, and the stock
// a refund, cancel or expiry gives back to its SKU row.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// buyerRow is one buyer_units row to count units into: a SKU's, or its
// program's when sku.Ticket is zero.
type buyerRow struct {
	sku   stock.SKU
	buyer keys.ID
	units int64
}

// capOf is the cap on the buyer_units row named by table t (0: none): its
// SKU's per_buyer, or its program's for a program row (empty ticket). A SKU
// that does not exist gives NULL, which no comparison passes.
func capOf(t string) string {
	return `(CASE WHEN ` + t + `.ticket = '' THEN COALESCE((SELECT per_buyer FROM programs p WHERE p.program = ` + t + `.program), 0)
		ELSE (SELECT per_buyer FROM skus s WHERE s.program = ` + t + `.program AND s.ticket = ` + t + `.ticket) END)`
}

// countBuyersSQL adds units to buyer rows under their caps; a row its cap
// refuses is left as it was and not returned. The rows are taken in the
// order of the VALUES list, so callers that sort them lock them in one
// global order.
var countBuyersSQL = `INSERT INTO buyer_units (program, ticket, buyer, units)
	SELECT w.program, w.ticket, w.buyer, w.units
	FROM (SELECT column1 AS program, column2 AS ticket, column3 AS buyer, column4 AS units FROM (VALUES %s) AS v) AS w
	WHERE w.units <= ` + capOf("w") + `
	ON CONFLICT (program, ticket, buyer) DO UPDATE SET units = buyer_units.units + excluded.units
	WHERE buyer_units.units + excluded.units <= ` + capOf("buyer_units") + `
	RETURNING program, ticket, buyer`

// capSQL reads the cap on one buyer_units row (0: none).
var capSQL = `SELECT COALESCE(` + capOf("w") + `, 0) FROM (SELECT CAST($1 AS TEXT) AS program, CAST($2 AS TEXT) AS ticket) AS w`

// countBuyers adds each row's units to its buyer_units row, inside tx,
// taking the rows in the order given (no row twice): only the rows under
// a cap, as a take counts them (a cap switched on later counts its scope
// from the holds and orders first). It returns the first row whose cap
// refused it (the transaction must then be rolled back: the other rows
// were counted), or nil.
func countBuyers(ctx context.Context, tx *sql.Tx, rows []buyerRow) (*buyerRow, error) {
	type name struct{ program, ticket, buyer keys.ID }
	var capped []buyerRow
	for _, r := range rows {
		var limit int64
		if err := tx.QueryRowContext(ctx, capSQL, r.sku.Program, r.sku.Ticket).Scan(&limit); err != nil {
			return nil, notCommitted("buyer cap", err)
		}
		if limit > 0 {
			capped = append(capped, r)
		}
	}
	counted := make(map[name]bool, len(capped))
	for chunk := range slices.Chunk(capped, rowsPerStatement) {
		vals := make([]string, len(chunk))
		args := make([]any, 0, 4*len(chunk))
		for i, r := range chunk {
			k := len(args)
			vals[i] = fmt.Sprintf("($%d, $%d, $%d, CAST($%d AS BIGINT))", k+1, k+2, k+3, k+4)
			args = append(args, r.sku.Program, r.sku.Ticket, r.buyer, r.units)
		}
		got, err := tx.QueryContext(ctx, fmt.Sprintf(countBuyersSQL, strings.Join(vals, ", ")), args...)
		if err := collectRows(got, err, counted, func(n *name) []any { return []any{&n.program, &n.ticket, &n.buyer} }); err != nil {
			return nil, notCommitted("buyer units", err)
		}
	}
	for i, r := range capped {
		if !counted[name{r.sku.Program, r.sku.Ticket, r.buyer}] {
			return &capped[i], nil
		}
	}
	return nil, nil
}

// recountBuyers rewrites the buyer_units rows of scope (a ticket, with its
// pools; or with a zero Ticket, a whole program) from the holds held and
// the orders that stand: what a cap switched on counts from. Takes count
// units into a scope only while it has a cap, so a cap switched on finds
// its rows missing or stale. The caller holds the scope's SKU rows, so no
// take of it commits meanwhile.
func recountBuyers(ctx context.Context, tx *sql.Tx, scope stock.SKU) error {
	in := `program = $1 AND (ticket = $2 OR ` + pooledRange + `)`
	if scope.Ticket.IsZero() {
		in = `program = $1 AND $2 = ''`
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM buyer_units WHERE program = $1 AND ticket = $2`, scope.Program, scope.Ticket); err != nil {
		return fmt.Errorf("ledger: recount buyers: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO buyer_units (program, ticket, buyer, units)
		SELECT $1, $2, buyer, SUM(quantity) FROM (
			SELECT buyer, quantity FROM holds WHERE `+in+` AND state = 'held'
			UNION ALL SELECT buyer, quantity FROM orders WHERE `+in+` AND refunded_at = 0) AS live
		GROUP BY buyer`, scope.Program, scope.Ticket); err != nil {
		return fmt.Errorf("ledger: recount buyers: %w", err)
	}
	return nil
}

// returned is what a return of stock found: the row's new version, and
// the gate epoch and shard count at that instant, which decide whether and
// where Redis gets the units back.
type returned struct {
	version, epoch int64
	shards         int
	ended          bool // the sale has ended: its gate admits no one, and is owed nothing
}

// returnStock gives q units of column back and uncounts them from the
// buyer, inside tx.
func returnStock(ctx context.Context, tx *sql.Tx, sku stock.SKU, buyer keys.ID, q int64, column string, now int64) (returned, error) {
	r, err := returnSKU(ctx, tx, sku, q, column, now)
	if err != nil {
		return r, err
	}
	return r, uncountBuyer(ctx, tx, sku, buyer, q)
}

// returnSKU is returnStock's first half: the SKU row.
func returnSKU(ctx context.Context, tx *sql.Tx, sku stock.SKU, q int64, column string, now int64) (returned, error) {
	var r returned
	var ended int64
	err := tx.QueryRowContext(ctx, `UPDATE skus SET `+column+` = `+column+` - $3, version = version + 1, updated_at = $4
		WHERE program = $1 AND ticket = $2 AND `+column+` >= $3
		RETURNING version, gate_epoch, shards, ended_at`, sku.Program, sku.Ticket, q, now).Scan(&r.version, &r.epoch, &r.shards, &ended)
	r.ended = ended > 0
	if errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("ledger: return %d %s units of %s: the row has fewer", q, column, sku)
	}
	if err != nil {
		return r, notCommitted("return stock", err)
	}
	return r, nil
}

// uncountBuyer is returnStock's second half: the buyer's SKU and program
// rows.
func uncountBuyer(ctx context.Context, tx *sql.Tx, sku stock.SKU, buyer keys.ID, q int64) error {
	if _, err := tx.ExecContext(ctx, `UPDATE buyer_units SET units = units - $4
		WHERE program = $1 AND ticket IN ($2, '') AND buyer = $3 AND units >= $4`, sku.Program, sku.Base().Ticket, buyer, q); err != nil {
		return notCommitted("buyer units", err)
	}
	return nil
}

// capLock takes, on PostgreSQL, the transaction's advisory lock of a
// buyer cap's scope (a ticket, or with a zero Ticket its program): shared
// by a transfer, which moves buyer counts without locking any SKU row,
// and exclusive by a change of the scope's cap, which recounts it from one
// read. Neither then slips between the other's read and write (a transfer
// committing during the recount left the sender counted for units gone
// and the receiver uncounted). An advisory lock, not the ticket's row: a
// share lock on the row held every sale of the ticket up for the
// transfer's length, and its order (order, then row) was the reverse of a
// listing's and a settle's. SQLite's one writer needs none.
func (l *Ledger) capLock(ctx context.Context, tx *sql.Tx, scope stock.SKU, exclusive bool) error {
	if l.driver != Postgres {
		return nil
	}
	fn := "pg_advisory_xact_lock_shared"
	if exclusive {
		fn = "pg_advisory_xact_lock"
	}
	if _, err := tx.ExecContext(ctx, `SELECT `+fn+`(hashtextextended($1, 0))`,
		"stockgate cap "+scope.Program.String()+"/"+scope.Ticket.String()); err != nil {
		return notCommitted("cap lock", err)
	}
	return nil
}

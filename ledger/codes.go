package ledger

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

// Access codes unlock a pool whose rule is AccessCode. The ledger stores a
// code's hash (the caller hashes), its use limit and the buyer it is bound
// to, if any. A use is an order or a hold that stands on the code: the
// count is taken from them in the transaction that adds one, under the
// code row's lock, so a refund, a cancel or an expiry gives the use back
// with the stock, and nothing else has to.

// Errors of access codes.
var (
	// ErrCodeInvalid: no such code for the pool, or bound to another buyer.
	ErrCodeInvalid = errors.New("ledger: access code not valid here")
	// ErrCodeUsedUp: the code's uses are all taken.
	ErrCodeUsedUp = errors.New("ledger: access code used up")
)

// Code is one access code of a pool.
type Code struct {
	Hash    string
	MaxUses int64
	Buyer   keys.ID // zero: anyone holding it
}

// MaxCodesPerCall bounds one PutCodes.
const MaxCodesPerCall = 10_000

// PutCodes adds codes to a pool (pool is the pool's stock); a code already
// there keeps its first settings. It returns how many were new.
func (l *Ledger) PutCodes(ctx context.Context, pool stock.SKU, codes []Code) (int, error) {
	if pool.Pool().IsZero() || len(codes) == 0 || len(codes) > MaxCodesPerCall {
		return 0, fmt.Errorf("%w: %d codes for %s", stock.ErrInvalid, len(codes), pool)
	}
	for _, c := range codes {
		if c.Hash == "" || c.MaxUses < 1 {
			return 0, fmt.Errorf("%w: a code has a hash and at least one use", stock.ErrInvalid)
		}
	}
	if _, err := l.SKU(ctx, pool); err != nil {
		return 0, err
	}
	now := l.now().UnixMilli()
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("ledger: put codes: %w", err)
	}
	defer tx.Rollback()
	// A move copying the program would not copy these: refused under its
	// tombstone, as every other write of the program is.
	if err := l.fenceMoved(ctx, tx, pool.Program); err != nil {
		return 0, err
	}
	added := 0
	for chunk := range slices.Chunk(codes, rowsPerStatement) {
		var vals []string
		var args []any
		for _, c := range chunk {
			vals = append(vals, placeholders(len(args), 6))
			args = append(args, pool.Program, pool.Ticket, c.Hash, c.MaxUses, c.Buyer, now)
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO access_codes (program, ticket, code_hash, max_uses, buyer, created_at)
			VALUES `+strings.Join(vals, ", ")+` ON CONFLICT (program, ticket, code_hash) DO NOTHING`, args...)
		if err != nil {
			return 0, fmt.Errorf("ledger: put codes: %w", err)
		}
		n, _ := res.RowsAffected()
		added += int(n)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("ledger: put codes: commit: %w", err)
	}
	return added, nil
}

// CodeOf returns a pool's code by its hash, or ErrNotFound.
func (l *Ledger) CodeOf(ctx context.Context, pool stock.SKU, hash string) (Code, error) {
	c := Code{Hash: hash}
	err := l.db.QueryRowContext(ctx, `SELECT max_uses, buyer FROM access_codes WHERE program = $1 AND ticket = $2 AND code_hash = $3`,
		pool.Program, pool.Ticket, hash).Scan(&c.MaxUses, &c.Buyer)
	if errors.Is(err, sql.ErrNoRows) {
		return c, ErrNotFound
	}
	if err != nil {
		return c, fmt.Errorf("ledger: code: %w", err)
	}
	return c, nil
}

// orderPurchase is the purchase an order's units came from: its gate
// request (which a transfer's split keeps), else its own key.
const orderPurchase = `CASE WHEN gate_key = '' THEN idem_key ELSE gate_key END`

// codeUsesSQL counts a code's uses: the purchases with an order standing
// (a transfer's split is one use with the order it was split from) and
// the holds still held on it.
const codeUsesSQL = `SELECT (SELECT COUNT(DISTINCT ` + orderPurchase + `) FROM orders WHERE code_hash = $3 AND code_hash <> '' AND program = $1 AND ticket = $2 AND refunded_at = 0)
	+ (SELECT COUNT(*) FROM holds WHERE code_hash = $3 AND code_hash <> '' AND program = $1 AND ticket = $2 AND state = 'held')`

// orderOwedCode is the access code whose use an order's refund gives
// back: none while another part of its purchase (a transfer's split, or
// the order it was split from) stands with the code. An order without a
// code reads nothing more (the partial index on code_hash never holds
// the empty ones).
const orderOwedCode = `CASE WHEN orders.code_hash = '' THEN ''
	WHEN EXISTS (SELECT 1 FROM orders s WHERE s.code_hash = orders.code_hash AND s.code_hash <> '' AND s.program = orders.program
	AND s.ticket = orders.ticket AND s.refunded_at = 0 AND s.id <> orders.id
	AND (CASE WHEN s.gate_key = '' THEN s.idem_key ELSE s.gate_key END) = (CASE WHEN orders.gate_key = '' THEN orders.idem_key ELSE orders.gate_key END))
	THEN '' ELSE orders.code_hash END`

// CodeUses is how many uses of a code stand now.
func (l *Ledger) CodeUses(ctx context.Context, pool stock.SKU, hash string) (int64, error) {
	var n int64
	if err := l.db.QueryRowContext(ctx, codeUsesSQL, pool.Program, pool.Ticket, hash).Scan(&n); err != nil {
		return 0, fmt.Errorf("ledger: code uses: %w", err)
	}
	return n, nil
}

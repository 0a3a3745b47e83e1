package ledger

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"

	"github.com/stockgate/stockgate/keys"
)

// ErrSplit marks an order of a batch that could not be committed together
// with the others (its SKU's stock or a buyer's cap would not cover the
// whole batch, or the sale ended); nothing of it was written. It wraps the
// reason (stock.ErrSoldOut, stock.ErrLimit, ...). Commit it alone to learn
// its own answer.
var ErrSplit = errors.New("ledger: commit alone")

// BatchResult is one item's outcome in a batch of confirms: the stored
// order and nil, ErrDuplicate with what the key already had, or ErrSplit.
type BatchResult struct {
	Order Order
	Hold  Hold
	Err   error
}

// rowsPerStatement bounds one multi-row statement (PostgreSQL takes at most
// 65,535 parameters; SQLite 32,766).
const rowsPerStatement = 500

// placeholders is "($k+1, ..., $k+n)" for a row of n parameters after k.
func placeholders(k, n int) string { return "(" + list(k, n) + ")" }

// insertOrders writes the order rows in multi-row statements and returns
// the row keys it inserted (a key already taken is left out).
func insertOrders(ctx context.Context, tx *sql.Tx, orders []Order) (map[keys.ID]bool, error) {
	inserted := map[keys.ID]bool{}
	for chunk := range slices.Chunk(orders, rowsPerStatement) {
		var vals []string
		var args []any
		for _, o := range chunk {
			vals = append(vals, placeholders(len(args), 15))
			args = append(args, o.ID, o.IdempotencyKey, o.RequestHash, o.SKU.Program, o.SKU.Ticket, o.Buyer, o.Quantity,
				o.Gate, o.GateKey, o.HoldID, o.CreatedAt.UnixMilli(), o.TakeEpoch, o.CartID, o.CodeHash, keys.Join(o.SeatIDs, ","))
		}
		got, err := tx.QueryContext(ctx, `INSERT INTO orders (id, idem_key, request_hash, program, ticket, buyer, quantity, gate,
			gate_key, hold_id, created_at, take_epoch, cart_id, code_hash, seat_ids)
			VALUES `+strings.Join(vals, ", ")+` ON CONFLICT (idem_key) DO NOTHING RETURNING idem_key`, args...)
		if err := collectIDs(got, err, inserted); err != nil {
			return nil, notCommitted("insert orders", err)
		}
	}
	return inserted, nil
}

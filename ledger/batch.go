package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// ErrSplit marks an order of a batch that could not be committed together
// with the others (its SKU's stock or a buyer's cap would not cover the
// whole batch, or the sale ended); nothing of it was written. It wraps the
// reason (stock.ErrSoldOut, stock.ErrLimit, ...). Commit it alone to learn
// its own answer.
var ErrSplit = errors.New("ledger: commit alone")

// BatchResult is one order's outcome in PurchaseBatch: the stored order
// and nil, ErrDuplicate with the order the key already had, or ErrSplit.
type BatchResult struct {
	Order Order
	Err   error
}

// PurchaseBatch commits many orders the Redis gate admitted in one
// transaction (group commit): the order rows, then one conditional update
// per SKU for the sum of its new orders, then each buyer's counts under the
// caps. Winners of a hot SKU then cost one transaction per batch instead of
// one each, all waiting on one row lock. If a SKU's update or a buyer's cap
// refuses, the transaction is rolled back and retried without that SKU's
// orders, which come back as ErrSplit. The error return is for the batch as
// a whole: ErrNotCommitted before COMMIT, any other error at COMMIT (the
// outcome is unknown; look the keys up).
//
// With direct, the orders went around the Redis gate (the breaker is open):
// each SKU's update is optimistic, at the version read in the same
// transaction, and bumps bypass_seq like PurchaseDirect; a version that
// moved meanwhile (another replica sold) fails the batch with ErrConflict,
// nothing written, to be retried.
func (l *Ledger) PurchaseBatch(ctx context.Context, orders []Order, direct bool) (_ []BatchResult, err error) {
	op := "purchase_batch"
	if direct {
		op = "purchase_direct_batch"
	}
	defer l.observe(op, time.Now(), &err)
	out := make([]BatchResult, len(orders))
	now := l.now().UTC().Truncate(time.Millisecond)
	live := make([]int, 0, len(orders))
	for i, o := range orders {
		if o.Quantity < 1 || o.IdempotencyKey.IsZero() {
			return nil, fmt.Errorf("%w: order quantity %d key %q", stock.ErrInvalid, o.Quantity, o.IdempotencyKey)
		}
		if o.ID.IsZero() {
			orders[i].ID = NewID()
		}
		orders[i].CreatedAt = now
		live = append(live, i)
	}
	for len(live) > 0 {
		split, why, dups, err := l.tryBatch(ctx, orders, live, now, direct)
		if err != nil {
			return nil, err
		}
		if split.Program.IsZero() {
			for _, i := range live {
				out[i] = BatchResult{Order: orders[i]}
			}
			l.batch.Observe(float64(len(live) - len(dups)))
			for _, i := range dups {
				out[i] = l.batchReplay(ctx, orders[i])
			}
			return out, nil
		}
		// Take the refusing SKU out and try again without it.
		kept := live[:0:0]
		for _, i := range live {
			if orders[i].SKU == split {
				out[i] = BatchResult{Err: fmt.Errorf("%w: %w", ErrSplit, why)}
			} else {
				kept = append(kept, i)
			}
		}
		live = kept
	}
	return out, nil
}

// batchReplay answers an order of a batch whose request, or row key, was
// taken: ErrDuplicate with the stored order, or ErrKeyReused.
func (l *Ledger) batchReplay(ctx context.Context, o Order) BatchResult {
	if !o.Req.IsZero() {
		prev, err := l.orderReplay(ctx, o.Req)
		return BatchResult{Order: prev, Err: err}
	}
	prev, err := l.OrderByKey(ctx, o.IdempotencyKey)
	if err != nil {
		return BatchResult{Err: fmt.Errorf("ledger: batch: duplicate key: %w", err)}
	}
	return BatchResult{Order: prev, Err: ErrDuplicate}
}

// skuEpoch groups a batch's orders: one conditional update per SKU and gate
// epoch, so orders admitted by a gate since rebuilt fail alone.
type skuEpoch struct {
	sku   stock.SKU
	epoch int64
}

// tryBatch runs one transaction over orders[live]. It returns the SKU that
// refused and why (zero when it committed), and the indexes whose request
// or row key was taken.
func (l *Ledger) tryBatch(ctx context.Context, orders []Order, live []int, now time.Time, direct bool) (stock.SKU, error, []int, error) {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return stock.SKU{}, nil, nil, notCommitted("batch: begin", err)
	}
	defer tx.Rollback()
	var dups []int
	// Around the gate, each SKU's version and epoch as read in this
	// transaction: the updates below apply only at that version, and the
	// epoch cannot move without the version.
	read := map[stock.SKU]SKUState{}
	if direct {
		for _, i := range live {
			sku := orders[i].SKU
			if _, ok := read[sku]; ok {
				continue
			}
			st, err := scanSKU(tx.QueryRowContext(ctx, selectSKU, sku.Program, sku.Ticket))
			if errors.Is(err, stock.ErrUnknownSKU) {
				return sku, err, nil, nil
			}
			if err != nil {
				return stock.SKU{}, nil, nil, notCommitted("batch: read sku", err)
			}
			read[sku] = st
		}
	}
	sums := map[skuEpoch]int64{}
	buyers := map[stock.SKU]map[keys.ID]int64{}
	// Claims in one global order (scope, key): two batches that share
	// requests (a retry sent to two replicas) wait on each other's claims
	// in the same order, never in a cycle.
	byKey := slices.Clone(live)
	slices.SortFunc(byKey, func(a, b int) int {
		ra, rb := orders[a].Req, orders[b].Req
		if c := ra.Scope.Compare(rb.Scope); c != 0 {
			return c
		}
		return ra.Key.Compare(rb.Key)
	})
	// Claims and order rows in one statement each, not one round trip per
	// order: winners are what the ledger is busy with.
	taken, err := claimAll(ctx, tx, orders, byKey, now.UnixMilli())
	if err != nil {
		return stock.SKU{}, nil, nil, err
	}
	var fresh []int
	for _, i := range byKey {
		if taken[i] {
			dups = append(dups, i)
			continue
		}
		orders[i].TakeEpoch = orders[i].GateEpoch
		if direct {
			orders[i].TakeEpoch = read[orders[i].SKU].GateEpoch
		}
		fresh = append(fresh, i)
	}
	inserted, err := insertOrders(ctx, tx, orders, fresh)
	if err != nil {
		return stock.SKU{}, nil, nil, err
	}
	for _, i := range fresh {
		o := orders[i]
		if !inserted[o.IdempotencyKey] {
			dups = append(dups, i) // a row key taken: only internal writes get here
			continue
		}
		g := skuEpoch{o.SKU, o.GateEpoch}
		if direct {
			g.epoch = -1
		}
		sums[g] += o.Quantity
		if buyers[o.SKU] == nil {
			buyers[o.SKU] = map[keys.ID]int64{}
		}
		buyers[o.SKU][o.Buyer] += o.Quantity
	}
	// SKU rows in a fixed order, all before any buyer row, as every write
	// that moves stock: concurrent batches, refunds and expiries cannot
	// deadlock.
	groups := make([]skuEpoch, 0, len(sums))
	for g := range sums {
		groups = append(groups, g)
	}
	slices.SortFunc(groups, func(a, b skuEpoch) int {
		if c := a.sku.Compare(b.sku); c != 0 {
			return c
		}
		return int(a.epoch - b.epoch)
	})
	versions := map[stock.SKU]int64{}
	for _, g := range groups {
		var version int64 = -1
		if direct {
			version = read[g.sku].Version
		}
		v, _, err := updateSKU(ctx, tx, g.sku, sums[g], "sold", version, g.epoch, now.UnixMilli())
		switch {
		case errors.Is(err, ErrConflict):
			return stock.SKU{}, nil, nil, ErrConflict
		case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrSaleEnded), errors.Is(err, stock.ErrUnknownSKU),
			errors.Is(err, ErrStaleGate):
			return g.sku, err, nil, nil
		case err != nil:
			return stock.SKU{}, nil, nil, err
		}
		versions[g.sku] = v
		if direct {
			// Two updates of one SKU in a batch cannot happen around the
			// gate (one group per SKU), but keep the read version true.
			st := read[g.sku]
			st.Version = v
			read[g.sku] = st
		}
	}
	skus := make([]stock.SKU, 0, len(buyers))
	for sku := range buyers {
		skus = append(skus, sku)
	}
	slices.SortFunc(skus, stock.SKU.Compare)
	// Buyer rows: every SKU's (SKUs in order, buyers in order), then every
	// program's, so two batches over different SKUs of one program meet
	// the program's rows in the same order (they would deadlock taking
	// them SKU by SKU).
	perProgram := map[stock.SKU]map[keys.ID]int64{}
	for _, sku := range skus {
		names := make([]keys.ID, 0, len(buyers[sku]))
		for b := range buyers[sku] {
			names = append(names, b)
		}
		slices.SortFunc(names, keys.ID.Compare)
		for _, b := range names {
			err := countSKUBuyer(ctx, tx, sku, b, buyers[sku][b])
			if errors.Is(err, stock.ErrLimit) {
				return sku, err, nil, nil
			}
			if err != nil {
				return stock.SKU{}, nil, nil, err
			}
			if perProgram[sku.Whole()] == nil {
				perProgram[sku.Whole()] = map[keys.ID]int64{}
			}
			perProgram[sku.Whole()][b] += buyers[sku][b]
		}
	}
	programs := make([]stock.SKU, 0, len(perProgram))
	for p := range perProgram {
		programs = append(programs, p)
	}
	slices.SortFunc(programs, stock.SKU.Compare)
	for _, p := range programs {
		names := make([]keys.ID, 0, len(perProgram[p]))
		for b := range perProgram[p] {
			names = append(names, b)
		}
		slices.SortFunc(names, keys.ID.Compare)
		for _, b := range names {
			err := countProgramBuyer(ctx, tx, p.Program, b, perProgram[p][b])
			if errors.Is(err, stock.ErrLimit) {
				// Over the program's cap: split out the first SKU of the
				// program this buyer takes in the batch, and try again.
				for _, sku := range skus {
					if sku.Program == p.Program && buyers[sku][b] > 0 {
						return sku, err, nil, nil
					}
				}
			}
			if err != nil {
				return stock.SKU{}, nil, nil, err
			}
		}
	}
	for sku, v := range versions {
		if err := stamp(ctx, tx, sku, v); err != nil {
			return stock.SKU{}, nil, nil, err
		}
	}
	if err := tx.Commit(); err != nil {
		return stock.SKU{}, nil, nil, fmt.Errorf("ledger: batch: commit: %w", err)
	}
	return stock.SKU{}, nil, dups, nil
}

// rowsPerStatement bounds one multi-row statement (PostgreSQL takes at most
// 65,535 parameters; SQLite 32,766).
const rowsPerStatement = 500

// placeholders is "($k+1, ..., $k+n)" for a row of n parameters after k.
func placeholders(k, n int) string {
	var b strings.Builder
	b.WriteByte('(')
	for j := range n {
		if j > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('$')
		b.WriteString(strconv.Itoa(k + j + 1))
	}
	b.WriteByte(')')
	return b.String()
}

// claimAll claims the client requests of orders[idx] with the orders as
// their answers (claimRows) and returns the indexes whose key was taken
// already (or earlier in the same batch).
func claimAll(ctx context.Context, tx *sql.Tx, orders []Order, idx []int, now int64) (map[int]bool, error) {
	rows := make([]claimRow, 0, len(idx))
	for _, i := range idx {
		if o := orders[i]; !o.Req.IsZero() {
			rows = append(rows, claimRow{id: o.IdempotencyKey, req: o.Req, sku: o.SKU, answer: encodeSnapshot(&o, nil)})
		}
	}
	taken, err := claimRows(ctx, tx, rows, now)
	if err != nil {
		return nil, err
	}
	out := map[int]bool{}
	for _, i := range idx {
		if taken[orders[i].IdempotencyKey] {
			out[i] = true
		}
	}
	return out, nil
}

// insertOrders writes the order rows of orders[idx] in multi-row
// statements and returns the row keys it inserted (a key already taken is
// left out).
func insertOrders(ctx context.Context, tx *sql.Tx, orders []Order, idx []int) (map[keys.ID]bool, error) {
	inserted := map[keys.ID]bool{}
	for len(idx) > 0 {
		chunk := idx[:min(len(idx), rowsPerStatement)]
		idx = idx[len(chunk):]
		var vals []string
		var args []any
		for _, i := range chunk {
			o := orders[i]
			vals = append(vals, placeholders(len(args), 12))
			args = append(args, o.ID, o.IdempotencyKey, o.RequestHash, o.SKU.Program, o.SKU.Ticket, o.Buyer, o.Quantity,
				o.Gate, o.GateKey, o.HoldID, o.CreatedAt.UnixMilli(), o.TakeEpoch)
		}
		got, err := tx.QueryContext(ctx, `INSERT INTO orders (id, idem_key, request_hash, program, ticket, buyer, quantity, gate,
			gate_key, hold_id, created_at, take_epoch)
			VALUES `+strings.Join(vals, ", ")+` ON CONFLICT (idem_key) DO NOTHING RETURNING idem_key`, args...)
		if err != nil {
			return nil, notCommitted("insert orders", err)
		}
		for got.Next() {
			var k keys.ID
			if err := got.Scan(&k); err != nil {
				got.Close()
				return nil, notCommitted("insert orders", err)
			}
			inserted[k] = true
		}
		got.Close()
		if err := got.Err(); err != nil {
			return nil, notCommitted("insert orders", err)
		}
	}
	return inserted, nil
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

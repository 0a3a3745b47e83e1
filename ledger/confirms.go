package ledger

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// HoldRequest is one client's confirm or cancel of a hold, for
// ConfirmBatch and CancelBatch.
type HoldRequest struct {
	HoldID, Buyer keys.ID
	Req           Request
}

// plainHolds reads the holds the requests name and returns, by request
// index, the hold of each request a batch may decide: a hold that exists,
// held, of the buyer named, under a client key, named once, and for which
// live says yes. Every other request is for the caller to split out.
func (l *Ledger) plainHolds(ctx context.Context, rs []HoldRequest, live func(Hold) bool) (map[int]Hold, error) {
	ids := make([]keys.ID, 0, len(rs))
	for _, r := range rs {
		ids = append(ids, r.HoldID)
	}
	found, err := l.holdsByID(ctx, ids)
	if err != nil {
		return nil, err
	}
	out := map[int]Hold{}
	named := map[keys.ID]bool{}
	for i, r := range rs {
		h, ok := found[r.HoldID]
		if !ok || r.Req.IsZero() || h.Buyer != r.Buyer || h.State != Held || !h.CartID.IsZero() || named[h.ID] || !live(h) {
			continue
		}
		named[h.ID] = true
		out[i] = h
	}
	return out, nil
}

// ConfirmBatch confirms many holds in one transaction (group commit): the
// requests are claimed with their orders as the stored answers, the holds
// change state in one statement, the orders are inserted in one, and each
// SKU row moves held to sold once for all its holds, and a seat hold's
// seats are sold in one statement for all. Confirms are most of
// what an on-sale writes (every sale that pays while held), and one
// transaction per confirm is one durable commit each.
//
// It decides only the plain case: a live hold (counted or seats) of the
// buyer named, under a request key not used before. Anything else (a
// retry, a hold ended or ending, a hold of another buyer, a hold named
// twice, a key taken) comes back as ErrSplit with nothing written, for
// Confirm to answer alone with its own replay or refusal. The error return
// is for the batch as a whole: ErrNotCommitted before COMMIT, any other
// error at COMMIT (the outcome is unknown). Either way each confirm can be
// asked again of Confirm, which replays what committed.
func (l *Ledger) ConfirmBatch(ctx context.Context, cs []HoldRequest) (_ []BatchResult, err error) {
	defer l.observe("confirm_batch", time.Now(), &err)
	out := make([]BatchResult, len(cs))
	now := l.now().UTC().Truncate(time.Millisecond)
	plain, err := l.plainHolds(ctx, cs, func(h Hold) bool { return now.Before(h.ExpiresAt) })
	if err != nil {
		return nil, err
	}
	orders := make([]Order, len(cs))
	live := make([]int, 0, len(cs))
	seats := map[keys.ID]bool{} // the seat holds
	for i, c := range cs {
		h, ok := plain[i]
		if !ok {
			out[i] = BatchResult{Err: ErrSplit}
			continue
		}
		seats[h.ID] = len(h.SeatIDs) > 0
		orders[i] = confirmOrder(h, c.Req, now)
		live = append(live, i)
	}
	for len(live) > 0 {
		split, err := l.tryConfirms(ctx, orders, live, seats, now)
		if err != nil {
			return nil, err
		}
		if len(split) == 0 {
			for _, i := range live {
				out[i] = BatchResult{Order: orders[i]}
			}
			l.batch.Observe(float64(len(live)))
			return out, nil
		}
		kept := live[:0:0]
		for _, i := range live {
			if split[i] {
				out[i] = BatchResult{Err: ErrSplit}
			} else {
				kept = append(kept, i)
			}
		}
		live = kept
	}
	return out, nil
}

// confirmOrder is the order a confirm of h makes: the hold's stock, gate
// record and take epoch, under the row key derived from the hold.
func confirmOrder(h Hold, req Request, now time.Time) Order {
	return Order{ID: NewID(), IdempotencyKey: ConfirmKey(h.ID), RequestHash: h.RequestHash, SKU: h.SKU, Buyer: h.Buyer,
		Quantity: h.Quantity, Gate: h.Gate, GateKey: h.IdempotencyKey, HoldID: h.ID, CreatedAt: now, TakeEpoch: h.TakeEpoch,
		CodeHash: h.CodeHash, SeatIDs: h.SeatIDs, Req: req}
}

// tryConfirms runs one transaction over orders[live] and returns the
// indexes that must be decided alone (nothing written then), or nil when
// it committed. Locks are taken as every stock write takes them: requests
// (in key order), holds, then SKU rows in SKU order.
func (l *Ledger) tryConfirms(ctx context.Context, orders []Order, live []int, seats map[keys.ID]bool, now time.Time) (map[int]bool, error) {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, notCommitted("confirm batch: begin", err)
	}
	defer tx.Rollback()
	byKey := slices.Clone(live)
	slices.SortFunc(byKey, func(a, b int) int {
		ra, rb := orders[a].Req, orders[b].Req
		if c := ra.Scope.Compare(rb.Scope); c != 0 {
			return c
		}
		return ra.Key.Compare(rb.Key)
	})
	taken, err := claimAll(ctx, tx, orders, byKey, now.UnixMilli())
	if err != nil {
		return nil, err
	}
	if len(taken) > 0 {
		return taken, nil // retries and reused keys: Confirm answers them
	}
	// The state change decides each hold's fate, as in Confirm: a hold that
	// ended or began ending since it was read changes no row here.
	changed, err := confirmHolds(ctx, tx, orders, live, now)
	if err != nil {
		return nil, err
	}
	split := map[int]bool{}
	for _, i := range live {
		if !changed[orders[i].HoldID] {
			split[i] = true
		}
	}
	if len(split) > 0 {
		return split, nil
	}
	rows := make([]Order, len(live))
	for j, i := range live {
		rows[j] = orders[i]
	}
	inserted, err := insertOrders(ctx, tx, rows)
	if err != nil {
		return nil, err
	}
	sums := map[stock.SKU]int64{}
	for _, i := range live {
		if !inserted[orders[i].IdempotencyKey] {
			split[i] = true // the hold's order row exists: Confirm replays it
		}
		sums[orders[i].SKU] += orders[i].Quantity
	}
	if len(split) > 0 {
		return split, nil
	}
	skus := make([]stock.SKU, 0, len(sums))
	for sku := range sums {
		skus = append(skus, sku)
	}
	slices.SortFunc(skus, stock.SKU.Compare)
	for _, sku := range skus {
		var v int64
		err := tx.QueryRowContext(ctx, `UPDATE skus SET held = held - $3, sold = sold + $3, version = version + 1, updated_at = $4
			WHERE program = $1 AND ticket = $2 AND held >= $3 RETURNING version`,
			sku.Program, sku.Ticket, sums[sku], now.UnixMilli()).Scan(&v)
		if err != nil {
			// Fewer held than the live holds of the SKU add up to: the
			// ledger disagrees with itself, which no retry mends.
			return nil, notCommitted(fmt.Sprintf("confirm batch: %s held < %d", sku, sums[sku]), err)
		}
		if err := stamp(ctx, tx, sku, v); err != nil {
			return nil, err
		}
	}
	// A seat hold's seats are sold with it, after the SKU rows as in
	// Confirm.
	var seated []any
	for _, i := range live {
		if seats[orders[i].HoldID] {
			seated = append(seated, orders[i].HoldID)
		}
	}
	for chunk := range slices.Chunk(seated, rowsPerStatement) {
		if _, err := tx.ExecContext(ctx, `UPDATE seats SET state = $2 WHERE state = $1 AND hold_id IN (`+list(2, len(chunk))+`)`,
			append([]any{seatHeld, seatSold}, chunk...)...); err != nil {
			return nil, notCommitted("sell seats", err)
		}
	}
	events := make([]Event, 0, len(live))
	for _, i := range live {
		events = append(events, confirmEvent(orders[i]))
	}
	if err := emit(ctx, tx, now, events...); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("ledger: confirm batch: commit: %w", err)
	}
	return nil, nil
}

// confirmHolds marks the holds of orders[idx] confirmed by their orders,
// in one statement per chunk, where they are still held and live, and
// returns the ids it changed.
func confirmHolds(ctx context.Context, tx *sql.Tx, orders []Order, idx []int, now time.Time) (map[keys.ID]bool, error) {
	changed := map[keys.ID]bool{}
	for len(idx) > 0 {
		chunk := idx[:min(len(idx), rowsPerStatement)]
		idx = idx[len(chunk):]
		args := []any{Confirmed, now.UnixMilli(), Held}
		var cases, in []string
		for _, i := range chunk {
			o := orders[i]
			cases = append(cases, fmt.Sprintf("WHEN $%d THEN $%d", len(args)+1, len(args)+2))
			in = append(in, fmt.Sprintf("$%d", len(args)+1))
			args = append(args, o.HoldID, o.ID)
		}
		rows, err := tx.QueryContext(ctx, `UPDATE holds SET state = $1, ended_at = $2, order_id = CASE id `+
			strings.Join(cases, " ")+` END WHERE id IN (`+strings.Join(in, ", ")+`) AND state = $3 AND expires_at > $2
			RETURNING id`, args...)
		if err := collectIDs(rows, err, changed); err != nil {
			return nil, notCommitted("confirm holds", err)
		}
	}
	return changed, nil
}

// collectIDs adds the ids a RETURNING id statement gave (rows, err are its
// QueryContext's results) to into, and closes rows.
func collectIDs(rows *sql.Rows, err error, into map[keys.ID]bool) error {
	return collectRows(rows, err, into, func(k *keys.ID) []any { return []any{k} })
}

// collectRows adds every row of a query (rows and err as QueryContext
// returned them) to into, each read into a K through the destinations
// dest gives, and closes rows.
func collectRows[K comparable](rows *sql.Rows, err error, into map[K]bool, dest func(*K) []any) error {
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var k K
		if err := rows.Scan(dest(&k)...); err != nil {
			return err
		}
		into[k] = true
	}
	return rows.Err()
}

// holdsByID reads the holds named, in statements of rowsPerStatement ids;
// ids not found are missing from the map.
func (l *Ledger) holdsByID(ctx context.Context, ids []keys.ID) (map[keys.ID]Hold, error) {
	return byID(ctx, l.db, selectHold, scanHold, func(h Hold) keys.ID { return h.ID }, ids)
}

// ordersByID is holdsByID for orders.
func (l *Ledger) ordersByID(ctx context.Context, ids []keys.ID) (map[keys.ID]Order, error) {
	return byID(ctx, l.db, selectOrder, scanOrder, func(o Order) keys.ID { return o.ID }, ids)
}

func byID[T any](ctx context.Context, db *sql.DB, sel string, scan func(rowScanner) (T, error), id func(T) keys.ID,
	ids []keys.ID) (map[keys.ID]T, error) {
	out := make(map[keys.ID]T, len(ids))
	for chunk := range slices.Chunk(ids, rowsPerStatement) {
		args := make([]any, len(chunk))
		for i, id := range chunk {
			args[i] = id
		}
		rows, err := db.QueryContext(ctx, sel+` WHERE id IN (`+list(0, len(chunk))+`)`, args...)
		if err != nil {
			return nil, notCommitted("read rows", err)
		}
		for rows.Next() {
			v, err := scan(rows)
			if err != nil {
				rows.Close()
				return nil, notCommitted("read rows", err)
			}
			out[id(v)] = v
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, notCommitted("read rows", err)
		}
	}
	return out, nil
}

package ledger

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
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
	if l.driver == Postgres {
		l.trips.Inc() // the read of the holds
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
	return Order{ID: NewIDOf(h.SKU), IdempotencyKey: ConfirmKey(h.ID), RequestHash: h.RequestHash, SKU: h.SKU, Buyer: h.Buyer,
		Quantity: h.Quantity, Gate: h.Gate, GateKey: h.IdempotencyKey, HoldID: h.ID, CreatedAt: now, TakeEpoch: h.TakeEpoch,
		CodeHash: h.CodeHash, SeatIDs: h.SeatIDs, Req: req}
}

// tryConfirms runs one transaction over orders[live] and returns the
// indexes that must be decided alone (nothing written then), or nil when
// it committed. Its statements go together (one pipeline on PostgreSQL):
// the holds' state change, which decides each hold's fate against a
// sweeper or a cancel as in Confirm; the SKU rows locked in SKU order and
// moved held to sold once each; the requests with their answers; the
// order rows; the seat holds' seats sold; the events.
func (l *Ledger) tryConfirms(ctx context.Context, orders []Order, live []int, seats map[keys.ID]bool, now time.Time) (map[int]bool, error) {
	r, err := l.runner(ctx)
	if err != nil {
		return nil, notCommitted("confirm batch: connect", err)
	}
	defer r.close()
	d, ms := l.driver, now.UnixMilli()
	hs := newRowset("ttt")
	sums := map[stock.SKU]int64{}
	var claims []claimRow
	rows := make([]Order, 0, len(live))
	events := make([]Event, 0, len(live))
	sold := newRowset("t")
	for _, i := range live {
		o := orders[i]
		hs.add(o.HoldID.String(), o.Buyer.String(), o.ID.String())
		sums[o.SKU] += o.Quantity
		claims = append(claims, claimRow{req: o.Req, sku: o.SKU, answer: encodeSnapshot(&o, nil)})
		rows = append(rows, o)
		events = append(events, confirmEvent(o))
		if seats[o.HoldID] {
			sold.add(o.HoldID.String())
		}
	}
	skus := slices.SortedFunc(maps.Keys(sums), stock.SKU.Compare)
	upd := newRowset("tti")
	for _, sku := range skus {
		upd.add(sku.Program.String(), sku.Ticket.String(), sums[sku])
	}
	changed, updated, claimed, inserted := map[keys.ID]bool{}, map[stock.SKU]bool{}, map[ScopedKey]bool{}, map[keys.ID]bool{}
	orderOf := map[keys.ID]keys.ID{} // the order each hold's confirm makes
	for _, i := range live {
		orderOf[orders[i].HoldID] = orders[i].ID
	}
	lock := newRowset("t")
	for _, i := range live {
		lock.add(orders[i].HoldID.String())
	}
	steps := []step{
		{sql: l.sql.lockHolds, args: lock.args(d)},
		{sql: l.sql.confirmHolds, args: append([]any{ms}, hs.args(d)...), read: func(rs resultRows) error {
			var id, order keys.ID
			var state string
			err := rs.Scan(&id, &state, &order)
			changed[id] = state == Confirmed && order == orderOf[id]
			return err
		}},
		l.lockStep(skus, nil),
		{sql: l.sql.confirmUpdate, args: append([]any{ms}, upd.args(d)...), read: func(rs resultRows) error {
			var sku stock.SKU
			err := rs.Scan(&sku.Program, &sku.Ticket)
			updated[sku] = true
			return err
		}},
		l.claimsStep(now, claims, claimed),
		l.ordersStep(now, rows, inserted),
	}
	if sold.n > 0 {
		steps = append(steps, step{sql: l.sql.sellSeats, args: sold.args(d)})
	}
	steps = append(steps, l.eventsStep(now, events, nil))
	if err := r.run(ctx, steps); err != nil {
		return nil, notCommitted("confirm batch", err)
	}
	split := map[int]bool{}
	for _, i := range live {
		o := orders[i]
		// A hold that ended or began ending since it was read changes no
		// row; a key taken is a retry or a reuse; an order row there is
		// the hold's, confirmed before: Confirm answers each.
		if !changed[o.HoldID] || !claimed[ScopedKey{o.Req.Scope, o.Req.Key}] || !inserted[o.IdempotencyKey] {
			split[i] = true
		}
	}
	if len(split) > 0 {
		if err := r.end(ctx, false); err != nil {
			return nil, notCommitted("confirm batch: roll back", err)
		}
		return split, nil
	}
	for _, sku := range skus {
		if !updated[sku] {
			// Fewer held than the live holds of the SKU add up to: the
			// ledger disagrees with itself, which no retry mends.
			_ = r.end(ctx, false) // the failure returned says more than the rollback's
			return nil, notCommitted("confirm batch", fmt.Errorf("%s holds fewer than %d", sku, sums[sku]))
		}
	}
	if err := r.end(ctx, true); err != nil {
		return nil, fmt.Errorf("ledger: confirm batch: commit: %w", err)
	}
	return nil, nil
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

// holdsByID reads the holds named in one statement of fixed text (ids
// not found are missing from the map).
func (l *Ledger) holdsByID(ctx context.Context, ids []keys.ID) (map[keys.ID]Hold, error) {
	return byID(ctx, l, l.sql.holdsRead, scanHold, func(h Hold) keys.ID { return h.ID }, ids)
}

// ordersByID is holdsByID for orders.
func (l *Ledger) ordersByID(ctx context.Context, ids []keys.ID) (map[keys.ID]Order, error) {
	return byID(ctx, l, l.sql.ordersRead, scanOrder, func(o Order) keys.ID { return o.ID }, ids)
}

func byID[T any](ctx context.Context, l *Ledger, q string, scan func(rowScanner) (T, error), id func(T) keys.ID,
	ids []keys.ID) (map[keys.ID]T, error) {
	out := make(map[keys.ID]T, len(ids))
	in := newRowset("t")
	for _, id := range ids {
		in.add(id.String())
	}
	rows, err := l.queryRepeated(ctx, q, in.args(l.driver)...)
	if err != nil {
		return nil, notCommitted("read rows", err)
	}
	defer rows.Close()
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, notCommitted("read rows", err)
		}
		out[id(v)] = v
	}
	if err := rows.Err(); err != nil {
		return nil, notCommitted("read rows", err)
	}
	return out, nil
}

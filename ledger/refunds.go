package ledger

import (
	"context"
	"database/sql"
	"slices"
	"time"

	"github.com/stockgate/stockgate/keys"
)

// OrderRequest is a buyer's request about one of their orders (a refund).
type OrderRequest struct {
	OrderID keys.ID
	Buyer   keys.ID
	Req     Request
}

// OrderResult is one refund's outcome in RefundBatch: the refunded order,
// or ErrSplit (nothing written: ask Refund alone).
type OrderResult struct {
	Order Order
	Err   error
}

// RefundBatch refunds many orders in one transaction, as CancelBatch ends
// holds: the requests are claimed with the refunded orders as their
// answers, the orders are marked in one statement, seats sold with them
// are freed in one, each SKU row gives its sold units back once, and the
// buyers' counts go down. After a cancelled on-sale or a promoter's mass
// refund, refunds come in bursts, and one transaction each is one durable
// commit each.
//
// It decides only the plain case: an order of the buyer named, not
// refunded, named once, under a request key not used before. Anything else
// (a retry, another buyer's order, a second refund, a key taken) comes
// back as ErrSplit with nothing written, for Refund to answer alone. The
// error return is for the batch as a whole, as in ConfirmBatch; Refund
// replays whatever did commit.
func (l *Ledger) RefundBatch(ctx context.Context, rs []OrderRequest) (_ []OrderResult, err error) {
	defer l.observe("refund_batch", time.Now(), &err)
	out := make([]OrderResult, len(rs))
	now := l.now().UTC().Truncate(time.Millisecond)
	ids := make([]keys.ID, 0, len(rs))
	for _, r := range rs {
		ids = append(ids, r.OrderID)
	}
	found, err := l.ordersByID(ctx, ids)
	if err != nil {
		return nil, err
	}
	var refs []refund
	named := map[keys.ID]bool{}
	for i, r := range rs {
		o, ok := found[r.OrderID]
		if !ok || r.Req.IsZero() || o.Buyer != r.Buyer || !o.RefundedAt.IsZero() || named[o.ID] {
			out[i] = OrderResult{Err: ErrSplit}
			continue
		}
		named[o.ID] = true
		o.RefundedAt = now
		refs = append(refs, refund{idx: i, order: o, req: r.Req})
	}
	for len(refs) > 0 {
		split, err := l.tryRefunds(ctx, refs, now)
		if err != nil {
			return nil, err
		}
		if len(split) == 0 {
			for _, r := range refs {
				out[r.idx] = OrderResult{Order: r.order}
			}
			l.batch.Observe(float64(len(refs)))
			return out, nil
		}
		refs = slices.DeleteFunc(refs, func(r refund) bool {
			if split[r.order.ID] {
				out[r.idx] = OrderResult{Err: ErrSplit}
			}
			return split[r.order.ID]
		})
	}
	return out, nil
}

// refund is one order to refund (as it reads once refunded), with the
// request that refunds it and its index in the caller's batch.
type refund struct {
	idx   int
	order Order
	req   Request
}

// tryRefunds refunds the orders in one transaction and returns the ids
// that could not be refunded with the others (their key was taken, or
// another refund came first), with nothing written; nil when it committed.
// Its locks come in the order of every stock write: requests, order rows,
// seats, SKU rows in SKU order, buyer rows.
func (l *Ledger) tryRefunds(ctx context.Context, refs []refund, now time.Time) (map[keys.ID]bool, error) {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, notCommitted("refunds: begin", err)
	}
	defer tx.Rollback()
	claims := make([]claimRow, 0, len(refs))
	for _, r := range refs {
		claims = append(claims, claimRow{id: r.order.ID, req: r.req, sku: r.order.SKU, answer: encodeSnapshot(&r.order, nil)})
	}
	taken, err := claimRows(ctx, tx, claims, now.UnixMilli())
	if err != nil || len(taken) > 0 {
		return taken, err
	}
	ids := make([]keys.ID, len(refs))
	for i, r := range refs {
		ids[i] = r.order.ID
	}
	if err := l.lockRows(ctx, tx, l.sql.lockOrders, ids); err != nil {
		return nil, err
	}
	changed, err := markRefunded(ctx, tx, refs, now)
	if err != nil {
		return nil, err
	}
	gone := map[keys.ID]bool{}
	var holds []any
	for _, r := range refs {
		if !changed[r.order.ID] {
			gone[r.order.ID] = true
		}
		if holder, ok := r.order.seatHolder(); ok {
			holds = append(holds, holder)
		}
	}
	if len(gone) > 0 {
		return gone, nil
	}
	seated, err := freeSeats(ctx, tx, holds)
	if err != nil {
		return nil, err
	}
	backs := make([]back, 0, len(refs))
	for _, r := range refs {
		o := r.order
		backs = append(backs, back{id: o.ID, sku: o.SKU, buyer: o.Buyer, quantity: o.Quantity, gate: o.Gate,
			takeEpoch: o.TakeEpoch, seats: seated[seatHolderOf(o)]})
	}
	offers, err := giveBack(ctx, tx, "sold", "orders", backs, now)
	if err != nil {
		return nil, err
	}
	events := make([]Event, 0, len(refs)+len(offers))
	for _, r := range refs {
		e := orderEvent(EventOrderRefunded, r.order)
		e.Trace = r.req.Trace // the refund's, not the purchase's
		events = append(events, e)
	}
	return nil, emitCommit(ctx, tx, now, "refunds", append(events, offers...)...)
}

// markRefunded marks the orders refunded and returns the ones it did,
// as they were read: not already refunded, with the buyer and quantity
// read, and none of their tickets listed for resale.
func markRefunded(ctx context.Context, tx *sql.Tx, refs []refund, now time.Time) (map[keys.ID]bool, error) {
	changed := map[keys.ID]bool{}
	for chunk := range slices.Chunk(refs, rowsPerStatement) {
		args := []any{now.UnixMilli()}
		for _, r := range chunk {
			args = append(args, r.order.ID)
		}
		// An order's buyer and quantity change when its tickets move
		// (Transfer): one that changed since it was read is decided alone,
		// by Refund, which reads it under its lock.
		rows, err := tx.QueryContext(ctx, `UPDATE orders SET refunded_at = $1 WHERE refunded_at = 0 AND id IN (`+
			list(1, len(chunk))+`) RETURNING id, buyer, quantity`, args...)
		type asIs struct {
			id, buyer keys.ID
			q         int64
		}
		read := map[asIs]bool{}
		if err := collectRows(rows, err, read, func(a *asIs) []any { return []any{&a.id, &a.buyer, &a.q} }); err != nil {
			return nil, notCommitted("refund orders", err)
		}
		for _, r := range chunk {
			if read[asIs{r.order.ID, r.order.Buyer, r.order.Quantity}] {
				changed[r.order.ID] = true
			}
		}
	}
	// An order with tickets listed for resale is not refunded: Refund
	// alone says why. Its row is held here, as by whoever lists from it.
	for chunk := range slices.Chunk(refs, rowsPerStatement) {
		args := make([]any, 0, len(chunk))
		for _, r := range chunk {
			args = append(args, r.order.ID)
		}
		rows, err := tx.QueryContext(ctx, `SELECT order_id FROM order_listings WHERE listed > 0 AND order_id IN (`+list(0, len(chunk))+`)`, args...)
		listed := map[keys.ID]bool{}
		if err := collectIDs(rows, err, listed); err != nil {
			return nil, notCommitted("listed orders", err)
		}
		for id := range listed {
			delete(changed, id)
		}
	}
	return changed, nil
}

// freeSeats frees the seats sold through the seat holds and returns the
// holds that had any.
//
// Seats sold through a confirmed seat hold (or a cart's seat line) go back
// with its order. No one else moves them meanwhile: only the refund of
// that order frees them, and the refund holds its row.
func freeSeats(ctx context.Context, tx *sql.Tx, holds []any) (map[keys.ID]bool, error) {
	seated := map[keys.ID]bool{}
	for chunk := range slices.Chunk(holds, rowsPerStatement) {
		args := append([]any{seatSold}, chunk...)
		rows, err := tx.QueryContext(ctx, `SELECT DISTINCT hold_id FROM seats WHERE state = $1 AND hold_id IN (`+
			list(1, len(chunk))+`)`, args...)
		if err := collectIDs(rows, err, seated); err != nil {
			return nil, notCommitted("read seats", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE seats SET state = $2, hold_id = '' WHERE state = $1 AND hold_id IN (`+
			list(2, len(chunk))+`)`, append([]any{seatSold, seatFree}, chunk...)...); err != nil {
			return nil, notCommitted("free seats", err)
		}
	}
	return seated, nil
}

// seatHolderOf is the order's seat holder, or the zero id for none.
func seatHolderOf(o Order) keys.ID {
	id, _ := o.seatHolder()
	return id
}

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

// HoldResult is one hold's outcome in CancelBatch: the cancelled hold, or
// ErrSplit (nothing written: ask Cancel alone).
type HoldResult struct {
	Hold Hold
	Err  error
}

// CancelBatch cancels many holds in one transaction: the requests are
// claimed with the cancelled holds as their stored answers, and the holds
// end together (endHolds). It decides only the plain case, a held hold of
// the buyer named under an unused key; anything else (a retry, a hold
// confirmed or ended, another buyer's, one named twice, a key taken) comes
// back as ErrSplit with nothing written, for Cancel to answer alone. The
// error return is for the batch as a whole, as in ConfirmBatch; Cancel
// replays whatever did commit.
func (l *Ledger) CancelBatch(ctx context.Context, cs []HoldRequest) (_ []HoldResult, err error) {
	defer l.observe("cancel_batch", time.Now(), &err)
	out := make([]HoldResult, len(cs))
	now := l.now().UTC().Truncate(time.Millisecond)
	plain, err := l.plainHolds(ctx, cs, func(Hold) bool { return true })
	if err != nil {
		return nil, err
	}
	var ends []holdEnd
	for i, c := range cs {
		h, ok := plain[i]
		if !ok {
			out[i] = HoldResult{Err: ErrSplit}
			continue
		}
		ends = append(ends, holdEnd{idx: i, hold: h, req: c.Req})
	}
	for len(ends) > 0 {
		split, err := l.tryEnds(ctx, ends, Cancelled, false, now)
		if err != nil {
			return nil, err
		}
		if len(split) == 0 {
			for _, e := range ends {
				out[e.idx] = HoldResult{Hold: e.ended(Cancelled, now)}
			}
			l.batch.Observe(float64(len(ends)))
			return out, nil
		}
		ends = slices.DeleteFunc(ends, func(e holdEnd) bool {
			if split[e.hold.ID] {
				out[e.idx] = HoldResult{Err: ErrSplit}
			}
			return split[e.hold.ID]
		})
	}
	return out, nil
}

// ExpireDue expires up to limit live holds whose expiry has passed, in one
// transaction (endHolds), and returns those this call expired. Any number
// of sweepers may run it at once: a hold whose state another sweeper, a
// confirm or a cancel changed first is left out and the rest expire.
func (l *Ledger) ExpireDue(ctx context.Context, limit int) (_ []Hold, err error) {
	defer l.observe(Expired, time.Now(), &err)
	now := l.now().UTC().Truncate(time.Millisecond)
	rows, err := l.queryRepeated(ctx, selectHold+` WHERE state = $1 AND expires_at <= $2 ORDER BY expires_at LIMIT $3`,
		Held, now.UnixMilli(), limit)
	if err != nil {
		return nil, fmt.Errorf("ledger: expire: %w", err)
	}
	var ends []holdEnd
	for rows.Next() {
		h, err := scanHold(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		ends = append(ends, holdEnd{hold: h})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: expire: %w", err)
	}
	for len(ends) > 0 {
		gone, err := l.tryEnds(ctx, ends, Expired, true, now)
		if err != nil {
			return nil, err
		}
		if len(gone) == 0 {
			break
		}
		ends = slices.DeleteFunc(ends, func(e holdEnd) bool { return gone[e.hold.ID] })
	}
	done := make([]Hold, len(ends))
	for i, e := range ends {
		done[i] = e.ended(Expired, now)
	}
	return done, nil
}

// holdEnd is one hold to end, with the client request that ends it (zero
// for the sweeper) and its index in the caller's batch.
type holdEnd struct {
	idx  int
	hold Hold
	req  Request
}

func (e holdEnd) ended(state string, now time.Time) Hold {
	h := e.hold
	h.State, h.EndedAt = state, now
	return h
}

// tryEnds ends the holds in one transaction and returns the ids that could
// not be ended with the others (their key was taken, or their state changed
// since they were read), with nothing written; nil when it committed. It
// takes its locks as every stock write does: requests in key order, hold
// rows, seats, SKU rows in SKU order, then buyer rows, SKU ones before
// program ones, each in order.
func (l *Ledger) tryEnds(ctx context.Context, ends []holdEnd, state string, dueOnly bool, now time.Time) (map[keys.ID]bool, error) {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, notCommitted("end holds: begin", err)
	}
	defer tx.Rollback()
	var claims []claimRow
	for _, e := range ends {
		if !e.req.IsZero() {
			h := e.ended(state, now)
			claims = append(claims, claimRow{id: e.hold.ID, req: e.req, sku: e.hold.SKU, answer: encodeSnapshot(nil, &h)})
		}
	}
	taken, err := claimRows(ctx, tx, claims, now.UnixMilli())
	if err != nil || len(taken) > 0 {
		return taken, err
	}
	ids := make([]keys.ID, len(ends))
	for i, e := range ends {
		ids[i] = e.hold.ID
	}
	if err := l.lockRows(ctx, tx, l.sql.lockHolds, ids); err != nil {
		return nil, err
	}
	changed, err := endStates(ctx, tx, ends, state, dueOnly, now)
	if err != nil {
		return nil, err
	}
	gone := map[keys.ID]bool{}
	for _, e := range ends {
		if !changed[e.hold.ID] {
			gone[e.hold.ID] = true
		}
	}
	if len(gone) > 0 {
		return gone, nil
	}
	var seated []any
	var backs []back
	for _, e := range ends {
		if len(e.hold.SeatIDs) > 0 {
			seated = append(seated, e.hold.ID)
		}
		backs = append(backs, holdBack(e.hold))
	}
	if len(seated) > 0 {
		if _, err := tx.ExecContext(ctx, `UPDATE seats SET state = $1, hold_id = '' WHERE state = $2 AND hold_id IN (`+
			list(2, len(seated))+`)`, append([]any{seatFree, seatHeld}, seated...)...); err != nil {
			return nil, notCommitted("free seats", err)
		}
	}
	offers, err := giveBack(ctx, tx, "held", "holds", backs, now)
	if err != nil {
		return nil, err
	}
	events := make([]Event, 0, len(ends)+len(offers))
	for _, e := range ends {
		ev := holdEvent(endEvent(state, e.hold), e.hold)
		ev.Trace = e.req.Trace // the cancel's ("" for the sweeper's expiries)
		events = append(events, ev)
	}
	return nil, emitCommit(ctx, tx, now, "end holds", append(events, offers...)...)
}

// lockRows locks the rows of ids in id order (q is lockHolds or
// lockOrders), as every batch that changes several takes them.
func (l *Ledger) lockRows(ctx context.Context, tx *sql.Tx, q string, ids []keys.ID) error {
	in := newRowset("t")
	for _, id := range ids {
		in.add(id.String())
	}
	rows, err := tx.QueryContext(ctx, q, in.args(l.driver)...)
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	if err != nil {
		return notCommitted("lock rows", err)
	}
	return nil
}

// endStates moves the holds that are still held (and due, with dueOnly)
// to state, in one statement per chunk, and returns the ids it changed.
func endStates(ctx context.Context, tx *sql.Tx, ends []holdEnd, state string, dueOnly bool, now time.Time) (map[keys.ID]bool, error) {
	changed := map[keys.ID]bool{}
	for chunk := range slices.Chunk(ends, rowsPerStatement) {
		args := []any{state, now.UnixMilli(), Held}
		for _, e := range chunk {
			args = append(args, e.hold.ID)
		}
		// The holds are found by id: state and expiry are compared as
		// expressions no index matches, so a planner whose statistics lag
		// a burst of new holds cannot pick the (state, expires_at) index and
		// read every held hold (see confirmHolds).
		due := ""
		switch {
		case dueOnly:
			due = " AND expires_at + 0 <= $2"
		case state == Cancelled:
			// A hold past its expiry is not cancelled: Cancel ends it
			// expired, alone (see endHold).
			due = " AND expires_at + 0 > $2"
		}
		rows, err := tx.QueryContext(ctx, `UPDATE holds SET state = $1, ended_at = $2 WHERE state || '' = $3`+due+
			` AND id IN (`+list(3, len(chunk))+`) RETURNING id`, args...)
		if err := collectIDs(rows, err, changed); err != nil {
			return nil, notCommitted("end holds", err)
		}
	}
	return changed, nil
}

// back is an ended hold's or a refunded order's units coming back.
type back struct {
	id        keys.ID
	sku       stock.SKU
	buyer     keys.ID
	quantity  int64
	gate      string
	takeEpoch int64
	seats     bool // seats went back with it
}

func holdBack(h Hold) back {
	return back{id: h.ID, sku: h.SKU, buyer: h.Buyer, quantity: h.Quantity, gate: h.Gate, takeEpoch: h.TakeEpoch, seats: len(h.SeatIDs) > 0}
}

// giveBack returns the units of ended holds (column "held", table
// "holds") or refunded orders ("sold", "orders"): each SKU's row once, in
// SKU order, then the buyers' counts; then offers them to each SKU's
// waitlist, and returns the offers' events.
func giveBack(ctx context.Context, tx *sql.Tx, column, table string, backs []back, now time.Time) ([]Event, error) {
	bySKU := map[stock.SKU][]back{}
	for _, b := range backs {
		bySKU[b.sku] = append(bySKU[b.sku], b)
	}
	skus := make([]stock.SKU, 0, len(bySKU))
	for sku := range bySKU {
		skus = append(skus, sku)
	}
	slices.SortFunc(skus, stock.SKU.Compare)
	got := make(map[stock.SKU]returned, len(skus))
	for _, sku := range skus {
		r, err := returnUnits(ctx, tx, column, table, sku, bySKU[sku], now)
		if err != nil {
			return nil, err
		}
		got[sku] = r
	}
	if err := unbuy(ctx, tx, skus, bySKU); err != nil {
		return nil, err
	}
	var events []Event
	for _, sku := range skus {
		var units int64
		rows := make([]backRow, 0, len(bySKU[sku]))
		for _, b := range bySKU[sku] {
			units += b.quantity
			rows = append(rows, backRow{table, b.id, b.quantity, isOwed(b.gate, b.takeEpoch, b.seats, got[sku])})
		}
		offers, err := offerBack(ctx, tx, sku, units, rows, now)
		if err != nil {
			return nil, err
		}
		events = append(events, offers...)
	}
	return events, nil
}

// returnUnits gives a SKU's returned units back in one update of its row,
// stamps the requests that returned them with the new row version, and
// records on each hold or order whether Redis is owed its units, as owed
// decides for one.
func returnUnits(ctx context.Context, tx *sql.Tx, column, table string, sku stock.SKU, backs []back, now time.Time) (returned, error) {
	var q int64
	for _, b := range backs {
		q += b.quantity
	}
	var r returned
	var ended int64
	err := tx.QueryRowContext(ctx, `UPDATE skus SET `+column+` = `+column+` - $3, version = version + 1, updated_at = $4
		WHERE program = $1 AND ticket = $2 AND `+column+` >= $3
		RETURNING version, gate_epoch, shards, ended_at`, sku.Program, sku.Ticket, q, now.UnixMilli()).Scan(&r.version, &r.epoch, &r.shards, &ended)
	if errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("ledger: return %d %s units of %s: the row has fewer", q, column, sku)
	}
	if err != nil {
		return r, notCommitted("return stock", err)
	}
	r.ended = ended > 0
	if err := stamp(ctx, tx, sku, r.version); err != nil {
		return r, err
	}
	byPending := map[int][]any{}
	for _, b := range backs {
		p := isOwed(b.gate, b.takeEpoch, b.seats, r)
		byPending[p] = append(byPending[p], b.id)
	}
	for _, p := range []int{owedNothing, owedUnits, owedCounts} {
		for chunk := range slices.Chunk(byPending[p], rowsPerStatement) {
			if _, err := tx.ExecContext(ctx, `UPDATE `+table+` SET restore_pending = $1, restore_epoch = $2, restore_shards = $3
				WHERE id IN (`+list(3, len(chunk))+`)`, append([]any{p, r.epoch, r.shards}, chunk...)...); err != nil {
				return r, notCommitted("restore owed", err)
			}
		}
	}
	return r, nil
}

// unbuy takes returned units off their buyers' counts: every SKU's rows
// (SKUs in order, buyers in order), then every program's.
func unbuy(ctx context.Context, tx *sql.Tx, skus []stock.SKU, bySKU map[stock.SKU][]back) error {
	type row struct {
		sku   stock.SKU // a zero Ticket: the program's row
		buyer keys.ID
	}
	units := map[row]int64{}
	var rows []row
	add := func(r row, q int64) {
		if _, ok := units[r]; !ok {
			rows = append(rows, r)
		}
		units[r] += q
	}
	for _, sku := range skus {
		for _, b := range bySKU[sku] {
			add(row{sku.Base(), b.buyer}, b.quantity) // caps count a ticket's units of every pool
		}
	}
	for _, sku := range skus {
		for _, b := range bySKU[sku] {
			add(row{sku.Whole(), b.buyer}, b.quantity)
		}
	}
	slices.SortStableFunc(rows, func(a, b row) int {
		if a.sku.Ticket.IsZero() != b.sku.Ticket.IsZero() {
			return boolInt(a.sku.Ticket.IsZero()) - boolInt(b.sku.Ticket.IsZero())
		}
		if c := a.sku.Compare(b.sku); c != 0 {
			return c
		}
		return a.buyer.Compare(b.buyer)
	})
	for _, r := range rows {
		if _, err := tx.ExecContext(ctx, `UPDATE buyer_units SET units = units - $4
			WHERE program = $1 AND ticket = $2 AND buyer = $3 AND units >= $4`,
			r.sku.Program, r.sku.Ticket, r.buyer, units[r]); err != nil {
			return notCommitted("buyer units", err)
		}
	}
	return nil
}

// isOwed decides whether Redis is owed returned units (see owed). Seats go
// back by their gate record (which seats, whose), taken through the gate or
// not: the seat consistency check may have written a hold taken around it
// into Redis, and a release by owner is a no-op where the owner holds
// nothing.
func isOwed(gate string, takeEpoch int64, seats bool, r returned) int {
	switch {
	case seats && gate != "":
		return owedUnits
	case seats:
		return owedNothing
	case !r.ended && (gate != "" || takeEpoch != r.epoch):
		return owedUnits
	}
	// The units are not owed: the gate has ended, or the take went around
	// it at this epoch (the gate's next rebuild reads the units from the
	// ledger). The buyer's counts (and a code's use) are owed all the
	// same: the gate counted them if it admitted the take, and also when
	// an attempt it admitted met a rebuilt gate and the retake went around
	// it, keeping its counts. Owed nothing, such a buyer was refused at the
	// cap after a refund of its only order (found with self-sized shards).
	// A release of counts never made is a no-op.
	return owedCounts
}

// What a return owes Redis, as restore_pending stores it.
const (
	owedNothing = 0
	owedUnits   = 1 // the units, and the counts the gate made for them
	owedCounts  = 2 // only the counts: the ticket's gate has ended
)

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// list is "$k+1, ..., $k+n".
func list(k, n int) string {
	var b strings.Builder
	for j := range n {
		if j > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('$')
		b.WriteString(strconv.Itoa(k + j + 1))
	}
	return b.String()
}

// claimRow is one request to claim in a batch, with the answer it gets,
// named by the id of what it acts on.
type claimRow struct {
	id     keys.ID
	req    Request
	sku    stock.SKU
	answer string
}

// claimRows claims the requests in one global order (scope, key), in
// multi-row statements, and returns the ids of the rows whose key was
// taken already (or earlier in the same batch).
func claimRows(ctx context.Context, tx *sql.Tx, rows []claimRow, now int64) (map[keys.ID]bool, error) {
	taken := map[keys.ID]bool{}
	rows = slices.Clone(rows)
	slices.SortFunc(rows, func(a, b claimRow) int {
		if c := a.req.Scope.Compare(b.req.Scope); c != 0 {
			return c
		}
		return a.req.Key.Compare(b.req.Key)
	})
	first := map[ScopedKey]bool{}
	rows = slices.DeleteFunc(rows, func(r claimRow) bool {
		k := ScopedKey{r.req.Scope, r.req.Key}
		if first[k] {
			taken[r.id] = true // the same key twice in one batch: the first claims it
			return true
		}
		first[k] = true
		return false
	})
	for chunk := range slices.Chunk(rows, rowsPerStatement) {
		var vals []string
		var args []any
		for _, r := range chunk {
			if err := r.req.validate(); err != nil {
				return nil, err
			}
			vals = append(vals, placeholders(len(args), 8))
			args = append(args, r.req.Scope, r.req.Key, r.req.Fingerprint, r.req.Op, r.sku.Program, r.sku.Ticket, r.answer, now)
		}
		got, err := tx.QueryContext(ctx, `INSERT INTO requests (scope, idem_key, fingerprint, op, program, ticket, result, created_at)
			VALUES `+strings.Join(vals, ", ")+` ON CONFLICT (scope, idem_key) DO NOTHING RETURNING scope, idem_key`, args...)
		claimed := map[ScopedKey]bool{}
		if err := collectRows(got, err, claimed, func(k *ScopedKey) []any { return []any{&k.Scope, &k.Key} }); err != nil {
			return nil, notCommitted("claim requests", err)
		}
		for _, r := range chunk {
			if !claimed[ScopedKey{r.req.Scope, r.req.Key}] {
				taken[r.id] = true
			}
		}
	}
	return taken, nil
}

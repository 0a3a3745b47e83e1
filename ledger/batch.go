package ledger

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
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

// BatchResult is one take's outcome in a batch: the stored order (a
// purchase, a confirm) or hold and nil, ErrDuplicate with what the key
// already had, or ErrSplit.
type BatchResult struct {
	Order Order
	Hold  Hold
	Err   error
}

// Take is one gate-admitted take of stock for CommitBatch: a purchase
// (Order) or, when Hold is set, a hold.
type Take struct {
	Order Order
	Hold  *Hold
}

// SKU is the SKU the take is of.
func (t Take) SKU() stock.SKU { return t.sku() }

func (t *Take) sku() stock.SKU {
	if t.Hold != nil {
		return t.Hold.SKU
	}
	return t.Order.SKU
}

func (t *Take) buyer() keys.ID {
	if t.Hold != nil {
		return t.Hold.Buyer
	}
	return t.Order.Buyer
}

func (t *Take) quantity() int64 {
	if t.Hold != nil {
		return t.Hold.Quantity
	}
	return t.Order.Quantity
}

func (t *Take) req() Request {
	if t.Hold != nil {
		return t.Hold.Req
	}
	return t.Order.Req
}

// key is the take's row key (orders.idem_key or holds.idem_key).
func (t *Take) key() keys.ID {
	if t.Hold != nil {
		return t.Hold.IdempotencyKey
	}
	return t.Order.IdempotencyKey
}

func (t *Take) codeHash() string {
	if t.Hold != nil {
		return t.Hold.CodeHash
	}
	return t.Order.CodeHash
}

func (t *Take) gateEpoch() int64 {
	if t.Hold != nil {
		return t.Hold.GateEpoch
	}
	return t.Order.GateEpoch
}

func (t *Take) setTakeEpoch(e int64) {
	if t.Hold != nil {
		t.Hold.TakeEpoch = e
		return
	}
	t.Order.TakeEpoch = e
}

// column is the SKU column the take moves stock into.
func (t *Take) column() string {
	if t.Hold != nil {
		return "held"
	}
	return "sold"
}

// answer is the take as its request's stored answer.
func (t *Take) answer() string {
	if t.Hold != nil {
		return encodeSnapshot(nil, t.Hold)
	}
	return encodeSnapshot(&t.Order, nil)
}

func (t *Take) result() BatchResult {
	if t.Hold != nil {
		return BatchResult{Hold: *t.Hold}
	}
	return BatchResult{Order: t.Order}
}

// PurchaseBatch is CommitBatch of purchases only.
func (l *Ledger) PurchaseBatch(ctx context.Context, orders []Order, direct bool) ([]BatchResult, error) {
	takes := make([]Take, len(orders))
	for i, o := range orders {
		takes[i] = Take{Order: o}
	}
	res, err := l.CommitBatch(ctx, takes, direct)
	for i := range takes {
		orders[i] = takes[i].Order
	}
	return res, err
}

// CommitBatch commits many takes the Redis gate admitted (purchases and
// counted holds, of any SKUs) in one transaction (group commit): the
// requests with their answers in one statement, the order rows in one,
// the hold rows in one, then one conditional update per SKU, gate epoch
// and column (sold or held) for the sum of its takes, then the buyers'
// counts under the caps. Winners of a hot SKU then cost one transaction per
// batch instead of one each, all waiting on one row lock. If a SKU's update
// or a buyer's cap refuses, the transaction is rolled back and retried
// without the takes refused (refusal: the SKU's for its stock or an ended
// sale, its stale epoch's, the buyer's over a cap), which come back as
// ErrSplit; the SKU's other takes stay in the batch. The error return
// is for the batch as a whole: ErrNotCommitted before COMMIT, any other
// error at COMMIT (the outcome is unknown; look the keys up).
//
// With direct, the takes went around the Redis gate (the breaker is open):
// each SKU's update is optimistic, at the version read in the same
// transaction, and bumps bypass_seq like PurchaseDirect; a version that
// moved meanwhile (another replica sold) fails the batch with ErrConflict,
// nothing written, to be retried.
func (l *Ledger) CommitBatch(ctx context.Context, takes []Take, direct bool) (_ []BatchResult, err error) {
	op := "purchase_batch"
	if direct {
		op = "purchase_direct_batch"
	}
	defer l.observe(op, time.Now(), &err)
	out := make([]BatchResult, len(takes))
	now := l.now().UTC().Truncate(time.Millisecond)
	live := make([]int, 0, len(takes))
	for i := range takes {
		t := &takes[i]
		if t.quantity() < 1 || t.key().IsZero() || (t.Hold != nil && t.Hold.ExpiresAt.IsZero()) {
			return nil, fmt.Errorf("%w: take quantity %d key %q", stock.ErrInvalid, t.quantity(), t.key())
		}
		if t.Hold != nil && len(t.Hold.SeatIDs) > 0 && int64(len(t.Hold.SeatIDs)) != t.Hold.Quantity {
			return nil, fmt.Errorf("%w: %d seats for quantity %d", stock.ErrInvalid, len(t.Hold.SeatIDs), t.Hold.Quantity)
		}
		if t.Hold != nil {
			if t.Hold.ID.IsZero() {
				t.Hold.ID = NewID()
			}
			t.Hold.State, t.Hold.CreatedAt = Held, now
			t.Hold.ExpiresAt = t.Hold.ExpiresAt.UTC().Truncate(time.Millisecond)
		} else {
			if t.Order.ID.IsZero() {
				t.Order.ID = NewID()
			}
			t.Order.CreatedAt = now
		}
		live = append(live, i)
	}
	for len(live) > 0 {
		refused, dups, err := l.tryBatch(ctx, takes, live, now, direct)
		if err != nil {
			return nil, err
		}
		if refused.why == nil {
			for _, i := range live {
				out[i] = takes[i].result()
			}
			l.batch.Observe(float64(len(live) - len(dups)))
			for _, i := range dups {
				out[i] = l.batchReplay(ctx, takes[i])
			}
			return out, nil
		}
		// Take the refused takes out and try again without them.
		kept := live[:0:0]
		for _, i := range live {
			if refused.covers(&takes[i]) {
				out[i] = BatchResult{Err: fmt.Errorf("%w: %w", ErrSplit, refused.why)}
			} else {
				kept = append(kept, i)
			}
		}
		if len(kept) == len(live) {
			return nil, fmt.Errorf("ledger: batch: %v refused by no take of the batch (%+v)", refused.why, refused)
		}
		live = kept
	}
	return out, nil
}

// batchReplay answers a take of a batch whose request, or row key, was
// taken: ErrDuplicate with what was stored, or ErrKeyReused.
func (l *Ledger) batchReplay(ctx context.Context, t Take) BatchResult {
	switch {
	case t.Hold != nil && !t.Hold.Req.IsZero():
		prev, err := l.holdReplay(ctx, t.Hold.Req)
		return BatchResult{Hold: prev, Err: err}
	case t.Hold != nil:
		prev, err := l.HoldByKey(ctx, t.Hold.IdempotencyKey)
		if err != nil {
			return BatchResult{Err: fmt.Errorf("ledger: batch: duplicate key: %w", err)}
		}
		return BatchResult{Hold: prev, Err: ErrDuplicate}
	case !t.Order.Req.IsZero():
		prev, err := l.orderReplay(ctx, t.Order.Req)
		return BatchResult{Order: prev, Err: err}
	}
	prev, err := l.OrderByKey(ctx, t.Order.IdempotencyKey)
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

// skuCol is one conditional update of a batch: a SKU, the gate epoch its
// takes were admitted under, and the column they move stock into.
type skuCol struct {
	skuEpoch
	column  string
	counted bool // units, not seats: a seated ticket refuses them
}

// refusal names the takes of a batch that one statement refused, with
// why: every take of a SKU (its stock, an ended sale), a SKU's takes
// admitted under one gate epoch (a stale gate), one buyer's takes of a
// SKU or, for a program's cap, of any of the program's SKUs, or the seat
// holds that could not have their seats. Only those
// are split out; the rest of the batch, the SKU's other buyers too, is
// tried again without them.
type refusal struct {
	sku   stock.SKU // a zero Ticket: any SKU of the program
	epoch int64     // -1: any epoch
	buyer keys.ID   // zero: any buyer
	// only, when set, names the takes refused by their row keys instead
	// (seat holds whose seats are not all free).
	only map[keys.ID]bool
	why  error // nil: nothing was refused
}

func (r refusal) covers(t *Take) bool {
	if r.only != nil {
		return r.only[t.key()]
	}
	s := t.sku()
	return s.Program == r.sku.Program && (r.sku.Ticket.IsZero() || s.Ticket == r.sku.Ticket) &&
		(r.epoch < 0 || t.gateEpoch() == r.epoch) && (r.buyer.IsZero() || t.buyer() == r.buyer)
}

// tryBatch runs one transaction over takes[live]. It returns the takes
// that refused and why (a zero refusal when it committed), and the
// indexes whose request or row key was taken.
func (l *Ledger) tryBatch(ctx context.Context, takes []Take, live []int, now time.Time, direct bool) (refusal, []int, error) {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return refusal{}, nil, notCommitted("batch: begin", err)
	}
	defer tx.Rollback()
	var dups []int
	// Around the gate, each SKU's version and epoch as read in this
	// transaction: the updates below apply only at that version, and the
	// epoch cannot move without the version.
	read := map[stock.SKU]SKUState{}
	if direct {
		for _, i := range live {
			sku := takes[i].sku()
			if _, ok := read[sku]; ok {
				continue
			}
			st, err := scanSKU(tx.QueryRowContext(ctx, selectSKU, sku.Program, sku.Ticket))
			if errors.Is(err, stock.ErrUnknownSKU) {
				return refusal{sku: sku, epoch: -1, why: err}, nil, nil
			}
			if err != nil {
				return refusal{}, nil, notCommitted("batch: read sku", err)
			}
			read[sku] = st
		}
	}
	sums := map[skuCol]int64{}
	buyers := map[stock.SKU]map[keys.ID]int64{}
	// Claims, order rows and hold rows in one statement each, not one
	// round trip per take: winners are what the ledger is busy with.
	// claimRows takes the claims in one global order (scope, key): two
	// batches that share requests (a retry sent to two replicas) wait on
	// each other's claims in the same order, never in a cycle.
	var claims []claimRow
	for _, i := range live {
		t := &takes[i]
		if r := t.req(); !r.IsZero() {
			claims = append(claims, claimRow{id: t.key(), req: r, sku: t.sku(), answer: t.answer()})
		}
	}
	taken, err := claimRows(ctx, tx, claims, now.UnixMilli())
	if err != nil {
		return refusal{}, nil, err
	}
	var orders []Order
	var holds []Hold
	var fresh []int
	for _, i := range live {
		t := &takes[i]
		if taken[t.key()] {
			dups = append(dups, i)
			continue
		}
		e := t.gateEpoch()
		if direct {
			e = read[t.sku()].GateEpoch
		}
		t.setTakeEpoch(e)
		if t.Hold != nil {
			holds = append(holds, *t.Hold)
		} else {
			orders = append(orders, t.Order)
		}
		fresh = append(fresh, i)
	}
	inserted, err := insertOrders(ctx, tx, orders)
	if err != nil {
		return refusal{}, nil, err
	}
	if err := insertHolds(ctx, tx, holds, inserted); err != nil {
		return refusal{}, nil, err
	}
	for _, i := range fresh {
		t := &takes[i]
		if !inserted[t.key()] {
			dups = append(dups, i) // a row key taken: only internal writes get here
			continue
		}
		g := skuCol{skuEpoch{t.sku(), t.gateEpoch()}, t.column(), t.Hold == nil || len(t.Hold.SeatIDs) == 0}
		if direct {
			g.epoch = -1
		}
		sums[g] += t.quantity()
		if buyers[t.sku()] == nil {
			buyers[t.sku()] = map[keys.ID]int64{}
		}
		buyers[t.sku()][t.buyer()] += t.quantity()
	}
	var seated []*Hold
	for _, i := range fresh {
		if t := &takes[i]; t.Hold != nil && len(t.Hold.SeatIDs) > 0 && inserted[t.key()] {
			seated = append(seated, t.Hold)
		}
	}
	if r, err := takeBatchSeats(ctx, tx, seated); err != nil || r.why != nil {
		return r, nil, err
	}
	// SKU rows in a fixed order, all before any buyer row, as every write
	// that moves stock: concurrent batches, refunds and expiries cannot
	// deadlock.
	groups := make([]skuCol, 0, len(sums))
	for g := range sums {
		groups = append(groups, g)
	}
	slices.SortFunc(groups, func(a, b skuCol) int {
		if c := a.sku.Compare(b.sku); c != 0 {
			return c
		}
		if a.epoch != b.epoch {
			return int(a.epoch - b.epoch)
		}
		if c := strings.Compare(a.column, b.column); c != 0 {
			return c
		}
		return cmp.Compare(b2i(a.counted), b2i(b.counted))
	})
	versions := map[stock.SKU]int64{}
	var emptied []stock.SKU // SKUs the batch left with nothing: sold out
	for _, g := range groups {
		var version int64 = -1
		if direct {
			version = read[g.sku].Version
		}
		v, e, empty, err := updateSKU(ctx, tx, g.sku, sums[g], g.column, version, g.epoch, now.UnixMilli(), g.counted)
		if empty && err == nil {
			emptied = append(emptied, g.sku)
		}
		switch {
		case errors.Is(err, ErrConflict):
			return refusal{}, nil, ErrConflict
		case errors.Is(err, ErrStaleGate):
			return refusal{sku: g.sku, epoch: g.epoch, why: err}, nil, nil
		case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrSaleEnded), errors.Is(err, stock.ErrUnknownSKU):
			return refusal{sku: g.sku, epoch: -1, why: err}, nil, nil
		case err != nil:
			return refusal{}, nil, err
		}
		versions[g.sku] = v
		if err := seatEpochs(ctx, tx, seated, g.sku, e); err != nil {
			return refusal{}, nil, err
		}
		if direct {
			// Two updates of one SKU in a batch cannot happen around the
			// gate (one group per SKU), but keep the read version true.
			st := read[g.sku]
			st.Version = v
			read[g.sku] = st
		}
	}
	refused, err := countBatchBuyers(ctx, tx, buyers)
	if err != nil {
		return refusal{}, nil, err
	}
	if refused != nil {
		return refusal{sku: refused.sku, epoch: -1, buyer: refused.buyer, why: stock.ErrLimit}, nil, nil
	}
	if r, err := useBatchCodes(ctx, tx, takes, fresh, inserted); err != nil || r.why != nil {
		return r, nil, err
	}
	// Events last: after every SKU row they are about is locked.
	var events []Event
	for _, i := range fresh {
		switch t := &takes[i]; {
		case !inserted[t.key()]:
		case t.Hold != nil:
			events = append(events, holdEvent(EventHoldCreated, *t.Hold))
		default:
			events = append(events, orderEvent(EventOrderCreated, t.Order))
		}
	}
	for _, sku := range emptied {
		events = withSoldOut(events, true, sku)
	}
	if err := emit(ctx, tx, now, events...); err != nil {
		return refusal{}, nil, err
	}
	for sku, v := range versions {
		if err := stamp(ctx, tx, sku, v); err != nil {
			return refusal{}, nil, err
		}
	}
	if err := tx.Commit(); err != nil {
		return refusal{}, nil, fmt.Errorf("ledger: batch: commit: %w", err)
	}
	return refusal{}, dups, nil
}

// useBatchCodes checks the access codes of a batch's new takes, after its
// buyer rows (the order every stock write takes rows in): each code's row
// is locked, in hash order, and its standing uses counted, this batch's
// rows included (they are inserted). A code over its limit, or bound to
// another buyer, refuses its takes: they are decided alone (useCode).
func useBatchCodes(ctx context.Context, tx *sql.Tx, takes []Take, fresh []int, inserted map[keys.ID]bool) (refusal, error) {
	type code struct {
		sku  stock.SKU
		hash string
	}
	byCode := map[code][]*Take{}
	for _, i := range fresh {
		t := &takes[i]
		if h := t.codeHash(); h != "" && inserted[t.key()] {
			c := code{t.sku(), h}
			byCode[c] = append(byCode[c], t)
		}
	}
	codes := slices.SortedFunc(maps.Keys(byCode), func(a, b code) int { return strings.Compare(a.hash, b.hash) })
	for _, c := range codes {
		var maxUses, uses int64
		var bound keys.ID
		err := tx.QueryRowContext(ctx, `UPDATE access_codes SET max_uses = max_uses WHERE program = $1 AND ticket = $2 AND code_hash = $3
			RETURNING max_uses, buyer`, c.sku.Program, c.sku.Ticket, c.hash).Scan(&maxUses, &bound)
		if errors.Is(err, sql.ErrNoRows) {
			return refusalOf(byCode[c], ErrCodeInvalid), nil
		}
		if err != nil {
			return refusal{}, notCommitted("batch: lock code", err)
		}
		for _, t := range byCode[c] {
			if !bound.IsZero() && t.buyer() != bound {
				return refusalOf([]*Take{t}, ErrCodeInvalid), nil
			}
		}
		if err := tx.QueryRowContext(ctx, codeUsesSQL, c.sku.Program, c.sku.Ticket, c.hash).Scan(&uses); err != nil {
			return refusal{}, notCommitted("batch: count code uses", err)
		}
		if uses > maxUses {
			return refusalOf(byCode[c], ErrCodeUsedUp), nil
		}
	}
	return refusal{}, nil
}

// refusalOf refuses exactly the takes given.
func refusalOf(ts []*Take, why error) refusal {
	only := map[keys.ID]bool{}
	for _, t := range ts {
		only[t.key()] = true
	}
	return refusal{only: only, why: why}
}

// rowsPerStatement bounds one multi-row statement (PostgreSQL takes at most
// 65,535 parameters; SQLite 32,766).
const rowsPerStatement = 500

// placeholders is "($k+1, ..., $k+n)" for a row of n parameters after k.
func placeholders(k, n int) string { return "(" + list(k, n) + ")" }

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

// insertHolds writes counted hold rows in multi-row statements and adds
// the row keys it inserted to inserted (a key already taken is left out).
func insertHolds(ctx context.Context, tx *sql.Tx, holds []Hold, inserted map[keys.ID]bool) error {
	for chunk := range slices.Chunk(holds, rowsPerStatement) {
		var vals []string
		var args []any
		for _, h := range chunk {
			vals = append(vals, placeholders(len(args), 15))
			args = append(args, h.ID, h.IdempotencyKey, h.RequestHash, h.SKU.Program, h.SKU.Ticket, h.Buyer, h.Quantity,
				h.Gate, Held, h.ExpiresAt.UnixMilli(), h.CreatedAt.UnixMilli(), h.TakeEpoch, keys.Join(h.SeatIDs, ","), h.CartID, h.CodeHash)
		}
		got, err := tx.QueryContext(ctx, `INSERT INTO holds (id, idem_key, request_hash, program, ticket, buyer, quantity, gate,
			state, expires_at, created_at, take_epoch, seat_ids, cart_id, code_hash)
			VALUES `+strings.Join(vals, ", ")+` ON CONFLICT (idem_key) DO NOTHING RETURNING idem_key`, args...)
		if err := collectIDs(got, err, inserted); err != nil {
			return notCommitted("insert holds", err)
		}
	}
	return nil
}

// countBatchBuyers counts a batch's units on its buyers' rows in one
// statement (countBuyers): every SKU's rows (SKUs in order, buyers in
// order), then every program's, so two batches over different SKUs of one
// program meet the program's rows in the same order (they would deadlock
// taking them SKU by SKU), as every write that moves stock does. It
// returns the first row a cap refused, or nil.
func countBatchBuyers(ctx context.Context, tx *sql.Tx, buyers map[stock.SKU]map[keys.ID]int64) (*buyerRow, error) {
	// Caps count a ticket's units whatever pool they came from: each
	// ticket's row, named as the first of its SKUs here for a refusal.
	bases := map[stock.SKU]map[keys.ID]int64{}
	named := map[stock.SKU]stock.SKU{}
	for _, sku := range slices.SortedFunc(maps.Keys(buyers), stock.SKU.Compare) {
		base := sku.Base()
		if bases[base] == nil {
			bases[base], named[base] = map[keys.ID]int64{}, sku
		}
		for b, q := range buyers[sku] {
			bases[base][b] += q
		}
	}
	var rows []buyerRow
	perProgram := map[buyerRow]int64{}
	for _, sku := range slices.SortedFunc(maps.Keys(bases), stock.SKU.Compare) {
		for _, b := range slices.SortedFunc(maps.Keys(bases[sku]), keys.ID.Compare) {
			rows = append(rows, buyerRow{sku, b, bases[sku][b]})
			perProgram[buyerRow{sku: sku.Whole(), buyer: b}] += bases[sku][b]
		}
	}
	programs := slices.SortedFunc(maps.Keys(perProgram), func(a, b buyerRow) int {
		if c := a.sku.Compare(b.sku); c != 0 {
			return c
		}
		return a.buyer.Compare(b.buyer)
	})
	for _, p := range programs {
		rows = append(rows, buyerRow{p.sku, p.buyer, perProgram[p]})
	}
	refused, err := countBuyers(ctx, tx, rows)
	if refused != nil && !refused.sku.Ticket.IsZero() {
		refused.sku = named[refused.sku]
	}
	return refused, err
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

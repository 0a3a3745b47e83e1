package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// Take is one request that takes stock, committed all or nothing with the
// request's row: a purchase (one order), a hold or a seat hold (one hold),
// or a cart (Cart set: an order or a hold per line, in ticket order, no
// ticket twice). Every line is admitted by the Redis gate at a gate epoch
// (GateEpoch), or taken at the row's epoch (GateEpoch -1: seats, and every
// line of a batch committed around the gate).
type Take struct {
	Req    Request // the client's request; zero for an internal write
	Cart   *Cart   // the cart the lines are of; nil for a single take
	Orders []Order
	Holds  []Hold
	// version, when versioned, is the SKU row version a take around the
	// gate was decided at (PurchaseDirect, Hold): ErrConflict if it moved.
	version   int64
	versioned bool
}

// PurchaseTake is the take of one order.
func PurchaseTake(o Order) Take { return Take{Req: o.Req, Orders: []Order{o}} }

// HoldTake is the take of one hold (counted, or of seats).
func HoldTake(h Hold) Take { return Take{Req: h.Req, Holds: []Hold{h}} }

// CartTake is the take of a cart's lines: its orders, or its holds.
func CartTake(c Cart) Take {
	t := Take{Req: c.Req, Cart: &c, Orders: c.Orders, Holds: c.Holds}
	return t
}

// TakeResult is what Commit made of one take. Err is nil when it
// committed (Take holds it as stored: ids, times, epochs); ErrDuplicate
// when its request committed before (Take holds that answer);
// ErrKeyReused; a refusal (stock.ErrSoldOut, stock.ErrLimit,
// stock.ErrSaleEnded, stock.ErrUnknownSKU, ErrStaleGate, ErrSeatedTake, a
// *SeatsTakenError, ErrCodeUsedUp, ErrCodeInvalid; a cart's wrapped in a
// *LineError naming its line, but for its program's cap); or an error:
// one wrapping ErrNotCommitted when nothing was written, any other when
// COMMIT failed and the outcome is unknown.
type TakeResult struct {
	Take
	Err error
}

// Order is the take's single order (a purchase).
func (r TakeResult) Order() Order {
	if len(r.Orders) == 0 {
		return Order{}
	}
	return r.Orders[0]
}

// Hold is the take's single hold.
func (r TakeResult) Hold() Hold {
	if len(r.Holds) == 0 {
		return Hold{}
	}
	return r.Holds[0]
}

// takeAttempts bounds the transactions one Commit runs: the first
// optimistic, the others after what refused in it was taken out.
const takeAttempts = 5

// Commit commits takes together, in as few transactions as it can: each
// attempt locks the SKU rows of every line in one global order, writes
// every table with one set-based statement (the requests with their
// final answers and row versions, the order and hold rows, the seats,
// the conditional update of every SKU, the buyers' counts under the caps,
// the events) and commits. On PostgreSQL an attempt costs two round trips
// whatever its size: its statements go in one pipeline, then COMMIT. A
// take that cannot commit is decided alone, by what the locked rows say,
// and never fails another: the attempt is rolled back and run again
// without it. With direct, the takes went around the Redis gate (its
// breaker is open): their stock is taken at the rows' current epoch, and
// each SKU's bypass_seq moves so its gate is rebuilt before it serves.
func (l *Ledger) Commit(ctx context.Context, takes []Take, direct bool) []TakeResult {
	start := time.Now()
	res, err := l.commit(ctx, takes, direct)
	l.observe(batchOp(takes, direct), start, &err)
	return res
}

// batchOp names a batch for stockgate_ledger_writes_total by what it
// carries, as the single-take calls name theirs: "purchase", "hold",
// "cart" or "cart_hold" when every take is of that kind, "take" when
// kinds mix; "_direct" when it went around the gate.
func batchOp(takes []Take, direct bool) string {
	op := ""
	for _, t := range takes {
		k := t.kind()
		if op != "" && op != k {
			op = "take"
			break
		}
		op = k
	}
	if op == "" {
		op = "take"
	}
	if direct {
		op += "_direct"
	}
	return op
}

// kind is what the take makes: "purchase", "hold", "cart" or "cart_hold".
func (t Take) kind() string {
	switch {
	case t.Cart != nil && len(t.Holds) > 0:
		return "cart_hold"
	case t.Cart != nil:
		return "cart"
	case len(t.Holds) > 0:
		return "hold"
	}
	return "purchase"
}

// commit is Commit; err is what failed the batch as a whole, if anything.
func (l *Ledger) commit(ctx context.Context, takes []Take, direct bool) ([]TakeResult, error) {
	res := make([]TakeResult, len(takes))
	now := l.now().UTC().Truncate(time.Millisecond)
	b := &takeBatch{l: l, now: now, direct: direct, takes: takes, res: res}
	var live []int
	for i := range takes {
		res[i].Take = takes[i]
		if err := b.prepare(i); err != nil {
			res[i].Err = err
			continue
		}
		live = append(live, i)
	}
	var dups []int
	var err error
	for attempt := 1; len(live) > 0; attempt++ {
		var out attemptOut
		out, err = b.attempt(ctx, live, attempt > 1)
		if err != nil {
			if isRetryable(err) && attempt < takeAttempts {
				continue
			}
			break
		}
		dups = append(dups, out.dups...)
		if out.committed {
			l.batch.Observe(float64(len(out.kept)))
			for _, i := range out.kept {
				res[i].Take = takes[i]
			}
			live = nil
			break
		}
		if attempt == takeAttempts {
			err = notCommitted("take", fmt.Errorf("still refused after %d attempts", attempt))
			break
		}
		live = out.kept
	}
	for _, i := range live {
		if res[i].Err == nil && err != nil {
			res[i].Err = err
		}
	}
	for _, i := range dups {
		res[i] = l.replayTake(ctx, takes[i])
	}
	return res, err
}

// commitOne commits one take alone: what the single-take calls share.
func (l *Ledger) commitOne(ctx context.Context, t Take, direct bool) TakeResult {
	res, err := l.commit(ctx, []Take{t}, direct)
	if res[0].Err == nil && err != nil {
		res[0].Err = err
	}
	return res[0]
}

// takeBatch is one Commit's takes and what it knows of them.
type takeBatch struct {
	l      *Ledger
	now    time.Time
	direct bool
	takes  []Take
	res    []TakeResult
	// Found refusing in an attempt, for the next ones to read first:
	// buyers' counts under their caps, code uses.
	readCaps, readCodes bool
}

// tline is one line of a take, as the statements write it.
type tline struct {
	take    int
	idx     int // its index in the take's orders or holds
	hold    bool
	id, key keys.ID
	sku     stock.SKU
	buyer   keys.ID
	q       int64
	epoch   int64 // the gate epoch it was admitted under; -1: the row's
	seats   []keys.ID
	code    string
}

func (b *takeBatch) lines(i int) []tline {
	t := &b.takes[i]
	out := make([]tline, 0, len(t.Orders)+len(t.Holds))
	for j := range t.Orders {
		o := &t.Orders[j]
		out = append(out, tline{take: i, idx: j, id: o.ID, key: o.IdempotencyKey, sku: o.SKU, buyer: o.Buyer, q: o.Quantity,
			epoch: b.epochOf(o.GateEpoch, len(o.SeatIDs) > 0), seats: o.SeatIDs, code: o.CodeHash})
	}
	for j := range t.Holds {
		h := &t.Holds[j]
		out = append(out, tline{take: i, idx: j, hold: true, id: h.ID, key: h.IdempotencyKey, sku: h.SKU, buyer: h.Buyer,
			q: h.Quantity, epoch: b.epochOf(h.GateEpoch, len(h.SeatIDs) > 0), seats: h.SeatIDs, code: h.CodeHash})
	}
	return out
}

// epochOf is the epoch a line is checked against: none (-1) around the
// gate and for seats, which the seat gate keeps without epochs.
func (b *takeBatch) epochOf(gate int64, seated bool) int64 {
	if b.direct || seated || gate < 0 {
		return -1
	}
	return gate
}

// prepare checks take i and fills in what the ledger assigns: ids,
// creation times, states.
func (b *takeBatch) prepare(i int) error {
	t := &b.takes[i]
	t.Orders, t.Holds = slices.Clone(t.Orders), slices.Clone(t.Holds)
	n := len(t.Orders) + len(t.Holds)
	switch {
	case n == 0 || (t.Cart == nil && n > 1) || (t.Cart != nil && n > MaxCartLines):
		return fmt.Errorf("%w: a take of %d lines", stock.ErrInvalid, n)
	case len(t.Orders) > 0 && len(t.Holds) > 0:
		return fmt.Errorf("%w: a take both buys and holds", stock.ErrInvalid)
	}
	if !t.Req.IsZero() {
		if err := t.Req.validate(); err != nil {
			return err
		}
	}
	if t.Cart != nil {
		c := *t.Cart
		c.Orders, c.Holds, c.Req = t.Orders, t.Holds, t.Req
		if err := c.validate(); err != nil {
			return err
		}
		if c.ID.IsZero() {
			c.ID = NewID()
		}
		c.CreatedAt = b.now
		t.Cart = &c
	}
	for j := range t.Orders {
		if err := b.prepareOrder(&t.Orders[j], t.Cart); err != nil {
			return err
		}
	}
	for j := range t.Holds {
		if err := b.prepareHold(&t.Holds[j], t.Cart); err != nil {
			return err
		}
	}
	if t.Cart != nil {
		t.Cart.Orders, t.Cart.Holds = t.Orders, t.Holds
	}
	return nil
}

// prepareOrder checks o and fills in its id and creation time, and its
// cart's id when it is a line of cart (nil: none).
func (b *takeBatch) prepareOrder(o *Order, cart *Cart) error {
	if o.Quantity < 1 || o.IdempotencyKey.IsZero() {
		return fmt.Errorf("%w: order quantity %d key %q", stock.ErrInvalid, o.Quantity, o.IdempotencyKey)
	}
	if len(o.SeatIDs) > 0 && int64(len(o.SeatIDs)) != o.Quantity {
		return fmt.Errorf("%w: %d seats for quantity %d", stock.ErrInvalid, len(o.SeatIDs), o.Quantity)
	}
	if o.ID.IsZero() {
		o.ID = NewIDOf(o.SKU)
	}
	o.CreatedAt = b.now
	if cart != nil {
		o.CartID, o.Req = cart.ID, Request{}
	}
	return nil
}

// prepareHold is prepareOrder for a hold, which also starts held.
func (b *takeBatch) prepareHold(h *Hold, cart *Cart) error {
	if h.Quantity < 1 || h.IdempotencyKey.IsZero() || h.ExpiresAt.IsZero() {
		return fmt.Errorf("%w: hold quantity %d key %q", stock.ErrInvalid, h.Quantity, h.IdempotencyKey)
	}
	if len(h.SeatIDs) > 0 && int64(len(h.SeatIDs)) != h.Quantity {
		return fmt.Errorf("%w: %d seats for quantity %d", stock.ErrInvalid, len(h.SeatIDs), h.Quantity)
	}
	if h.ID.IsZero() {
		h.ID = NewIDOf(h.SKU)
	}
	h.State, h.CreatedAt = Held, b.now
	h.ExpiresAt = h.ExpiresAt.UTC().Truncate(time.Millisecond)
	if cart != nil {
		h.CartID, h.Req = cart.ID, Request{}
	}
	return nil
}

// answer is take i's answer as its request's row keeps it.
func (b *takeBatch) answer(i int) string {
	t := &b.takes[i]
	switch {
	case t.Cart != nil:
		c := *t.Cart
		c.Req = Request{}
		return encodeCart(&c)
	case len(t.Holds) > 0:
		return encodeSnapshot(nil, &t.Holds[0])
	}
	return encodeSnapshot(&t.Orders[0], nil)
}

// claimSKU is the SKU a take's request row names (its row version is the
// SKU's after the take): a cart names its program only.
func (b *takeBatch) claimSKU(i int) stock.SKU {
	t := &b.takes[i]
	switch {
	case t.Cart != nil:
		return stock.SKU{Program: t.Cart.Program}
	case len(t.Holds) > 0:
		return t.Holds[0].SKU
	}
	return t.Orders[0].SKU
}

// attemptOut is what one attempt did: committed (the takes kept), or
// rolled back with the takes to try again (kept); dups are the takes whose
// request or row key another committed first.
type attemptOut struct {
	committed bool
	kept      []int
	dups      []int
}

// skuRow is a SKU row as an attempt locked it.
type skuRow struct {
	total, sold, held, version, epoch int64
	ended, seated                     bool
}

func (r skuRow) remaining() int64 { return r.total - r.sold - r.held }

// buyerName names a buyer_units row.
type buyerName struct{ program, ticket, buyer keys.ID }

// codeName names an access code of a pool.
type codeName struct {
	sku  stock.SKU
	hash string
}

// codeRow is an access code as an attempt read it.
type codeRow struct {
	maxUses, uses int64
	buyer         keys.ID
}

// attempt runs one transaction over takes[live]. Careful attempts read
// first (every SKU row; buyers' counts and code uses when an attempt
// before found them refusing), decide every take by what they read, and
// write only what passes; the first attempt writes at once, and checks
// after.
func (b *takeBatch) attempt(ctx context.Context, live []int, careful bool) (out attemptOut, err error) {
	l := b.l
	r, err := l.runner(ctx)
	if err != nil {
		return out, notCommitted("take: connect", err)
	}
	defer r.close()

	lines, kept, dups := b.within(live)
	out.dups = dups
	if len(kept) == 0 {
		return attemptOut{committed: true, dups: out.dups}, nil
	}
	skus := skusOf(lines)
	var rows map[stock.SKU]skuRow
	careful = careful || slices.ContainsFunc(kept, func(i int) bool { return b.takes[i].versioned })
	if careful {
		rd, err := b.readFirst(ctx, r, kept, lines, skus)
		if err != nil {
			return out, err
		}
		rows = rd.rows
		kept, lines, dups = b.decideRead(kept, lines, rd)
		out.dups = append(out.dups, dups...)
		if len(kept) == 0 {
			_ = r.end(ctx, false) // the failure returned says more than the rollback's
			return attemptOut{committed: true, dups: out.dups}, nil
		}
	}

	w := b.writeSteps(l.driver, kept, lines)
	steps := []step{w.seats}
	if !careful && l.driver == Postgres {
		// Lock the SKU rows in order before the update (a careful attempt
		// holds them already; SQLite has one writer).
		steps = append(steps, l.lockStep(skus, nil))
	}
	steps = append(steps, w.steps...)
	steps = slices.DeleteFunc(steps, func(s step) bool { return s.sql == "" })
	if err := r.run(ctx, steps); err != nil {
		return out, notCommitted("take", err)
	}

	v := b.check(kept, lines, w)
	out.dups = append(out.dups, v.dups...)
	capRefused := false
	if !v.sku && len(v.refused) == 0 {
		if capRefused, err = b.capsRefuse(ctx, r, w); err != nil {
			return out, err
		}
	}
	if len(v.refused) == 0 && !v.sku && !capRefused && !v.code {
		if err := r.end(ctx, true); err != nil {
			return out, fmt.Errorf("ledger: take: commit: %w", err)
		}
		b.committed(kept, lines, w)
		return attemptOut{committed: true, kept: kept, dups: out.dups}, nil
	}
	if err := r.end(ctx, false); err != nil {
		return out, notCommitted("take: roll back", err)
	}
	// What the rows refuse is decided by the next attempt, which reads them
	// (and buyers' caps and codes, when those refused) before it writes.
	b.readCaps = b.readCaps || capRefused
	b.readCodes = b.readCodes || v.code
	if careful && v.sku {
		// Even after its read, a SKU's update refused: decide by the read.
		for i := range b.decide(kept, lines, rows, nil, nil) {
			v.refused[i] = true
		}
	}
	kept = slices.DeleteFunc(kept, func(i int) bool { return v.refused[i] })
	return attemptOut{kept: kept, dups: out.dups}, nil
}

// capsRefuse counts the buyers of w's capped lines under their caps (one
// more round trip, for capped SKUs only) and reports whether a cap
// refused.
func (b *takeBatch) capsRefuse(ctx context.Context, r txRunner, w *writes) (bool, error) {
	capped := w.capped()
	if len(capped) == 0 {
		return false, nil
	}
	if err := r.run(ctx, []step{b.l.buyersStep(capped, w.counted)}); err != nil {
		return false, notCommitted("take: buyers", err)
	}
	for _, c := range capped {
		if !w.counted[buyerName{c.sku.Program, c.sku.Ticket, c.buyer}] {
			return true, nil
		}
	}
	return false, nil
}

// replayTake answers a take whose request (or row key) committed before.
func (l *Ledger) replayTake(ctx context.Context, t Take) TakeResult {
	out := TakeResult{Take: t}
	if !t.Req.IsZero() {
		rec, err := l.replayOf(ctx, t.Req)
		out.Err = err
		switch {
		case !errors.Is(err, ErrDuplicate):
		case t.Cart != nil && rec.Cart != nil:
			c := *rec.Cart
			out.Cart, out.Orders, out.Holds = &c, c.Orders, c.Holds
		case t.Cart == nil && len(t.Holds) > 0 && rec.Hold != nil:
			out.Holds = []Hold{*rec.Hold}
		case t.Cart == nil && len(t.Orders) > 0 && rec.Order != nil:
			out.Orders = []Order{*rec.Order}
		default:
			out.Err = fmt.Errorf("%w: key was used for a %s", ErrKeyReused, rec.Op)
		}
		return out
	}
	// An internal write: its row key decides.
	switch {
	case len(t.Holds) > 0:
		h, err := l.HoldByKey(ctx, t.Holds[0].IdempotencyKey)
		if err != nil {
			return TakeResult{Take: t, Err: fmt.Errorf("ledger: take: duplicate key: %w", err)}
		}
		out.Holds, out.Err = []Hold{h}, ErrDuplicate
	default:
		o, err := l.OrderByKey(ctx, t.Orders[0].IdempotencyKey)
		if err != nil {
			return TakeResult{Take: t, Err: fmt.Errorf("ledger: take: duplicate key: %w", err)}
		}
		out.Orders, out.Err = []Order{o}, ErrDuplicate
	}
	return out
}

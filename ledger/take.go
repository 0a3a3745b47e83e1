package ledger

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
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

// Purchase commits an order the Redis gate admitted: the request's row,
// the conditional update sold + q where sold + held + q <= total at the
// order's gate epoch, and the order row, in one transaction. It returns
// stock.ErrSoldOut when the ledger has not enough left, ErrStaleGate when
// a rebuild closed the order's gate epoch, or ErrDuplicate with the order
// already stored for the request (ErrKeyReused for another request).
func (l *Ledger) Purchase(ctx context.Context, o Order) (_ Order, err error) {
	defer l.observe("purchase", time.Now(), &err)
	r := l.commitOne(ctx, PurchaseTake(o), false)
	return r.Order(), r.Err
}

// PurchaseDirect commits an order that bypassed the Redis gate (the breaker
// is open) at the SKU row version the caller read: ErrConflict says it
// moved. It also bumps bypass_seq, so Redis is re-seeded before it serves
// the SKU again. Other outcomes are as for Purchase.
func (l *Ledger) PurchaseDirect(ctx context.Context, o Order, version int64) (_ Order, err error) {
	defer l.observe("purchase_direct", time.Now(), &err)
	if version < 0 {
		return Order{}, fmt.Errorf("%w: version %d", stock.ErrInvalid, version)
	}
	t := PurchaseTake(o)
	t.version, t.versioned = version, true
	r := l.commitOne(ctx, t, true)
	return r.Order(), r.Err
}

// Hold sets stock aside: the request's row, the hold row and held + q under
// the same checks as a purchase (stock, per-buyer cap, sale not ended, gate
// epoch; a seat hold's seats all free). version >= 0 takes it around the
// Redis gate at that row version, as PurchaseDirect. It returns
// ErrDuplicate with the hold stored for the request, or ErrKeyReused.
func (l *Ledger) Hold(ctx context.Context, h Hold, version int64) (_ Hold, err error) {
	defer l.observe("hold", time.Now(), &err)
	t := HoldTake(h)
	if version >= 0 {
		t.version, t.versioned = version, true
	}
	r := l.commitOne(ctx, t, version >= 0)
	return r.Hold(), r.Err
}

// PurchaseCart commits a cart: the request's row, every line's conditional
// update (sold + q where sold + held + q <= total, at the line's gate epoch
// or, when direct, at the row's, bumping bypass_seq), the buyer's counts
// under the SKU and program caps (the program's counting every line), and
// the order rows, in one transaction. A refusal is a *LineError, or
// stock.ErrLimit for the program's cap, and writes nothing. ErrDuplicate
// returns the cart already stored for the request; ErrKeyReused says the
// key was used for another request.
func (l *Ledger) PurchaseCart(ctx context.Context, c Cart, direct bool) (_ Cart, err error) {
	defer l.observe("cart", time.Now(), &err)
	c.Holds = nil
	return l.takeCart(ctx, c, direct)
}

// HoldCart is PurchaseCart for a held cart: every line (c.Holds) held
// until its expiry, all or nothing, as holds of the cart.
func (l *Ledger) HoldCart(ctx context.Context, c Cart, direct bool) (_ Cart, err error) {
	defer l.observe("cart_hold", time.Now(), &err)
	c.Orders = nil
	return l.takeCart(ctx, c, direct)
}

func (l *Ledger) takeCart(ctx context.Context, c Cart, direct bool) (Cart, error) {
	r := l.commitOne(ctx, CartTake(c), direct)
	if r.Cart == nil || (r.Err != nil && !errors.Is(r.Err, ErrDuplicate)) {
		return Cart{}, r.Err
	}
	out := *r.Cart
	out.Req = Request{}
	return out, r.Err
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
		o := &t.Orders[j]
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
		if t.Cart != nil {
			o.CartID, o.Req = t.Cart.ID, Request{}
		}
	}
	for j := range t.Holds {
		h := &t.Holds[j]
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
		if t.Cart != nil {
			h.CartID, h.Req = t.Cart.ID, Request{}
		}
	}
	if t.Cart != nil {
		t.Cart.Orders, t.Cart.Holds = t.Orders, t.Holds
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

// within keeps, of the takes live, the first of each request (or row
// key): the others are duplicates, answered by its replay. A take naming
// a seat an earlier take of the batch names is refused: the seat is the
// earlier's. It returns the kept takes' lines, the kept and the
// duplicates.
func (b *takeBatch) within(live []int) (lines []tline, kept, dups []int) {
	seenReq := map[ScopedKey]bool{}
	seenKey := map[keys.ID]bool{}
	seenSeat := map[seatName]bool{}
	for _, i := range live {
		t := &b.takes[i]
		ls := b.lines(i)
		dup := false
		if !t.Req.IsZero() {
			k := ScopedKey{t.Req.Scope, t.Req.Key}
			dup = seenReq[k]
			seenReq[k] = true
		}
		for _, ln := range ls {
			dup = dup || seenKey[ln.key]
		}
		if dup {
			dups = append(dups, i)
			continue
		}
		if ln, named := namedBefore(ls, seenSeat); len(named) > 0 {
			b.refuse(ln, &SeatsTakenError{Seats: named})
			continue
		}
		for _, ln := range ls {
			seenKey[ln.key] = true
			for _, s := range ln.seats {
				seenSeat[seatName{ln.sku, s}] = true
			}
		}
		lines = append(lines, ls...)
		kept = append(kept, i)
	}
	return lines, kept, dups
}

// skusOf is the SKUs lines name, in the order their rows are locked.
func skusOf(lines []tline) []stock.SKU {
	set := map[stock.SKU]bool{}
	for _, ln := range lines {
		set[ln.sku] = true
	}
	return slices.SortedFunc(maps.Keys(set), stock.SKU.Compare)
}

// readRows is what a careful attempt reads before it writes.
type readRows struct {
	rows      map[stock.SKU]skuRow
	buyers    map[buyerName][2]int64 // units, cap; nil unless caps are read
	codes     map[codeName]codeRow   // nil unless codes are read
	committed map[ScopedKey]bool     // the kept takes' requests committed meanwhile
}

// readFirst locks and reads the rows of skus, and the buyers' counts and
// code uses when an attempt before found them refusing, and which of the
// kept takes' requests committed meanwhile.
func (b *takeBatch) readFirst(ctx context.Context, r txRunner, kept []int, lines []tline, skus []stock.SKU) (readRows, error) {
	rd := readRows{rows: map[stock.SKU]skuRow{}, committed: map[ScopedKey]bool{}}
	steps := []step{b.lockStep(skus, rd.rows)}
	if b.readCaps {
		rd.buyers = map[buyerName][2]int64{}
		steps = append(steps, b.buyersReadStep(lines, rd.buyers))
	}
	if b.readCodes {
		rd.codes = map[codeName]codeRow{}
		if s, ok := b.codesReadStep(lines, rd.codes); ok {
			steps = append(steps, s)
		}
	}
	if s, ok := b.requestsReadStep(kept, rd.committed); ok {
		steps = append(steps, s)
	}
	if err := r.run(ctx, steps); err != nil {
		return rd, notCommitted("take: read", err)
	}
	return rd, nil
}

// decideRead drops from kept, first, the takes whose requests committed
// meanwhile (a copy of the request on another replica, while an earlier
// attempt of this batch rolled back): duplicates, decided before any row
// says "sold out" to a request that stands. Then those the rows read
// refuse (decide). It returns what is left and the duplicates.
func (b *takeBatch) decideRead(kept []int, lines []tline, rd readRows) (_ []int, _ []tline, dups []int) {
	drop := map[int]bool{}
	for _, i := range kept {
		if t := &b.takes[i]; !t.Req.IsZero() && rd.committed[ScopedKey{t.Req.Scope, t.Req.Key}] {
			drop[i] = true
			dups = append(dups, i)
		}
	}
	kept, lines = without(kept, lines, drop)
	kept, lines = without(kept, lines, b.decide(kept, lines, rd.rows, rd.buyers, rd.codes))
	return kept, lines, dups
}

// without is kept and lines without the takes in drop.
func without(kept []int, lines []tline, drop map[int]bool) ([]int, []tline) {
	if len(drop) == 0 {
		return kept, lines
	}
	kept = slices.DeleteFunc(kept, func(i int) bool { return drop[i] })
	lines = slices.DeleteFunc(lines, func(ln tline) bool { return drop[ln.take] })
	return kept, lines
}

// checked is what an attempt's statements did against what they were to
// do: the takes refused, those of them another committed first (dups),
// and whether a SKU's update or a code's use refused.
type checked struct {
	refused   map[int]bool
	dups      []int
	sku, code bool
}

// check reads what the statements w did for the kept takes' lines: a
// request or row key not claimed (another committed it first), a seat
// not got (taken), a SKU's update that did not happen, a code used past
// its uses or by another buyer.
func (b *takeBatch) check(kept []int, lines []tline, w *writes) checked {
	c := checked{refused: map[int]bool{}}
	for _, i := range kept {
		t := &b.takes[i]
		if !t.Req.IsZero() && !w.claimed[ScopedKey{t.Req.Scope, t.Req.Key}] {
			c.refused[i] = true
			c.dups = append(c.dups, i)
		}
	}
	for _, ln := range lines {
		if c.refused[ln.take] {
			continue
		}
		if !w.inserted[ln.key] {
			c.refused[ln.take] = true
			c.dups = append(c.dups, ln.take)
			continue
		}
		if missing := missingSeats(ln, w.seatsGot); len(missing) > 0 {
			c.refused[ln.take] = true
			b.refuse(ln, &SeatsTakenError{Seats: missing})
		}
	}
	for _, ln := range lines { // the lines written, after a careful attempt's refusals
		if _, ok := w.updated[ln.sku]; !ok {
			c.sku = true
		}
	}
	for cn, cr := range w.codes {
		if cr.uses > cr.maxUses || !w.codeFound[cn] {
			c.code = true
		}
	}
	if !c.code {
		for _, ln := range lines {
			if ln.code == "" || c.refused[ln.take] {
				continue
			}
			if cr := w.codes[codeName{ln.sku, ln.code}]; !cr.buyer.IsZero() && cr.buyer != ln.buyer {
				c.code = true
			}
		}
	}
	return c
}

// committed fills in what the commit of the kept takes decided: lines
// taken at the row's epoch took it as their update saw it, and a cart
// carries its lines.
func (b *takeBatch) committed(kept []int, lines []tline, w *writes) {
	for _, ln := range lines {
		e := ln.epoch
		if e < 0 {
			e = w.updated[ln.sku].epoch
		}
		t := &b.takes[ln.take]
		if ln.hold {
			t.Holds[ln.idx].TakeEpoch = e
		} else {
			t.Orders[ln.idx].TakeEpoch = e
		}
	}
	for _, i := range kept {
		if t := &b.takes[i]; t.Cart != nil {
			t.Cart.Orders, t.Cart.Holds = t.Orders, t.Holds
		}
	}
}

// refuse records why take ln.take is refused, naming the line in a cart.
func (b *takeBatch) refuse(ln tline, why error) {
	t := &b.takes[ln.take]
	if t.Cart != nil && !(errors.Is(why, stock.ErrLimit) && ln.sku.Ticket.IsZero()) {
		why = &LineError{Line: ln.idx, Err: why}
	}
	if b.res[ln.take].Err == nil {
		b.res[ln.take].Err = why
	}
}

// decide runs through the takes in order against the rows read, as if
// each were committed in turn, and refuses the takes that would not pass:
// an unknown SKU, an ended sale, counted units of a seated ticket, a gate
// since rebuilt, not enough left; with buyers and codes read, a cap or a
// code's uses. It returns the takes refused (their results say why).
func (b *takeBatch) decide(kept []int, lines []tline, rows map[stock.SKU]skuRow, buyers map[buyerName][2]int64,
	codes map[codeName]codeRow) map[int]bool {
	byTake := map[int][]tline{}
	for _, ln := range lines {
		byTake[ln.take] = append(byTake[ln.take], ln)
	}
	left := map[stock.SKU]int64{}
	for sku, r := range rows {
		left[sku] = r.remaining()
	}
	units := map[buyerName]int64{}
	uses := map[codeName]int64{}
	refused := map[int]bool{}
	for _, i := range kept {
		ls := byTake[i]
		need, at, why := rowsRefusal(&b.takes[i], ls, rows, left)
		var counts map[buyerName]int64
		if why == nil && buyers != nil {
			counts, at, why = capsRefusal(ls, buyers, units)
		}
		if why == nil && codes != nil {
			at, why = codesRefusal(ls, codes, uses)
		}
		if why != nil {
			refused[i] = true
			b.refuse(at, why)
			continue
		}
		for sku, q := range need {
			left[sku] -= q
		}
		for n, q := range counts {
			units[n] += q
		}
		for _, ln := range ls {
			if ln.code != "" {
				uses[codeName{ln.sku, ln.code}]++
			}
		}
	}
	return refused
}

// rowsRefusal is why the rows read refuse take t of lines ls (nil: they
// do not) and the line refused, with what t needs of each SKU, given
// what the takes decided before it left.
func rowsRefusal(t *Take, ls []tline, rows map[stock.SKU]skuRow, left map[stock.SKU]int64) (need map[stock.SKU]int64, at tline, why error) {
	need = map[stock.SKU]int64{}
	for _, ln := range ls {
		r, ok := rows[ln.sku]
		switch {
		case !ok:
			why = stock.ErrUnknownSKU
		case r.ended:
			why = stock.ErrSaleEnded
		case len(ln.seats) == 0 && r.seated:
			why = ErrSeatedTake
		case ln.epoch >= 0 && ln.epoch != r.epoch:
			why = ErrStaleGate
		case left[ln.sku]-need[ln.sku] < ln.q:
			why = stock.ErrSoldOut
		case t.versioned && r.version != t.version:
			why = ErrConflict
		}
		if why != nil {
			return need, ln, why
		}
		need[ln.sku] += ln.q
	}
	return need, tline{}, nil
}

// capsRefusal is whether the buyers' counts read refuse lines ls under a
// ticket's or the program's cap (stock.ErrLimit; the line refused names
// the whole program's SKU for the program's), given the units the takes
// decided before them count; and what ls count.
func capsRefusal(ls []tline, buyers map[buyerName][2]int64, units map[buyerName]int64) (counts map[buyerName]int64, at tline, why error) {
	counts = map[buyerName]int64{}
	for _, ln := range ls {
		base, whole := ln.sku.Base(), ln.sku.Whole()
		counts[buyerName{base.Program, base.Ticket, ln.buyer}] += ln.q
		counts[buyerName{whole.Program, whole.Ticket, ln.buyer}] += ln.q
	}
	for _, ln := range ls {
		for _, n := range []buyerName{{ln.sku.Base().Program, ln.sku.Base().Ticket, ln.buyer}, {ln.sku.Program, keys.ID{}, ln.buyer}} {
			bu := buyers[n]
			if bu[1] > 0 && bu[0]+units[n]+counts[n] > bu[1] {
				at = ln
				if n.ticket.IsZero() {
					at.sku = ln.sku.Whole()
				}
				return counts, at, stock.ErrLimit
			}
		}
	}
	return counts, tline{}, nil
}

// codesRefusal is whether the code uses read refuse lines ls: a code
// unknown or another buyer's, or one used up, given the uses the takes
// decided before them make.
func codesRefusal(ls []tline, codes map[codeName]codeRow, uses map[codeName]int64) (at tline, why error) {
	for _, ln := range ls {
		if ln.code == "" {
			continue
		}
		c := codeName{ln.sku, ln.code}
		cr, ok := codes[c]
		switch {
		case !ok || (!cr.buyer.IsZero() && cr.buyer != ln.buyer):
			return ln, ErrCodeInvalid
		case cr.uses+uses[c]+1 > cr.maxUses:
			return ln, ErrCodeUsedUp
		}
	}
	return tline{}, nil
}

// missingSeats are the seats of ln the seat statement did not get.
func missingSeats(ln tline, got map[seatName]bool) []string {
	var out []string
	for _, s := range ln.seats {
		if !got[seatName{ln.sku, s}] {
			out = append(out, s.String())
		}
	}
	slices.Sort(out)
	return out
}

// namedBefore finds the first line of ls naming seats already in seen,
// and those seats.
func namedBefore(ls []tline, seen map[seatName]bool) (tline, []string) {
	for _, ln := range ls {
		var named []string
		for _, s := range ln.seats {
			if seen[seatName{ln.sku, s}] {
				named = append(named, s.String())
			}
		}
		if len(named) > 0 {
			slices.Sort(named)
			return ln, named
		}
	}
	return tline{}, nil
}

type seatName struct {
	sku  stock.SKU
	seat keys.ID
}

// requestsReadStep reads which of the takes' requests are committed
// already (found); ok is false when no take names a request.
func (b *takeBatch) requestsReadStep(kept []int, found map[ScopedKey]bool) (step, bool) {
	in := newRowset("tt")
	for _, i := range kept {
		if r := b.takes[i].Req; !r.IsZero() {
			in.add(r.Scope.String(), r.Key.String())
		}
	}
	if in.n == 0 {
		return step{}, false
	}
	return step{sql: b.l.sql.requestsRead, args: in.args(b.l.driver), read: func(rs resultRows) error {
		var k ScopedKey
		if err := rs.Scan(&k.Scope, &k.Key); err != nil {
			return err
		}
		found[k] = true
		return nil
	}}, true
}

// lockStep locks the SKU rows, in (program, ticket) order, and reads them
// into rows.
func (b *takeBatch) lockStep(skus []stock.SKU, rows map[stock.SKU]skuRow) step {
	return b.l.lockStep(skus, rows)
}

// lockStep locks the SKU rows of skus (sorted), in their order, and reads
// them into rows (nil: not read). Every batch that changes several SKU
// rows takes them this way first, so no two wait on each other in a
// cycle.
func (l *Ledger) lockStep(skus []stock.SKU, rows map[stock.SKU]skuRow) step {
	in := newRowset("tt")
	for _, s := range skus {
		in.add(s.Program.String(), s.Ticket.String())
	}
	return step{sql: l.sql.takeLock, args: in.args(l.driver), read: func(rs resultRows) error {
		if rows == nil {
			return nil
		}
		var sku stock.SKU
		var r skuRow
		var ended, seated int64
		if err := rs.Scan(&sku.Program, &sku.Ticket, &r.total, &r.sold, &r.held, &r.version, &r.epoch, &ended, &seated); err != nil {
			return err
		}
		r.ended, r.seated = ended > 0, seated == 1
		rows[sku] = r
		return nil
	}}
}

// buyerRows are the buyer_units rows the lines count into, in the one
// order every stock write takes them in: each ticket's rows (tickets in
// order, buyers in order), then each program's.
func buyerRows(lines []tline) []buyerRow {
	units := map[buyerName]int64{}
	for _, ln := range lines {
		base := ln.sku.Base()
		units[buyerName{base.Program, base.Ticket, ln.buyer}] += ln.q
		units[buyerName{ln.sku.Program, keys.ID{}, ln.buyer}] += ln.q
	}
	names := slices.SortedFunc(maps.Keys(units), func(a, b buyerName) int {
		// Ticket rows before program rows (an empty ticket), then by name.
		if c := cmp.Compare(boolInt(a.ticket.IsZero()), boolInt(b.ticket.IsZero())); c != 0 {
			return c
		}
		if c := a.program.Compare(b.program); c != 0 {
			return c
		}
		if c := a.ticket.Compare(b.ticket); c != 0 {
			return c
		}
		return a.buyer.Compare(b.buyer)
	})
	out := make([]buyerRow, len(names))
	for i, n := range names {
		out[i] = buyerRow{stock.SKU{Program: n.program, Ticket: n.ticket}, n.buyer, units[n]}
	}
	return out
}

// buyersReadStep reads the buyers' counts and caps of the lines' rows.
func (b *takeBatch) buyersReadStep(lines []tline, into map[buyerName][2]int64) step {
	in := newRowset("ttt")
	for _, r := range buyerRows(lines) {
		in.add(r.sku.Program.String(), r.sku.Ticket.String(), r.buyer.String())
	}
	return step{sql: b.l.sql.buyersRead, args: in.args(b.l.driver), read: func(rs resultRows) error {
		var n buyerName
		var units, cap int64
		if err := rs.Scan(&n.program, &n.ticket, &n.buyer, &units, &cap); err != nil {
			return err
		}
		into[n] = [2]int64{units, cap}
		return nil
	}}
}

// codesReadStep reads the lines' access codes and their standing uses.
func (b *takeBatch) codesReadStep(lines []tline, into map[codeName]codeRow) (step, bool) {
	in := newRowset("ttt")
	seen := map[codeName]bool{}
	for _, ln := range lines {
		if c := (codeName{ln.sku, ln.code}); ln.code != "" && !seen[c] {
			seen[c] = true
			in.add(ln.sku.Program.String(), ln.sku.Ticket.String(), ln.code)
		}
	}
	if in.n == 0 {
		return step{}, false
	}
	return step{sql: b.l.sql.codesRead, args: in.args(b.l.driver), read: func(rs resultRows) error {
		var c codeName
		var r codeRow
		if err := rs.Scan(&c.sku.Program, &c.sku.Ticket, &c.hash, &r.maxUses, &r.buyer, &r.uses); err != nil {
			return err
		}
		into[c] = r
		return nil
	}}, true
}

// writes are an attempt's write statements and what they report.
type writes struct {
	seats     step   // seats first (empty sql: no seat lines)
	steps     []step // the SKU rows, requests, rows, buyers, codes, events
	updated   map[stock.SKU]updatedRow
	claimed   map[ScopedKey]bool
	inserted  map[keys.ID]bool
	seatsGot  map[seatName]bool
	buyerRows []buyerRow
	counted   map[buyerName]bool
	codes     map[codeName]codeRow
	codeFound map[codeName]bool
}

// updatedRow is what a SKU's update said of its row: the gate epoch the
// stock was taken under, and the caps its buyers' counts are under (the
// ticket's, which its pools share, and its program's).
type updatedRow struct {
	epoch, perBuyer, programCap int64
}

// capped are the buyer rows under a cap, as the SKUs' updates read the
// caps (a ticket's pools share its cap).
func (w *writes) capped() []buyerRow {
	skuCap, programCap := map[stock.SKU]bool{}, map[keys.ID]bool{}
	for sku, u := range w.updated {
		if u.perBuyer > 0 {
			skuCap[sku.Base()] = true
		}
		if u.programCap > 0 {
			programCap[sku.Program] = true
		}
	}
	var out []buyerRow
	for _, r := range w.buyerRows {
		if (r.sku.Ticket.IsZero() && programCap[r.sku.Program]) || (!r.sku.Ticket.IsZero() && skuCap[r.sku]) {
			out = append(out, r)
		}
	}
	return out
}

// buyersStep counts rows (in the order given) under their caps; counted
// gets the rows written. A row not written was refused by its cap.
func (l *Ledger) buyersStep(rows []buyerRow, counted map[buyerName]bool) step {
	bu := newRowset("ttti")
	for _, r := range rows {
		bu.add(r.sku.Program.String(), r.sku.Ticket.String(), r.buyer.String(), r.units)
	}
	return step{sql: l.sql.takeBuyers, args: bu.args(l.driver), read: func(rs resultRows) error {
		var n buyerName
		if err := rs.Scan(&n.program, &n.ticket, &n.buyer); err != nil {
			return err
		}
		counted[n] = true
		return nil
	}}
}

// writeSteps builds the set-based statements of takes[kept] and lines.
func (b *takeBatch) writeSteps(d string, kept []int, lines []tline) *writes {
	l := b.l
	now := b.now.UnixMilli()
	w := &writes{updated: map[stock.SKU]updatedRow{}, claimed: map[ScopedKey]bool{}, inserted: map[keys.ID]bool{},
		seatsGot: map[seatName]bool{}, counted: map[buyerName]bool{}, codes: map[codeName]codeRow{}, codeFound: map[codeName]bool{}}

	// Seats, held by their hold or sold to their order.
	seats := newRowset("ttttt")
	for _, ln := range lines {
		state := seatSold
		if ln.hold {
			state = seatHeld
		}
		for _, s := range slices.SortedFunc(slices.Values(ln.seats), keys.ID.Compare) {
			seats.add(ln.sku.Program.String(), ln.sku.Ticket.String(), s.String(), ln.id.String(), state)
		}
	}
	if seats.n > 0 {
		w.seats = step{sql: l.sql.takeSeats, args: seats.args(d), read: func(rs resultRows) error {
			var s seatName
			if err := rs.Scan(&s.sku.Program, &s.sku.Ticket, &s.seat); err != nil {
				return err
			}
			w.seatsGot[s] = true
			return nil
		}}
	}

	// One conditional update per SKU, for the sum of its lines.
	type delta struct{ sold, held, epoch, counted int64 }
	deltas := map[stock.SKU]*delta{}
	for _, ln := range lines {
		dl := deltas[ln.sku]
		if dl == nil {
			dl = &delta{epoch: ln.epoch}
			deltas[ln.sku] = dl
		}
		if ln.hold {
			dl.held += ln.q
		} else {
			dl.sold += ln.q
		}
		if len(ln.seats) == 0 {
			dl.counted = 1
		}
		if dl.epoch != ln.epoch {
			dl.epoch = -2 // lines of two epochs: the update refuses, and the careful attempt tells them apart
		}
	}
	bypass := int64(0)
	if b.direct {
		bypass = 1
	}
	upd := newRowset("ttiiiii")
	for _, sku := range slices.SortedFunc(maps.Keys(deltas), stock.SKU.Compare) {
		dl := deltas[sku]
		upd.add(sku.Program.String(), sku.Ticket.String(), dl.sold, dl.held, dl.epoch, dl.counted, bypass)
	}
	w.steps = append(w.steps, step{sql: l.sql.takeUpdate, args: append([]any{now}, upd.args(d)...), read: func(rs resultRows) error {
		var sku stock.SKU
		var u updatedRow
		if err := rs.Scan(&sku.Program, &sku.Ticket, &u.epoch, &u.perBuyer, &u.programCap); err != nil {
			return err
		}
		w.updated[sku] = u
		return nil
	}})

	// The requests, with their answers and the row version they made.
	var claims []claimRow
	for _, i := range kept {
		if t := &b.takes[i]; !t.Req.IsZero() {
			claims = append(claims, claimRow{req: t.Req, sku: b.claimSKU(i), answer: b.answer(i)})
		}
	}
	if len(claims) > 0 {
		w.steps = append(w.steps, l.claimsStep(b.now, claims, w.claimed))
	}

	// The order and hold rows.
	var orders []Order
	var holds []Hold
	for _, ln := range lines {
		t := &b.takes[ln.take]
		if ln.hold {
			h := t.Holds[ln.idx]
			h.TakeEpoch = ln.epoch
			holds = append(holds, h)
			continue
		}
		o := t.Orders[ln.idx]
		o.TakeEpoch = ln.epoch
		orders = append(orders, o)
	}
	if len(orders) > 0 {
		w.steps = append(w.steps, l.ordersStep(b.now, orders, w.inserted))
		// An organizer's orders (comps, box office) say so beside them; a
		// buyer's purchase writes nothing more.
		chans := newRowset("tt")
		for _, o := range orders {
			if o.Channel != "" {
				chans.add(o.ID.String(), o.Channel)
			}
		}
		if chans.n > 0 {
			w.steps = append(w.steps, step{sql: l.sql.takeChannels, args: chans.args(d)})
		}
	}
	if len(holds) > 0 {
		hs := newRowset("tttttittiittt")
		for _, h := range holds {
			hs.add(h.ID.String(), h.IdempotencyKey.String(), h.RequestHash, h.SKU.Program.String(), h.SKU.Ticket.String(),
				h.Quantity, h.Buyer.String(), h.Gate, h.ExpiresAt.UnixMilli(), h.TakeEpoch, keys.Join(h.SeatIDs, ","),
				h.CartID.String(), h.CodeHash)
		}
		w.steps = append(w.steps, step{sql: l.sql.takeHolds, args: append([]any{now}, hs.args(d)...), read: readKeys(w.inserted)})
	}

	// The buyers' counts: only under a cap, so only once the SKUs'
	// updates have said which rows have one (see buyersStep).
	w.buyerRows = buyerRows(lines)

	// Access codes, after the rows that use them: each code's row locked,
	// its standing uses counted with this attempt's.
	cs := newRowset("ttt")
	seenCode := map[codeName]bool{}
	for _, ln := range lines {
		c := codeName{ln.sku, ln.code}
		if ln.code != "" && !seenCode[c] {
			seenCode[c] = true
			w.codes[c] = codeRow{}
		}
	}
	for _, c := range slices.SortedFunc(maps.Keys(seenCode), func(a, b codeName) int {
		if v := a.sku.Compare(b.sku); v != 0 {
			return v
		}
		return cmp.Compare(a.hash, b.hash)
	}) {
		cs.add(c.sku.Program.String(), c.sku.Ticket.String(), c.hash)
	}
	if cs.n > 0 {
		w.steps = append(w.steps, step{sql: l.sql.takeCodesLock, args: cs.args(d)}, step{sql: l.sql.codesRead, args: cs.args(d),
			read: func(rs resultRows) error {
				var c codeName
				var r codeRow
				if err := rs.Scan(&c.sku.Program, &c.sku.Ticket, &c.hash, &r.maxUses, &r.buyer, &r.uses); err != nil {
					return err
				}
				w.codes[c], w.codeFound[c] = r, true
				return nil
			}})
	}

	// Events last, after every row they are about: each line's, then a
	// sale.sold_out for each SKU the attempt left with nothing.
	var events []Event
	for _, ln := range lines {
		t := &b.takes[ln.take]
		var e Event
		if ln.hold {
			e = holdEvent(EventHoldCreated, t.Holds[ln.idx])
		} else {
			e = orderEvent(EventOrderCreated, t.Orders[ln.idx])
		}
		e.Trace = t.Req.Trace // a cart's lines carry no request of their own
		events = append(events, e)
	}
	w.steps = append(w.steps, l.eventsStep(b.now, events, slices.SortedFunc(maps.Keys(deltas), stock.SKU.Compare)))
	return w
}

// claimsStep claims the requests in one global order (scope, key): two
// batches that share requests (a retry sent to two replicas) wait on
// each other's claims in the same order, never in a cycle. claimed gets
// the keys claimed; a key missing from it was taken already.
func (l *Ledger) claimsStep(now time.Time, claims []claimRow, claimed map[ScopedKey]bool) step {
	claims = slices.Clone(claims)
	slices.SortFunc(claims, func(a, b claimRow) int {
		if c := a.req.Scope.Compare(b.req.Scope); c != 0 {
			return c
		}
		return a.req.Key.Compare(b.req.Key)
	})
	rs := newRowset("ttttttt")
	for _, c := range claims {
		rs.add(c.req.Scope.String(), c.req.Key.String(), c.req.Fingerprint, c.req.Op, c.sku.Program.String(), c.sku.Ticket.String(), c.answer)
	}
	return step{sql: l.sql.takeClaims, args: append([]any{now.UnixMilli()}, rs.args(l.driver)...), read: func(r resultRows) error {
		var k ScopedKey
		if err := r.Scan(&k.Scope, &k.Key); err != nil {
			return err
		}
		claimed[k] = true
		return nil
	}}
}

// ordersStep inserts order rows (TakeEpoch -1: the row's epoch at the
// insert); inserted gets the row keys inserted.
func (l *Ledger) ordersStep(now time.Time, orders []Order, inserted map[keys.ID]bool) step {
	rs := newRowset("ttttttitttittt")
	for _, o := range orders {
		rs.add(o.ID.String(), o.IdempotencyKey.String(), o.RequestHash, o.SKU.Program.String(), o.SKU.Ticket.String(),
			o.Buyer.String(), o.Quantity, o.Gate, o.GateKey.String(), o.HoldID.String(), o.TakeEpoch, o.CartID.String(), o.CodeHash,
			keys.Join(o.SeatIDs, ","))
	}
	return step{sql: l.sql.takeOrders, args: append([]any{now.UnixMilli()}, rs.args(l.driver)...), read: readKeys(inserted)}
}

// readKeys reads a RETURNING idem_key into into.
func readKeys(into map[keys.ID]bool) func(resultRows) error {
	return func(rs resultRows) error {
		var k keys.ID
		if err := rs.Scan(&k); err != nil {
			return err
		}
		into[k] = true
		return nil
	}
}

// eventsStep writes events in order, then a sale.sold_out for each of
// soldOut that has nothing left by then.
func (l *Ledger) eventsStep(now time.Time, events []Event, soldOut []stock.SKU) step {
	rs := newRowset("ittttittttiit")
	ord := int64(0)
	for _, e := range events {
		rs.add(ord, NewID().String(), e.Type, e.SKU.Program.String(), e.SKU.Ticket.String(), int64(partitionOf(e.SKU)),
			e.Subject.String(), e.Order.String(), e.Buyer.String(), e.Cart.String(), e.Quantity, int64(0), e.Trace)
		ord++
	}
	for _, sku := range soldOut {
		rs.add(ord, NewID().String(), EventSaleSoldOut, sku.Program.String(), sku.Ticket.String(), int64(partitionOf(sku)),
			"", "", "", "", int64(0), int64(1), "")
		ord++
	}
	return step{sql: l.sql.takeEvents, args: append([]any{now.UnixMilli()}, rs.args(l.driver)...)}
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

// takeSQL are the take engine's statements, in the driver's dialect: the
// same text but for how each reads its input rows.
type takeSQL struct {
	takeLock, takeSeats, takeUpdate, takeClaims, takeOrders, takeHolds, takeBuyers string
	takeChannels                                                                   string
	takeCodesLock, codesRead, buyersRead, takeEvents                               string
	confirmHolds, confirmUpdate, sellSeats, holdsRead, ordersRead                  string
	lockHolds, lockOrders                                                          string
	requestsRead                                                                   string
}

func newTakeSQL(d string) takeSQL {
	forUpdate := ""
	if d == Postgres {
		forUpdate = " FOR UPDATE OF s"
	}
	rowsAt := func(first int, cols ...string) string { return rowsFrom(d, "w", first, cols...) }
	var q takeSQL
	q.takeLock = `SELECT s.program, s.ticket, s.total, s.sold, s.held, s.version, s.gate_epoch, s.ended_at, s.seated
		FROM skus s JOIN ` + rowsAt(1, "program text", "ticket text") + ` ON s.program = w.program AND s.ticket = w.ticket
		ORDER BY s.program, s.ticket` + forUpdate
	q.takeSeats = `UPDATE seats SET state = w.state, hold_id = w.owner
		FROM ` + rowsAt(1, "program text", "ticket text", "seat_id text", "owner text", "state text") + `
		WHERE seats.program = w.program AND seats.ticket = w.ticket AND seats.seat_id = w.seat_id AND seats.state = 'free'
		RETURNING seats.program, seats.ticket, seats.seat_id`
	// The rows are locked in (program, ticket) order first (takeLock,
	// before this), as every batch that changes several SKU rows locks
	// them, so no two wait on each other in a cycle. (One statement with a
	// sorted FOR UPDATE in a CTE costs PostgreSQL more to plan than the
	// two: 281 against 186 us a batch.)
	q.takeUpdate = `UPDATE skus SET sold = skus.sold + w.sold, held = skus.held + w.held, version = skus.version + 1,
			updated_at = $1, bypass_seq = skus.bypass_seq + w.bypass
		FROM ` + rowsAt(2, "program text", "ticket text", "sold bigint", "held bigint", "epoch bigint", "counted bigint", "bypass bigint") + `
		WHERE skus.program = w.program AND skus.ticket = w.ticket AND skus.ended_at = 0
			AND skus.sold + skus.held + w.sold + w.held <= skus.total AND (w.counted = 0 OR skus.seated = 0)
			AND (w.epoch = -1 OR skus.gate_epoch = w.epoch)
		RETURNING skus.program, skus.ticket, skus.gate_epoch, skus.per_buyer,
			COALESCE((SELECT p.per_buyer FROM programs p WHERE p.program = skus.program), 0)`
	q.takeClaims = `INSERT INTO requests (scope, idem_key, fingerprint, op, program, ticket, result, sku_version, created_at)
		SELECT w.scope, w.idem_key, w.fingerprint, w.op, w.program, w.ticket, w.result,
			COALESCE((SELECT s.version FROM skus s WHERE s.program = w.program AND s.ticket = w.ticket), 0), $1
		FROM ` + rowsAt(2, "scope text", "idem_key text", "fingerprint text", "op text", "program text", "ticket text", "result text") + `
		WHERE true ON CONFLICT (scope, idem_key) DO NOTHING RETURNING scope, idem_key`
	epochOf := `CASE WHEN w.epoch >= 0 THEN w.epoch ELSE (SELECT s.gate_epoch FROM skus s WHERE s.program = w.program AND s.ticket = w.ticket) END`
	q.takeOrders = `INSERT INTO orders (id, idem_key, request_hash, program, ticket, buyer, quantity, gate, gate_key, hold_id,
			take_epoch, cart_id, code_hash, seat_ids, created_at)
		SELECT w.id, w.idem_key, w.request_hash, w.program, w.ticket, w.buyer, w.quantity, w.gate, w.gate_key, w.hold_id,
			` + epochOf + `, w.cart_id, w.code_hash, w.seat_ids, $1
		FROM ` + rowsAt(2, "id text", "idem_key text", "request_hash text", "program text", "ticket text", "buyer text",
		"quantity bigint", "gate text", "gate_key text", "hold_id text", "epoch bigint", "cart_id text", "code_hash text", "seat_ids text") + `
		WHERE true ON CONFLICT (idem_key) DO NOTHING RETURNING idem_key`
	q.takeChannels = `INSERT INTO order_channels (order_id, channel)
		SELECT w.order_id, w.channel FROM ` + rowsAt(1, "order_id text", "channel text") + `
		WHERE true ON CONFLICT (order_id) DO NOTHING`
	q.takeHolds = `INSERT INTO holds (id, idem_key, request_hash, program, ticket, quantity, buyer, gate, state, expires_at,
			take_epoch, seat_ids, cart_id, code_hash, created_at)
		SELECT w.id, w.idem_key, w.request_hash, w.program, w.ticket, w.quantity, w.buyer, w.gate, 'held', w.expires_at,
			` + epochOf + `, w.seat_ids, w.cart_id, w.code_hash, $1
		FROM ` + rowsAt(2, "id text", "idem_key text", "request_hash text", "program text", "ticket text", "quantity bigint",
		"buyer text", "gate text", "expires_at bigint", "epoch bigint", "seat_ids text", "cart_id text", "code_hash text") + `
		WHERE true ON CONFLICT (idem_key) DO NOTHING RETURNING idem_key`
	// Only rows under a cap are counted: a cap switched on later counts
	// its scope's rows from the holds and orders first (see PutSKU and
	// PutProgram).
	q.takeBuyers = `INSERT INTO buyer_units (program, ticket, buyer, units)
		SELECT w.program, w.ticket, w.buyer, w.units FROM ` + rowsAt(1, "program text", "ticket text", "buyer text", "units bigint") + `
		WHERE ` + capOf("w") + ` > 0 AND w.units <= ` + capOf("w") + `
		ON CONFLICT (program, ticket, buyer) DO UPDATE SET units = buyer_units.units + excluded.units
		WHERE buyer_units.units + excluded.units <= ` + capOf("buyer_units") + `
		RETURNING program, ticket, buyer`
	q.buyersRead = `SELECT w.program, w.ticket, w.buyer, COALESCE(b.units, 0), COALESCE(` + capOf("w") + `, 0)
		FROM ` + rowsAt(1, "program text", "ticket text", "buyer text") + `
		LEFT JOIN buyer_units b ON b.program = w.program AND b.ticket = w.ticket AND b.buyer = w.buyer`
	q.takeCodesLock = `UPDATE access_codes SET max_uses = access_codes.max_uses
		FROM ` + rowsAt(1, "program text", "ticket text", "code_hash text") + `
		WHERE access_codes.program = w.program AND access_codes.ticket = w.ticket AND access_codes.code_hash = w.code_hash`
	q.codesRead = `SELECT c.program, c.ticket, c.code_hash, c.max_uses, c.buyer,
			(SELECT COUNT(*) FROM orders o WHERE o.code_hash = c.code_hash AND o.code_hash <> '' AND o.program = c.program AND o.ticket = c.ticket AND o.refunded_at = 0)
			+ (SELECT COUNT(*) FROM holds h WHERE h.code_hash = c.code_hash AND h.code_hash <> '' AND h.program = c.program AND h.ticket = c.ticket AND h.state = 'held')
		FROM access_codes c JOIN ` + rowsAt(1, "program text", "ticket text", "code_hash text") + `
			ON c.program = w.program AND c.ticket = w.ticket AND c.code_hash = w.code_hash`
	q.takeEvents = `INSERT INTO events (event_id, type, program, ticket, partition, subject, order_id, buyer, cart_id, quantity, created_at, traceparent)
		SELECT w.event_id, w.type, w.program, w.ticket, w.part, w.subject, w.order_id, w.buyer, w.cart_id, w.quantity, $1, w.traceparent
		FROM ` + rowsAt(2, "ord bigint", "event_id text", "type text", "program text", "ticket text", "part bigint", "subject text",
		"order_id text", "buyer text", "cart_id text", "quantity bigint", "if_empty bigint", "traceparent text") + `
		WHERE w.if_empty = 0 OR (SELECT s.total - s.sold - s.held FROM skus s WHERE s.program = w.program AND s.ticket = w.ticket) = 0
		ORDER BY w.ord`
	// The holds are found by id alone and the state change is decided in
	// the SET: with the conditions in the WHERE, a planner whose statistics
	// lag a burst of new holds (estimated 52 held, found 32,000) scans the
	// (state, expires_at) index and joins every held hold with the batch
	// (20 ms a batch of 40, seen). A hold that is not confirmable is
	// written unchanged and not returned as confirmed.
	live := `holds.state = 'held' AND holds.expires_at > $1 AND holds.buyer = w.buyer AND holds.cart_id = ''`
	q.confirmHolds = `UPDATE holds SET state = CASE WHEN ` + live + ` THEN 'confirmed' ELSE holds.state END,
			ended_at = CASE WHEN ` + live + ` THEN $1 ELSE holds.ended_at END,
			order_id = CASE WHEN ` + live + ` THEN w.order_id ELSE holds.order_id END
		FROM ` + rowsAt(2, "id text", "buyer text", "order_id text") + `
		WHERE holds.id = w.id
		RETURNING holds.id, holds.state, holds.order_id`
	q.confirmUpdate = `UPDATE skus SET held = skus.held - w.q, sold = skus.sold + w.q, version = skus.version + 1, updated_at = $1
		FROM ` + rowsAt(2, "program text", "ticket text", "q bigint") + `
		WHERE skus.program = w.program AND skus.ticket = w.ticket AND skus.held >= w.q
		RETURNING skus.program, skus.ticket`
	// Rows of holds and orders are locked in id order before a batch
	// changes several, as SKU rows are in SKU order.
	forUpdateOf := func(t string) string {
		if d == Postgres {
			return " FOR UPDATE OF " + t
		}
		return ""
	}
	q.requestsRead = `SELECT r.scope, r.idem_key FROM requests r JOIN ` + rowsAt(1, "scope text", "idem_key text") +
		` ON r.scope = w.scope AND r.idem_key = w.idem_key`
	q.lockHolds = `SELECT h.id FROM holds h JOIN ` + rowsAt(1, "id text") + ` ON h.id = w.id ORDER BY h.id` + forUpdateOf("h")
	q.lockOrders = `SELECT o.id FROM orders o JOIN ` + rowsAt(1, "id text") + ` ON o.id = w.id ORDER BY o.id` + forUpdateOf("o")
	q.holdsRead = selectHoldFrom("h") + ` JOIN ` + rowsAt(1, "id text") + ` ON h.id = w.id`
	q.ordersRead = selectOrderFrom("o") + ` JOIN ` + rowsAt(1, "id text") + ` ON o.id = w.id`
	q.sellSeats = `UPDATE seats SET state = 'sold' FROM ` + rowsAt(1, "hold_id text") + `
		WHERE seats.state = 'held' AND seats.hold_id = w.hold_id`
	return q
}

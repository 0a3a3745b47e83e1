package sale

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// MaxCartLines is the most lines one cart may have.
const MaxCartLines = ledger.MaxCartLines

// CartLine is one line of a cart: Quantity units of a ticket of the
// cart's program. A seated ticket's line is seats: the given Seats (all of
// one section; Quantity then is their number, or 0), or the best Quantity
// adjacent seats, in Section when it is given, else in the first section
// (in id order) that has them.
type CartLine struct {
	Ticket   keys.ID
	Quantity int64
	Seats    []keys.ID
	Section  keys.ID
}

// CartTake asks for every line of a cart, all or nothing: bought, or held
// for TTL (0: the shortest default hold lifetime of its tickets).
type CartTake struct {
	Ask
	Program keys.ID
	Lines   []CartLine
	TTL     time.Duration
}

// Cart is a committed cart: an order per line, in ticket order, or for a
// held cart a hold per line (and once confirmed, their orders too).
type Cart struct {
	ID, Program, Buyer keys.ID
	Orders             []Order
	Holds              []Hold
	CreatedAt          time.Time
}

func cartOf(c ledger.Cart) Cart {
	out := Cart{ID: c.ID, Program: c.Program, Buyer: c.Buyer, CreatedAt: c.CreatedAt}
	for _, o := range c.Orders {
		out.Orders = append(out.Orders, orderOf(o))
	}
	for _, h := range c.Holds {
		out.Holds = append(out.Holds, holdOf(h))
	}
	return out
}

// check refuses a cart that is not one: no lines, too many, a ticket
// twice, a quantity out of bounds. It returns the lines in ticket order.
func (t CartTake) check(hold bool) ([]CartLine, error) {
	if err := t.Ask.check(); err != nil {
		return nil, err
	}
	if t.TTL != 0 && (!hold || t.TTL < time.Second || t.TTL > MaxHoldTTL) {
		return nil, refuse(ErrInvalid, "ttl_seconds out of bounds")
	}
	if t.Program.IsZero() {
		return nil, refuse(ErrInvalid, "program id must match [A-Za-z0-9_-]{1,64}")
	}
	if len(t.Lines) == 0 || len(t.Lines) > MaxCartLines {
		return nil, refuse(ErrInvalid, fmt.Sprintf("a cart has 1 to %d lines", MaxCartLines))
	}
	lines := slices.Clone(t.Lines)
	slices.SortFunc(lines, func(a, b CartLine) int { return a.Ticket.Compare(b.Ticket) })
	for i, l := range lines {
		if len(l.Seats) > 0 {
			switch {
			case !l.Section.IsZero():
				return nil, refuseLine(ErrInvalid, l.Ticket, "a line names its seats, or a section for the best seats; not both")
			case l.Quantity != 0 && l.Quantity != int64(len(l.Seats)):
				return nil, refuseLine(ErrInvalid, l.Ticket, "quantity must be the number of seats named (or left out)")
			case !distinct(l.Seats):
				return nil, refuseLine(ErrInvalid, l.Ticket, "a seat is named twice")
			}
			// Seats are a set: their order is not part of the request.
			l.Seats = slices.SortedFunc(slices.Values(l.Seats), keys.ID.Compare)
			l.Quantity = int64(len(l.Seats))
			lines[i] = l
		}
		switch {
		case l.Ticket.IsZero():
			return nil, refuse(ErrInvalid, "every line names a ticket id matching [A-Za-z0-9_-]{1,64}")
		case i > 0 && lines[i-1].Ticket == l.Ticket:
			return nil, refuse(ErrInvalid, "ticket "+l.Ticket.String()+" is in two lines; one line per ticket")
		case l.Quantity < 1:
			return nil, refuse(ErrInvalid, "every line's quantity must be an integer >= 1")
		case l.Quantity > stock.MaxPerOrderCap:
			return nil, refuseLine(ErrOverMax, l.Ticket, fmt.Sprintf("quantity %d over the largest order any ticket allows (%d)", l.Quantity, stock.MaxPerOrderCap))
		}
	}
	return lines, nil
}

// PurchaseCart buys every line of a cart or none. Each line is taken at
// the gate as a request of its own (its own quota counts and deduction
// records, derived from the cart's request, so a retry or a re-send moves
// each line once); when a line is refused, every line taken is given back.
// The ledger commits all the lines' orders in one transaction with the
// cart's request. A refusal names the line; a refused cart is not
// remembered, so a retry with the same key is evaluated again (and may
// succeed once stock came back), as a refused purchase is.
func (s *Service) PurchaseCart(ctx context.Context, t CartTake) (Result, error) {
	return s.takeCart(ctx, t, false)
}

// HoldCart holds every line of a cart or none, until one expiry shared by
// every line, as PurchaseCart buys them. The cart is then confirmed,
// cancelled or expires whole (ConfirmCart, CancelCart); a line's hold
// cannot be confirmed or cancelled alone (ErrInCart).
func (s *Service) HoldCart(ctx context.Context, t CartTake) (Result, error) {
	return s.takeCart(ctx, t, true)
}

func (s *Service) takeCart(ctx context.Context, t CartTake, hold bool) (Result, error) {
	lines, err := t.check(hold)
	if err != nil {
		return Result{}, err
	}
	op := ledger.OpCart
	fields := []string{t.Program.String()}
	for _, l := range lines {
		f := l.Ticket.String() + ":" + strconv.FormatInt(l.Quantity, 10)
		if len(l.Seats) > 0 {
			f += ":" + keys.Join(l.Seats, ",")
		}
		if !l.Section.IsZero() {
			f += ":@" + l.Section.String()
		}
		fields = append(fields, f)
	}
	if hold {
		op, fields = ledger.OpCartHold, append(fields, t.TTL.String())
	}
	c := cartFlow{s: s, buyer: t.Buyer, hold: hold, ttl: t.TTL, req: newRequest(t.Buyer, t.Key, op, fields...)}
	for i, l := range lines {
		c.lines = append(c.lines, want{sku: stock.SKU{Program: t.Program, Ticket: l.Ticket}, buyer: t.Buyer, q: l.Quantity,
			hold: hold, req: c.req.lineOf(i)})
		c.picks = append(c.picks, seatPick{seats: l.Seats, section: l.Section})
	}
	return s.runTake(ctx, c.req, func(ctx context.Context) answer {
		skus := make([]stock.SKU, 0, len(c.lines))
		for _, l := range c.lines {
			skus = append(skus, l.sku)
		}
		return s.throughQueue(ctx, t.Program, t.Ask, c.req, skus, c.take)
	})
}

// ConfirmCart makes every hold of a held cart an order, all or none, once;
// a retry gets the same cart.
func (s *Service) ConfirmCart(ctx context.Context, id keys.ID, a Ask) (Result, error) {
	return s.ownerAction(ctx, ledger.OpCartConfirm, id, a, s.confirmCart)
}

// CancelCart ends every hold of a held cart; their stock goes back, once.
func (s *Service) CancelCart(ctx context.Context, id keys.ID, a Ask) (Result, error) {
	return s.ownerAction(ctx, ledger.OpCartCancel, id, a, s.cancelCart)
}

// RefundCart refunds every order of a cart not refunded yet (one line is
// refunded alone through its order: Refund); their stock goes back, once.
func (s *Service) RefundCart(ctx context.Context, id keys.ID, a Ask) (Result, error) {
	return s.ownerAction(ctx, ledger.OpCartRefund, id, a, s.refundCart)
}

func (s *Service) confirmCart(ctx context.Context, id, buyer keys.ID, r request) answer {
	c, err := s.ledger.ConfirmCart(ctx, id, buyer, r.ledger())
	switch {
	case err == nil:
		for _, o := range c.Orders {
			s.sellSeats(ctx, o)
		}
		return answer{cart: &c}
	case errors.Is(err, ledger.ErrDuplicate):
		return answer{cart: &c, replayed: true}
	case errors.Is(err, ledger.ErrHoldEnded):
		for _, h := range c.Holds {
			if h.State == ledger.Cancelled {
				return ansHoldCancelled
			}
		}
		return ansHoldExpired
	case errors.Is(err, ledger.ErrHoldConfirmed):
		return fail(refuse(ErrHoldConfirmed, "a purchased cart has no holds to confirm"))
	}
	return s.ownerError(ctx, err, fail(ErrUnknownCart))
}

func (s *Service) cancelCart(ctx context.Context, id, buyer keys.ID, r request) answer {
	c, changed, err := s.ledger.CancelCart(ctx, id, buyer, r.ledger())
	switch {
	case errors.Is(err, ledger.ErrDuplicate):
		return answer{cart: &c, replayed: true}
	case errors.Is(err, ledger.ErrHoldConfirmed):
		return fail(refuse(ErrHoldConfirmed, "the cart is bought; refund it instead"))
	case err != nil:
		return s.ownerError(ctx, err, fail(ErrUnknownCart))
	}
	for _, id := range changed {
		s.returnOwed(ctx, "hold", id)
	}
	return answer{cart: &c}
}

func (s *Service) refundCart(ctx context.Context, id, buyer keys.ID, r request) answer {
	c, changed, err := s.ledger.RefundCart(ctx, id, buyer, r.ledger())
	switch {
	case errors.Is(err, ledger.ErrDuplicate):
		return answer{cart: &c, replayed: true}
	case errors.Is(err, ledger.ErrNotBought):
		return fail(notBought(c))
	case err != nil:
		return s.ownerError(ctx, err, fail(ErrUnknownCart))
	}
	for _, id := range changed {
		s.returnOwed(ctx, "order", id)
	}
	return answer{cart: &c}
}

// notBought refuses the refund of held cart c, never confirmed, naming
// its state (its holds end together).
func notBought(c ledger.Cart) error {
	state := ledger.Held
	if len(c.Holds) > 0 {
		state = holdOf(c.Holds[0]).State
	}
	detail := "the cart is " + state + ", never confirmed: nothing was bought to refund"
	if state == ledger.Held {
		detail += " (cancel it to give its tickets back)"
	}
	return refuse(ErrCartNotBought, detail)
}

// CartByID returns a cart with its orders as they are now.
func (s *Service) CartByID(ctx context.Context, id keys.ID) (Cart, error) {
	c, err := s.ledger.CartByID(ctx, id)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return Cart{}, ErrUnknownCart
	case err != nil:
		return Cart{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return cartOf(c), nil
}

// sellSeats marks a seat order's seats sold in the gate. If this fails
// they stay held by the order's owner id, which no one else can take; the
// seat consistency check repairs it.
func (s *Service) sellSeats(ctx context.Context, o ledger.Order) {
	if section, ids, ok := seats.DecodeGate(o.Gate); ok && s.seats != nil {
		_ = s.redis(ctx, func(ctx context.Context) error {
			_, err := s.seats.Sell(ctx, o.SKU, section, o.GateRequest(), ids)
			return err
		})
	}
}

// cartFlow is one cart purchase: its request and a want per line.
type cartFlow struct {
	s     *Service
	buyer keys.ID
	req   request
	lines []want
	hold  bool
	ttl   time.Duration // a held cart's lifetime; 0: the shortest default of its tickets
	// picks are what each line asks of its seats (nothing for a counted
	// line); placed, the seats each seat line has in this attempt.
	picks  []seatPick
	placed []placed
	// exclusive: this attempt holds the cart's lock, so no other attempt
	// of the cart is at the gate now. A deduction it finds made under a
	// line's id was then made by an attempt that is over (a 503 whose
	// script ran late, after a stall).
	exclusive bool
}

// seatPick is what a seat line asks for: the given seats, or the best
// adjacent ones (seats empty) in section, or in any.
type seatPick struct {
	seats   []keys.ID
	section keys.ID
}

// placed is a seat line's seats, all of one section.
type placed struct {
	section keys.ID
	ids     []keys.ID
}

// ledgerCart is the cart the ledger commits: a line per want (an order, or
// a hold until expires), with each line's gate record when the gate took it.
func (c *cartFlow) ledgerCart(got []taken, expires time.Time) ledger.Cart {
	cart := ledger.Cart{Program: c.lines[0].sku.Program, Buyer: c.buyer, Req: c.req.ledger()}
	for i, w := range c.lines {
		var gate string
		var epoch int64
		if got != nil {
			gate, epoch = shard.EncodeParts(got[i].parts), got[i].epoch
		}
		// A seat line's record names its seats and their owner even when
		// taken around the gate, as a seat hold's does: its return
		// releases them by owner (a no-op where not held).
		p := c.placed[i]
		if len(p.ids) > 0 {
			gate, epoch = seats.EncodeGate(p.section, p.ids), -1
		}
		if c.hold {
			cart.Holds = append(cart.Holds, ledger.Hold{IdempotencyKey: w.req.gateID(), SKU: w.sku, Buyer: c.buyer,
				Quantity: w.q, Gate: gate, GateEpoch: epoch, ExpiresAt: expires, SeatIDs: p.ids})
		} else {
			cart.Orders = append(cart.Orders, ledger.Order{IdempotencyKey: w.req.gateID(), SKU: w.sku, Buyer: c.buyer,
				Quantity: w.q, Gate: gate, GateEpoch: epoch, SeatIDs: p.ids})
		}
	}
	return cart
}

// commit writes the cart in the ledger, group-committed with the other
// takes: through the gate, or around it.
func (c *cartFlow) commit(ctx context.Context, cart ledger.Cart, direct bool) (ledger.Cart, error) {
	if c.hold {
		cart.Orders = nil
	} else {
		cart.Holds = nil
	}
	if direct {
		return c.s.direct.commitCart(cart)
	}
	return c.s.committer.commitCart(cart)
}

// expiry is when a held cart's holds expire: its own lifetime, or the
// shortest default of its tickets.
func (c *cartFlow) expiry(states []ledger.SKUState) time.Time {
	ttl := c.ttl
	if ttl == 0 {
		for _, st := range states {
			if ttl == 0 || st.HoldTTL < ttl {
				ttl = st.HoldTTL
			}
		}
	}
	return time.Now().Add(ttl)
}

// taken is a line the gate took: what to give back if the cart fails.
type taken struct {
	w     want
	parts []shard.Part
	quota *quotaTicket
	epoch int64
	// replayed: another attempt of this cart (a copy sent to another
	// replica) made this line's deduction; it is that attempt's to commit
	// or give back, never this one's.
	replayed bool
	// seats: a seat line's seats, held in the gate under the line's id.
	seats placed
}

// lockCart names the lock copies of one cart request take turns under.
var lockCart = keys.MustID("cart")

func (c *cartFlow) take(ctx context.Context) answer {
	// Copies of one cart sent to several replicas at once take turns: a
	// copy refused on one line must not give back another line's
	// deduction while a copy that shares it is committing. The second
	// copy then meets the first's records and its ledger row, and replays.
	var lease *lock.Lease
	err := errors.New("breaker open")
	if c.s.breaker.State() != breaker.Open {
		lease, err = c.s.locker.Acquire(ctx, keys.Lock(c.lines[0].sku.Program, c.req.gateID(), lockCart), c.s.opts.ReseedWait)
	}
	switch {
	case errors.Is(err, lock.ErrBusy):
		return ansUnavailable // the other copy is still at it: retry with the same key
	case err != nil:
		// Redis cannot be reached: neither can a copy's gate take; the
		// ledger decides alone.
	default:
		c.exclusive = true
		defer func() {
			if err := lease.Release(context.WithoutCancel(ctx)); err != nil {
				c.s.log.WarnContext(ctx, "release cart lock", "err", err)
			}
		}()
	}
	for attempt := 1; ; attempt++ {
		a, stale := c.takeOnce(ctx)
		if stale.IsZero() {
			return a
		}
		if attempt == takeAttempts {
			return c.s.counted(pathGate, ansUnavailable)
		}
		// A line's gate was rebuilt under it: rebuild, then take again.
		if err := c.s.reseed(ctx, stale, reasonStale, false); err != nil {
			c.s.log.WarnContext(ctx, "rebuild after a stale admission", "sku", stale.String(), "err", err)
		}
		c.s.settings.Invalidate(stale)
	}
}

// refused answers a refusal of the cart: the replay when the cart had
// committed before (a retry), the refusal otherwise.
func (c *cartFlow) refused(ctx context.Context, kind *Err, i int, detail string) answer {
	return c.s.lookupOr(ctx, c.req, fail(refuseLine(kind, c.lines[i].sku.Ticket, detail)))
}

// takeOnce is one attempt; stale names a SKU whose gate was rebuilt under
// the attempt (everything it took is given back).
func (c *cartFlow) takeOnce(ctx context.Context) (_ answer, stale stock.SKU) {
	s := c.s
	states := make([]ledger.SKUState, len(c.lines))
	direct := s.breaker.State() == breaker.Open
	for i, w := range c.lines {
		st, err := s.settings.Get(ctx, w.sku)
		switch {
		case errors.Is(err, stock.ErrUnknownSKU):
			return c.refused(ctx, ErrUnknownSKU, i, ""), stale
		case err != nil:
			s.log.ErrorContext(ctx, "load sku settings", "sku", w.sku.String(), "err", err)
			return ansUnavailable, stale
		case w.q > st.MaxPerOrder:
			return c.refused(ctx, ErrOverMax, i, fmt.Sprintf("quantity %d over this ticket's maximum of %d per order", w.q, st.MaxPerOrder)), stale
		case st.Seated && s.seats == nil:
			return c.refused(ctx, ErrNoSeating, i, ""), stale
		case st.Seated && len(c.picks[i].seats) == 0 && w.q > MaxBestSeats:
			return c.refused(ctx, ErrInvalid, i, fmt.Sprintf("at most %d best seats per line", MaxBestSeats)), stale
		case !st.Seated && (len(c.picks[i].seats) > 0 || !c.picks[i].section.IsZero()):
			return c.refused(ctx, ErrNotSeated, i, ""), stale
		case !st.EndedAt.IsZero():
			return c.refused(ctx, ErrSaleEnded, i, ""), stale
		case !st.Seated && s.cache.SoldOut(w.sku):
			return c.refused(ctx, ErrSoldOut, i, ""), stale
		case st.PerBuyer > 0 && w.q > st.PerBuyer:
			return c.refused(ctx, ErrLimit, i, ""), stale
		case c.hold && c.ttl != 0 && (c.ttl < ledger.MinHoldTTL || c.ttl > st.HoldTTLMax):
			return c.refused(ctx, ErrInvalid, i, fmt.Sprintf("ttl_seconds must be in %d..%d for this ticket",
				int(ledger.MinHoldTTL.Seconds()), int(st.HoldTTLMax.Seconds()))), stale
		}
		if st, err = s.gateFresh(ctx, w.sku, st); err != nil {
			s.log.ErrorContext(ctx, "load sku settings", "sku", w.sku.String(), "err", err)
			return ansUnavailable, stale
		}
		if !st.Seated && st.GateStale() && !direct && s.breaker.State() == breaker.Closed {
			if err := s.reseed(ctx, w.sku, reasonBypass, false); err != nil {
				direct = true
			}
		}
		states[i] = st
	}
	if a, ok := c.placeGiven(ctx, states); !ok {
		return a, stale
	}
	if direct {
		return c.direct(ctx, states), stale
	}
	if slices.ContainsFunc(states, func(st ledger.SKUState) bool { return st.Seated }) {
		// A retry of a committed cart with seats is answered from the
		// ledger before its seats are touched: holding them again under
		// the same owners is a no-op, but a refusal of a later line would
		// release them from the committed cart.
		if a, ok, err := s.recorded(ctx, c.req); err != nil {
			return ansUnavailable, stale
		} else if ok {
			return a, stale
		}
	}
	var got []taken
	undo := func(release bool) {
		ownerless := release && c.deadAttempts(ctx, got)
		for _, t := range got {
			if len(t.seats.ids) > 0 {
				c.releaseSeats(ctx, t)
				continue
			}
			if t.replayed && !ownerless {
				t.quota.replayed(ctx) // only the counts this attempt made
				continue
			}
			s.giveBack(ctx, t.w.sku, t.w.req.gateID(), t.parts)
			if release {
				t.quota.release(ctx)
			}
		}
	}
	for i, w := range c.lines {
		st := states[i]
		if st.Seated {
			p, a, err := c.holdSeats(ctx, i)
			switch {
			case err != nil && notRun(err):
				undo(true)
				return c.direct(ctx, states), stale
			case err != nil:
				s.log.ErrorContext(ctx, "seats", "sku", w.sku.String(), "err", err)
				undo(true)
				return s.counted(pathGate, ansUnavailable), stale
			case a.err != nil:
				undo(true)
				return s.counted(pathGate, a), stale
			}
			c.placed[i] = p
			got = append(got, taken{w: w, seats: p})
			continue
		}
		quota, qerr := s.takeQuota(ctx, w, st)
		switch {
		case errors.Is(qerr, errOverCap), errors.Is(qerr, shard.ErrKeyCounted), errors.Is(qerr, stock.ErrLimit):
			undo(true)
			return s.counted(pathGate, c.refused(ctx, ErrLimit, i, "")), stale
		case qerr != nil && notRun(qerr):
			undo(true)
			return c.direct(ctx, states), stale
		case qerr != nil:
			s.log.ErrorContext(ctx, "quota", "sku", w.sku.String(), "err", qerr)
			undo(true)
			return s.counted(pathGate, ansUnavailable), stale
		}
		req := shard.Request{SKU: w.sku, Shards: st.Shards, RequestID: w.req.gateID(), Quantity: w.q, MaxQuantity: st.MaxPerOrder}
		d, err := s.deduct(ctx, req)
		if err != nil && !notRun(err) && !isOutcome(err) {
			// Unknown outcome: ask again under the same request id, whose
			// deduction record answers for the first attempt.
			d, err = s.deduct(ctx, req)
		}
		switch {
		case errors.Is(err, stock.ErrSoldOut):
			if d.Left == 0 {
				s.markSoldOut(w.sku)
			}
			quota.release(ctx)
			undo(true)
			return s.counted(pathGate, c.refused(ctx, ErrSoldOut, i, "")), stale
		case err != nil && notRun(err):
			quota.keepKey()
			quota.release(ctx)
			undo(true)
			return c.direct(ctx, states), stale
		case err != nil:
			// Still unknown for this line: its record answers a retry with
			// the same key. The lines before it are known and go back.
			s.log.ErrorContext(ctx, "deduct", "sku", w.sku.String(), "err", err)
			undo(true)
			return s.counted(pathGate, ansUnavailable), stale
		}
		epoch, same := d.Epoch()
		if !same {
			got = append(got, taken{w: w, parts: d.Parts, quota: quota})
			undo(false) // the quota counts stay: the retake counts under the same ids
			return answer{}, w.sku
		}
		if !d.Replayed {
			s.cache.ClearSoldOut(w.sku)
		}
		got = append(got, taken{w: w, parts: d.Parts, quota: quota, epoch: epoch, replayed: d.Replayed})
	}
	committed, err := c.commit(ctx, c.ledgerCart(got, c.expiry(states)), false)
	var le *ledger.LineError
	line := -1
	if errors.As(err, &le) {
		line = le.Line
	}
	var te *ledger.SeatsTakenError
	switch {
	case err == nil:
		for _, o := range committed.Orders {
			s.sellSeats(ctx, o)
		}
		s.count(pathGate, "sold")
		return answer{cart: &committed}, stale
	case errors.Is(err, ledger.ErrDuplicate):
		// Another attempt of this cart committed first: give back only what
		// its orders do not stand on. Its seat lines hold the same seats
		// under the same owners: they stay.
		for _, t := range got {
			if len(t.seats.ids) == 0 {
				s.giveBackUnused(ctx, t.w, t.parts)
				t.quota.replayed(ctx)
			}
		}
		return answer{cart: &committed, replayed: true}, stale
	case errors.As(err, &te) && line >= 0:
		undo(true)
		return s.counted(pathGate, c.refusedSeats(ctx, ErrSeatsTaken, line, te.Seats)), stale
	case errors.Is(err, ledger.ErrKeyReused):
		undo(true)
		return ansKeyReused, stale
	case errors.Is(err, ledger.ErrStaleGate) && line >= 0:
		undo(false)
		return answer{}, c.lines[line].sku
	case errors.Is(err, ledger.ErrSeatedTake) && line >= 0:
		undo(true)
		return s.counted(pathGate, c.refused(ctx, ErrSeated, line, "")), stale
	case errors.Is(err, stock.ErrSoldOut) && line >= 0:
		s.metrics.ledgerRefusals.Inc()
		undo(true)
		return s.counted(pathGate, c.refused(ctx, ErrSoldOut, line, "")), stale
	case errors.Is(err, stock.ErrLimit):
		undo(true)
		if line < 0 {
			return s.counted(pathGate, s.lookupOr(ctx, c.req, ansLimit)), stale
		}
		return s.counted(pathGate, c.refused(ctx, ErrLimit, line, "")), stale
	case errors.Is(err, stock.ErrSaleEnded) && line >= 0:
		undo(true)
		return s.counted(pathGate, c.refused(ctx, ErrSaleEnded, line, "")), stale
	case errors.Is(err, stock.ErrUnknownSKU) && line >= 0:
		undo(true)
		return s.counted(pathGate, c.refused(ctx, ErrUnknownSKU, line, "")), stale
	case errors.Is(err, errLedgerBusy):
		undo(true)
		return s.counted(pathGate, ansLedgerBusy), stale
	case errors.Is(err, ledger.ErrNotCommitted):
		s.log.ErrorContext(ctx, "ledger cart", "err", err)
		undo(true)
		return s.counted(pathGate, ansUnavailable), stale
	}
	// COMMIT failed and may have landed: look before giving anything back.
	s.log.ErrorContext(ctx, "ledger cart", "err", err)
	if a, ok, lerr := s.recorded(ctx, c.req); lerr == nil && ok {
		return a, stale
	} else if lerr == nil {
		undo(true)
	}
	return s.counted(pathGate, ansUnavailable), stale
}

// direct commits the cart straight in the ledger while Redis cannot, as
// takeDirect does a purchase: bounded in number, optimistic on every
// line's row version, each line bumping its SKU's bypass_seq so its gate
// is rebuilt before it serves again.
func (c *cartFlow) direct(ctx context.Context, states []ledger.SKUState) answer {
	s := c.s
	release, ok := s.fallbackSlot()
	if !ok {
		return s.counted(pathLedger, ansBusy)
	}
	defer release()
	if a, ok := c.placeBest(ctx, states); !ok {
		return s.counted(pathLedger, a)
	}
	cart := c.ledgerCart(nil, c.expiry(states))
	var te *ledger.SeatsTakenError
	for attempt := range s.opts.FallbackAttempts {
		if !s.fallbackPause(ctx, attempt) {
			return ansUnavailable
		}
		committed, err := c.commit(ctx, cart, true)
		var le *ledger.LineError
		line := 0
		if errors.As(err, &le) {
			line = le.Line
		}
		switch {
		case err == nil:
			for _, w := range c.lines {
				s.bypassed.Store(w.sku, struct{}{})
			}
			s.count(pathLedger, "sold")
			return answer{cart: &committed}
		case errors.Is(err, ledger.ErrDuplicate):
			return answer{cart: &committed, replayed: true}
		case errors.Is(err, ledger.ErrKeyReused):
			return ansKeyReused
		case errors.Is(err, ledger.ErrConflict):
			continue
		case errors.As(err, &te):
			return s.counted(pathLedger, c.refusedSeats(ctx, ErrSeatsTaken, line, te.Seats))
		case errors.Is(err, ledger.ErrSeatedTake):
			return s.counted(pathLedger, c.refused(ctx, ErrSeated, line, ""))
		case errors.Is(err, stock.ErrSoldOut):
			return s.counted(pathLedger, c.refused(ctx, ErrSoldOut, line, ""))
		case errors.Is(err, stock.ErrLimit) && le == nil:
			return s.counted(pathLedger, s.lookupOr(ctx, c.req, ansLimit))
		case errors.Is(err, stock.ErrLimit):
			return s.counted(pathLedger, c.refused(ctx, ErrLimit, line, ""))
		case errors.Is(err, stock.ErrSaleEnded):
			return s.counted(pathLedger, c.refused(ctx, ErrSaleEnded, line, ""))
		case errors.Is(err, stock.ErrUnknownSKU):
			return s.counted(pathLedger, c.refused(ctx, ErrUnknownSKU, line, ""))
		case errors.Is(err, errLedgerBusy):
			return s.counted(pathLedger, ansLedgerBusy)
		case errors.Is(err, ledger.ErrNotCommitted):
			s.log.ErrorContext(ctx, "fallback cart", "err", err)
			return s.counted(pathLedger, ansUnavailable)
		}
		s.log.ErrorContext(ctx, "fallback cart", "err", err)
		return s.counted(pathLedger, s.lookupOr(ctx, c.req, ansUnavailable))
	}
	return s.counted(pathLedger, ansBusy)
}

// deadAttempts reports whether the deductions got replays (made under a
// line's id before this attempt) belong to no attempt that may still
// commit them: this attempt holds the cart's lock, and the cart is not in
// the ledger. Then a refusal gives them back with its own; otherwise (or
// when the ledger cannot tell) they stay, which at worst keeps units out
// of Redis until the consistency check, never sells one twice.
func (c *cartFlow) deadAttempts(ctx context.Context, got []taken) bool {
	if !c.exclusive || !slices.ContainsFunc(got, func(t taken) bool { return t.replayed }) {
		return false
	}
	_, committed, err := c.s.recorded(ctx, c.req)
	return err == nil && !committed
}

// refusedSeats answers a refusal of the cart's line i naming seats.
func (c *cartFlow) refusedSeats(ctx context.Context, kind *Err, i int, ids []string) answer {
	return c.s.lookupOr(ctx, c.req, fail(refuseLineSeats(kind, c.lines[i].sku.Ticket, ids)))
}

// placeGiven finds the section of each seat line that names its seats,
// refusing seats not in the map and seats of two sections; it starts this
// attempt's placed seats.
func (c *cartFlow) placeGiven(ctx context.Context, states []ledger.SKUState) (answer, bool) {
	c.placed = make([]placed, len(c.lines))
	for i, w := range c.lines {
		pick := c.picks[i]
		if !states[i].Seated || len(pick.seats) == 0 {
			continue
		}
		m, err := c.s.seatMaps.Get(ctx, w.sku)
		if err != nil {
			return ansUnavailable, false
		}
		section, unknown, spans := m.section(pick.seats)
		switch {
		case spans:
			return c.refused(ctx, ErrSeatsSpan, i, ""), false
		case len(unknown) > 0:
			return c.refusedSeats(ctx, ErrUnknownSeats, i, unknown), false
		}
		c.placed[i] = placed{section: section, ids: pick.seats}
	}
	return answer{}, true
}

// sections are the sections a best-seats line looks in, in order: its
// own, or every section of the map by id.
func (c *cartFlow) sections(ctx context.Context, i int) ([]keys.ID, error) {
	if sec := c.picks[i].section; !sec.IsZero() {
		return []keys.ID{sec}, nil
	}
	m, err := c.s.seatMaps.Get(ctx, c.lines[i].sku)
	if err != nil {
		return nil, err
	}
	var out []keys.ID
	for _, sec := range m {
		if !slices.Contains(out, sec) {
			out = append(out, sec)
		}
	}
	slices.SortFunc(out, keys.ID.Compare)
	return out, nil
}

// holdSeats holds line i's seats in the gate under the line's id: the
// given ones, all or none, or the best adjacent ones. A refusal is in the
// answer; an error is Redis's.
func (c *cartFlow) holdSeats(ctx context.Context, i int) (placed, answer, error) {
	s, w, owner := c.s, c.lines[i], c.lines[i].req.gateID()
	if p := c.placed[i]; len(p.ids) > 0 {
		err := s.redis(ctx, func(ctx context.Context) error { return s.seats.Hold(ctx, w.sku, p.section, owner, p.ids) })
		var se *seats.SeatError
		switch {
		case errors.As(err, &se) && errors.Is(err, seats.ErrTaken):
			return p, c.refusedSeats(ctx, ErrSeatsTaken, i, se.Seats), nil
		case errors.As(err, &se):
			return p, c.refusedSeats(ctx, ErrSeatsNotInGate, i, se.Seats), nil
		}
		return p, answer{}, err
	}
	sections, err := c.sections(ctx, i)
	if err != nil {
		return placed{}, ansUnavailable, nil
	}
	for _, sec := range sections {
		var ids []keys.ID
		err := s.redis(ctx, func(ctx context.Context) (err error) {
			ids, err = s.seats.Best(ctx, w.sku, sec, owner, int(w.q))
			return err
		})
		switch {
		case errors.Is(err, seats.ErrNoAdjacent):
			continue
		case err != nil:
			return placed{}, answer{}, err
		}
		return placed{section: sec, ids: ids}, answer{}, nil
	}
	return placed{}, c.refused(ctx, ErrNoAdjacent, i, fmt.Sprintf("no %d adjacent seats free", w.q)), nil
}

// placeBest picks each best-seats line's seats from the ledger's map, for
// a cart committed around the gate.
func (c *cartFlow) placeBest(ctx context.Context, states []ledger.SKUState) (answer, bool) {
	for i, w := range c.lines {
		if !states[i].Seated || len(c.placed[i].ids) > 0 {
			continue
		}
		sections, err := c.sections(ctx, i)
		if err != nil {
			return ansUnavailable, false
		}
		for _, sec := range sections {
			all, err := c.s.ledger.Seats(ctx, w.sku, sec)
			if err != nil {
				return ansUnavailable, false
			}
			if ids := bestAdjacent(all, int(w.q)); ids != nil {
				c.placed[i] = placed{section: sec, ids: ids}
				break
			}
		}
		if len(c.placed[i].ids) == 0 {
			return c.refused(ctx, ErrNoAdjacent, i, fmt.Sprintf("no %d adjacent seats free", w.q)), false
		}
	}
	return answer{}, true
}

// releaseSeats gives back the seats a line held in the gate. If Redis
// cannot, they stay held by the line's id, which nothing else holds; the
// seat consistency check frees them.
func (c *cartFlow) releaseSeats(ctx context.Context, t taken) {
	ctx = context.WithoutCancel(ctx) // as giveBack
	err := c.s.redis(ctx, func(ctx context.Context) error {
		_, err := c.s.seats.Release(ctx, t.w.sku, t.seats.section, t.w.req.gateID(), t.seats.ids)
		return err
	})
	if err != nil {
		c.s.log.WarnContext(ctx, "release cart seats; the seat check frees them", "sku", t.w.sku.String(), "err", err)
	}
}

// distinct reports whether no id is in ids twice.
func distinct(ids []keys.ID) bool {
	sorted := slices.SortedFunc(slices.Values(ids), keys.ID.Compare)
	return len(slices.CompactFunc(sorted, func(a, b keys.ID) bool { return a == b })) == len(ids)
}

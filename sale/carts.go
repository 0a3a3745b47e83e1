package sale

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/seats"
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

func cartOf(c ledger.Cart, now time.Time) Cart {
	out := Cart{ID: c.ID, Program: c.Program, Buyer: c.Buyer, CreatedAt: c.CreatedAt}
	for _, o := range c.Orders {
		out.Orders = append(out.Orders, orderOf(o))
	}
	for _, h := range c.Holds {
		out.Holds = append(out.Holds, holdOf(h, now))
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
	tk, skus, err := s.cartTake(t, hold)
	if err != nil {
		return Result{}, err
	}
	return s.runTake(ctx, tk.req, func(ctx context.Context) answer {
		return s.throughQueue(ctx, t.Program, t.Ask, tk.req, skus, tk.run)
	})
}

// cartTake is the take a cart asks for (held when hold), a line per
// ticket, and the SKUs of its lines.
func (s *Service) cartTake(t CartTake, hold bool) (*take, []stock.SKU, error) {
	lines, err := t.check(hold)
	if err != nil {
		return nil, nil, err
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
	r := newRequest(t.Buyer, t.Key, op, fields...).on(t.Program)
	tk := &take{s: s, req: r, ttl: t.TTL, cart: true, device: t.Device}
	skus := make([]stock.SKU, 0, len(lines))
	for i, l := range lines {
		sku := stock.SKU{Program: t.Program, Ticket: l.Ticket}
		tk.lines = append(tk.lines, &line{w: want{sku: sku, buyer: t.Buyer, q: l.Quantity, hold: hold, req: r.lineOf(i)},
			pick: seatPick{seats: l.Seats, section: l.Section}})
		skus = append(skus, sku)
	}
	return tk, skus, nil
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
			s.holdEnded(ctx, o.SKU.Program, o.Buyer, o.GateRequest())
		}
		return answer{cart: &c}
	case errors.Is(err, ledger.ErrDuplicate):
		for _, o := range c.Orders { // as confirm's replay
			s.holdEnded(ctx, o.SKU.Program, o.Buyer, o.GateRequest())
		}
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
		// The first answer may never have been given (its COMMIT reply
		// lost): what it owes Redis goes back now, not at a sweep.
		for _, h := range c.Holds {
			if !s.returnFound(ctx, "hold", h.ID) {
				return ansUnavailable // as cancel's replay
			}
			s.holdEnded(ctx, h.SKU.Program, h.Buyer, h.IdempotencyKey)
		}
		return answer{cart: &c, replayed: true}
	case errors.Is(err, ledger.ErrHoldConfirmed):
		return fail(refuse(ErrHoldConfirmed, "the cart is bought; refund it instead"))
	case err != nil:
		return s.ownerError(ctx, err, fail(ErrUnknownCart))
	}
	for _, h := range c.Holds {
		if slices.Contains(changed, h.ID) {
			s.holdEnded(ctx, h.SKU.Program, h.Buyer, h.IdempotencyKey)
		}
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
		for _, o := range c.Orders { // as cancelCart's replay
			if !s.returnFound(ctx, "order", o.ID) {
				return ansUnavailable
			}
		}
		return answer{cart: &c, replayed: true}
	case errors.Is(err, ledger.ErrNotBought):
		return fail(notBought(c, s.now()))
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
func notBought(c ledger.Cart, now time.Time) error {
	state := ledger.Held
	if len(c.Holds) > 0 {
		state = holdOf(c.Holds[0], now).State
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
	return cartOf(c, s.now()), nil
}

// sellSeats marks a seat order's seats sold in the gate. If this fails
// they stay held by the order's owner id, which no one else can take; the
// seat consistency check repairs it.
func (s *Service) sellSeats(ctx context.Context, o ledger.Order) {
	if section, ids, ok := seats.DecodeGate(o.Gate); ok && s.seats != nil {
		// The order stands: mark its seats even when the request's own
		// budget ran out committing it (the call has its own timeout).
		ctx = context.WithoutCancel(ctx)
		_ = s.redis(ctx, "gate.seats_sell", func(ctx context.Context) error {
			_, err := s.seats.Sell(ctx, o.SKU, section, o.GateRequest(), ids)
			return err
		})
	}
}

// distinct reports whether no id is in ids twice.
func distinct(ids []keys.ID) bool {
	sorted := slices.SortedFunc(slices.Values(ids), keys.ID.Compare)
	return len(slices.CompactFunc(sorted, func(a, b keys.ID) bool { return a == b })) == len(ids)
}

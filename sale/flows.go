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

// Ask is what every write names: the buyer (the scope of its key) and the
// client's Idempotency-Key.
type Ask struct {
	Buyer keys.ID
	Key   keys.ID
	// Admission is the waiting room's token, for a program that has one.
	Admission string
	// Device is the request's device or payment fingerprint, as the
	// platform saw it (opaque; "" for none): a hold counts against its
	// program's device hold budget under it.
	Device string
}

// MaxDevice is the longest device fingerprint.
const MaxDevice = 256

// ValidDevice reports whether d is a device fingerprint the gate takes:
// empty, or 1..MaxDevice printable ASCII characters.
func ValidDevice(d string) bool {
	if len(d) > MaxDevice {
		return false
	}
	for i := 0; i < len(d); i++ {
		if d[i] < 0x20 || d[i] > 0x7e {
			return false
		}
	}
	return true
}

// check refuses a missing buyer or key. Both were parsed at the edge, so
// only their presence is left to check.
func (a Ask) check() error {
	if a.Buyer.IsZero() {
		return refuse(ErrInvalid, "buyer must match [A-Za-z0-9_-]{1,64}")
	}
	if a.Key.IsZero() {
		return refuse(ErrInvalid, "the Idempotency-Key must match [A-Za-z0-9_-]{1,64}")
	}
	return nil
}

// Take asks for Quantity units of a SKU: a purchase, or a hold for TTL (0:
// the SKU's default), from the public pool or the pool Access names.
type Take struct {
	Ask
	SKU      stock.SKU
	Quantity int64
	TTL      time.Duration
	Access   Access
	// Channel makes a purchase an organizer's order (ledger.ChannelComp,
	// ledger.ChannelBoxOffice): it skips the waiting room and is counted
	// apart in the report. "" for a buyer's own purchase.
	Channel string
}

func (t Take) check(hold bool) error {
	if err := t.Ask.check(); err != nil {
		return err
	}
	if t.SKU.Program.IsZero() || t.SKU.Ticket.IsZero() {
		return refuse(ErrInvalid, "program and ticket ids must match [A-Za-z0-9_-]{1,64}")
	}
	if t.Quantity < 1 {
		return refuse(ErrInvalid, "quantity must be an integer >= 1")
	}
	if t.Quantity > stock.MaxPerOrderCap {
		return refuse(ErrOverMax, fmt.Sprintf("quantity %d over the largest order any ticket allows (%d)", t.Quantity, stock.MaxPerOrderCap))
	}
	if t.TTL != 0 && (!hold || t.TTL < time.Second || t.TTL > MaxHoldTTL) {
		return refuse(ErrInvalid, "ttl_seconds out of bounds")
	}
	return nil
}

// Closed answers, before a request's body is read, ErrSoldOut or
// ErrSaleEnded when the SKU takes no new requests and the key committed no
// request of it for any buyer: a sold-out storm is then refused without
// decoding a body. It decides from memory (the SKU's cached settings and
// sold-out flag, and its sealed set of committed keys) and answers nil
// whenever it does not know: the request then takes its full path, which
// replays a retry of a committed request or answers 422 for a reused key.
func (s *Service) Closed(ctx context.Context, sku stock.SKU, key keys.ID) error {
	if sku.IsZero() || key.IsZero() {
		return nil
	}
	st, err := s.settings.Get(ctx, sku)
	if err != nil || st.Seated {
		return nil
	}
	refusal := ErrSoldOut
	switch {
	case !st.Rule.ClosedAt.IsZero():
		refusal = ErrPoolClosed
	case !st.EndedAt.IsZero():
		refusal = ErrSaleEnded
	case !s.cache.SoldOutFresh(sku):
		// Not known sold out, or due for its re-check: the request's own
		// path decides (and SoldOut picks one request to ask Redis again).
		return nil
	}
	if !s.replays.sealedWithout(sku, key) {
		return nil
	}
	return refusal
}

// Purchase sells the units: through the Redis gate, then the ledger, or
// straight to the ledger while Redis cannot be used.
func (s *Service) Purchase(ctx context.Context, t Take) (Result, error) {
	w, err := t.want(false)
	if err != nil {
		return Result{}, err
	}
	if t.Channel != "" {
		// The organizer's own order: no waiting room to pass.
		return s.runTake(ctx, w.req, func(ctx context.Context) answer { return s.takeOne(ctx, w) })
	}
	return s.runTake(ctx, w.req, func(ctx context.Context) answer { return s.admitted(ctx, t.Ask, w.sku.Program, w.req, w) })
}

// Hold sets the units aside for the buyer until confirmed, cancelled or
// expired.
func (s *Service) Hold(ctx context.Context, t Take) (Result, error) {
	w, err := t.want(true)
	if err != nil {
		return Result{}, err
	}
	return s.runTake(ctx, w.req, func(ctx context.Context) answer { return s.admitted(ctx, t.Ask, w.sku.Program, w.req, w) })
}

// Recorded answers a purchase (or a hold) already committed under t's
// key, as its retry would be answered: its replay, or ErrKeyReused when
// the key was used for another request. ok is false when the key has no
// committed request (or t is invalid), and nothing is taken either way.
// The gateway asks it of a take it refuses before it runs (a client out
// of wrong access-code guesses): the limit is on guessing, and a retry of
// a committed take guesses nothing (helper-94 #4: it was answered 429
// until the limit let it through to its replay). The key is looked for
// among the SKU's committed keys first, read at most once per change of
// the SKU row, as for a buyer over the cap: a limited bot's flood of new
// keys costs no ledger call each. A take committed since this replica's
// settings were read (a second, SettingsTTL) may not be found yet: its
// retry is told 429, and its Retry-After brings it back to its replay.
func (s *Service) Recorded(ctx context.Context, t Take, hold bool) (Result, bool, error) {
	w, err := t.want(hold)
	if err != nil {
		return Result{}, false, nil
	}
	// Detached, as a take is: the committed keys' read it may start is
	// shared with the requests that arrive meanwhile, and must not end
	// when this client goes away.
	ctx, cancel := s.detach(ctx)
	defer cancel()
	st, err := s.settings.Get(ctx, w.sku)
	if err != nil {
		return Result{}, false, err
	}
	committed, err := s.replays.committedAt(ctx, w.sku, w.req.scope, w.req.key, st.Version)
	if err != nil || !committed {
		return Result{}, false, err
	}
	a, ok, err := s.recorded(ctx, w.req)
	if err != nil || !ok {
		return Result{}, false, err
	}
	r, err := a.result(s.now)
	return r, true, err
}

// want is what t asks for as a purchase or a hold, its request named as
// the ledger records it (a replay matches it by fingerprint).
func (t Take) want(hold bool) (want, error) {
	if err := t.check(hold); err != nil {
		return want{}, err
	}
	sku := poolOf(t.SKU, t.Access.Pool)
	if hold {
		return want{sku: sku, buyer: t.Buyer, q: t.Quantity, hold: true, ttl: t.TTL, access: t.Access, device: t.Device,
			req: newRequest(t.Buyer, t.Key, ledger.OpHold, t.Access.fields(sku.Program.String(), sku.Ticket.String(), strconv.FormatInt(t.Quantity, 10), t.TTL.String())...).on(sku.Program)}, nil
	}
	fields := t.Access.fields(sku.Program.String(), sku.Ticket.String(), strconv.FormatInt(t.Quantity, 10))
	if t.Channel != "" {
		if !ledger.ValidChannel(t.Channel) {
			return want{}, refuse(ErrInvalid, "channel must be comp or box_office")
		}
		fields = append(fields, "channel", t.Channel)
	}
	return want{sku: sku, buyer: t.Buyer, q: t.Quantity, access: t.Access, channel: t.Channel,
		req: newRequest(t.Buyer, t.Key, ledger.OpPurchase, fields...).on(sku.Program)}, nil
}

// SeatTake asks for seats of a seated SKU: the given Seats (all of one
// section), or else the best Quantity adjacent seats of Section (of any
// section when Section is "").
type SeatTake struct {
	Ask
	SKU      stock.SKU
	Seats    []keys.ID
	Section  keys.ID
	Quantity int
	TTL      time.Duration
}

// MaxBestSeats is the most seats one best-available request may ask for.
const MaxBestSeats = 64

// HoldSeats holds seats, all or nothing; ErrSeatsTaken names the seats
// already taken.
func (s *Service) HoldSeats(ctx context.Context, t SeatTake) (Result, error) {
	if err := (Take{Ask: t.Ask, SKU: t.SKU, Quantity: 1, TTL: t.TTL}).check(true); err != nil {
		return Result{}, err
	}
	if len(t.Seats) == 0 {
		if t.Quantity < 1 || t.Quantity > MaxBestSeats {
			return Result{}, refuse(ErrInvalid, fmt.Sprintf(
				"give seats (a list of seat ids), or quantity (1..%d) and optionally a section, for the best adjacent seats", MaxBestSeats))
		}
		r := newRequest(t.Buyer, t.Key, ledger.OpSeatHold, t.SKU.Program.String(), t.SKU.Ticket.String(), "best", t.Section.String(),
			strconv.Itoa(t.Quantity), t.TTL.String()).on(t.SKU.Program)
		return s.runTake(ctx, r, func(ctx context.Context) answer {
			return s.throughQueue(ctx, t.SKU.Program, t.Ask, r, []stock.SKU{t.SKU}, s.seatTake(t, r, int64(t.Quantity), seatPick{section: t.Section}).run)
		})
	}
	if t.Quantity != 0 || !t.Section.IsZero() {
		return Result{}, refuse(ErrInvalid, "give either seats, or quantity and section")
	}
	if len(t.Seats) > stock.MaxPerOrderCap {
		return Result{}, refuse(ErrInvalid, fmt.Sprintf("at most %d seats", stock.MaxPerOrderCap))
	}
	seen := map[keys.ID]bool{}
	for _, id := range t.Seats {
		if id.IsZero() || seen[id] {
			return Result{}, refuse(ErrInvalid, fmt.Sprintf("seat %q is invalid or repeated", id))
		}
		seen[id] = true
	}
	ids := slices.Clone(t.Seats)
	slices.SortFunc(ids, keys.ID.Compare)
	r := newRequest(t.Buyer, t.Key, ledger.OpSeatHold, t.SKU.Program.String(), t.SKU.Ticket.String(), "seats", keys.Join(ids, ","), t.TTL.String()).on(t.SKU.Program)
	return s.runTake(ctx, r, func(ctx context.Context) answer {
		return s.throughQueue(ctx, t.SKU.Program, t.Ask, r, []stock.SKU{t.SKU}, s.seatTake(t, r, int64(len(ids)), seatPick{seats: ids}).run)
	})
}

// Confirm makes a held hold an order, once; a retry gets the same order.
func (s *Service) Confirm(ctx context.Context, holdID keys.ID, a Ask) (Result, error) {
	return s.ownerAction(ctx, ledger.OpConfirm, holdID, a, s.confirm)
}

// ConfirmPart makes keep of a held hold's units an order, once, and gives
// the rest back to stock in the same ledger transaction (then to Redis),
// once; keep 0 is Confirm. A seat hold is confirmed whole. A retry gets
// the same order.
func (s *Service) ConfirmPart(ctx context.Context, holdID keys.ID, a Ask, keep int64) (Result, error) {
	switch {
	case keep == 0:
		return s.Confirm(ctx, holdID, a)
	case keep < 0 || keep > stock.MaxPerOrderCap:
		return Result{}, refuse(ErrInvalid, fmt.Sprintf("quantity must be in 1..%d", stock.MaxPerOrderCap))
	}
	return s.ownerAction(ctx, ledger.OpConfirm, holdID, a, func(ctx context.Context, id, buyer keys.ID, r request) answer {
		return s.confirmPart(ctx, id, buyer, keep, r)
	}, "keep", strconv.FormatInt(keep, 10))
}

// Extend moves a held hold's expiry to ttl from now (0: the SKU's hold
// TTL), up to the SKU's maximum lifetime from the hold's creation; never
// nearer than it was. A retry with the same key answers the hold as that
// request left it. An expired hold cannot be extended, even before the
// sweeper has given its stock back.
func (s *Service) Extend(ctx context.Context, holdID keys.ID, a Ask, ttl time.Duration) (Result, error) {
	if ttl != 0 && (ttl < ledger.MinHoldTTL || ttl > ledger.MaxHoldTTL) {
		return Result{}, refuse(ErrInvalid, fmt.Sprintf("ttl_seconds must be in %d..%d",
			int(ledger.MinHoldTTL.Seconds()), int(ledger.MaxHoldTTL.Seconds())))
	}
	return s.ownerAction(ctx, ledger.OpExtend, holdID, a, func(ctx context.Context, id, buyer keys.ID, r request) answer {
		return s.extend(ctx, id, buyer, ttl, r)
	}, ttl.String())
}

// Cancel ends a held hold; its stock goes back, once.
func (s *Service) Cancel(ctx context.Context, holdID keys.ID, a Ask) (Result, error) {
	return s.ownerAction(ctx, ledger.OpCancel, holdID, a, s.cancel)
}

// Refund gives an order's stock back, once.
func (s *Service) Refund(ctx context.Context, orderID keys.ID, a Ask) (Result, error) {
	return s.ownerAction(ctx, ledger.OpRefund, orderID, a, s.refund)
}

func (s *Service) ownerAction(ctx context.Context, op string, id keys.ID, a Ask,
	f func(ctx context.Context, id, buyer keys.ID, r request) answer, args ...string) (Result, error) {
	if err := a.check(); err != nil {
		return Result{}, err
	}
	if id.IsZero() {
		return Result{}, refuse(ErrInvalid, "ids match [A-Za-z0-9_-]{1,64}")
	}
	r := newRequest(a.Buyer, a.Key, op, append([]string{id.String()}, args...)...)
	return s.run(ctx, r, func(ctx context.Context) answer { return f(ctx, id, a.Buyer, r) })
}

// HoldByID reads a hold. One still held past its expiry is expired
// first (expireDue): an answer "expired" is then what every later
// confirm, cancel or extension finds, whichever replica and primary. A
// cart's hold is left to its cart, which ends whole.
func (s *Service) HoldByID(ctx context.Context, id keys.ID) (Hold, error) {
	h, err := s.ledger.HoldByID(ctx, id)
	if err == nil && h.State == ledger.Held && h.CartID.IsZero() && !s.now().Before(h.ExpiresAt) {
		// Detached: an expiry begun is finished, its stock given back.
		wctx, cancel := s.detach(ctx)
		if cur, err := s.expireDue(wctx, h); err == nil {
			h = cur
		} else {
			// The ledger takes no write now (a failover, a program on
			// the move) or Redis is slow: the read is answered from the
			// clock as before; the sweeper expires the hold later.
			s.log.DebugContext(ctx, "read of a hold past its expiry: not expired now", "hold", id.String(), "err", err)
		}
		cancel()
	}
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return Hold{}, ErrUnknownHold
	case err != nil:
		return Hold{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return holdOf(h, s.now()), nil
}

// OrderByID reads an order.
func (s *Service) OrderByID(ctx context.Context, id keys.ID) (Order, error) {
	o, err := s.ledger.OrderByID(ctx, id)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return Order{}, ErrUnknownOrder
	case err != nil:
		return Order{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return orderOf(o), nil
}

// PutSKU creates a SKU or changes its settings. A live SKU changes behind
// the fence: its gate closes, the ledger changes, the shards are rebuilt
// from it, the gate reopens, so Redis never admits more than the new total
// allows. The same config twice leaves the same state.
func (s *Service) PutSKU(ctx context.Context, c SKUConfig) (SKUState, error) {
	cfg := ledger.SKUConfig{SKU: c.SKU, Total: c.Total, Shards: c.Shards, MaxPerOrder: c.MaxPerOrder, Resale: c.Resale,
		PerBuyer: c.PerBuyer, HoldTTL: c.HoldTTL, HoldTTLMax: c.HoldTTLMax}
	if err := cfg.Validate(); err != nil {
		return SKUState{}, refuse(ErrInvalid, err.Error())
	}
	sku := c.SKU
	ctx, cancel := s.detach(ctx)
	defer cancel()
	var st ledger.SKUState
	putErr := error(nil)
	put := func(ctx context.Context) error {
		st, putErr = s.ledger.PutSKU(ctx, cfg)
		return putErr
	}
	var err error
	_, lerr := s.ledger.SKU(ctx, sku)
	switch {
	case lerr == nil:
		if whole, ok := s.putChangesNothing(ctx, cfg); ok {
			return whole, nil
		}
		_, err = s.rebuildWith(ctx, sku, reasonAdmin, true, s.opts.ReseedWait, put)
	case !errors.Is(lerr, stock.ErrUnknownSKU):
		// Not known to be new: changed without closing its gate, a live
		// SKU's Redis would admit past a lowered total for a while.
		s.log.ErrorContext(ctx, "put sku: read", "sku", sku.String(), "err", lerr)
		return SKUState{}, ErrGateNotClosed
	default:
		err = s.createSKU(ctx, sku, put)
	}
	s.settings.Invalidate(sku)
	s.stockChanged(sku)
	s.clearSoldOut(sku)
	if err != nil {
		// The rebuild, which tells the replicas, did not finish: tell
		// them here, so none answers sold-out from memory past a
		// restock; they meet the fence and rebuild.
		s.notifyRestocked(ctx, sku)
	}
	switch {
	case errors.Is(putErr, stock.ErrInvalid):
		return SKUState{}, refuse(ErrBelowCommitted, putErr.Error())
	case putErr != nil:
		// The ledger's answer was lost or it refused: the change may have
		// been made. A PUT sets, so the same PUT again tells.
		s.log.ErrorContext(ctx, "put sku", "sku", sku.String(), "err", putErr)
		return SKUState{}, refuse(ErrUnavailable, "ledger unavailable: the change may or may not have been made; PUT the same settings again to know")
	case st.Program.IsZero():
		// The change never ran: the gate could not be closed.
		s.log.ErrorContext(ctx, "put sku: gate not closed", "sku", sku.String(), "err", err)
		return SKUState{}, ErrGateNotClosed
	case err != nil:
		// The ledger changed and marked the gate stale: the change stands
		// (a 5xx would say otherwise), and the gate is rebuilt from the
		// ledger before it serves the SKU (the next purchase, the drift
		// check, or the breaker's re-seed when Redis is back).
		s.log.WarnContext(ctx, "put sku: committed; gate rebuilt later", "sku", sku.String(), "err", err)
	}
	s.forgetPools(ctx, sku)
	whole, err := s.ticketState(ctx, st)
	if err != nil {
		return skuStateOf(st), nil // the row as committed
	}
	return whole, nil
}

// createSKU makes sku, which a read found unknown, with put, under the
// SKU's rebuild lock all the same, and builds its gate. Two first PUTs at
// once, one seeding its layout before the other changed the shard count,
// left the first layout open beside the second's, a zombie (helper-91
// S2); under the lock the second finds the SKU made and changes it as
// any live SKU is changed.
//
// When Redis does not answer for the lock (asked once, as the locked
// callback makes it), a SKU still unknown has no gate to close, so it is
// made in the ledger alone, its gate built from it when Redis is back.
// Once Redis has answered, a failure is the rebuild's (a shard's master
// out, the lock busy), and nothing runs unlocked: a SKU made meanwhile by
// another PUT would be changed past its open gate (helper-93 #2).
func (s *Service) createSKU(ctx context.Context, sku stock.SKU, put func(context.Context) error) error {
	ran, answered := false, false
	run := func(ctx context.Context) error { ran = true; return put(ctx) }
	_, err := s.rebuildBy(ctx, sku, reasonAdmin, true, s.opts.ReseedWait,
		rebuildHow{change: run, creates: true, locked: func() { answered = true }})
	if err == nil || ran || answered {
		return err
	}
	if _, lerr := s.ledger.SKU(ctx, sku); !errors.Is(lerr, stock.ErrUnknownSKU) {
		return err // made meanwhile, or not known: the gate not closed, nothing changed
	}
	if err = put(ctx); err == nil {
		err = s.reseed(ctx, sku, reasonAdmin, true)
	}
	return err
}

// putChangesNothing reports whether a PUT of cfg finds the ticket set to
// it already (the organizer's total, with its pools', and every setting),
// and answers the ticket as it is: there is nothing to change, so no gate
// to close. The retry of a PUT whose reply was lost (503, outcome
// unknown, "PUT the same settings again to know") said "unchanged" while
// a master was out, for a ticket the first attempt had made
// (helper-74 #3). A seated ticket's total is its map's: it always goes
// the whole way.
func (s *Service) putChangesNothing(ctx context.Context, cfg ledger.SKUConfig) (SKUState, bool) {
	// The public row and its pools' in one read: a pool change between
	// two reads showed a total the ticket never had.
	sts, err := s.ledger.Pools(ctx, cfg.SKU)
	if err != nil || len(sts) == 0 {
		return SKUState{}, false
	}
	cur, want := sts[0], cfg.WithDefaults()
	if cur.Seated || cur.Shards != want.Shards || cur.MaxPerOrder != want.MaxPerOrder || cur.PerBuyer != want.PerBuyer ||
		cur.HoldTTL != want.HoldTTL || cur.HoldTTLMax != want.HoldTTLMax || (want.Resale != "" && want.Resale != cur.Resale) {
		return SKUState{}, false
	}
	whole := wholeOf(cur, sts[1:])
	if whole.Total != want.Total {
		return SKUState{}, false
	}
	return whole, true
}

// SKU reads a SKU's settings and counts from the ledger.
func (s *Service) SKU(ctx context.Context, sku stock.SKU) (SKUState, error) {
	st, err := s.ledger.SKU(ctx, sku)
	switch {
	case errors.Is(err, stock.ErrUnknownSKU):
		return SKUState{}, ErrUnknownSKU
	case err != nil:
		return SKUState{}, refuse(ErrUnavailable, "ledger unavailable")
	}
	whole, err := s.ticketState(ctx, st)
	if err != nil {
		return SKUState{}, refuse(ErrUnavailable, "ledger unavailable")
	}
	return whole, nil
}

// PutProgram sets a program's caps across its tickets: what one buyer may
// hold + own, and hold at once (per buyer and per device fingerprint); 0
// removes each.
func (s *Service) PutProgram(ctx context.Context, p Program) error {
	switch {
	case p.ID.IsZero():
		return refuse(ErrInvalid, "program ids match [A-Za-z0-9_-]{1,64}")
	case p.PerBuyer < 0 || p.PerBuyer > stock.MaxTotal:
		return refuse(ErrInvalid, "per_buyer must be an integer >= 0")
	case p.HoldBudget < 0 || p.HoldBudget > ledger.MaxHoldBudget || p.DeviceHoldBudget < 0 || p.DeviceHoldBudget > ledger.MaxHoldBudget:
		return refuse(ErrInvalid, fmt.Sprintf("hold_budget and device_hold_budget must be integers in 0..%d", ledger.MaxHoldBudget))
	}
	err := s.ledger.SetProgram(ctx, p)
	switch {
	case errors.Is(err, ledger.ErrSchema):
		return refuse(ErrUnavailable, "hold budgets need the ledger at a newer schema: run `stockgate migrate` with this build")
	case err != nil:
		s.log.ErrorContext(ctx, "put program", "program", p.ID.String(), "err", err)
		return refuse(ErrUnavailable, "ledger unavailable")
	}
	s.programs.Invalidate(p.ID)
	s.notifySettings(ctx, "program "+p.ID.String())
	return nil
}

// MaxSeatMap is the most seats one seat map change may add.
const MaxSeatMap = 100_000

// LoadSeats adds seats to a SKU's map (seats it has keep their state), in
// the ledger and Redis, and returns the map's size.
func (s *Service) LoadSeats(ctx context.Context, sku stock.SKU, list []Seat) (int64, error) {
	if s.seats == nil {
		return 0, ErrNoSeating
	}
	if len(list) == 0 || len(list) > MaxSeatMap {
		return 0, refuse(ErrInvalid, fmt.Sprintf("seats must list 1..%d seats", MaxSeatMap))
	}
	type place struct {
		section keys.ID
		row     string
		number  int
	}
	seen := map[keys.ID]bool{}
	// Two ids at one place are one seat the venue would sell twice
	// (helper-110); the ledger checks the seats already loaded.
	at := map[place]keys.ID{}
	rows := make([]ledger.Seat, 0, len(list))
	gate := make([]seats.Seat, 0, len(list))
	for _, st := range list {
		g := seats.Seat{ID: st.ID, Section: st.Section, Row: st.Row, Number: st.Number}
		if err := g.Validate(); err != nil || seen[st.ID] {
			return 0, refuse(ErrInvalid, fmt.Sprintf("seat %q is invalid or repeated", st.ID))
		}
		p := place{st.Section, st.Row, st.Number}
		if other, ok := at[p]; ok {
			return 0, refuse(ErrInvalid, fmt.Sprintf("seats %q and %q are at one place (section %s, row %q, number %d)",
				other, st.ID, st.Section, st.Row, st.Number))
		}
		seen[st.ID], at[p] = true, st.ID
		gate = append(gate, g)
		rows = append(rows, ledger.Seat{ID: st.ID, Section: st.Section, Row: st.Row, Number: st.Number})
	}
	ctx, cancel := s.detach(ctx)
	defer cancel()
	if _, err := s.ledger.SKU(ctx, sku); errors.Is(err, stock.ErrUnknownSKU) {
		return 0, refuse(ErrUnknownSKU, "no such program/ticket: create it (PUT /v1/admin/skus/{program}/{ticket}) before its seat map")
	}
	n, err := s.ledger.LoadSeats(ctx, sku, rows)
	switch {
	case errors.Is(err, stock.ErrInvalid):
		return 0, refuse(ErrSeatMapRefused, err.Error())
	case err != nil:
		s.log.ErrorContext(ctx, "load seats", "sku", sku.String(), "err", err)
		return 0, refuse(ErrUnavailable, "ledger unavailable")
	}
	err = s.redis(ctx, "gate.seats_load", func(ctx context.Context) error { return s.seats.Load(ctx, sku, gate) })
	// The ledger has the seats either way: every replica drops its seat
	// map and settings rather than refuse the new seats for SettingsTTL
	// (helper-70 #7), and new seats are new stock.
	s.settings.Invalidate(sku)
	s.seatMaps.Invalidate(sku)
	s.notifySettings(ctx, "seats "+sku.String())
	if err != nil {
		s.log.ErrorContext(ctx, "load seats into redis", "sku", sku.String(), "err", err)
		return 0, ErrSeatsNotInRedis
	}
	s.notifyRestocked(ctx, sku)
	return n, nil
}

// Seats reads a section's seats (all for ""), served from memory for
// StockTTL so a read flood costs one ledger query per period.
func (s *Service) Seats(ctx context.Context, sku stock.SKU, section keys.ID) (Section, error) {
	v, err := s.sectionViews.Get(ctx, sectionKey{sku, section})
	if err != nil {
		return Section{}, refuse(ErrUnavailable, "ledger unavailable")
	}
	if len(v.Seats) == 0 {
		if err := s.known(ctx, sku); err != nil {
			return Section{}, err // an empty map of a SKU that is not there: 404, as its stock is
		}
	}
	return v, nil
}

// known refuses a SKU the ledger does not have (ErrUnknownSKU), from the
// settings cache: a read of what it holds would otherwise answer an
// empty 200 where its stock answers 404.
func (s *Service) known(ctx context.Context, sku stock.SKU) error {
	switch _, err := s.settings.Get(ctx, sku); {
	case errors.Is(err, stock.ErrUnknownSKU):
		return ErrUnknownSKU
	case err != nil:
		return refuse(ErrUnavailable, "ledger unavailable")
	}
	return nil
}

// CheckSeats compares the gate's seat states with the ledger's now and
// writes the ledger's over every seat that differs.
func (s *Service) CheckSeats(ctx context.Context, sku stock.SKU) (SeatCheck, error) {
	if err := s.known(ctx, sku); err != nil {
		return SeatCheck{}, err
	}
	r, _, err := s.checkSeats(ctx, sku, nil)
	if err != nil && !errors.Is(err, ErrNoSeating) {
		s.log.ErrorContext(ctx, "seat check", "sku", sku.String(), "err", err)
		return r, refuse(ErrUnavailable, "seat check failed: "+err.Error())
	}
	return r, err
}

package sale

import (
	"context"
	"crypto/rand"
	"errors"
	"slices"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// The take engine. Every request for stock is a take of one or more
// lines, all or nothing: a purchase or a hold is one line of counted
// units, a seat hold one line of seats, a cart or a held cart a line per
// ticket, counted or seats. One path decides them all: each line's
// settings and access rules, the gate (the buyer's counts and a shard
// deduction for counted units, the seats for a seat line), one group
// commit (Ledger.Commit, with the other takes queued meanwhile), and one
// switch over what the ledger answered. Whatever a take moved at the gate
// and did not commit goes back; nothing answers 2xx without a commit.
// When Redis cannot be used the same take commits around the gate
// (direct), bounded in number.

// take is one request for stock and what an attempt of it did.
type take struct {
	s   *Service
	req request
	ttl time.Duration // a hold's lifetime; 0: the default (a cart: its tickets' shortest)
	// cart: a cart or held cart, answered as one, whose refusals name the
	// line; otherwise a single take (one line), answered as an order or a
	// hold. seatHold: a single take of seats (a seat hold).
	cart, seatHold bool
	lines          []*line
	// probeIn: a line went around the gate because its master's breaker
	// is open, which probes it again after this long (a 503 of the way
	// around says so in Retry-After).
	probeIn time.Duration
	// exclusive: this attempt holds the cart's lock, so no other attempt
	// of the cart is at the gate now. A deduction it finds made under a
	// line's id was then made by an attempt that is over (a 503 whose
	// script ran late, after a stall).
	exclusive bool
	// aroundGate: the cart's lock could not be taken (Redis did not
	// answer), so every attempt goes around the gate.
	aroundGate bool
	// device is the request's device fingerprint (Ask.Device); budgets are
	// the hold budget entries this request's attempts counted.
	device  string
	budgets []budgetEntry
	// holder names this attempt at the gate (shard.Request.Holder): a
	// deduction it makes or finds goes back once it and every other
	// attempt holding it have let go. Made at its first deduct (most
	// takes of a flash sale are refused before one).
	holder string
}

// newHolder is a fresh attempt's holder id.
func newHolder() string { return rand.Text()[:16] }

// holderID is t's holder, made on first use.
func (t *take) holderID() string {
	if t.holder == "" {
		t.holder = newHolder()
	}
	return t.holder
}

// program is the take's program: every line of a take is of one.
func (t *take) program() keys.ID { return t.lines[0].w.sku.Program }

// line is one ticket of a take, and what this attempt took of it.
type line struct {
	w    want     // its stock (a pool's for a pool line), units and request (its gate records)
	pick seatPick // a seat line's seats, or the section to find the best in
	st   ledger.SKUState
	// At the gate:
	quota    *quotaTicket
	parts    []shard.Part
	epoch    int64
	replayed bool   // another attempt made this line's deduction (see exclusive)
	seats    placed // a seat line's seats, held in the gate under the line's id
	counted  bool   // the gate took its units
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
	// keep are those of ids the request's committed take stands on, when
	// this attempt turned out to be its replay: undo leaves them held.
	keep []keys.ID
}

// seated reports a line of seats (as its ticket's settings say).
func (ln *line) seated() bool { return ln.st.Seated }

// takeOne takes w, a purchase or a hold: a take of one line.
func (s *Service) takeOne(ctx context.Context, w want) answer {
	t := &take{s: s, req: w.req, ttl: w.ttl, lines: []*line{{w: w}}, device: w.device}
	return t.run(ctx)
}

// seatTake is the take of a seat hold: q seats, as pick says.
func (s *Service) seatTake(t SeatTake, r request, q int64, pick seatPick) *take {
	w := want{sku: t.SKU, buyer: t.Buyer, q: q, hold: true, ttl: t.TTL, req: r}
	return &take{s: s, req: r, ttl: t.TTL, seatHold: true, lines: []*line{{w: w, pick: pick}}, device: t.Device}
}

// takeAttempts bounds how often one take is taken again after its gate
// was rebuilt under it (ErrStaleGate).
const takeAttempts = 3

// run takes t: copies of a cart sent to several replicas at once take
// turns (a copy refused on one line must not give back another line's
// deduction while a copy that shares it is committing), and an attempt
// whose gate was rebuilt under it is taken again once the new gate is up.
func (t *take) run(ctx context.Context) answer {
	s := t.s
	if t.cart {
		first := t.lines[0].w.sku
		lease, err := s.locker.Acquire(ctx, keys.RequestLock(first.Program, first.Ticket, lockCart, t.req.gateID()), s.opts.ReseedWait)
		switch {
		case errors.Is(err, lock.ErrBusy):
			return ansUnavailable // the other copy is still at it: retry with the same key
		case err != nil:
			// Redis did not answer for the whole wait: the ledger decides
			// alone, around the gate, so this copy leaves no deduction that
			// another copy could find and give back while this one commits.
			t.aroundGate = true
		default:
			t.exclusive = true
			defer func() {
				if err := lease.Release(context.WithoutCancel(ctx)); err != nil {
					s.log.WarnContext(ctx, "release cart lock", "err", err)
				}
			}()
		}
	}
	var kept []*quotaTicket // the counts stale attempts kept for their retakes
	for attempt := 1; ; attempt++ {
		a, stale := t.once(ctx)
		if stale.IsZero() {
			t.settleBudgets(ctx, a)
			releaseKept(ctx, kept, a)
			return a
		}
		for _, ln := range t.lines {
			if ln.quota != nil {
				kept = append(kept, ln.quota)
			}
		}
		if attempt == takeAttempts {
			t.settleBudgets(ctx, ansUnavailable)
			releaseKept(ctx, kept, ansUnavailable)
			return s.counted(pathGate, ansUnavailable)
		}
		// A rebuild closed the gate a line was admitted by: its stock went
		// with the old gate and the ledger counts without it. Make sure the
		// new gate is up, then take again.
		if err := s.reseed(ctx, stale, reasonStale, false); err != nil {
			s.log.WarnContext(ctx, "rebuild after a stale admission", "sku", stale.String(), "err", err)
		}
		s.settings.Invalidate(stale)
	}
}

// releaseKept settles the counts stale attempts of a take kept for their
// retakes, by a, the take's answer. Sold now: its order or hold stands on
// them, and its return gives them back. A replay of a request committed
// before: what they counted afresh is one too many (the committed
// request's own counts stand, or went back with its stock). Refused: all
// go back. A retake through the gate counts under the same ids and
// settles them itself; one that went around the gate (the new gate not up
// yet) never touched them, and its refusal left the buyer counted at the
// cap for a request that took nothing. Giving back what was given back
// already is a no-op.
func releaseKept(ctx context.Context, kept []*quotaTicket, a answer) {
	for _, q := range kept {
		switch {
		case a.replayed:
			q.replayed(ctx)
		case a.err != nil:
			q.release(ctx)
		}
	}
}

// flagged answers line i, which its SKU's sold-out flag refuses, unless
// gate says the gate decides (see soldOutFlagged). A cart's line too: the
// retry of a cart whose first attempt holds the line's units at the gate
// and is still committing was told sold out, and the cart then stood
// (helper-80 #1). A cart is looked up whole (the committed keys are
// single takes').
func (t *take) flagged(ctx context.Context, i int, r lineRefusal) (a answer, gate bool) {
	w := t.lines[i].w
	found, gate, err := t.s.soldOutFlagged(ctx, w)
	switch {
	case err != nil:
		return ansUnavailable, false
	case t.cart && !gate:
		return t.no(ctx, i, r), false
	case found:
		return t.s.lookupOr(ctx, w.req, fail(ErrSoldOut)), false
	case !gate:
		return fail(ErrSoldOut), false
	}
	return answer{}, true
}

// lockCart names the lock copies of one cart request take turns under.
var lockCart = keys.MustID("cart")

// no answers r, a refusal of line i: for a cart it names the line. A
// retry of a request that committed before gets its replay instead:
// looked up in the ledger, or, for a single take of a SKU that takes no
// more requests (r.closed: sold out, ended), found in memory (see
// committedOr), so a storm of them costs no ledger read each.
func (t *take) no(ctx context.Context, i int, r lineRefusal) answer {
	var err error
	switch {
	case t.cart:
		err = refuseLine(r.kind, t.lines[i].w.sku.Ticket, r.detail)
	case r.detail != "":
		err = refuse(r.kind, r.detail)
	default:
		err = r.kind
	}
	if r.closed && !t.cart {
		return t.s.committedOr(ctx, t.lines[i].w, fail(err))
	}
	return t.s.lookupOr(ctx, t.req, fail(err))
}

// noSeats is no naming the seats of line i it is about.
func (t *take) noSeats(ctx context.Context, i int, kind *Err, ids []string) answer {
	err := refuseSeats(kind, ids)
	if t.cart {
		err = refuseLineSeats(kind, t.lines[i].w.sku.Ticket, ids)
	}
	return t.s.lookupOr(ctx, t.req, fail(err))
}

// refused answers a refusal of the take after the gate took some of it:
// what this attempt took goes back, and the buyer's counts with it,
// unless the request committed before: the refusal is then its replay,
// and only the counts this attempt made go (a retry whose committed take
// gave its stock back deducts afresh, and that stock is not the replay's).
func (t *take) refused(ctx context.Context, refusal answer) answer {
	counts := countsRelease
	if refusal.replayed {
		counts = countsReplayed
		for _, ln := range t.lines {
			if ln.counted && len(ln.seats.ids) > 0 {
				// The same seats under the same owner: those the committed
				// take stands on stay held (undo releases the rest).
				ln.seats.keep = t.committedSeats(ctx, refusal, ln)
			}
		}
	}
	t.undo(ctx, counts)
	return refusal
}

// checkSettings reads each line's settings and refuses what they refuse, before
// the gate moves anything. direct says the take must go around the gate
// (the breaker is open, or a gate that must be rebuilt could not be).
func (t *take) checkSettings(ctx context.Context) (a answer, ok, direct bool) {
	s := t.s
	now := s.now()
	for i, ln := range t.lines {
		w := &ln.w
		st, err := s.settings.Get(ctx, w.sku)
		switch {
		case errors.Is(err, stock.ErrUnknownSKU) && !w.sku.Pool().IsZero():
			return fail(ErrUnknownPool), false, false
		case errors.Is(err, stock.ErrUnknownSKU) && t.cart:
			return t.no(ctx, i, lineRefusal{kind: ErrUnknownSKU}), false, false
		case errors.Is(err, stock.ErrUnknownSKU):
			return ansUnknownSKU, false, false
		case err != nil:
			s.log.ErrorContext(ctx, "load sku settings", "sku", w.sku.String(), "err", err)
			return ansUnavailable, false, false
		}
		// Read afresh first when this replica sold the SKU around the
		// gate since: a pool's rule changed meanwhile (the change's
		// notice lost while Redis was out) was checked as it had been,
		// and only the fresh row went on to the take (helper-77 #1).
		if st, err = s.gateFresh(ctx, w.sku, st); err != nil {
			s.log.ErrorContext(ctx, "load sku settings", "sku", w.sku.String(), "err", err)
			return ansUnavailable, false, false
		}
		// Refusals decided by the settings: a retry of a request that
		// committed under earlier settings still gets its answer.
		if err := s.admit(st, w.access, now); err != nil {
			return s.lookupOr(ctx, t.req, fail(err)), false, false
		}
		if st.Rule.Access == ledger.AccessCode {
			c, err := s.codeFor(ctx, *w)
			switch {
			case errors.Is(err, ErrCodeInvalid):
				return s.lookupOr(ctx, t.req, fail(err)), false, false
			case err != nil:
				s.log.ErrorContext(ctx, "load access code", "sku", w.sku.String(), "err", err)
				return ansUnavailable, false, false
			}
			w.code = c
		}
		ask := lineAsk{st: st, q: w.q, hold: w.hold, ttl: t.ttl,
			picked: len(ln.pick.seats) > 0 || !ln.pick.section.IsZero(), best: len(ln.pick.seats) == 0,
			cart: t.cart, seatHold: t.seatHold, seating: s.seats != nil,
			soldOut: s.cache, sku: w.sku, held: w.held}
		r, ok := refuseBySettings(ask)
		if ok && r.kind == ErrSoldOut {
			if a, gate := t.flagged(ctx, i, r); !gate {
				return a, false, false
			}
			ask.soldOut = nil // the gate decides
			r, ok = refuseBySettings(ask)
		}
		if ok {
			return t.no(ctx, i, r), false, false
		}
		if !st.Seated && st.GateStale() && !direct {
			// The ledger sold around Redis: rebuild before Redis serves
			// again. While the rebuild cannot be done (a master of the
			// SKU's shards is out) the SKU sells around its gate, trying
			// again at most once per breaker period.
			if !s.rebuildDue(w.sku) || !s.reseedSoon(ctx, w.sku) {
				t.probeIn = max(t.probeIn, s.rebuildIn(w.sku))
				direct = true
			}
		}
		ln.st = st
	}
	return answer{}, true, direct
}

// once is one attempt of t; stale names a SKU whose gate was rebuilt under
// the attempt (everything it took is given back).
func (t *take) once(ctx context.Context) (_ answer, stale stock.SKU) {
	s := t.s
	for _, ln := range t.lines { // a fresh attempt: nothing taken yet
		*ln = line{w: ln.w, pick: ln.pick}
	}
	a, ok, direct := t.checkSettings(ctx)
	if !ok {
		return a, stale
	}
	direct = direct || t.aroundGate
	if a, ok := t.placeGiven(ctx); !ok {
		return a, stale
	}
	// Held units count against the program's hold budgets first: an
	// identity at its budget is refused with nothing taken. Around the
	// gate too: the budgets live in a slot of their own, whose master
	// may answer while the SKU's gate cannot be used (a stale gate whose
	// rebuild is busy, its shards' master out). Skipped there, a buyer
	// held past the budget for as long as the gate stayed stale
	// (helper-94 #1); with Redis out the count fails at once (the
	// breaker) and the hold goes on uncounted.
	if a, ok := t.takeBudgets(ctx); !ok {
		return a, stale
	}
	if direct {
		return t.direct(ctx), stale
	}
	if slices.ContainsFunc(t.lines, (*line).seated) {
		// A retry of a committed take with seats is answered from the
		// ledger before its seats are touched: holding them again under the
		// same owners is a no-op, but a refusal of a later line would
		// release them from the committed take.
		if a, ok, err := s.recorded(ctx, t.req); err != nil {
			return ansUnavailable, stale
		} else if ok {
			return a, stale
		}
	}
	for i, ln := range t.lines {
		var a answer
		var out gateOut
		if ln.seated() {
			a, out = t.gateSeats(ctx, i)
		} else {
			a, out = t.gateUnits(ctx, i)
		}
		switch out {
		case gateTook:
			continue
		case gateDirect:
			t.undo(ctx, countsRelease)
			return t.direct(ctx), stale
		case gateStale:
			t.undo(ctx, countsKeep) // the retake counts under the same ids
			return answer{}, ln.w.sku
		case gateReplay:
			t.undo(ctx, countsKeep)
			return a, stale
		}
		return s.counted(pathGate, t.refused(ctx, a)), stale
	}
	return t.commit(ctx, false)
}

// expiry is when the take's holds expire: its own lifetime, or the
// default (a cart: the shortest default of its tickets).
func (t *take) expiry() time.Time {
	ttl := t.ttl
	if ttl == 0 {
		for _, ln := range t.lines {
			if ttl == 0 || ln.st.HoldTTL < ttl {
				ttl = ln.st.HoldTTL
			}
		}
	}
	return t.s.now().Add(ttl)
}

// sellSeats marks a bought seat line's seats sold in the gate.
func (t *take) sellSeats(ctx context.Context, a answer) {
	if a.cart != nil {
		for _, o := range a.cart.Orders {
			t.s.sellSeats(ctx, o)
		}
	}
}

// placeGiven finds the section of each seat line that names its seats,
// refusing seats not in the map and seats of two sections.
func (t *take) placeGiven(ctx context.Context) (answer, bool) {
	for i, ln := range t.lines {
		if !ln.seated() || len(ln.pick.seats) == 0 {
			continue
		}
		m, err := t.s.seatMaps.Get(ctx, ln.w.sku)
		if err != nil {
			return ansUnavailable, false
		}
		section, unknown, spans := m.section(ln.pick.seats)
		switch {
		case spans:
			return t.no(ctx, i, lineRefusal{kind: ErrSeatsSpan}), false
		case len(unknown) > 0:
			return t.noSeats(ctx, i, ErrUnknownSeats, unknown), false
		}
		ln.seats = placed{section: section, ids: ln.pick.seats}
	}
	return answer{}, true
}

// sections are the sections a best-seats line looks in, in order: its
// own, or every section of the map by id.
func (t *take) sections(ctx context.Context, i int) ([]keys.ID, error) {
	if sec := t.lines[i].pick.section; !sec.IsZero() {
		return []keys.ID{sec}, nil
	}
	m, err := t.s.seatMaps.Get(ctx, t.lines[i].w.sku)
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

// placeBest picks each best-seats line's seats from the ledger's map, for
// a take committed around the gate.
func (t *take) placeBest(ctx context.Context) (answer, bool) {
	for i, ln := range t.lines {
		if !ln.seated() || len(ln.seats.ids) > 0 {
			continue
		}
		sections, err := t.sections(ctx, i)
		if err != nil {
			return ansUnavailable, false
		}
		for _, sec := range sections {
			all, err := t.s.ledger.Seats(ctx, ln.w.sku, sec)
			if err != nil {
				return ansUnavailable, false
			}
			if ids := bestAdjacent(all, int(ln.w.q)); ids != nil {
				ln.seats = placed{section: sec, ids: ids}
				break
			}
		}
		if len(ln.seats.ids) == 0 {
			return t.noAdjacent(ctx, i, sections), false
		}
	}
	return answer{}, true
}

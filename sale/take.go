package sale

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"time"

	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
	"github.com/stockgate/stockgate/tracing"
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
		lease, err := s.locker.Acquire(ctx, keys.Lock(t.program(), t.req.gateID(), lockCart), s.opts.ReseedWait)
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
	}
	t.undo(ctx, counts)
	return refusal
}

// checkSettings reads each line's settings and refuses what they refuse, before
// the gate moves anything. direct says the take must go around the gate
// (the breaker is open, or a gate that must be rebuilt could not be).
func (t *take) checkSettings(ctx context.Context) (a answer, ok, direct bool) {
	s := t.s
	now := time.Now()
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
			soldOut: s.cache, sku: w.sku}
		if r, ok := refuseBySettings(ask); ok {
			return t.no(ctx, i, r), false, false
		}
		if st, err = s.gateFresh(ctx, w.sku, st); err != nil {
			s.log.ErrorContext(ctx, "load sku settings", "sku", w.sku.String(), "err", err)
			return ansUnavailable, false, false
		}
		if !st.Seated && st.GateStale() && !direct {
			// The ledger sold around Redis: rebuild before Redis serves
			// again. While the rebuild cannot be done (a master of the
			// SKU's shards is out) the SKU sells around its gate, trying
			// again at most once per breaker period.
			if !s.rebuildDue(w.sku) || s.reseed(ctx, w.sku, reasonBypass, false) != nil {
				s.rebuildFailed(w.sku)
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
	if !direct {
		// Held units count against the program's hold budgets first: an
		// identity at its budget is refused with nothing taken.
		if a, ok := t.takeBudgets(ctx); !ok {
			return a, stale
		}
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

// openNode notes when the master whose breaker refused err (if one did)
// probes again.
func (t *take) openNode(err error) {
	if d, ok := breaker.RetryIn(err); ok {
		t.probeIn = max(t.probeIn, d)
	}
}

// gateOut is what the gate did with a line.
type gateOut int

const (
	gateTook   gateOut = iota // taken: go on
	gateRefuse                // refused (or Redis failed): the answer is the refusal
	gateDirect                // Redis certainly moved nothing: go around the gate
	gateStale                 // the line's gate was rebuilt under it: take again
	gateReplay                // the request committed before: the answer is its replay
)

// gateUnits takes line i's units at the gate: the buyer's counts under
// the caps, then a shard deduction.
func (t *take) gateUnits(ctx context.Context, i int) (answer, gateOut) {
	s, ln := t.s, t.lines[i]
	w, st := ln.w, ln.st
	quota, qerr := s.takeQuota(ctx, w, st)
	ln.quota = quota
	switch {
	case errors.Is(qerr, errCodeUsedUp):
		// Its uses are counted: a retry of a request that used it gets its
		// replay.
		s.metrics.poolRefusals.WithLabelValues("code-used-up").Inc()
		return t.no(ctx, i, lineRefusal{kind: ErrCodeUsedUp}), gateRefuse
	case errors.Is(qerr, errOverCap), errors.Is(qerr, shard.ErrKeyCounted):
		// Over the cap, or over it but this key was counted before (a
		// retry of a request whose stock came back, or a reuse of the
		// key): the ledger knows which.
		return t.no(ctx, i, lineRefusal{kind: ErrLimit}), gateRefuse
	case errors.Is(qerr, stock.ErrLimit) && !t.cart:
		// A retry of a request that was counted passes (its count is kept
		// per request id). A request never counted here (sold around the
		// gate, or before the cap existed) is found among the SKU's
		// committed keys, read at most once per change of the SKU row: a
		// flood of new requests from one buyer costs no ledger call each.
		return s.committedAt(ctx, w, ansLimit, st.Version), gateRefuse
	case errors.Is(qerr, stock.ErrLimit):
		return t.no(ctx, i, lineRefusal{kind: ErrLimit}), gateRefuse
	case qerr != nil && notRun(qerr):
		t.openNode(qerr)
		return answer{}, gateDirect
	case qerr != nil:
		// Sent, then no answer: the ledger, which counts the buyers under
		// the caps itself, decides. Going around the gate releases the
		// count by its request id, should the script have run.
		s.log.WarnContext(ctx, "quota outcome unknown; the ledger decides", "sku", w.sku.String(), "err", qerr)
		return answer{}, gateDirect
	}
	req := shard.Request{SKU: w.sku, Shards: st.Shards, RequestID: w.req.gateID(), Quantity: w.q, MaxQuantity: st.MaxPerOrder, Holder: t.holderID()}
	d, err := s.deduct(ctx, req)
	if err != nil && !notRun(err) && !isOutcome(err) {
		// The outcome is unknown: the script may have run and its reply been
		// lost. Ask again with the same request id: its deduction record
		// answers for the first attempt, so stock moves at most once.
		s.log.WarnContext(ctx, "deduct outcome unknown; asking again", "sku", w.sku.String(), "err", err)
		d, err = s.deduct(ctx, req)
	}
	if d.Probes > 0 {
		s.metrics.probes.Observe(float64(d.Probes))
	}
	if s.opts.AutoShards > 0 && w.sku.Pool().IsZero() {
		// A pool's stock keeps the shards its pool was given.
		s.sizer.note(w.sku, d.Probes)
	}
	switch {
	case errors.Is(err, stock.ErrSoldOut):
		// Only an empty SKU is remembered as sold out: 3 left is sold out
		// for a buyer of 4, not for a buyer of 1.
		if d.Left == 0 {
			s.markSoldOut(w.sku)
		}
		return t.no(ctx, i, lineRefusal{kind: ErrSoldOut, closed: d.Left == 0}), gateRefuse
	case err != nil && notRun(err):
		// Nothing moved in Redis: the ledger can take this one directly
		// (and may commit it: its key keeps its mark).
		quota.keepKey()
		t.openNode(err)
		return answer{}, gateDirect
	case err != nil:
		// Still unknown (sent, then no answer: the master died or hangs).
		// The ledger decides: the take commits around the gate, which
		// moves the SKU's bypass_seq, so every replica rebuilds the gate
		// from the ledger before Redis serves the SKU again, and whatever
		// this call did take in Redis is dropped by that fenced rebuild,
		// never counted twice. Refused there, the units it may have taken
		// stay out of Redis until the drift check: the safe side.
		s.log.WarnContext(ctx, "deduct outcome unknown; the ledger decides", "sku", w.sku.String(), "err", err)
		return answer{}, gateDirect
	}
	epoch, same := d.Epoch()
	ln.parts, ln.epoch, ln.replayed, ln.counted = d.Parts, epoch, d.Replayed, true
	if !same {
		// A shard was rebuilt part-way through the take: the ledger would
		// refuse it. Give back what this epoch's shards took and go again.
		return answer{}, gateStale
	}
	if !d.Replayed {
		// Stock was there: a stale sold-out flag (the one re-check let
		// through) must not keep telling others it is gone.
		s.cache.ClearSoldOut(w.sku)
	} else if !t.cart {
		// This request took stock before. If that attempt committed,
		// replay it; otherwise the stock it took is ours to commit now,
		// and the ledger's request row settles a race with the original
		// attempt. (A cart's copies take turns under its lock instead.)
		a, ok, err := s.recorded(ctx, t.req)
		switch {
		case err != nil:
			s.log.ErrorContext(ctx, "lookup request", "err", err)
			return ansUnavailable, gateRefuse
		case ok:
			// The committed request stands on the deduction (its
			// committing attempt holds it for good), or was refused and
			// stands on nothing: either way this attempt lets go, so the
			// last attempt of a refused request to let go returns the
			// units (TestReplayOfARefusalLetsGo).
			s.giveBack(ctx, w.sku, w.req.gateID(), t.holder, d.Parts)
			quota.replayed(ctx)
			ln.counted = false
			return a, gateReplay
		}
	}
	return answer{}, gateTook
}

// gateSeats holds line i's seats at the gate under the line's id: the
// given ones, all or none, or the best adjacent ones.
func (t *take) gateSeats(ctx context.Context, i int) (answer, gateOut) {
	s, ln := t.s, t.lines[i]
	w, owner := ln.w, ln.w.req.gateID()
	if p := ln.seats; len(p.ids) > 0 {
		err := s.redis(ctx, "gate.seats_hold", func(ctx context.Context) error { return s.seats.Hold(ctx, w.sku, p.section, owner, p.ids) })
		var se *seats.SeatError
		switch {
		case errors.As(err, &se) && errors.Is(err, seats.ErrTaken):
			return t.noSeats(ctx, i, ErrSeatsTaken, se.Seats), gateRefuse
		case errors.As(err, &se):
			return t.noSeats(ctx, i, ErrSeatsNotInGate, se.Seats), gateRefuse
		case err != nil && notRun(err):
			return answer{}, gateDirect
		case err != nil:
			s.log.ErrorContext(ctx, "seats", "sku", w.sku.String(), "err", err)
			return ansUnavailable, gateRefuse
		}
		ln.counted = true
		return answer{}, gateTook
	}
	sections, err := t.sections(ctx, i)
	if err != nil {
		return ansUnavailable, gateRefuse
	}
	for _, sec := range sections {
		var ids []keys.ID
		err := s.redis(ctx, "gate.seats_best", func(ctx context.Context) (err error) {
			ids, err = s.seats.Best(ctx, w.sku, sec, owner, int(w.q))
			return err
		})
		switch {
		case errors.Is(err, seats.ErrNoAdjacent):
			continue
		case err != nil && notRun(err):
			return answer{}, gateDirect
		case err != nil:
			s.log.ErrorContext(ctx, "seats", "sku", w.sku.String(), "err", err)
			return ansUnavailable, gateRefuse
		}
		ln.seats, ln.counted = placed{section: sec, ids: ids}, true
		return answer{}, gateTook
	}
	return t.noAdjacent(ctx, i, sections), gateRefuse
}

// noAdjacent refuses a best-seats line that found no run long enough.
func (t *take) noAdjacent(ctx context.Context, i int, sections []keys.ID) answer {
	where := "any section"
	if len(sections) == 1 && !t.lines[i].pick.section.IsZero() {
		where = "section " + sections[0].String()
	}
	return t.no(ctx, i, lineRefusal{kind: ErrNoAdjacent, detail: fmt.Sprintf("no %d adjacent seats free in %s", t.lines[i].w.q, where)})
}

// countsFate is what undo does with the buyer's counts a line made.
type countsFate int

const (
	countsRelease  countsFate = iota // given back with the stock
	countsKeep                       // kept: the retake counts under the same ids
	countsReplayed                   // a committed take stands on them: only this attempt's own go
)

// undo gives back what this attempt took at the gate: each line's stock
// (or seats), and its counts as counts says. A deduction goes back only
// when no attempt holds it any more (shard.Store.Restore): a line another
// attempt deducted (replayed: a copy of the request on another replica)
// lets go of it, and so does the attempt that made it, and whichever of
// them commits keeps it (TestOriginalRefusalKeepsTheTwinsDeduction: the
// maker refused, its twin committed, and the maker's give-back once left
// Redis ahead of the ledger). An attempt that holds the cart's lock over
// a cart the ledger lacks gives them back outright (deadAttempts). At
// worst units stay out of Redis until the drift check (an attempt that
// never lets go: a replica lost mid-take, a commit's unknown outcome),
// never sold twice. Once the request is known committed (counts is
// countsReplayed), a single take gives back only the parts its order or
// hold does not stand on, whichever attempt deducted them: the copy that
// committed may have done so on this very deduction (TestModelConcurrent
// found Redis two units ahead of the ledger when a refused twin gave
// back the deduction its committed copy stood on).
func (t *take) undo(ctx context.Context, counts countsFate) {
	s := t.s
	ownerless := counts == countsRelease && t.deadAttempts(ctx)
	for _, ln := range t.lines {
		switch {
		case !ln.counted:
			t.settleCounts(ctx, ln, counts)
		case len(ln.seats.ids) > 0:
			t.releaseSeats(ctx, ln)
		case counts == countsReplayed && !t.cart:
			// The request committed (this refusal is its replay), maybe
			// on this very deduction: give back only what its rows do not
			// stand on, whichever attempt took it.
			s.giveBackUnused(ctx, ln.w, t.holder, ln.parts)
			ln.quota.replayed(ctx)
		case ln.replayed && !ownerless:
			// Another attempt's deduction, which it may yet commit on:
			// this attempt lets go of it (the units go back once no
			// attempt holds them), and of the counts it made.
			s.giveBack(ctx, ln.w.sku, ln.w.req.gateID(), t.holder, ln.parts)
			ln.quota.replayed(ctx)
		default:
			holder := t.holder
			if ownerless {
				holder = shard.AllHolders
			}
			s.giveBack(ctx, ln.w.sku, ln.w.req.gateID(), holder, ln.parts)
			t.settleCounts(ctx, ln, counts)
		}
		ln.counted = false
	}
}

// settleCounts does with line ln's counts what counts says.
func (t *take) settleCounts(ctx context.Context, ln *line, counts countsFate) {
	switch counts {
	case countsRelease:
		ln.quota.release(ctx)
	case countsReplayed:
		ln.quota.replayed(ctx)
	}
}

// deadAttempts reports whether the deductions replayed (made under a
// line's id before this attempt) belong to no attempt that may still
// commit them: this attempt holds the cart's lock, and the ledger neither
// has the cart nor is committing it. Then a refusal gives them back with
// its own. The cart's lock does not prove an earlier attempt done: one
// whose reply was lost let go of it while its COMMIT still waited (for a
// synchronous standby), its row unseen, and a give-back then left Redis
// ahead of the ledger once the row landed. So the ledger is asked to wait
// out any writer of the cart's row (ledger.RequestSettled), for at most
// settleWait; not knowing, the units stay taken for the drift check.
func (t *take) deadAttempts(ctx context.Context) bool {
	if !t.exclusive || !slices.ContainsFunc(t.lines, func(ln *line) bool { return ln.replayed }) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleWait)
	defer cancel()
	return errors.Is(t.s.ledger.RequestSettled(ctx, t.req.scope, t.req.key), ledger.ErrNotFound)
}

// settleWait bounds deadAttempts' wait for an earlier attempt's COMMIT.
const settleWait = 2 * time.Second

// releaseSeats gives back the seats a line held in the gate. If Redis
// cannot, they stay held by the line's id, which nothing else holds; the
// seat consistency check frees them.
func (t *take) releaseSeats(ctx context.Context, ln *line) {
	ctx = context.WithoutCancel(ctx) // as giveBack
	err := t.s.redis(ctx, "gate.seats_release", func(ctx context.Context) error {
		_, err := t.s.seats.Release(ctx, ln.w.sku, ln.seats.section, ln.w.req.gateID(), ln.seats.ids)
		return err
	})
	if err != nil {
		t.s.log.WarnContext(ctx, "release seats; the seat check frees them", "sku", ln.w.sku.String(), "err", err)
	}
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
	return time.Now().Add(ttl)
}

// ledgerTake is the take as the ledger commits it: a line's order, or its
// hold until the take's expiry, with its gate record (its deduction's
// parts, or its seats) and the epoch the gate admitted it under (direct:
// none, taken at the row's).
func (t *take) ledgerTake(direct bool, trace string) ledger.Take {
	expires := t.expiry()
	var orders []ledger.Order
	var holds []ledger.Hold
	for _, ln := range t.lines {
		w := ln.w
		gate, epoch := "", int64(-1)
		if !direct && !ln.seated() {
			gate, epoch = shard.EncodeParts(ln.parts), ln.epoch
		}
		// A seat line's record names its seats and their owner even when
		// taken around the gate: its return releases them by owner (a no-op
		// where not held).
		if p := ln.seats; len(p.ids) > 0 {
			gate, epoch = seats.EncodeGate(p.section, p.ids), -1
		}
		if w.hold {
			holds = append(holds, ledger.Hold{IdempotencyKey: w.req.gateID(), SKU: w.sku, Buyer: w.buyer, Quantity: w.q,
				Gate: gate, GateEpoch: epoch, ExpiresAt: expires, SeatIDs: ln.seats.ids, CodeHash: w.codeHash()})
		} else {
			orders = append(orders, ledger.Order{IdempotencyKey: w.req.gateID(), SKU: w.sku, Buyer: w.buyer, Quantity: w.q,
				Gate: gate, GateEpoch: epoch, SeatIDs: ln.seats.ids, CodeHash: w.codeHash(), Channel: w.channel})
		}
	}
	req := t.req.ledger()
	req.Trace = trace
	if !t.cart {
		if len(holds) > 0 {
			holds[0].Req = req
			return ledger.HoldTake(holds[0])
		}
		orders[0].Req = req
		return ledger.PurchaseTake(orders[0])
	}
	return ledger.CartTake(ledger.Cart{Program: t.program(), Buyer: t.lines[0].w.buyer, Orders: orders, Holds: holds, Req: req})
}

// answerOf is what the ledger committed (or replayed), as the take's
// answer.
func (t *take) answerOf(r ledger.TakeResult) answer {
	switch {
	case t.cart && r.Cart != nil:
		c := *r.Cart
		c.Req = ledger.Request{}
		return answer{cart: &c}
	case t.cart:
		return answer{cart: &ledger.Cart{}}
	case len(r.Holds) > 0:
		h := r.Holds[0]
		return answer{hold: &h}
	}
	return answer{order: r.Order()}
}

// commit commits the take through its group committer (direct: the one of
// takes around the gate) and answers by what the ledger said.
func (t *take) commit(ctx context.Context, direct bool) (answer, stock.SKU) {
	s := t.s
	path, c := pathGate, s.committer
	if direct {
		path, c = pathLedger, s.direct
	}
	lt := t.ledgerTake(direct, tracing.Traceparent(ctx))
	r := c.commitTake(ctx, lt)
	for try := 0; ledger.NoPrimary(r.Err) && s.awaitPrimary(ctx, try); try++ {
		r = c.commitTake(withinDeadline(ctx), lt)
	}
	o := judgeCommit(r.Err, direct, t.cart)
	switch o.verdict {
	case verdictSold:
		if direct {
			for _, ln := range t.lines {
				// Before this replica lets Redis serve the SKU again it
				// reads the row afresh, which shows the gate stale.
				s.bypassed.Store(ln.w.sku, struct{}{})
			}
		}
		a := t.answerOf(r)
		t.sellSeats(ctx, a)
		s.count(path, "sold")
		return a, stock.SKU{}
	case verdictReplay:
		// Another attempt of this request committed first (on another
		// replica, around the gate, or before a Redis re-send). Give back
		// only what its rows do not stand on; a seat line holds the same
		// seats under the same owner: they stay, unless that take has
		// ended since. Not before its row is known to be on the
		// synchronous standby (ledger.RequestDurable): unknown, the stock
		// stays taken and the client asks again.
		if derr := s.ledger.RequestDurable(ctx, t.req.scope, t.req.key); derr != nil && !errors.Is(derr, ledger.ErrNotFound) {
			s.logCommit(ctx, derr)
			return s.counted(path, ansUnavailable), stock.SKU{}
		}
		a := t.answerOf(r)
		a.replayed, a.durable = true, true
		t.settleDuplicate(ctx, a)
		return a, stock.SKU{}
	case verdictKeyReused:
		t.undo(ctx, countsRelease)
		return ansKeyReused, stock.SKU{}
	case verdictRetake:
		t.undo(ctx, countsKeep) // the retake counts under the same request ids
		return answer{}, t.lines[o.line].w.sku
	case verdictRefuse:
		if o.refusal.kind == ErrSoldOut {
			t.ledgerSoldOut(ctx, direct, o.line)
		}
		var no answer
		if o.refusal.kind == ErrSeatsTaken {
			no = t.noSeats(ctx, o.line, o.refusal.kind, o.seats)
		} else {
			no = t.no(ctx, o.line, o.refusal)
		}
		return s.counted(path, t.refused(ctx, no)), stock.SKU{}
	case verdictCartLimit:
		return s.counted(path, t.refused(ctx, s.lookupOr(ctx, t.req, ansLimit))), stock.SKU{}
	case verdictBusy:
		t.undo(ctx, countsRelease)
		return s.counted(path, ansLedgerBusy), stock.SKU{}
	case verdictNotCommitted:
		s.logCommit(ctx, r.Err)
		t.undo(ctx, countsRelease)
		return s.counted(path, ansUnavailable), stock.SKU{}
	}
	// COMMIT failed and may have landed. A row found answers; a row not
	// found proves nothing, so nothing is given back: while a COMMIT
	// waits (for a synchronous standby, or a backend still finishing it
	// after its client gave up) other sessions see its transaction as
	// running and its row as absent, and it lands a moment later. Giving
	// back then left Redis a unit ahead of the ledger
	// (TestAttackShedFreshCommitUnconfirmed, in a loaded make test). The
	// stock stays taken: the client's retry with its key joins this
	// deduction and commits or replays on it, and without a retry the
	// drift check repairs it: under-selling is the safe side of not
	// knowing. The buyer's counts and the code's uses go back (the key's
	// mark stays): nothing repairs them but their day-long lifetime, so
	// kept they would tell a buyer who bought nothing "limit reached",
	// while the ledger checks every cap and code at its commit anyway.
	s.logCommit(ctx, r.Err)
	if a, ok, lerr := s.recorded(ctx, t.req); lerr == nil && ok {
		return a, stock.SKU{}
	}
	for _, ln := range t.lines {
		ln.quota.keepKey()
		ln.quota.release(ctx)
	}
	return s.counted(path, ansUnavailable), stock.SKU{}
}

// ledgerSoldOut notes the ledger's "sold out" for line i. Around the
// gate, a row with nothing left marks the SKU sold out here; through it,
// Redis admitted what the ledger refuses: Redis was ahead of the truth (a
// write lost in a failover, sales around it), and the ledger wins.
func (t *take) ledgerSoldOut(ctx context.Context, direct bool, i int) {
	s := t.s
	if !direct {
		s.metrics.ledgerRefusals.Inc()
		return
	}
	if st, err := s.ledger.SKU(ctx, t.lines[i].w.sku); err == nil && st.Remaining() == 0 {
		s.markSoldOut(t.lines[i].w.sku)
	}
}

// awaitPrimary waits before the try-th retry of a write that found no
// server taking writes (ledger.NoPrimary: a failover under way) and
// reports whether to send it again: while ctx leaves time for the wait, a
// commit and the give-back after it (primaryMargin). The write is the
// same, so it is safe to send again; the stock it took stays taken
// meanwhile. Answered at once, as before, a planned failover of
// pg_auto_failover turned away one purchase in a hundred with 503 in its
// 1.4 s without a primary (stockbench faults, 977 a second).
func (s *Service) awaitPrimary(ctx context.Context, try int) bool {
	d := min(primaryBackoff<<min(try, 8), primaryBackoffMax)
	d = d/2 + mrand.N(d/2+1) // spread: the waiting takes do not come back at once
	// No deadline, no bound on the waits: answer as before.
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) < d+primaryMargin {
		return false
	}
	s.metrics.primaryWaits.Inc()
	select {
	case <-time.After(d):
		return true
	case <-ctx.Done():
		return false
	}
}

// The waits between a take's tries while no server takes writes: from
// primaryBackoff doubling to primaryBackoffMax, and none within
// primaryMargin of the take's deadline.
const (
	primaryBackoff    = 50 * time.Millisecond
	primaryBackoffMax = 500 * time.Millisecond
	primaryMargin     = time.Second
)

// logCommit logs a failed ledger commit, one line a second: a ledger
// that is down fails every request's.
func (s *Service) logCommit(ctx context.Context, err error) {
	if ok, left := s.logs.allow("ledger commit", time.Now()); ok {
		s.log.ErrorContext(ctx, "ledger commit", "err", err, "left_out", left)
	}
}

// settleDuplicate gives back what this attempt took that the request's
// committed rows do not stand on.
func (t *take) settleDuplicate(ctx context.Context, a answer) {
	s := t.s
	for _, ln := range t.lines {
		switch {
		case !ln.counted:
		case len(ln.seats.ids) > 0:
			// The same seats under the same owner: they stay, unless the
			// committed take has ended since (its seats were freed, and
			// this attempt just took them again).
			if t.takeEnded(ctx, a) {
				t.releaseSeats(ctx, ln)
			}
		default:
			s.giveBackUnused(ctx, ln.w, t.holder, ln.parts)
			ln.quota.replayed(ctx)
		}
	}
}

// takeEnded reports whether the committed take a replays no longer holds
// or owns its seats (cancelled, expired, refunded).
func (t *take) takeEnded(ctx context.Context, a answer) bool {
	if a.hold == nil {
		return false
	}
	cur, err := t.s.ledger.HoldByID(ctx, a.hold.ID)
	if err != nil || cur.State == ledger.Held {
		return false
	}
	return cur.State != ledger.Confirmed || t.s.orderRefunded(ctx, cur.OrderID)
}

// sellSeats marks a bought seat line's seats sold in the gate.
func (t *take) sellSeats(ctx context.Context, a answer) {
	if a.cart != nil {
		for _, o := range a.cart.Orders {
			t.s.sellSeats(ctx, o)
		}
	}
}

// direct commits the take straight in the ledger while Redis cannot be
// used: bounded in number (FallbackConcurrency; beyond it ErrBusy), each
// line taken at its row's current epoch and bumping its SKU's bypass_seq
// so its gate is rebuilt before it serves again. The ledger's batches of
// takes around the gate lock each SKU row and decide every take against
// it, so this replica's buyers of a SKU share one transaction and never
// conflict with each other. Best seats are picked from the ledger's map.
func (t *take) direct(ctx context.Context) answer {
	s := t.s
	release, ok := s.fallbackSlot()
	if !ok {
		if t.probeIn > 0 {
			return s.counted(pathLedger, fail(retryIn(ErrBusy, t.probeIn)))
		}
		return s.counted(pathLedger, ansBusy)
	}
	defer release()
	if a, ok := t.placeBest(ctx); !ok {
		return s.counted(pathLedger, a)
	}
	a, _ := t.commit(ctx, true)
	return a
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

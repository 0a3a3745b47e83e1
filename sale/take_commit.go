package sale

import (
	"context"
	"errors"
	mrand "math/rand/v2"
	"slices"
	"time"

	"github.com/stockgate/stockgate/cache"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
	"github.com/stockgate/stockgate/tracing"
)

// A take's commit: the ledger's take built from the lines, the commit
// through the take's lane, and the answer by the verdict on what the
// ledger said (judgeCommit, decide.go).

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
	if ledger.NoPrimary(r.Err) {
		r = s.resendWithoutPrimary(ctx, c, lt, r)
	}
	o := judgeCommit(r.Err, direct, t.cart)
	switch o.verdict {
	case verdictSold:
		t.sold(direct)
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
		if derr := s.ledger.RequestDurable(ctx, t.req.program, t.req.scope, t.req.key); derr != nil && !errors.Is(derr, ledger.ErrNotFound) {
			s.logCommit(ctx, derr)
			return s.counted(path, ansUnavailable), stock.SKU{}
		}
		for _, ln := range t.lines {
			// Its first attempt may have lost its reply before it told
			// anyone (helper-111 #3).
			s.changes.mark(ln.w.sku)
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
		if t.undo(ctx, countsRelease) {
			// A copy of the request on another replica holds the same
			// deduction and may commit on it: this attempt moved nothing,
			// but the request's outcome is not known.
			return s.counted(path, ansLedgerBusyShared), stock.SKU{}
		}
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
		if errors.Is(a.err, ErrKeyReused) {
			// Another request's row holds the key: this take's claim of
			// it cannot commit, so its units and counts go back, as for
			// a key reuse the ledger answered (a late payment's take and
			// its hold's refusal on another replica; a client's key sent
			// with two bodies at once). Kept, they waited for the drift
			// check, and the counts for their day.
			t.undo(ctx, countsRelease)
		} else if a.err == nil {
			// It sold, though its reply was lost: every replica's stock
			// view hears of it, and a cart's seats are sold in Redis's
			// map, as for a sale answered (helper-111 #3).
			t.sold(direct)
			t.sellSeats(ctx, a)
		}
		return a, stock.SKU{}
	}
	for _, ln := range t.lines {
		ln.quota.keepKey()
		ln.quota.release(ctx)
	}
	// A hold's budget counts stay, as its stock does: the gate alone
	// enforces budgets, so given back for a hold that landed they let the
	// buyer hold past the budget (helper-64). Kept for one that did not,
	// they lapse at its expiry plus budgetGrace, or end with it.
	t.budgets = nil
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
	// Marked for its TTL only (the zero Since): a unit that comes back
	// while this SKU's gate is out of reach (its master down) may come
	// back to the ledger alone, and nothing publishes a notice for that.
	if st, err := s.ledger.SKU(ctx, t.lines[i].w.sku); err == nil && st.Remaining() == 0 {
		s.markSoldOut(t.lines[i].w.sku, cache.Since{})
	}
}

// resendWithoutPrimary sends lt again, after r found no server taking
// writes, until it finds one or the request's time runs out
// (awaitPrimary); parked meanwhile (flight.park), re-sends included: at
// the end of a planned failover's gap its take came back at once, filled
// the bound of takes in flight and had new ones refused (881 of 82,308
// answered 503, stockbench faults at 1,553 a second). When as many are
// parked as may be, it waits and re-sends in its place, as before.
func (s *Service) resendWithoutPrimary(ctx context.Context, c *committer, lt ledger.Take, r ledger.TakeResult) ledger.TakeResult {
	if s.flight.park(ctx) {
		s.metrics.parked.Inc()
		defer s.metrics.parked.Dec()
		defer s.flight.unpark()
	}
	for try := 0; ledger.NoPrimary(r.Err) && s.awaitPrimary(ctx, try); try++ {
		s.flight.resent()
		r = c.commitTake(withinDeadline(ctx), lt)
	}
	return r
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
	if ok, left := s.logs.Allow("ledger commit", time.Now()); ok {
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
			// The same seats under the same owner stay while the committed
			// take stands on them. Any other seat this attempt took goes
			// back: a best-seats retry of a confirmed hold (whose seats are
			// sold, so none read as its own) took new ones, and a take that
			// has ended since (cancelled, expired, refunded) had its seats
			// freed and just took them again.
			if extra := without(ln.seats.ids, t.committedSeats(ctx, a, ln)); len(extra) > 0 {
				t.releaseSeats(ctx, ln, extra)
			}
		default:
			s.giveBackUnused(ctx, ln.w, t.holder, ln.parts)
			ln.quota.replayed(ctx)
		}
	}
}

// committedSeats are the seats line ln's committed take (a replays)
// stands on now: none once it has ended. A cart answers per line, by the
// line's SKU (no SKU twice in a cart).
func (t *take) committedSeats(ctx context.Context, a answer, ln *line) []keys.ID {
	switch {
	case a.err != nil:
		return nil // a refusal recorded under the request stands on nothing
	case a.hold != nil:
		return t.holdSeats(ctx, *a.hold)
	case a.cart != nil:
		for _, h := range a.cart.Holds {
			if h.SKU == ln.w.sku {
				return t.holdSeats(ctx, h)
			}
		}
		for _, o := range a.cart.Orders {
			if o.SKU == ln.w.sku {
				return t.orderSeats(ctx, o)
			}
		}
	case !a.order.ID.IsZero():
		return t.orderSeats(ctx, a.order)
	}
	return ln.seats.ids // not known: kept (the seat check frees them)
}

// holdSeats are hold h's seats while it is held or its order stands. A
// failed read keeps them all: the seat check frees what it should not.
func (t *take) holdSeats(ctx context.Context, h ledger.Hold) []keys.ID {
	cur, err := t.s.ledger.HoldByID(ctx, h.ID)
	switch {
	case err != nil, cur.State == ledger.Held:
		return h.SeatIDs
	case cur.State != ledger.Confirmed:
		return nil
	}
	return t.orderSeats(ctx, ledger.Order{ID: cur.OrderID, SeatIDs: h.SeatIDs})
}

// orderSeats are order o's seats unless it was refunded.
func (t *take) orderSeats(ctx context.Context, o ledger.Order) []keys.ID {
	if t.s.orderRefunded(ctx, o.ID) {
		return nil
	}
	return o.SeatIDs
}

// without is ids less those in keep.
func without(ids, keep []keys.ID) []keys.ID {
	var out []keys.ID
	for _, id := range ids {
		if !slices.Contains(keep, id) {
			out = append(out, id)
		}
	}
	return out
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
	release, ok := s.fallbackSlot(ctx)
	if !ok {
		if t.probeIn > 0 {
			return s.counted(pathLedger, fail(retryIn(ansBusy.err, t.probeIn)))
		}
		return s.counted(pathLedger, ansBusy)
	}
	defer release()
	if a, ok := t.freshPoolRules(ctx); !ok {
		return s.counted(pathLedger, a)
	}
	if a, ok := t.placeBest(ctx); !ok {
		return s.counted(pathLedger, a)
	}
	a, _ := t.commit(ctx, true)
	return a
}

// freshPoolRules decides each pool line again by its rule as the ledger
// has it now. Around the gate, nothing brings a rule another replica
// changed to this take: through the gate, its fence does (tookStale),
// and the ledger checks no rule; the notice that drops this replica's
// copy may not reach it while Redis is out for it. A pool made code-only
// sold to buyers with no code (helper-77 #1). One ledger read per pool
// line, only while its take goes around the gate.
func (t *take) freshPoolRules(ctx context.Context) (answer, bool) {
	s := t.s
	for _, ln := range t.lines {
		w := &ln.w
		if w.sku.Pool().IsZero() {
			continue
		}
		st, err := s.ledger.SKU(ctx, w.sku)
		if err != nil {
			s.log.ErrorContext(ctx, "load pool rule", "sku", w.sku.String(), "err", err)
			return ansUnavailable, false
		}
		if st.Rule.Equal(ln.st.Rule) {
			continue
		}
		s.settings.Invalidate(w.sku)
		if err := s.admit(st, w.access, s.now()); err != nil {
			return s.lookupOr(ctx, t.req, fail(err)), false
		}
		if st.Rule.Access != ledger.AccessCode {
			w.code = nil // open now: no code is used up
		} else if w.code == nil {
			c, err := s.codeFor(ctx, *w)
			switch {
			case errors.Is(err, ErrCodeInvalid):
				return s.lookupOr(ctx, t.req, fail(err)), false
			case err != nil:
				s.log.ErrorContext(ctx, "load access code", "sku", w.sku.String(), "err", err)
				return ansUnavailable, false
			}
			w.code = c
		}
		ln.st.Rule = st.Rule
	}
	return answer{}, true
}

// sold tells of t's committed sale: every replica's stock view changes at
// the next notice, and a sale around the gate (direct) leaves the gate
// stale: before this replica lets Redis serve the SKU again it reads the
// row afresh, and the others do at the next notices (a stock view read
// from the stale gate would stand otherwise).
func (t *take) sold(direct bool) {
	s := t.s
	for _, ln := range t.lines {
		s.changes.mark(ln.w.sku)
		if direct {
			s.bypassed.Store(ln.w.sku, struct{}{})
			s.restocksOwed.mark(ln.w.sku)
		}
	}
}

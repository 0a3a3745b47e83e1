package sale

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// A take at the gate: each line's units (the buyer's counts under the
// caps, then a shard deduction) or seats, and what goes back when an
// attempt ends without a sale.

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
	since := s.cache.Since()
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
			s.markSoldOut(w.sku, since)
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
	if tookStale(w.sku, st, epoch, same) {
		// Give back what this epoch's shards took and go again.
		return answer{}, gateStale
	}
	if !d.Replayed {
		// Stock was there: a stale sold-out flag (the one re-check let
		// through) must not keep telling others it is gone.
		s.clearSoldOut(w.sku)
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
// back the deduction its committed copy stood on). shared reports a
// deduction another attempt of the request still holds: that copy may
// yet commit, so a 503 of this one must say the outcome is unknown.
func (t *take) undo(ctx context.Context, counts countsFate) (shared bool) {
	s := t.s
	ownerless := counts == countsRelease && t.deadAttempts(ctx)
	for _, ln := range t.lines {
		switch {
		case !ln.counted:
			t.settleCounts(ctx, ln, counts)
		case len(ln.seats.ids) > 0:
			if free := without(ln.seats.ids, ln.seats.keep); len(free) > 0 {
				t.releaseSeats(ctx, ln, free)
			}
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
			shared = true
		default:
			holder := t.holder
			if ownerless {
				holder = shard.AllHolders
			}
			shared = s.giveBack(ctx, ln.w.sku, ln.w.req.gateID(), holder, ln.parts) || shared
			t.settleCounts(ctx, ln, counts)
		}
		ln.counted = false
	}
	return shared
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
	return errors.Is(t.s.ledger.RequestSettled(ctx, t.req.program, t.req.scope, t.req.key), ledger.ErrNotFound)
}

// settleWait bounds deadAttempts' wait for an earlier attempt's COMMIT.
const settleWait = 2 * time.Second

// releaseSeats gives back ids, seats line ln held in the gate. If Redis
// cannot, they stay held by the line's id, which nothing else holds; the
// seat consistency check frees them.
func (t *take) releaseSeats(ctx context.Context, ln *line, ids []keys.ID) {
	ctx = context.WithoutCancel(ctx) // as giveBack
	err := t.s.redis(ctx, "gate.seats_release", func(ctx context.Context) error {
		_, err := t.s.seats.Release(ctx, ln.w.sku, ln.seats.section, ln.w.req.gateID(), ids)
		return err
	})
	if err != nil {
		t.s.log.WarnContext(ctx, "release seats; the seat check frees them", "sku", ln.w.sku.String(), "err", err)
	}
}

// tookStale reports whether a deduction of sku, admitted under settings
// st, must be taken again: a shard was rebuilt part-way through it (not
// same: the ledger would refuse it), or the pool's gate was rebuilt since
// its rule admitted the take (a change of the pool, waited out at the
// fence). The ledger checks no access rule, so such a take goes again
// under the pool's settings as they are now: a rule made stricter is not
// sold around (helper-70 #1). A ticket's own settings the ledger checks
// again, so its takes go on.
func tookStale(sku stock.SKU, st ledger.SKUState, epoch int64, same bool) bool {
	return !same || epoch != st.GateEpoch && !sku.Pool().IsZero()
}

package sale

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// answer is the outcome of one write, shared by joined duplicates: an order
// or a hold, or err (one of the kinds in errors.go).
type answer struct {
	order    ledger.Order
	hold     *ledger.Hold
	cart     *ledger.Cart
	replayed bool
	err      error
}

func fail(err error) answer { return answer{err: err} }

var (
	ansSoldOut     = fail(ErrSoldOut)
	ansKeyReused   = fail(ErrKeyReused)
	ansUnknownSKU  = fail(ErrUnknownSKU)
	ansLimit       = fail(ErrLimit)
	ansSaleEnded   = fail(ErrSaleEnded)
	ansUnavailable = fail(ErrUnavailable)
	ansCodeUsedUp  = fail(ErrCodeUsedUp)
)

// want is one request for stock: a purchase, or a hold when hold is set.
type want struct {
	sku   stock.SKU
	req   request
	buyer keys.ID
	q     int64
	hold  bool
	ttl   time.Duration // a hold's lifetime; 0 for the SKU's default
	// access is what the request presents to its pool's rule (sku is the
	// pool's stock); code is its access code as the gate counts it.
	access Access
	code   *codeUse
}

func (w want) order(gate string, epoch int64) ledger.Order {
	return ledger.Order{IdempotencyKey: w.req.gateID(), SKU: w.sku, Buyer: w.buyer, Quantity: w.q, Gate: gate,
		Req: w.req.ledger(), GateEpoch: epoch, CodeHash: w.codeHash()}
}

// codeHash is the ledger's name of the request's access code ("" for none).
func (w want) codeHash() string {
	if w.code == nil {
		return ""
	}
	return w.code.hash
}

// commit records the request in the ledger: through the gate (version < 0,
// at the gate epoch it was admitted under) or around it. On ErrDuplicate
// the answer carries what the request stored.
func (s *Service) commit(ctx context.Context, w want, st ledger.SKUState, gate string, version, epoch int64) (answer, error) {
	if w.hold {
		ttl := w.ttl
		if ttl == 0 {
			ttl = st.HoldTTL
		}
		h := ledger.Hold{IdempotencyKey: w.req.gateID(), SKU: w.sku, Buyer: w.buyer,
			Quantity: w.q, Gate: gate, ExpiresAt: time.Now().Add(ttl), Req: w.req.ledger(), GateEpoch: epoch, CodeHash: w.codeHash()}
		var err error
		if version < 0 {
			h, err = s.committer.commitHold(h) // through the gate: group-committed with the SKU's other takes
		} else {
			h, err = s.direct.commitHold(h) // around it: batched like the purchases around it
		}
		return answer{hold: &h}, err
	}
	var o ledger.Order
	var err error
	if version < 0 {
		o, err = s.committer.commit(w.order(gate, epoch))
	} else {
		// Around the gate: batched with this replica's other buyers of the
		// SKU, optimistic against other replicas (the ledger reads the
		// version in the batch's transaction).
		o, err = s.direct.commit(w.order(gate, epoch))
	}
	return answer{order: o}, err
}

// recorded is the answer a committed request got, from the ledger's
// requests table: the replay of a retry from any replica, at any time.
// ok is false when the key has no committed request; a key used for
// another request answers 422.
func (s *Service) recorded(ctx context.Context, r request) (answer, bool, error) {
	rec, err := s.ledger.RequestByKey(ctx, r.scope, r.key)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return answer{}, false, nil
	case err != nil:
		return answer{}, false, err
	case rec.Fingerprint != r.ledger().Fingerprint:
		return ansKeyReused, true, nil
	}
	return replayed(rec), true, nil
}

// replayed is the answer of a committed request, replayed.
func replayed(rec ledger.Recorded) answer {
	a := answer{replayed: true, hold: rec.Hold, cart: rec.Cart}
	if rec.Order != nil {
		a.order = *rec.Order
	}
	if a.hold == nil && rec.Order == nil && rec.Cart == nil {
		return ansUnavailable // a row without its answer: a bug, never a guess
	}
	return a
}

// committedOr answers a request the gate refused in bulk (its SKU sold out
// or ended): a retry of a request that committed gets
// its answer, from any replica, without a ledger call per request (see
// replays); any other request gets the refusal.
func (s *Service) committedOr(ctx context.Context, w want, refusal answer) answer {
	return s.committedAt(ctx, w, refusal, 0)
}

// committedAt is committedOr for a caller that knows the SKU row's version
// was at most known a moment ago (see replays.committedAt).
func (s *Service) committedAt(ctx context.Context, w want, refusal answer, known int64) answer {
	committed, err := s.replays.committedAt(ctx, w.sku, w.req.scope, w.req.key, known)
	if err != nil {
		s.log.WarnContext(ctx, "committed keys", "sku", w.sku.String(), "err", err)
		return ansUnavailable
	}
	if !committed {
		return refusal
	}
	return s.lookupOr(ctx, w.req, refusal)
}

// lookupOr answers with the committed request's replay if there is one,
// else with refusal.
func (s *Service) lookupOr(ctx context.Context, r request, refusal answer) answer {
	a, ok, err := s.recorded(ctx, r)
	switch {
	case err != nil:
		s.log.ErrorContext(ctx, "lookup request", "err", err)
		return ansUnavailable
	case ok:
		return a
	}
	return refusal
}

// takeAttempts bounds how often one request is taken again after its
// gate was rebuilt under it (ErrStaleGate).
const takeAttempts = 3

// take is the flow of a purchase or a hold: settings → closed SKU (sold
// out, ended) → per-buyer quota → Redis deduction → ledger commit at the
// deduction's gate epoch → answer, or straight to the ledger when Redis
// cannot be used. Every path that took stock and did not commit gives it
// back, and no path answers 2xx without a commit.
func (s *Service) take(ctx context.Context, w want) answer {
	for attempt := 1; ; attempt++ {
		a, stale := s.takeOnce(ctx, w)
		if !stale {
			return a
		}
		if attempt == takeAttempts {
			return s.counted(pathGate, ansUnavailable)
		}
		// A rebuild closed the gate this request was admitted by: its stock
		// went with the old gate and the ledger counts without it. Make
		// sure the new gate is up, then take again.
		if err := s.reseed(ctx, w.sku, reasonStale, false); err != nil {
			s.log.WarnContext(ctx, "rebuild after a stale admission", "sku", w.sku.String(), "err", err)
		}
		s.settings.Invalidate(w.sku)
	}
}

// takeOnce is one attempt of take; stale reports an admission the ledger
// refused because the gate was rebuilt meanwhile (nothing moved).
func (s *Service) takeOnce(ctx context.Context, w want) (_ answer, stale bool) {
	st, err := s.settings.Get(ctx, w.sku)
	switch {
	case errors.Is(err, stock.ErrUnknownSKU) && !w.sku.Pool().IsZero():
		return fail(ErrUnknownPool), false
	case errors.Is(err, stock.ErrUnknownSKU):
		return ansUnknownSKU, false
	case err != nil:
		s.log.ErrorContext(ctx, "load sku settings", "sku", w.sku.String(), "err", err)
		return ansUnavailable, false
	}
	// Refusals decided by the SKU's settings: a retry of a request that
	// committed under earlier settings still gets its answer (a lookup is
	// cheap on these rare paths).
	if err := s.admit(st, w.access, time.Now()); err != nil {
		return s.lookupOr(ctx, w.req, fail(err)), false
	}
	if st.Rule.Access == ledger.AccessCode {
		c, err := s.codeFor(ctx, w)
		switch {
		case errors.Is(err, ErrCodeInvalid):
			return s.lookupOr(ctx, w.req, fail(err)), false
		case err != nil:
			s.log.ErrorContext(ctx, "load access code", "sku", w.sku.String(), "err", err)
			return ansUnavailable, false
		}
		w.code = c
	}
	if w.q > st.MaxPerOrder {
		return s.lookupOr(ctx, w.req, fail(refuse(ErrOverMax,
			fmt.Sprintf("quantity %d over this ticket's maximum of %d per order", w.q, st.MaxPerOrder)))), false
	}
	if w.hold && w.ttl != 0 && (w.ttl < ledger.MinHoldTTL || w.ttl > st.HoldTTLMax) {
		return s.lookupOr(ctx, w.req, fail(refuse(ErrInvalid,
			fmt.Sprintf("ttl_seconds must be in %d..%d for this ticket", int(ledger.MinHoldTTL.Seconds()), int(st.HoldTTLMax.Seconds()))))), false
	}
	if st.Seated {
		return s.lookupOr(ctx, w.req, fail(ErrSeated)), false
	}
	if !st.EndedAt.IsZero() {
		return s.committedOr(ctx, w, ansSaleEnded), false
	}
	if s.cache.SoldOut(w.sku) {
		return s.committedOr(ctx, w, ansSoldOut), false
	}
	if st.PerBuyer > 0 && w.q > st.PerBuyer {
		return s.lookupOr(ctx, w.req, ansLimit), false // more than the cap in one request; no count needed
	}
	if st, err = s.gateFresh(ctx, w.sku, st); err != nil {
		s.log.ErrorContext(ctx, "load sku settings", "sku", w.sku.String(), "err", err)
		return ansUnavailable, false
	}
	if st.GateStale() && s.breaker.State() == breaker.Closed {
		// The ledger sold around Redis: rebuild before Redis serves again.
		if err := s.reseed(ctx, w.sku, reasonBypass, false); err != nil {
			return s.takeDirect(ctx, w, st), false
		}
	}

	quota, qerr := s.takeQuota(ctx, w, st)
	switch {
	case errors.Is(qerr, errCodeUsedUp):
		// Its uses are counted: a retry of a request that used it gets its
		// replay.
		s.metrics.poolRefusals.WithLabelValues("code-used-up").Inc()
		return s.counted(pathGate, s.lookupOr(ctx, w.req, ansCodeUsedUp)), false
	case errors.Is(qerr, errOverCap):
		return s.lookupOr(ctx, w.req, ansLimit), false
	case errors.Is(qerr, shard.ErrKeyCounted):
		// Over the cap, but this key was counted before: a retry of a
		// request whose stock came back (a refund, a cancel), or a reuse of
		// the key. The ledger knows which.
		return s.counted(pathGate, s.lookupOr(ctx, w.req, ansLimit)), false
	case errors.Is(qerr, stock.ErrLimit):
		// A retry of a request that was counted passes (its count is kept
		// per request id). A request never counted here (sold around the
		// gate, or before the cap existed) is found among the SKU's
		// committed keys, read at most once per change of the SKU row: a
		// flood of new requests from one buyer costs no ledger call each.
		return s.counted(pathGate, s.committedAt(ctx, w, ansLimit, st.Version)), false
	case qerr != nil && notRun(qerr):
		return s.takeDirect(ctx, w, st), false
	case qerr != nil:
		s.log.ErrorContext(ctx, "quota", "sku", w.sku.String(), "err", qerr)
		return s.counted(pathGate, ansUnavailable), false
	}
	req := shard.Request{SKU: w.sku, Shards: st.Shards, RequestID: w.req.gateID(), Quantity: w.q, MaxQuantity: st.MaxPerOrder}
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
	switch {
	case errors.Is(err, stock.ErrSoldOut):
		if d.Left == 0 {
			// Only an empty SKU is remembered as sold out: 3 left is sold
			// out for a buyer of 4, not for a buyer of 1.
			s.markSoldOut(w.sku)
			return s.counted(pathGate, s.refusedTake(ctx, w, quota, ansSoldOut, true)), false
		}
		return s.counted(pathGate, s.refusedTake(ctx, w, quota, ansSoldOut, false)), false
	case err != nil && notRun(err):
		// Nothing moved in Redis: the ledger can take this one directly
		// (and may commit it: its key keeps its mark).
		quota.keepKey()
		quota.release(ctx)
		return s.takeDirect(ctx, w, st), false
	case err != nil:
		// Still unknown: never take it again by the other path. The client's
		// retry with the same key meets the deduction record.
		s.log.ErrorContext(ctx, "deduct", "sku", w.sku.String(), "err", err)
		return s.counted(pathGate, ansUnavailable), false
	}
	if !d.Replayed {
		// Stock was there: a stale sold-out flag (the one re-check let
		// through) must not keep telling others it is gone.
		s.cache.ClearSoldOut(w.sku)
	}
	epoch, same := d.Epoch()
	if !same {
		// A shard was rebuilt part-way through the take: the ledger would
		// refuse it. Give back what this epoch's shards took and go again.
		s.giveBack(ctx, w.sku, w.req.gateID(), d.Parts)
		return answer{}, true
	}
	if d.Replayed {
		// This request took stock before. If that attempt committed, replay
		// it; otherwise the stock it took is ours to commit now, and the
		// ledger's request row settles a race with the original attempt.
		if a, ok, err := s.recorded(ctx, w.req); err != nil {
			s.log.ErrorContext(ctx, "lookup request", "err", err)
			return s.counted(pathGate, ansUnavailable), false
		} else if ok {
			quota.replayed(ctx)
			return a, false
		}
	}

	a, err := s.commit(ctx, w, st, shard.EncodeParts(d.Parts), -1, epoch)
	giveBack := func() {
		s.giveBack(ctx, w.sku, w.req.gateID(), d.Parts)
		quota.release(ctx)
	}
	refused := func(refusal answer, closed bool) answer {
		s.giveBack(ctx, w.sku, w.req.gateID(), d.Parts)
		return s.counted(pathGate, s.refusedTake(ctx, w, quota, refusal, closed))
	}
	switch {
	case err == nil:
		s.count(pathGate, "sold")
		return a, false
	case errors.Is(err, ledger.ErrDuplicate):
		// Another attempt of this request committed first (on another
		// replica, through the ledger fallback, or before a Redis re-send).
		// Give back only what its order does not stand on.
		s.giveBackUnused(ctx, w, d.Parts)
		quota.replayed(ctx)
		a.replayed = true
		return a, false
	case errors.Is(err, ledger.ErrKeyReused):
		giveBack()
		return ansKeyReused, false
	case errors.Is(err, ledger.ErrStaleGate):
		// The gate was rebuilt after it admitted this request: the rebuild
		// wiped this deduction (a give-back of it is refused as stale). The
		// quota count stays: the retake counts under the same request id
		// (once), and a copy of this request on another replica may commit.
		return answer{}, true
	case errors.Is(err, ledger.ErrSeatedTake):
		// A seat map came since this replica read the settings.
		return refused(fail(ErrSeated), false), false
	case errors.Is(err, stock.ErrSoldOut):
		// Redis admitted what the ledger refuses: Redis was ahead of the
		// truth (a write lost in a failover, sales around it). The ledger wins.
		s.metrics.ledgerRefusals.Inc()
		return refused(ansSoldOut, false), false
	case errors.Is(err, stock.ErrLimit):
		return refused(ansLimit, false), false
	case errors.Is(err, ledger.ErrCodeUsedUp):
		return refused(ansCodeUsedUp, false), false
	case errors.Is(err, ledger.ErrCodeInvalid):
		return refused(fail(ErrCodeInvalid), false), false
	case errors.Is(err, stock.ErrSaleEnded):
		return refused(ansSaleEnded, true), false
	case errors.Is(err, errLedgerBusy):
		giveBack()
		return s.counted(pathGate, ansLedgerBusy), false
	case errors.Is(err, ledger.ErrNotCommitted):
		s.log.ErrorContext(ctx, "ledger commit", "sku", w.sku.String(), "err", err)
		giveBack()
		return s.counted(pathGate, ansUnavailable), false
	}
	// COMMIT failed and may have landed. Look before giving the stock back:
	// restoring stock that was in fact sold would let Redis admit a buyer
	// the ledger must refuse.
	s.log.ErrorContext(ctx, "ledger commit", "sku", w.sku.String(), "err", err)
	if a, ok, lerr := s.recorded(ctx, w.req); lerr == nil && ok {
		return a, false
	} else if lerr == nil {
		giveBack()
	}
	// Otherwise the stock stays taken in Redis: under-selling until the
	// drift check repairs it is the safe side of not knowing.
	return s.counted(pathGate, ansUnavailable), false
}

// refusedTake answers a take refused after its quota was counted: with the
// replay when the request had committed before (giving back only counts
// this attempt made), else with the refusal (giving the counts back).
// closed means the SKU takes no more requests (see committedOr).
func (s *Service) refusedTake(ctx context.Context, w want, quota *quotaTicket, refusal answer, closed bool) answer {
	var a answer
	if closed {
		a = s.committedOr(ctx, w, refusal)
	} else {
		a = s.lookupOr(ctx, w.req, refusal)
	}
	if a.replayed {
		quota.replayed(ctx)
	} else {
		quota.release(ctx)
	}
	return a
}

// giveBackUnused returns the parts of this attempt's deduction that the
// committed row of the same request does not stand on. Two attempts of one
// request share its deduction records: the first to deduct and the one to
// commit may differ, and the loser must not give back the winner's stock.
func (s *Service) giveBackUnused(ctx context.Context, w want, parts []shard.Part) {
	var gate string
	if w.hold {
		h, err := s.ledger.HoldByKey(ctx, w.req.gateID())
		if err != nil {
			s.log.WarnContext(ctx, "committed hold of a duplicate", "err", err)
			return // keep the units: under-selling is the safe side
		}
		gate = h.Gate
	} else {
		o, err := s.ledger.OrderByKey(ctx, w.req.gateID())
		if err != nil {
			s.log.WarnContext(ctx, "committed order of a duplicate", "err", err)
			return
		}
		gate = o.Gate
	}
	used := map[shard.Part]bool{}
	if gate != "" {
		stored, err := shard.DecodeParts(gate)
		if err != nil {
			s.log.ErrorContext(ctx, "committed gate record", "err", err)
			return
		}
		for _, p := range stored {
			used[p] = true
		}
	}
	var unused []shard.Part
	for _, p := range parts {
		if !used[p] {
			unused = append(unused, p)
		}
	}
	if len(unused) > 0 {
		s.giveBack(ctx, w.sku, w.req.gateID(), unused)
	}
}

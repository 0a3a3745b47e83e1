package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// purchaseBody is the JSON a buyer sends. Quantity is a pointer so a missing
// field is told apart from 0; int64 makes encoding/json refuse 1.5, "1",
// 1e3 and 2^63 before any stock code sees them.
type purchaseBody struct {
	Buyer    string `json:"buyer"`
	Quantity *int64 `json:"quantity"`
}

// orderView is the 201 body of a purchase, and of its replays.
type orderView struct {
	OrderID   string    `json:"order_id"`
	Program   string    `json:"program"`
	Ticket    string    `json:"ticket"`
	Buyer     string    `json:"buyer"`
	Quantity  int64     `json:"quantity"`
	CreatedAt time.Time `json:"created_at"`
}

func viewOf(o ledger.Order) orderView {
	return orderView{OrderID: o.ID, Program: o.SKU.Program, Ticket: o.SKU.Ticket,
		Buyer: o.Buyer, Quantity: o.Quantity, CreatedAt: o.CreatedAt}
}

// answer is the outcome of one write, shared by joined duplicates. A 2xx
// carries an order or a hold.
type answer struct {
	status     int
	order      ledger.Order
	hold       *ledger.Hold
	replayed   bool
	kind       string // problem type when status >= 400
	detail     string
	retryAfter int
}

func refuse(status int, kind, detail string) answer {
	return answer{status: status, kind: kind, detail: detail}
}

var (
	ansSoldOut     = refuse(http.StatusConflict, "sold-out", "not enough stock left for this quantity")
	ansKeyReused   = refuse(http.StatusUnprocessableEntity, "idempotency-key-reused", "this Idempotency-Key was used for a different request")
	ansUnknownSKU  = refuse(http.StatusNotFound, "unknown-sku", "no such program/ticket")
	ansLimit       = refuse(http.StatusConflict, "limit-reached", "this buyer already holds or owns as many of this ticket as it allows")
	ansSaleEnded   = refuse(http.StatusConflict, "sale-ended", "the sale of this ticket has ended")
	ansUnavailable = answer{status: http.StatusServiceUnavailable, kind: "unavailable",
		detail: "stock service temporarily unavailable; retry with the same Idempotency-Key", retryAfter: 1}
)

// purchase handles POST /v1/skus/:program/:ticket/purchases.
func (s *Server) purchase(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	key, ok := idempotencyKey(c)
	if !ok {
		return
	}
	var body purchaseBody
	if !s.decodeBody(c, &body) || !validBuyer(c, body.Buyer) {
		return
	}
	if body.Quantity == nil || *body.Quantity < 1 {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "quantity must be an integer >= 1", 0)
		return
	}
	q := *body.Quantity
	w := want{sku: sku, buyer: body.Buyer, q: q,
		req: newRequest(body.Buyer, key, ledger.OpPurchase, sku.Program, sku.Ticket, strconv.FormatInt(q, 10))}
	s.runJoined(c, w.req, func(ctx context.Context) answer { return s.take(ctx, w) })
}

func (s *Server) write(c *gin.Context, a answer) {
	switch {
	case a.status < 300 && a.hold != nil:
		if a.replayed {
			c.Header("Idempotent-Replayed", "true")
		}
		c.Header("Location", "/v1/holds/"+a.hold.ID)
		c.JSON(a.status, holdViewOf(*a.hold))
	case a.status < 300:
		if a.replayed {
			c.Header("Idempotent-Replayed", "true")
		}
		c.Header("Location", "/v1/orders/"+a.order.ID)
		c.JSON(a.status, viewOf(a.order))
	case a.status >= 400:
		if a.status >= 500 {
			s.log.WarnContext(c.Request.Context(), "purchase failed", "route", c.FullPath(), "status", a.status, "detail", a.detail)
		}
		writeProblem(c, a.status, a.kind, a.detail, a.retryAfter)
	default:
		s.log.ErrorContext(c.Request.Context(), "purchase produced no answer", "route", c.FullPath())
		writeProblem(c, http.StatusInternalServerError, "internal", "internal error", 0)
	}
}

// want is one request for stock: a purchase, or a hold when hold is set.
type want struct {
	sku   stock.SKU
	req   request
	buyer string
	q     int64
	hold  bool
	ttl   time.Duration // a hold's lifetime; 0 for the SKU's default
}

func (w want) order(gate string, epoch int64) ledger.Order {
	return ledger.Order{IdempotencyKey: w.req.gateID(), SKU: w.sku, Buyer: w.buyer, Quantity: w.q, Gate: gate,
		Req: w.req.ledger(), GateEpoch: epoch}
}

// commit records the request in the ledger: through the gate (version < 0,
// at the gate epoch it was admitted under) or around it. On ErrDuplicate
// the answer carries what the request stored.
func (s *Server) commit(ctx context.Context, w want, st ledger.SKUState, gate string, version, epoch int64) (answer, error) {
	if w.hold {
		ttl := w.ttl
		if ttl == 0 {
			ttl = st.HoldTTL
		}
		h, err := s.ledger.Hold(ctx, ledger.Hold{IdempotencyKey: w.req.gateID(), SKU: w.sku, Buyer: w.buyer,
			Quantity: w.q, Gate: gate, ExpiresAt: time.Now().Add(ttl), Req: w.req.ledger(), GateEpoch: epoch}, version)
		return answer{status: http.StatusCreated, hold: &h}, err
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
	return answer{status: http.StatusCreated, order: o}, err
}

// recorded is the answer a committed request got, from the ledger's
// requests table: the replay of a retry from any replica, at any time.
// ok is false when the key has no committed request; a key used for
// another request answers 422.
func (s *Server) recorded(ctx context.Context, r request) (answer, bool, error) {
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
	status := http.StatusCreated
	if rec.Op == ledger.OpCancel || rec.Op == ledger.OpRefund {
		status = http.StatusOK
	}
	a := answer{status: status, replayed: true, hold: rec.Hold}
	if rec.Order != nil {
		a.order = *rec.Order
	}
	if a.hold == nil && rec.Order == nil {
		return ansUnavailable // a row without its answer: a bug, never a guess
	}
	return a
}

// committedOr answers a request the gate refused in bulk (its SKU sold out
// or ended, its buyer at the cap): a retry of a request that committed gets
// its answer, from any replica, without a ledger call per request (see
// replays); any other request gets the refusal.
func (s *Server) committedOr(ctx context.Context, w want, refusal answer) answer {
	committed, err := s.replays.committed(ctx, w.sku, w.req.scope, w.req.key)
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
func (s *Server) lookupOr(ctx context.Context, r request, refusal answer) answer {
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
func (s *Server) take(ctx context.Context, w want) answer {
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
func (s *Server) takeOnce(ctx context.Context, w want) (_ answer, stale bool) {
	st, err := s.settings.Get(ctx, w.sku)
	switch {
	case errors.Is(err, stock.ErrUnknownSKU):
		return ansUnknownSKU, false
	case err != nil:
		s.log.ErrorContext(ctx, "load sku settings", "sku", w.sku.String(), "err", err)
		return ansUnavailable, false
	}
	// Refusals decided by the SKU's settings: a retry of a request that
	// committed under earlier settings still gets its answer (a lookup is
	// cheap on these rare paths).
	if w.q > st.MaxPerOrder {
		return s.lookupOr(ctx, w.req, refuse(http.StatusUnprocessableEntity, "quantity-over-limit",
			fmt.Sprintf("quantity %d over this ticket's maximum of %d per order", w.q, st.MaxPerOrder))), false
	}
	if w.hold && w.ttl != 0 && (w.ttl < ledger.MinHoldTTL || w.ttl > st.HoldTTLMax) {
		return s.lookupOr(ctx, w.req, refuse(http.StatusUnprocessableEntity, "invalid-field",
			fmt.Sprintf("ttl_seconds must be in %d..%d for this ticket", int(ledger.MinHoldTTL.Seconds()), int(st.HoldTTLMax.Seconds())))), false
	}
	if st.Seated {
		return s.lookupOr(ctx, w.req, refuse(http.StatusConflict, "seated", "this ticket sells specific seats: use seat holds")), false
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
	if st.GateStale() && s.breaker.State() == breaker.Closed {
		// The ledger sold around Redis: rebuild before Redis serves again.
		if err := s.reseed(ctx, w.sku, reasonBypass, false); err != nil {
			return s.takeDirect(ctx, w, st), false
		}
	}

	quota, qerr := s.takeQuota(ctx, w, st)
	switch {
	case errors.Is(qerr, errOverCap):
		return s.lookupOr(ctx, w.req, ansLimit), false
	case errors.Is(qerr, stock.ErrLimit):
		// A retry of a request that was counted passes (its count is kept
		// per request id). One whose count was given back (its hold
		// cancelled, its order refunded) or a reused key is counted anew and
		// may be refused: the SKU's committed keys (read incrementally, once
		// for all askers) tell it from a new request, so a flood from one
		// buyer stops here without a ledger call per request.
		return s.counted(pathGate, s.committedOr(ctx, w, ansLimit)), false
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
		// Nothing moved in Redis: the ledger can take this one directly.
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
	case errors.Is(err, stock.ErrSoldOut):
		// Redis admitted what the ledger refuses: Redis was ahead of the
		// truth (a write lost in a failover, sales around it). The ledger wins.
		s.metrics.ledgerRefusals.Inc()
		return refused(ansSoldOut, false), false
	case errors.Is(err, stock.ErrLimit):
		return refused(ansLimit, false), false
	case errors.Is(err, stock.ErrSaleEnded):
		return refused(ansSaleEnded, true), false
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
func (s *Server) refusedTake(ctx context.Context, w want, quota *quotaTicket, refusal answer, closed bool) answer {
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
func (s *Server) giveBackUnused(ctx context.Context, w want, parts []shard.Part) {
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

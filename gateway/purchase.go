package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/keys"
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
	key := c.GetHeader("Idempotency-Key")
	if err := keys.CheckID(key); err != nil {
		writeProblem(c, http.StatusBadRequest, "invalid-idempotency-key",
			"an Idempotency-Key header matching [A-Za-z0-9_-]{1,64} is required (a UUID fits)", 0)
		return
	}
	var body purchaseBody
	if !s.decodeBody(c, &body) {
		return
	}
	if err := keys.CheckID(body.Buyer); err != nil {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "buyer must match [A-Za-z0-9_-]{1,64}", 0)
		return
	}
	if body.Quantity == nil || *body.Quantity < 1 {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "quantity must be an integer >= 1", 0)
		return
	}
	q := *body.Quantity
	hash := requestHash(sku, body.Buyer, q)

	res, mismatch := s.inflight.do(key, hash, func() answer {
		// Detached from the client: once stock is taken it must end in a
		// commit or a restore even if the client hangs up.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request.Context()), s.opts.WorkTimeout)
		defer cancel()
		return s.take(ctx, want{sku: sku, key: key, hash: hash, buyer: body.Buyer, q: q})
	})
	if mismatch {
		res = ansKeyReused
	}
	s.write(c, res)
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

// requestHash fingerprints what a purchase asks for, so a reused key with a
// different request is caught.
func requestHash(sku stock.SKU, buyer string, q int64) string {
	h := sha256.Sum256([]byte(sku.Program + "\x00" + sku.Ticket + "\x00" + buyer + "\x00" + strconv.FormatInt(q, 10)))
	return hex.EncodeToString(h[:16])
}

// want is one request for stock: a purchase, or a hold when hold is set.
type want struct {
	sku   stock.SKU
	key   string // Idempotency-Key, and the request id of the Redis deduction
	hash  string
	buyer string
	q     int64
	hold  bool
	ttl   time.Duration // a hold's lifetime; 0 for the SKU's default
}

func (w want) order(gate string) ledger.Order {
	return ledger.Order{IdempotencyKey: w.key, RequestHash: w.hash, SKU: w.sku, Buyer: w.buyer, Quantity: w.q, Gate: gate}
}

// commit records the request in the ledger: through the gate (version < 0)
// or around it. On ErrDuplicate the answer carries what the key stored.
func (s *Server) commit(ctx context.Context, w want, st ledger.SKUState, gate string, version int64) (answer, error) {
	if w.hold {
		ttl := w.ttl
		if ttl == 0 {
			ttl = st.HoldTTL
		}
		h, err := s.ledger.Hold(ctx, ledger.Hold{IdempotencyKey: w.key, RequestHash: w.hash, SKU: w.sku, Buyer: w.buyer,
			Quantity: w.q, Gate: gate, ExpiresAt: time.Now().Add(ttl)}, version)
		return answer{status: http.StatusCreated, hold: &h}, err
	}
	var o ledger.Order
	var err error
	if version < 0 {
		o, err = s.committer.commit(w.order(gate))
	} else {
		// Around the gate: batched with this replica's other buyers of the
		// SKU, optimistic against other replicas (the ledger reads the
		// version in the batch's transaction).
		o, err = s.direct.commit(w.order(gate))
	}
	return answer{status: http.StatusCreated, order: o}, err
}

// lookup finds what an earlier attempt with this key committed, if any.
func (s *Server) lookup(ctx context.Context, w want) (answer, error) {
	if w.hold {
		h, err := s.ledger.HoldByKey(ctx, w.key)
		return answer{status: http.StatusCreated, hold: &h}, err
	}
	o, err := s.ledger.OrderByKey(ctx, w.key)
	return answer{status: http.StatusCreated, order: o}, err
}

// replay answers a retry with what its key committed, unless the key was
// used for a different request.
func (w want) replay(a answer) answer {
	stored := a.order.RequestHash
	if a.hold != nil {
		stored = a.hold.RequestHash
	}
	if stored != w.hash {
		return ansKeyReused
	}
	a.replayed = true
	return a
}

// take is the flow of a purchase or a hold: settings → cached sold-out →
// per-buyer quota → Redis deduction → ledger commit → answer, or straight
// to the ledger when Redis cannot be used. Every path that took stock and
// did not commit gives it back, and no path answers 2xx without a commit.
func (s *Server) take(ctx context.Context, w want) answer {
	st, err := s.settings.Get(ctx, w.sku)
	switch {
	case errors.Is(err, stock.ErrUnknownSKU):
		return ansUnknownSKU
	case err != nil:
		s.log.ErrorContext(ctx, "load sku settings", "sku", w.sku.String(), "err", err)
		return ansUnavailable
	}
	if w.q > st.MaxPerOrder {
		return refuse(http.StatusUnprocessableEntity, "quantity-over-limit",
			fmt.Sprintf("quantity %d over this ticket's maximum of %d per order", w.q, st.MaxPerOrder))
	}
	if w.hold && w.ttl != 0 && (w.ttl < ledger.MinHoldTTL || w.ttl > st.HoldTTLMax) {
		return refuse(http.StatusUnprocessableEntity, "invalid-field",
			fmt.Sprintf("ttl_seconds must be in %d..%d for this ticket", int(ledger.MinHoldTTL.Seconds()), int(st.HoldTTLMax.Seconds())))
	}
	if !st.EndedAt.IsZero() {
		return ansSaleEnded
	}
	if st.Seated {
		return refuse(http.StatusConflict, "seated", "this ticket sells specific seats: use seat holds")
	}
	if s.cache.SoldOut(w.sku) {
		// A retry of a request this replica completed still gets its answer,
		// not the sold-out its own success may have caused.
		if a, ok := s.completed.GetIfPresent(w.key); ok {
			return w.replay(a)
		}
		return ansSoldOut
	}
	if st.PerBuyer > 0 && w.q > st.PerBuyer {
		return ansLimit // more than the cap in one request; no count needed
	}
	if st.GateStale() && s.breaker.State() == breaker.Closed {
		// The ledger sold around Redis: rebuild before Redis serves again.
		if err := s.reseed(ctx, w.sku, reasonBypass, false); err != nil {
			return s.takeDirect(ctx, w, st)
		}
	}

	quota, qerr := s.takeQuota(ctx, w, st)
	switch {
	case errors.Is(qerr, stock.ErrLimit):
		return s.counted(pathGate, ansLimit)
	case qerr != nil && notRun(qerr):
		return s.takeDirect(ctx, w, st)
	case qerr != nil:
		s.log.ErrorContext(ctx, "quota", "sku", w.sku.String(), "err", qerr)
		return s.counted(pathGate, ansUnavailable)
	}
	req := shard.Request{SKU: w.sku, Shards: st.Shards, RequestID: w.key, Quantity: w.q, MaxQuantity: st.MaxPerOrder}
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
			s.cache.MarkSoldOut(w.sku)
		}
		quota.release(ctx)
		return s.counted(pathGate, ansSoldOut)
	case err != nil && notRun(err):
		// Nothing moved in Redis: the ledger can take this one directly.
		quota.release(ctx)
		return s.takeDirect(ctx, w, st)
	case err != nil:
		// Still unknown: never take it again by the other path. The client's
		// retry with the same key meets the deduction record.
		s.log.ErrorContext(ctx, "deduct", "sku", w.sku.String(), "err", err)
		return s.counted(pathGate, ansUnavailable)
	}

	if !d.Replayed {
		// Stock was there: a stale sold-out flag (the one re-check let
		// through) must not keep telling others it is gone.
		s.cache.ClearSoldOut(w.sku)
	}
	if d.Replayed {
		// This key took stock before. If that attempt committed, replay it;
		// otherwise the stock it took is ours to commit now, and the ledger's
		// unique key settles a race with the original attempt.
		prev, err := s.lookup(ctx, w)
		switch {
		case err == nil:
			return w.replay(prev)
		case !errors.Is(err, ledger.ErrNotFound):
			s.log.ErrorContext(ctx, "lookup by key", "err", err)
			return s.counted(pathGate, ansUnavailable)
		}
	}

	gateRecord, _ := json.Marshal(d.Parts)
	a, err := s.commit(ctx, w, st, string(gateRecord), -1)
	giveBack := func() {
		s.giveBack(ctx, w.sku, w.key, d.Parts)
		quota.release(ctx)
	}
	switch {
	case err == nil:
		s.count(pathGate, "sold")
		s.completed.Set(w.key, a)
		return a
	case errors.Is(err, ledger.ErrDuplicate):
		// Another attempt with this key committed first (on another replica,
		// through the ledger fallback, or before a Redis re-send). Stock
		// this call took fresh goes back.
		if !d.Replayed {
			s.giveBack(ctx, w.sku, w.key, d.Parts)
		}
		return w.replay(a)
	case errors.Is(err, stock.ErrSoldOut):
		// Redis admitted what the ledger refuses: Redis was ahead of the
		// truth (a write lost in a failover, sales around it). The ledger wins.
		s.metrics.ledgerRefusals.Inc()
		giveBack()
		return s.counted(pathGate, ansSoldOut)
	case errors.Is(err, stock.ErrLimit):
		giveBack()
		return s.counted(pathGate, ansLimit)
	case errors.Is(err, stock.ErrSaleEnded):
		giveBack()
		return s.counted(pathGate, ansSaleEnded)
	case errors.Is(err, ledger.ErrNotCommitted):
		s.log.ErrorContext(ctx, "ledger commit", "sku", w.sku.String(), "err", err)
		giveBack()
		return s.counted(pathGate, ansUnavailable)
	}
	// COMMIT failed and may have landed. Look before giving the stock back:
	// restoring stock that was in fact sold would let Redis admit a buyer
	// the ledger must refuse.
	s.log.ErrorContext(ctx, "ledger commit", "sku", w.sku.String(), "err", err)
	if prev, lerr := s.lookup(ctx, w); lerr == nil {
		return w.replay(prev)
	} else if errors.Is(lerr, ledger.ErrNotFound) {
		giveBack()
	}
	// Otherwise the stock stays taken in Redis: under-selling until the
	// drift check repairs it is the safe side of not knowing.
	return s.counted(pathGate, ansUnavailable)
}

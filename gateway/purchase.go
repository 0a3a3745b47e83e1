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

// answer is the outcome of one purchase, shared by joined duplicates.
type answer struct {
	status     int
	order      ledger.Order
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
		return s.buy(ctx, sku, key, hash, body.Buyer, q)
	})
	if mismatch {
		res = ansKeyReused
	}
	s.write(c, res)
}

func (s *Server) write(c *gin.Context, a answer) {
	switch {
	case a.status == http.StatusCreated:
		if a.replayed {
			c.Header("Idempotent-Replayed", "true")
		}
		c.Header("Location", "/v1/orders/"+a.order.ID)
		c.JSON(http.StatusCreated, viewOf(a.order))
	case a.status >= 400:
		if a.status >= 500 {
			s.log.Warn("purchase failed", "route", c.FullPath(), "status", a.status, "detail", a.detail)
		}
		writeProblem(c, a.status, a.kind, a.detail, a.retryAfter)
	default:
		s.log.Error("purchase produced no answer", "route", c.FullPath())
		writeProblem(c, http.StatusInternalServerError, "internal", "internal error", 0)
	}
}

// requestHash fingerprints what a purchase asks for, so a reused key with a
// different request is caught.
func requestHash(sku stock.SKU, buyer string, q int64) string {
	h := sha256.Sum256([]byte(sku.Program + "\x00" + sku.Ticket + "\x00" + buyer + "\x00" + strconv.FormatInt(q, 10)))
	return hex.EncodeToString(h[:16])
}

// buy is the purchase flow: settings → cached sold-out → Redis deduction →
// ledger commit → answer, or straight to the ledger when Redis cannot be
// used. Every path that took stock and did not commit gives it back, and no
// path answers 201 without a committed order.
func (s *Server) buy(ctx context.Context, sku stock.SKU, key, hash, buyer string, q int64) answer {
	st, err := s.settings.Get(ctx, sku)
	switch {
	case errors.Is(err, stock.ErrUnknownSKU):
		return ansUnknownSKU
	case err != nil:
		s.log.Error("load sku settings", "sku", sku.String(), "err", err)
		return ansUnavailable
	}
	if q > st.MaxPerOrder {
		return refuse(http.StatusUnprocessableEntity, "quantity-over-limit",
			fmt.Sprintf("quantity %d over this ticket's maximum of %d per order", q, st.MaxPerOrder))
	}
	if s.cache.SoldOut(sku) {
		return ansSoldOut
	}
	order := ledger.Order{IdempotencyKey: key, RequestHash: hash, SKU: sku, Buyer: buyer, Quantity: q}
	if st.GateStale() && s.breaker.State() == breaker.Closed {
		// The ledger sold around Redis: rebuild before Redis serves again.
		if err := s.reseed(ctx, sku, reasonBypass, false); err != nil {
			return s.buyDirect(ctx, order)
		}
	}

	req := shard.Request{SKU: sku, Shards: st.Shards, RequestID: key, Quantity: q, MaxQuantity: st.MaxPerOrder}
	d, err := s.deduct(ctx, req)
	if err != nil && !notRun(err) && !isOutcome(err) {
		// The outcome is unknown: the script may have run and its reply been
		// lost. Ask again with the same request id: its deduction record
		// answers for the first attempt, so stock moves at most once.
		s.log.Warn("deduct outcome unknown; asking again", "sku", sku.String(), "err", err)
		d, err = s.deduct(ctx, req)
	}
	switch {
	case errors.Is(err, stock.ErrSoldOut):
		s.cache.MarkSoldOut(sku)
		return s.counted(pathGate, ansSoldOut)
	case err != nil && notRun(err):
		// Nothing moved in Redis: the ledger can sell this one directly.
		return s.buyDirect(ctx, order)
	case err != nil:
		// Still unknown: never sell it again by the other path. The client's
		// retry with the same key meets the deduction record.
		s.log.Error("deduct", "sku", sku.String(), "err", err)
		return s.counted(pathGate, ansUnavailable)
	}

	if d.Replayed {
		// This key took stock before. If that attempt committed, replay it;
		// otherwise the stock it took is ours to commit now, and the ledger's
		// unique key settles a race with the original attempt.
		prev, err := s.ledger.OrderByKey(ctx, key)
		switch {
		case err == nil:
			return replay(prev, hash)
		case !errors.Is(err, ledger.ErrNotFound):
			s.log.Error("order by key", "err", err)
			return s.counted(pathGate, ansUnavailable)
		}
	}

	gateRecord, _ := json.Marshal(d.Parts)
	order.Gate = string(gateRecord)
	o, err := s.ledger.Purchase(ctx, order)
	switch {
	case err == nil:
		s.count(pathGate, "sold")
		return answer{status: http.StatusCreated, order: o}
	case errors.Is(err, ledger.ErrDuplicate):
		// Another attempt with this key committed first (on another replica,
		// through the ledger fallback, or before a Redis re-send). Stock
		// this call took fresh goes back.
		if !d.Replayed {
			s.giveBack(ctx, sku, key, d.Parts)
		}
		return replay(o, hash)
	case errors.Is(err, stock.ErrSoldOut):
		// Redis admitted what the ledger refuses: Redis was ahead of the
		// truth (a write lost in a failover, sales around it). The ledger wins.
		s.metrics.ledgerRefusals.Inc()
		s.giveBack(ctx, sku, key, d.Parts)
		return s.counted(pathGate, ansSoldOut)
	case errors.Is(err, ledger.ErrNotCommitted):
		s.log.Error("ledger purchase", "sku", sku.String(), "err", err)
		s.giveBack(ctx, sku, key, d.Parts)
		return s.counted(pathGate, ansUnavailable)
	}
	// COMMIT failed and may have landed. Look before giving the stock back:
	// restoring stock that was in fact sold would let Redis admit a buyer
	// the ledger must refuse.
	s.log.Error("ledger purchase commit", "sku", sku.String(), "err", err)
	if prev, lerr := s.ledger.OrderByKey(ctx, key); lerr == nil {
		return replay(prev, hash)
	} else if errors.Is(lerr, ledger.ErrNotFound) {
		s.giveBack(ctx, sku, key, d.Parts)
	}
	// Otherwise the stock stays taken in Redis: under-selling until the
	// drift check repairs it is the safe side of not knowing.
	return s.counted(pathGate, ansUnavailable)
}

func replay(o ledger.Order, hash string) answer {
	if o.RequestHash != hash {
		return ansKeyReused
	}
	return answer{status: http.StatusCreated, order: o, replayed: true}
}

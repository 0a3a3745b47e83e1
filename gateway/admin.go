package gateway

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

type skuBody struct {
	Total       *int64 `json:"total"`
	Shards      *int   `json:"shards"`
	MaxPerOrder *int64 `json:"max_per_order"`
	PerBuyer    *int64 `json:"per_buyer"`
	HoldTTL     *int64 `json:"hold_ttl_seconds"`
	HoldTTLMax  *int64 `json:"hold_ttl_max_seconds"`
}

type skuView struct {
	Program     string `json:"program"`
	Ticket      string `json:"ticket"`
	Total       int64  `json:"total"`
	Sold        int64  `json:"sold"`
	Held        int64  `json:"held"`
	Remaining   int64  `json:"remaining"`
	Shards      int    `json:"shards"`
	MaxPerOrder int64  `json:"max_per_order"`
	Version     int64  `json:"version"`
	PerBuyer    int64  `json:"per_buyer"`
	HoldTTL     int64  `json:"hold_ttl_seconds"`
	HoldTTLMax  int64  `json:"hold_ttl_max_seconds"`
	Ended       bool   `json:"ended"`
}

func skuViewOf(st ledger.SKUState) skuView {
	return skuView{Program: st.Program, Ticket: st.Ticket, Total: st.Total, Sold: st.Sold, Held: st.Held,
		Remaining: st.Remaining(), Shards: st.Shards, MaxPerOrder: st.MaxPerOrder, Version: st.Version,
		PerBuyer: st.PerBuyer, HoldTTL: int64(st.HoldTTL.Seconds()), HoldTTLMax: int64(st.HoldTTLMax.Seconds()),
		Ended: !st.EndedAt.IsZero()}
}

// putSKU handles PUT /v1/admin/skus/:program/:ticket: create a SKU or change
// its total, shard count or per-order maximum, then rebuild its Redis shards
// from the ledger. PUT is idempotent by nature: the same body twice leaves
// the same state.
func (s *Server) putSKU(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	var body skuBody
	if !s.decodeBody(c, &body) {
		return
	}
	cfg := ledger.SKUConfig{SKU: sku, Shards: 1}
	if body.Total == nil {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "total is required", 0)
		return
	}
	cfg.Total = *body.Total
	if body.Shards != nil {
		cfg.Shards = *body.Shards
	}
	cfg.MaxPerOrder = 10
	if body.MaxPerOrder != nil {
		cfg.MaxPerOrder = *body.MaxPerOrder
	}
	if body.PerBuyer != nil {
		cfg.PerBuyer = *body.PerBuyer
	}
	secs := func(p *int64) time.Duration {
		if p == nil {
			return 0
		}
		if *p < 1 || *p > int64(ledger.MaxHoldTTL/time.Second) {
			return -1 // refused by Validate
		}
		return time.Duration(*p) * time.Second
	}
	cfg.HoldTTL, cfg.HoldTTLMax = secs(body.HoldTTL), secs(body.HoldTTLMax)
	if err := cfg.Validate(); err != nil {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", err.Error(), 0)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request.Context()), s.opts.WorkTimeout)
	defer cancel()
	st, err := s.ledger.PutSKU(ctx, cfg)
	switch {
	case errors.Is(err, stock.ErrInvalid):
		writeProblem(c, http.StatusConflict, "total-below-committed", err.Error(), 0)
		return
	case err != nil:
		s.log.Error("put sku", "sku", sku.String(), "err", err)
		writeProblem(c, http.StatusServiceUnavailable, "unavailable", "ledger unavailable", 1)
		return
	}
	// The ledger change marked the gate stale; rebuild Redis from it now.
	// If that fails, the next purchase or drift check rebuilds it, and until
	// then the ledger's conditional update refuses anything Redis admits
	// beyond the truth.
	s.settings.Invalidate(sku)
	s.stock.Invalidate(sku)
	s.cache.ClearSoldOut(sku)
	if err := s.reseed(ctx, sku, reasonAdmin, true); err != nil {
		s.log.Error("re-seed after put sku", "sku", sku.String(), "err", err)
		writeProblem(c, http.StatusServiceUnavailable, "unavailable",
			"ledger updated but Redis not rebuilt yet; it will be rebuilt before it serves this SKU", 1)
		return
	}
	c.JSON(http.StatusOK, skuViewOf(st))
}

// getSKU handles GET /v1/admin/skus/:program/:ticket: the ledger row.
func (s *Server) getSKU(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	st, err := s.ledger.SKU(c.Request.Context(), sku)
	switch {
	case errors.Is(err, stock.ErrUnknownSKU):
		writeProblem(c, http.StatusNotFound, "unknown-sku", "no such program/ticket", 0)
	case err != nil:
		writeProblem(c, http.StatusServiceUnavailable, "unavailable", "ledger unavailable", 1)
	default:
		c.JSON(http.StatusOK, skuViewOf(st))
	}
}

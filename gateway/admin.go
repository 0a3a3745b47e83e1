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
	// A live SKU changes behind the fence: its gate closes, the ledger
	// changes, the shards are rebuilt from it, the gate reopens, so Redis
	// never admits more than the new total allows. A new SKU has no gate yet.
	var st ledger.SKUState
	putErr := error(nil)
	put := func(ctx context.Context) error {
		st, putErr = s.ledger.PutSKU(ctx, cfg)
		return putErr
	}
	var err error
	if _, lerr := s.ledger.SKU(ctx, sku); lerr == nil {
		_, err = s.rebuildWith(ctx, sku, reasonAdmin, true, s.opts.ReseedWait, put)
	} else if err = put(ctx); err == nil {
		err = s.reseed(ctx, sku, reasonAdmin, true)
	}
	s.settings.Invalidate(sku)
	s.stock.Invalidate(sku)
	s.cache.ClearSoldOut(sku)
	switch {
	case errors.Is(putErr, stock.ErrInvalid):
		writeProblem(c, http.StatusConflict, "total-below-committed", putErr.Error(), 0)
		return
	case putErr != nil:
		s.log.ErrorContext(ctx, "put sku", "sku", sku.String(), "err", putErr)
		writeProblem(c, http.StatusServiceUnavailable, "unavailable", "ledger unavailable", 1)
		return
	case st.Program == "":
		// The change never ran: the gate could not be closed.
		s.log.ErrorContext(ctx, "put sku: gate not closed", "sku", sku.String(), "err", err)
		writeProblem(c, http.StatusServiceUnavailable, "unavailable", "could not close the gate for the change; nothing changed", 1)
		return
	case err != nil:
		// The ledger changed and marked the gate stale; the next purchase or
		// drift check rebuilds it.
		s.log.ErrorContext(ctx, "re-seed after put sku", "sku", sku.String(), "err", err)
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

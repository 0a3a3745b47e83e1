package gateway

import (
	"context"
	"errors"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/stock"
)

// stockView is the public answer to "how many are left?".
type stockView struct {
	Program   string `json:"program"`
	Ticket    string `json:"ticket"`
	Remaining int64  `json:"remaining"`
	SoldOut   bool   `json:"sold_out"`
}

// getStock handles GET /v1/skus/:program/:ticket/stock, answered from the
// local cache; a miss loads it once for all concurrent readers.
func (s *Server) getStock(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	v, err := s.stock.Get(c.Request.Context(), sku)
	switch {
	case errors.Is(err, stock.ErrUnknownSKU):
		writeProblem(c, http.StatusNotFound, "unknown-sku", "no such program/ticket", 0)
	case err != nil:
		writeProblem(c, http.StatusServiceUnavailable, "unavailable", "stock temporarily unavailable", 1)
	default:
		c.Header("Cache-Control", "max-age=1")
		c.JSON(http.StatusOK, v)
	}
}

// loadStock reads the gate's view (what buyers can still get), or the
// ledger's when Redis is unavailable, unseeded or behind ledger sales.
func (s *Server) loadStock(ctx context.Context, sku stock.SKU) (stockView, error) {
	st, err := s.settings.Get(ctx, sku)
	if err != nil {
		return stockView{}, err
	}
	var left int64
	seeded := false
	err = s.redis(ctx, func(ctx context.Context) (err error) {
		left, seeded, err = s.gate.Remaining(ctx, sku, st.Shards)
		return err
	})
	if err != nil || !seeded || st.GateStale() {
		fresh, lerr := s.ledger.SKU(ctx, sku)
		if lerr != nil {
			return stockView{}, errors.Join(err, lerr)
		}
		left = fresh.Remaining()
	}
	return stockView{Program: sku.Program, Ticket: sku.Ticket, Remaining: left, SoldOut: left == 0}, nil
}

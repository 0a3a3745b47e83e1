package gateway

import (
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/sale"
)

type skuBody struct {
	Total       *int64 `json:"total"`
	Shards      *int   `json:"shards"`
	MaxPerOrder *int64 `json:"max_per_order"`
	PerBuyer    *int64 `json:"per_buyer"`
	HoldTTL     *int64 `json:"hold_ttl_seconds"`
	HoldTTLMax  *int64 `json:"hold_ttl_max_seconds"`
	// Resale absent keeps the SKU's mode; "" is no mode (422), not
	// absent: an empty template variable is a mistake (helper-106 #3).
	Resale *string `json:"resale"`
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
	Listed      int64  `json:"listed"`
	Resale      string `json:"resale"`
}

func skuViewOf(st sale.SKUState) skuView {
	return skuView{Program: st.SKU.Program.String(), Ticket: st.SKU.Ticket.String(), Total: st.Total, Sold: st.Sold, Held: st.Held,
		Remaining: st.Remain, Shards: st.Shards, MaxPerOrder: st.MaxPerOrder, Version: st.Version,
		PerBuyer: st.PerBuyer, HoldTTL: int64(st.HoldTTL.Seconds()), HoldTTLMax: int64(st.HoldTTLMax.Seconds()),
		Ended: st.Ended, Listed: st.Listed, Resale: st.Resale}
}

// putSKU handles PUT /v1/admin/skus/:program/:ticket: create a SKU or change
// its total, shard count or per-order maximum. PUT is idempotent by nature:
// the same body twice leaves the same state.
func (s *Server) putSKU(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	var body skuBody
	if !s.decodeBody(c, &body) {
		return
	}
	if body.Total == nil {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "total is required", 0)
		return
	}
	cfg := sale.SKUConfig{SKU: sku, Total: *body.Total, Shards: 1, MaxPerOrder: 10}
	if body.Resale != nil {
		if *body.Resale == "" {
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "resale is first or alongside (absent keeps the SKU's)", 0)
			return
		}
		cfg.Resale = *body.Resale
	}
	if body.Shards != nil {
		cfg.Shards = *body.Shards
	}
	if body.MaxPerOrder != nil {
		cfg.MaxPerOrder = *body.MaxPerOrder
	}
	if body.PerBuyer != nil {
		cfg.PerBuyer = *body.PerBuyer
	}
	for name, p := range map[string]*int64{"hold_ttl_seconds": body.HoldTTL, "hold_ttl_max_seconds": body.HoldTTLMax} {
		// Bounded here, in the unit the client sent: past it, seconds
		// overflow a Duration, and the config's own check would name a
		// value the client never wrote.
		if p != nil && (*p < 1 || *p > int64(sale.MaxHoldTTL/time.Second)) {
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field",
				fmt.Sprintf("%s must be in 1..%d, not %d", name, int64(sale.MaxHoldTTL/time.Second), *p), 0)
			return
		}
	}
	secs := func(p *int64) time.Duration {
		if p == nil {
			return 0
		}
		return time.Duration(*p) * time.Second
	}
	cfg.HoldTTL, cfg.HoldTTLMax = secs(body.HoldTTL), secs(body.HoldTTLMax)
	st, err := s.sale.PutSKU(c.Request.Context(), cfg)
	if err != nil {
		s.writeError(c, err)
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
	st, err := s.sale.SKU(c.Request.Context(), sku)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, skuViewOf(st))
}

// endSale handles POST /v1/admin/skus/:program/:ticket/end.
func (s *Server) endSale(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	st, err := s.sale.EndSale(c.Request.Context(), sku)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, skuViewOf(st))
}

// rebuildView is the body of a reconcile.
type rebuildView struct {
	RedisBefore int64 `json:"redis_before"`
	Ledger      int64 `json:"ledger_remaining"`
	Shards      int   `json:"shards"`
	Rebuilt     bool  `json:"rebuilt"`
}

// reconcile handles POST /v1/admin/skus/:program/:ticket/reconcile.
func (s *Server) reconcile(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	pool, ok := poolQuery(c)
	if !ok {
		return
	}
	r, err := s.sale.Reconcile(c.Request.Context(), sale.PoolSKU(sku, pool))
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, rebuildView{RedisBefore: r.RedisBefore, Ledger: r.Ledger, Shards: r.Shards, Rebuilt: r.Rebuilt})
}

// putProgram handles PUT /v1/admin/programs/:program: {"per_buyer": n}
// caps what one buyer may hold + own of all the program's tickets;
// "hold_budget" what one buyer may hold at once across them, and
// "device_hold_budget" what one Buyer-Fingerprint may (both optional); 0
// removes each.
func (s *Server) putProgram(c *gin.Context) {
	program, err := keys.ParseID(c.Param("program"))
	if err != nil {
		writeProblem(c, http.StatusBadRequest, "invalid-id", "program ids match [A-Za-z0-9_-]{1,64}", 0)
		return
	}
	var body struct {
		PerBuyer         *int64 `json:"per_buyer"`
		HoldBudget       int64  `json:"hold_budget"`
		DeviceHoldBudget int64  `json:"device_hold_budget"`
	}
	if !s.decodeBody(c, &body) {
		return
	}
	if body.PerBuyer == nil {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "per_buyer must be an integer >= 0", 0)
		return
	}
	p := sale.Program{ID: program, PerBuyer: *body.PerBuyer, HoldBudget: body.HoldBudget, DeviceHoldBudget: body.DeviceHoldBudget}
	if err = s.sale.PutProgram(c.Request.Context(), p); err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"program": program.String(), "per_buyer": p.PerBuyer,
		"hold_budget": p.HoldBudget, "device_hold_budget": p.DeviceHoldBudget})
}

// organizerOrderBody is an order the organizer gives: comps, or a sale at
// the box office.
type organizerOrderBody struct {
	Buyer    string `json:"buyer"`
	Quantity *int64 `json:"quantity"`
	Channel  string `json:"channel"`
}

// postOrganizerOrder handles POST /v1/admin/skus/:program/:ticket/orders:
// an order of the SKU's public stock through the gate, as a purchase is
// (caps and stock apply, no waiting room), that the report counts as comps
// or box office by its channel. 201 with the order; the key makes it once.
func (s *Server) postOrganizerOrder(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	ask, ok := s.ask(c)
	if !ok {
		return
	}
	var body organizerOrderBody
	if !s.decodeBody(c, &body) {
		return
	}
	if ask.Buyer, ok = buyerField(c, body.Buyer); !ok {
		return
	}
	switch {
	case body.Quantity == nil || *body.Quantity < 1:
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "quantity must be an integer >= 1", 0)
		return
	case body.Channel != "comp" && body.Channel != "box_office":
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "channel must be comp or box_office", 0)
		return
	}
	s.written(c, http.StatusCreated)(s.sale.Purchase(c.Request.Context(), sale.Take{Ask: ask, SKU: sku, Quantity: *body.Quantity, Channel: body.Channel}))
}

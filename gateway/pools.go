package gateway

import (
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// poolBody is what an admin sets on a pool.
type poolBody struct {
	Allotment *int64     `json:"allotment"`
	Shards    *int       `json:"shards"`
	OpensAt   *time.Time `json:"opens_at"`
	ClosesAt  *time.Time `json:"closes_at"`
	// Access is open (absent), code or channel; "" is none of them (422):
	// read as absent, one empty template variable opened a code presale
	// to everyone (helper-106 #3).
	Access       *string `json:"access"`
	ChannelToken string  `json:"channel_token"`
	Into         string  `json:"into"` // default public
}

type poolView struct {
	Pool      string     `json:"pool"`
	Total     int64      `json:"allotment"`
	Sold      int64      `json:"sold"`
	Held      int64      `json:"held"`
	Remaining int64      `json:"remaining"`
	Shards    int        `json:"shards"`
	OpensAt   *time.Time `json:"opens_at,omitempty"`
	ClosesAt  *time.Time `json:"closes_at,omitempty"`
	ClosedAt  *time.Time `json:"closed_at,omitempty"`
	Access    string     `json:"access"`
	Into      string     `json:"into,omitempty"`
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func poolViewOf(p sale.PoolState) poolView {
	return poolView{Pool: p.Pool.String(), Total: p.Total, Sold: p.Sold, Held: p.Held, Remaining: p.Remain, Shards: p.Shards,
		OpensAt: timeOrNil(p.OpensAt), ClosesAt: timeOrNil(p.ClosesAt), ClosedAt: timeOrNil(p.ClosedAt), Access: p.Access,
		Into: p.Into.String()}
}

// skuPoolParams parses the ticket and the :pool of an admin pool route.
func skuPoolParams(c *gin.Context) (stock.SKU, keys.ID, bool) {
	sku, ok := skuParam(c)
	if !ok {
		return sku, keys.ID{}, false
	}
	pool, ok := poolParam(c)
	return sku, pool, ok
}

// poolParam parses the :pool of the path.
func poolParam(c *gin.Context) (keys.ID, bool) {
	pool, err := keys.ParseID(c.Param("pool"))
	if err != nil {
		writeProblem(c, http.StatusBadRequest, "invalid-id", "pool ids match [A-Za-z0-9_-]{1,64}", 0)
		return keys.ID{}, false
	}
	return pool, true
}

// putPool handles PUT /v1/admin/skus/:program/:ticket/pools/:pool: create a
// pool of the ticket or change it; its allotment comes from (or goes back
// to) the public pool.
func (s *Server) putPool(c *gin.Context) {
	sku, pool, ok := skuPoolParams(c)
	if !ok {
		return
	}
	var body poolBody
	if !s.decodeBody(c, &body) {
		return
	}
	if body.Allotment == nil {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "allotment is required", 0)
		return
	}
	spec := sale.PoolSpec{SKU: sku, Pool: pool, Allotment: *body.Allotment, Shards: 1, Access: sale.AccessOpen, Channel: body.ChannelToken}
	if body.Access != nil {
		spec.Access = *body.Access
	}
	if body.Shards != nil {
		if *body.Shards < 1 {
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "shards must be at least 1", 0)
			return
		}
		spec.Shards = *body.Shards
	}
	if body.OpensAt != nil {
		spec.OpensAt = *body.OpensAt
	}
	if body.ClosesAt != nil {
		spec.ClosesAt = *body.ClosesAt
	}
	if body.Into != "" {
		into, err := keys.ParseID(body.Into)
		if err != nil {
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "into must name a pool ([A-Za-z0-9_-]{1,64})", 0)
			return
		}
		spec.Into = into
	}
	switch spec.Access {
	case sale.AccessOpen, sale.AccessCode, sale.AccessChannel:
	default:
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "access is open, code or channel", 0)
		return
	}
	st, err := s.sale.PutPool(c.Request.Context(), spec)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, poolViewOf(st))
}

// getPools handles GET /v1/admin/skus/:program/:ticket/pools: every pool of
// the ticket with what it sold, holds and has left, the public one first.
func (s *Server) getPools(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	ps, err := s.sale.Pools(c.Request.Context(), sku)
	if err != nil {
		s.writeError(c, err)
		return
	}
	out := make([]poolView, 0, len(ps))
	for _, p := range ps {
		out = append(out, poolViewOf(p))
	}
	c.JSON(http.StatusOK, gin.H{"program": sku.Program.String(), "ticket": sku.Ticket.String(), "pools": out})
}

// closePool handles POST /v1/admin/skus/:program/:ticket/pools/:pool/close:
// the pool closes now and what it has left moves on, once.
func (s *Server) closePool(c *gin.Context) {
	sku, pool, ok := skuPoolParams(c)
	if !ok {
		return
	}
	st, err := s.sale.ClosePool(c.Request.Context(), sku, pool)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, poolViewOf(st))
}

// codesBody adds access codes to a code pool: the given ones, and
// `generate` new random ones with `max_uses` uses each.
type codesBody struct {
	Codes []struct {
		Code    string `json:"code"`
		MaxUses int64  `json:"max_uses"`
		Buyer   string `json:"buyer"`
	} `json:"codes"`
	Generate int   `json:"generate"`
	MaxUses  int64 `json:"max_uses"`
}

// postCodes handles POST /v1/admin/skus/:program/:ticket/pools/:pool/codes.
// The generated codes are in the answer and nowhere else: only hashes are
// kept.
func (s *Server) postCodes(c *gin.Context) {
	sku, pool, ok := skuPoolParams(c)
	if !ok {
		return
	}
	var body codesBody
	if !s.decodeBodyMax(c, &body, 1<<20) {
		return
	}
	specs := make([]sale.CodeSpec, 0, len(body.Codes))
	for i, b := range body.Codes {
		spec := sale.CodeSpec{Code: b.Code, MaxUses: b.MaxUses}
		if b.Buyer != "" {
			buyer, err := keys.ParseID(b.Buyer)
			if err != nil {
				writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", fmt.Sprintf("codes[%d].buyer must match [A-Za-z0-9_-]{1,64}", i), 0)
				return
			}
			spec.Buyer = buyer
		}
		specs = append(specs, spec)
	}
	added, generated, err := s.sale.PutCodes(c.Request.Context(), sku, pool, specs, body.Generate, body.MaxUses)
	if err != nil {
		s.writeError(c, err)
		return
	}
	if generated == nil {
		generated = []string{}
	}
	c.JSON(http.StatusOK, gin.H{"added": added, "generated": generated})
}

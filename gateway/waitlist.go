package gateway

import (
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// waitView is a buyer's waitlist entry as the API shows it.
type waitView struct {
	Program  string `json:"program"`
	Ticket   string `json:"ticket"`
	Pool     string `json:"pool,omitempty"`
	Buyer    string `json:"buyer"`
	Quantity int64  `json:"quantity"`
	// State: waiting, offered (confirm the offer's hold to buy), bought,
	// lapsed (the offer expired), declined (its hold was cancelled), left,
	// closed (no offer will come: the sale ended, the pool closed or is
	// no longer open to all, seats came, or a waiting room).
	State string `json:"state"`
	// Position is the place in line (1 = next) and Ahead the buyers
	// before it, while waiting.
	Position        int64     `json:"position,omitempty"`
	Ahead           *int64    `json:"ahead,omitempty"`
	OfferTTLSeconds int64     `json:"offer_ttl_seconds"`
	JoinedAt        time.Time `json:"joined_at"`
	Offer           *holdView `json:"offer,omitempty"`
}

func waitViewOf(e sale.WaitEntry) waitView {
	v := waitView{Program: e.SKU.Program.String(), Ticket: e.SKU.Base().Ticket.String(), Pool: e.SKU.Pool().String(),
		Buyer: e.Buyer.String(), Quantity: e.Quantity, State: e.State, OfferTTLSeconds: int64(e.OfferTTL / time.Second),
		JoinedAt: e.JoinedAt}
	if e.State == sale.WaitWaiting {
		ahead := e.Ahead
		v.Ahead, v.Position = &ahead, ahead+1
	}
	if e.Offer != nil {
		h := holdViewOf(*e.Offer)
		v.Offer = &h
	}
	return v
}

// waitBody is the JSON of a join: how many units the buyer wants (default
// 1), all of which an offer holds.
type waitBody struct {
	Quantity *int64 `json:"quantity"`
}

// waitParams reads the ticket, the ?pool= and the buyer of a waitlist
// route.
func waitParams(c *gin.Context) (stock.SKU, keys.ID, keys.ID, bool) {
	sku, ok := skuParam(c)
	if !ok {
		return sku, keys.ID{}, keys.ID{}, false
	}
	pool, ok := poolQuery(c)
	if !ok {
		return sku, pool, keys.ID{}, false
	}
	buyer, err := keys.ParseID(c.Param("buyer"))
	if err != nil {
		writeProblem(c, http.StatusBadRequest, "invalid-id", "buyer ids match [A-Za-z0-9_-]{1,64}", 0)
		return sku, pool, buyer, false
	}
	return sku, pool, buyer, true
}

// joinWaitlist handles PUT /v1/skus/:program/:ticket/waitlist/:buyer: 201
// with the new entry, or 200 with the entry the buyer already has.
func (s *Server) joinWaitlist(c *gin.Context) {
	sku, pool, buyer, ok := waitParams(c)
	if !ok {
		return
	}
	// No body at all is a join for one unit; a body must be valid.
	var body waitBody
	if !s.decodeOptionalBody(c, &body) {
		return
	}
	q := int64(1)
	if body.Quantity != nil {
		q = *body.Quantity
	}
	if q < 1 {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "quantity must be at least 1", 0)
		return
	}
	e, created, err := s.sale.JoinWaitlist(c.Request.Context(), sku, pool, buyer, q)
	if err != nil {
		s.writeError(c, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	c.JSON(status, waitViewOf(e))
}

// getWaitlist handles GET /v1/skus/:program/:ticket/waitlist/:buyer.
func (s *Server) getWaitlist(c *gin.Context) {
	sku, pool, buyer, ok := waitParams(c)
	if !ok {
		return
	}
	e, err := s.sale.WaitEntry(c.Request.Context(), sku, pool, buyer)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, waitViewOf(e))
}

// leaveWaitlist handles DELETE /v1/skus/:program/:ticket/waitlist/:buyer.
func (s *Server) leaveWaitlist(c *gin.Context) {
	sku, pool, buyer, ok := waitParams(c)
	if !ok {
		return
	}
	e, err := s.sale.LeaveWaitlist(c.Request.Context(), sku, pool, buyer)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, waitViewOf(e))
}

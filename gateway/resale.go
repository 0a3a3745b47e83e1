package gateway

import (
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// listingView is a listing as the API shows it.
type listingView struct {
	ListingID string     `json:"listing_id"`
	Program   string     `json:"program"`
	Ticket    string     `json:"ticket"`
	OrderID   string     `json:"order_id"`
	Seller    string     `json:"seller"`
	Quantity  int64      `json:"quantity"`
	Sold      int64      `json:"sold"`
	Withdrawn int64      `json:"withdrawn"`
	State     string     `json:"state"`
	CreatedAt time.Time  `json:"created_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
}

func listingViewOf(x sale.Listing) listingView {
	v := listingView{ListingID: x.ID.String(), Program: x.SKU.Program.String(), Ticket: x.SKU.Ticket.String(),
		OrderID: x.OrderID.String(), Seller: x.Seller.String(), Quantity: x.Quantity, Sold: x.Sold,
		Withdrawn: x.Withdrawn, State: x.State, CreatedAt: x.CreatedAt}
	if !x.EndedAt.IsZero() {
		v.EndedAt = &x.EndedAt
	}
	return v
}

// resaleBody lists quantity of an order's tickets for resale.
type resaleBody struct {
	Buyer    string `json:"buyer"`
	Quantity *int64 `json:"quantity"`
}

func (b *resaleBody) buyer() string { return b.Buyer }

// listForResale handles POST /v1/orders/:id/resale: 201 with the listing.
func (s *Server) listForResale(c *gin.Context) {
	var body resaleBody
	id, ask, ok := s.ownerAsk(c, "order", &body)
	if !ok {
		return
	}
	if body.Quantity == nil || *body.Quantity < 1 || *body.Quantity > stock.MaxPerOrderCap {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "quantity must be an integer in 1..1000", 0)
		return
	}
	s.written(c, http.StatusCreated)(s.sale.ListForResale(c.Request.Context(), id, ask, *body.Quantity))
}

// withdrawListing handles POST /v1/listings/:id/withdraw: the listing,
// its unsold tickets off sale.
func (s *Server) withdrawListing(c *gin.Context) {
	var body ownerBody
	id, ask, ok := s.ownerAsk(c, "listing", &body)
	if !ok {
		return
	}
	s.written(c, http.StatusOK)(s.sale.WithdrawListing(c.Request.Context(), id, ask))
}

// getListing handles GET /v1/listings/:id.
func (s *Server) getListing(c *gin.Context) {
	id, ok := idParam(c, "listing")
	if !ok {
		return
	}
	x, err := s.sale.ListingByID(c.Request.Context(), id)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, listingViewOf(x))
}

package gateway

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// transferBody moves quantity of an order's tickets (absent: all) from
// its buyer to another.
type transferBody struct {
	Buyer    string `json:"buyer"`
	To       string `json:"to"`
	Quantity *int64 `json:"quantity"`
}

// transferOrder handles POST /v1/orders/:id/transfer: the receiver's order
// (the same order when all its tickets moved).
func (s *Server) transferOrder(c *gin.Context) {
	var body transferBody
	id, ask, ok := s.ownerAsk(c, "order", &body)
	if !ok {
		return
	}
	to, err := keys.ParseID(body.To)
	if err != nil {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "to must match [A-Za-z0-9_-]{1,64}", 0)
		return
	}
	var q int64
	if body.Quantity != nil {
		if q = *body.Quantity; q < 1 || q > stock.MaxPerOrderCap {
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "quantity out of bounds", 0)
			return
		}
	}
	s.written(c, http.StatusOK)(s.sale.Transfer(c.Request.Context(), id, ask, to, q))
}

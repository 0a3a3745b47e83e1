package gateway

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/sale"
)

// eventView is an event as the API shows it: a pool's stock is named by
// its ticket and pool.
type eventView struct {
	Seq      int64     `json:"seq"`
	ID       string    `json:"id"`
	Type     string    `json:"type"`
	Program  string    `json:"program"`
	Ticket   string    `json:"ticket"`
	Pool     string    `json:"pool,omitempty"`
	Subject  string    `json:"subject,omitempty"`
	OrderID  string    `json:"order_id,omitempty"`
	Buyer    string    `json:"buyer,omitempty"`
	CartID   string    `json:"cart_id,omitempty"`
	Quantity int64     `json:"quantity,omitempty"`
	ToPool   *string   `json:"to_pool,omitempty"` // pool.moved: where ("public" for the public pool)
	At       time.Time `json:"at"`
}

type eventsView struct {
	Events []eventView `json:"events"`
	// Next is the after to read on from: the last event's seq (after as
	// given when there were none).
	Next int64 `json:"next"`
}

func eventViewOf(e sale.Event) eventView {
	v := eventView{Seq: e.Seq, ID: e.ID.String(), Type: e.Type, Program: e.SKU.Program.String(), Ticket: e.SKU.Base().Ticket.String(),
		Pool: e.SKU.Pool().String(), Subject: e.Subject.String(), OrderID: e.Order.String(), Buyer: e.Buyer.String(),
		CartID: e.Cart.String(), Quantity: e.Quantity, At: e.At}
	if !e.To.IsZero() {
		to := e.To.Pool().String()
		if to == "" {
			to = sale.PublicPool.String()
		}
		v.ToPool = &to
	}
	return v
}

// getEvents handles GET /v1/admin/events?program=&after=&limit=: the
// outbox's events after seq `after`, in order, up to limit (default 100).
func (s *Server) getEvents(c *gin.Context) {
	var program keys.ID
	if text := c.Query("program"); text != "" {
		var err error
		if program, err = keys.ParseID(text); err != nil {
			writeProblem(c, http.StatusBadRequest, "invalid-id", "program ids match [A-Za-z0-9_-]{1,64}", 0)
			return
		}
	}
	after, err := strconv.ParseInt(c.DefaultQuery("after", "0"), 10, 64)
	limit, lerr := strconv.Atoi(c.DefaultQuery("limit", "100"))
	if err != nil || lerr != nil || after < 0 || limit < 1 || limit > sale.MaxEventsPage {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", fmt.Sprintf("query: after is a seq >= 0, limit an integer in 1..%d", sale.MaxEventsPage), 0)
		return
	}
	got, err := s.sale.Events(c.Request.Context(), program, after, limit)
	if err != nil {
		s.writeError(c, err)
		return
	}
	v := eventsView{Events: make([]eventView, 0, len(got)), Next: after}
	for _, e := range got {
		v.Events = append(v.Events, eventViewOf(e))
		v.Next = e.Seq
	}
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusOK, v)
}

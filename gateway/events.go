package gateway

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/client/webhook"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/sale"
)

type eventsView struct {
	Events []webhook.Event `json:"events"`
	// Next is the after to read on from: the last event's seq (after as
	// given when there were none).
	Next int64 `json:"next"`
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
	v := eventsView{Events: make([]webhook.Event, 0, len(got)), Next: after}
	for _, e := range got {
		v.Events = append(v.Events, e)
		v.Next = e.Seq
	}
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusOK, v)
}

// missingEventsBody is POST /v1/admin/events/missing's body.
type missingEventsBody struct {
	IDs []string `json:"ids"`
}

// missingEvents handles POST /v1/admin/events/missing: of the event ids a
// sink received (a webhook receiver's de-duplication store, a stream's
// entries), those no primary of the ledger has. After a failover to a
// standby that lacked the old primary's last commits, they are the
// changes the platform was told of and the ledger lost (OPERATIONS.md).
func (s *Server) missingEvents(c *gin.Context) {
	var body missingEventsBody
	if !s.decodeBodyMax(c, &body, 1<<20) {
		return
	}
	if body.IDs == nil {
		// Absent or null: a script that sent nothing must not read
		// "nothing missing" (an empty list is asked for as [], and answered).
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "ids: required (a list, [] for none)", 0)
		return
	}
	if len(body.IDs) > sale.MaxEventIDs {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field",
			fmt.Sprintf("ids: at most %d at once", sale.MaxEventIDs), 0)
		return
	}
	ids := make([]keys.ID, len(body.IDs))
	for i, text := range body.IDs {
		id, err := keys.ParseID(text)
		if err != nil {
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", fmt.Sprintf("ids[%d] must match [A-Za-z0-9_-]{1,64}", i), 0)
			return
		}
		ids[i] = id
	}
	missing, err := s.sale.MissingEvents(c.Request.Context(), ids)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusOK, gin.H{"missing": missing, "checked": len(ids)})
}

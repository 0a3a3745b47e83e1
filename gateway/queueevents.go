package gateway

import (
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/waitroom"
)

// A waiting buyer may follow its place as Server-Sent Events instead of
// polling: GET /v1/programs/:program/queue/:ticket/events. The stream is
// answered from the same memory of the line as a check (no Redis call per
// buyer), sends a "status" event (the check's JSON) whenever what the
// buyer would see changes, and ends after a final state (admitted,
// expired), after queueStreamLife (the client reconnects, maybe to another
// replica), or when the server drains. Sold-out is told and the stream
// goes on: a returned ticket re-opens the line, and the next buyer hears
// it as promptly.

const (
	// queueStreamLife bounds one stream, so connections move between
	// replicas as they come and go.
	queueStreamLife = 5 * time.Minute
	// queueHeartbeat keeps idle proxies from closing a quiet stream.
	queueHeartbeat = 15 * time.Second
	// queueRetryMS is the reconnection delay the stream asks clients for.
	queueRetryMS = "2000"
)

// queueEvents handles GET /v1/programs/:program/queue/:ticket/events.
func (s *Server) queueEvents(c *gin.Context) {
	program, ok := programParam(c)
	if !ok {
		return
	}
	ctx := c.Request.Context()
	ticket := c.Param("ticket")
	st, err := s.rooms.Check(ctx, program, ticket)
	if err != nil {
		s.roomError(c, err) // a bad ticket is a problem, not a stream
		return
	}
	h := c.Writer.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx: pass events on at once
	c.Status(http.StatusOK)
	write := func(lines string) bool {
		if _, err := c.Writer.WriteString(lines); err != nil {
			return false
		}
		c.Writer.Flush()
		return true
	}
	if !write("retry: " + queueRetryMS + "\n\n") {
		return
	}
	var last []byte
	send := func(st waitroom.Status) bool {
		v := queueStatusViewOf(st)
		v.WaitSeconds = int64(max(st.Wait, 0) / time.Second)
		// as_of moves at every reading of the line: an event goes out
		// when anything else changed.
		asOf := v.AsOf
		v.AsOf = time.Time{}
		b := v.appendJSON(nil)
		if string(b) == string(last) {
			return true
		}
		last = b
		v.AsOf = asOf
		return write("event: status\ndata: " + string(v.appendJSON(nil)) + "\n\n")
	}
	tick := time.NewTicker(waitroom.Refresh)
	defer tick.Stop()
	beat := time.NewTicker(queueHeartbeat)
	defer beat.Stop()
	end := time.NewTimer(queueStreamLife)
	defer end.Stop()
	changes := s.rooms.Changes(program)
	for {
		if !send(st) || final(st.State) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-s.draining:
			return
		case <-end.C:
			return
		case <-beat.C:
			if !write(": keep-alive\n\n") {
				return
			}
			continue
		case <-tick.C:
		case <-changes: // the line moved (a notice from any replica)
		}
		changes = s.rooms.Changes(program)
		if st, err = s.rooms.Check(ctx, program, ticket); err != nil {
			// Redis or the ledger away for a moment: the client reconnects.
			write("event: error\ndata: {\"type\":\"" + roomCode(err) + "\"}\n\n")
			return
		}
	}
}

// final says a buyer in this state has nothing more to wait for.
func final(state string) bool {
	return state == waitroom.Admitted || state == waitroom.Expired
}

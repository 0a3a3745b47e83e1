package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/client/webhook"
	"github.com/stockgate/stockgate/relay"
)

// Relay is what the /v1/admin/relay routes ask of the outbox relay, in
// its own words (package relay); its errors are answered by relayError.
type Relay interface {
	Sinks(ctx context.Context) ([]relay.SinkStats, error)
	DeadLetters(ctx context.Context, sink string, after int64, limit int) ([]relay.DeadLetter, error)
	Redeliver(ctx context.Context, sink string, seq int64) (relay.DeadLetter, error)
}

// relayError answers a relay's error: its own refusals by their problem,
// anything else (the ledger behind it) 503.
func (s *Server) relayError(c *gin.Context, err error) {
	switch {
	case errors.Is(err, relay.ErrUnknownSink):
		writeProblem(c, http.StatusNotFound, "unknown-sink", "no relay sink of that name", 0)
	case errors.Is(err, relay.ErrUnknownDeadLetter):
		writeProblem(c, http.StatusNotFound, "unknown-dead-letter", "no dead letter of that sink and seq", 0)
	case errors.Is(err, relay.ErrRedeliveryFailed):
		writeProblem(c, http.StatusBadGateway, "redelivery-failed", err.Error(), 0)
	case errors.Is(err, relay.ErrInvalid):
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", err.Error(), 0)
	default:
		s.log.WarnContext(c.Request.Context(), "relay admin failed", "route", c.FullPath(), "err", err)
		writeProblem(c, http.StatusServiceUnavailable, "unavailable", "the ledger is unavailable", retryAfter(time.Second))
	}
}

type relaySinkView struct {
	Name    string     `json:"name"`
	Backlog int64      `json:"backlog"`
	Oldest  *time.Time `json:"oldest,omitempty"`
	// LagSeconds is the age of the oldest undelivered event (0 with none).
	LagSeconds float64 `json:"lag_seconds"`
	Dead       int64   `json:"dead_letters"`
	Leased     int     `json:"partitions_leased"`
}

type deadLetterView struct {
	Sink      string        `json:"sink"`
	Event     webhook.Event `json:"event"`
	Attempts  int           `json:"attempts"`
	LastError string        `json:"last_error"`
	DeadAt    time.Time     `json:"dead_at"`
}

func deadLetterViewOf(d relay.DeadLetter) deadLetterView {
	return deadLetterView{Sink: d.Sink, Event: d.Event, Attempts: d.Attempts, LastError: d.LastError, DeadAt: d.DeadAt}
}

// noSink answers for a sink the relay does not have (or with no relay).
func noSink(c *gin.Context, sink string) {
	writeProblem(c, http.StatusNotFound, "unknown-sink", fmt.Sprintf("no relay sink %q", sink), 0)
}

// getRelay handles GET /v1/admin/relay: every sink's backlog, lag, dead
// letters and leased partitions.
func (s *Server) getRelay(c *gin.Context) {
	v := struct {
		Sinks []relaySinkView `json:"sinks"`
	}{Sinks: []relaySinkView{}}
	if s.opts.Relay != nil {
		got, err := s.opts.Relay.Sinks(c.Request.Context())
		if err != nil {
			s.relayError(c, err)
			return
		}
		for _, k := range got {
			sv := relaySinkView{Name: k.Name, Backlog: k.Backlog, LagSeconds: k.Lag.Seconds(), Dead: k.Dead, Leased: k.Leased}
			if !k.Oldest.IsZero() {
				sv.Oldest = &k.Oldest
			}
			v.Sinks = append(v.Sinks, sv)
		}
	}
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusOK, v)
}

// getDeadLetters handles GET /v1/admin/relay/dead?sink=&after=&limit=: a
// sink's dead letters after seq `after`, up to limit (default 100).
func (s *Server) getDeadLetters(c *gin.Context) {
	sink := c.Query("sink")
	after, err := strconv.ParseInt(c.DefaultQuery("after", "0"), 10, 64)
	limit, lerr := strconv.Atoi(c.DefaultQuery("limit", "100"))
	if sink == "" || err != nil || lerr != nil || after < 0 || limit < 1 || limit > relay.MaxDeadLettersPage {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field",
			fmt.Sprintf("query: sink is required, after is a seq >= 0, limit an integer in 1..%d", relay.MaxDeadLettersPage), 0)
		return
	}
	if s.opts.Relay == nil {
		noSink(c, sink)
		return
	}
	got, err := s.opts.Relay.DeadLetters(c.Request.Context(), sink, after, limit)
	if err != nil {
		s.relayError(c, err)
		return
	}
	v := struct {
		DeadLetters []deadLetterView `json:"dead_letters"`
		Next        int64            `json:"next"`
	}{DeadLetters: []deadLetterView{}, Next: after}
	for _, d := range got {
		v.DeadLetters = append(v.DeadLetters, deadLetterViewOf(d))
		v.Next = d.Event.Seq
	}
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusOK, v)
}

// redeliver handles POST /v1/admin/relay/dead/{sink}/{seq}/redeliver: the
// dead letter delivered now through its sink and, once delivered,
// forgotten (200 with it). A sink that refuses it answers 502
// redelivery-failed and the dead letter stays.
func (s *Server) redeliver(c *gin.Context) {
	sink := c.Param("sink")
	seq, err := strconv.ParseInt(c.Param("seq"), 10, 64)
	if err != nil || seq < 1 {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "seq is an event's seq, an integer >= 1", 0)
		return
	}
	if s.opts.Relay == nil {
		noSink(c, sink)
		return
	}
	d, err := s.opts.Relay.Redeliver(c.Request.Context(), sink, seq)
	if err != nil {
		s.relayError(c, err)
		return
	}
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusOK, deadLetterViewOf(d))
}

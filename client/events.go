package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Event is one change of state from the ledger's outbox, in the one shape
// every consumer gets it: a webhook delivery's body (the server's package
// webhook names this type), an entry of the relay's Redis streams, and GET
// /v1/admin/events. A pool's stock is named by its ticket and pool.
type Event struct {
	Seq      int64  `json:"seq"`
	ID       string `json:"id"` // stable: de-duplicate by it
	Type     string `json:"type"`
	Program  string `json:"program"`
	Ticket   string `json:"ticket"`
	Pool     string `json:"pool,omitempty"`
	Subject  string `json:"subject,omitempty"` // the order's or hold's id
	OrderID  string `json:"order_id,omitempty"`
	Buyer    string `json:"buyer,omitempty"`
	CartID   string `json:"cart_id,omitempty"`
	Quantity int64  `json:"quantity,omitempty"`
	// Channel: the order it names was given by the organizer, "comp" or
	// "box_office" (not paid online: a comp owes no money back).
	Channel string    `json:"channel,omitempty"`
	ToPool  string    `json:"to_pool,omitempty"` // pool.moved: where ("public" for the public pool)
	At      time.Time `json:"at"`
}

// Events reads up to limit events after seq `after` (of one program when
// program is not empty), in order, and the after to read on from (admin).
func (c *Client) Events(ctx context.Context, program string, after int64, limit int) ([]Event, int64, error) {
	q := url.Values{"after": {strconv.FormatInt(after, 10)}, "limit": {strconv.Itoa(limit)}}
	if program != "" {
		q.Set("program", program)
	}
	var out struct {
		Events []Event `json:"events"`
		Next   int64   `json:"next"`
	}
	_, err := c.call(ctx, http.MethodGet, "/v1/admin/events?"+q.Encode(), "", true, nil, &out)
	return out.Events, out.Next, err
}

// RelaySink is a relay sink's figures.
type RelaySink struct {
	Name       string     `json:"name"`
	Backlog    int64      `json:"backlog"` // events not yet delivered
	Oldest     *time.Time `json:"oldest,omitempty"`
	LagSeconds float64    `json:"lag_seconds"` // age of the oldest undelivered event
	Dead       int64      `json:"dead_letters"`
	Leased     int        `json:"partitions_leased"`
}

// DeadLetter is an event a sink gave up on.
type DeadLetter struct {
	Sink      string    `json:"sink"`
	Event     Event     `json:"event"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error"`
	DeadAt    time.Time `json:"dead_at"`
}

// RelaySinks reads the outbox relay's sinks (admin).
func (c *Client) RelaySinks(ctx context.Context) ([]RelaySink, error) {
	var out struct {
		Sinks []RelaySink `json:"sinks"`
	}
	_, err := c.call(ctx, http.MethodGet, "/v1/admin/relay", "", true, nil, &out)
	return out.Sinks, err
}

// DeadLetters reads up to limit of sink's dead letters after seq `after`,
// and the after to read on from (admin).
func (c *Client) DeadLetters(ctx context.Context, sink string, after int64, limit int) ([]DeadLetter, int64, error) {
	q := url.Values{"sink": {sink}, "after": {strconv.FormatInt(after, 10)}, "limit": {strconv.Itoa(limit)}}
	var out struct {
		DeadLetters []DeadLetter `json:"dead_letters"`
		Next        int64        `json:"next"`
	}
	_, err := c.call(ctx, http.MethodGet, "/v1/admin/relay/dead?"+q.Encode(), "", true, nil, &out)
	return out.DeadLetters, out.Next, err
}

// Redeliver delivers sink's dead letter of seq now and, once delivered,
// has it forgotten (admin). ErrRedeliveryFailed: the sink refused it again.
func (c *Client) Redeliver(ctx context.Context, sink string, seq int64) (DeadLetter, error) {
	var out DeadLetter
	_, err := c.call(ctx, http.MethodPost, "/v1/admin/relay/dead/"+url.PathEscape(sink)+"/"+strconv.FormatInt(seq, 10)+"/redeliver", "", true, nil, &out)
	return out, err
}

// MissingEventsMax is how many event ids MissingEvents checks at once.
const MissingEventsMax = 1000

// MissingEvents answers which of ids (events a sink received: a webhook
// receiver's de-duplication store, a stream's entries) no primary of the
// ledger has, sorted, each once (admin). After a failover to a standby
// that lacked the old primary's last commits they are the changes the
// platform was told of and the ledger lost; docs/OPERATIONS.md says what
// to do with them. At most MissingEventsMax ids at once (ErrInvalid past
// that); ErrUnavailable while a primary does not answer.
func (c *Client) MissingEvents(ctx context.Context, ids []string) ([]string, error) {
	if ids == nil {
		ids = []string{}
	}
	var out struct {
		Missing []string `json:"missing"`
	}
	_, err := c.call(ctx, http.MethodPost, "/v1/admin/events/missing", "", true, map[string][]string{"ids": ids}, &out)
	return out.Missing, err
}

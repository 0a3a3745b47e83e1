package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Event is one change of state from the ledger's outbox.
type Event struct {
	Seq      int64     `json:"seq"`
	ID       string    `json:"id"` // stable: de-duplicate by it
	Type     string    `json:"type"`
	Program  string    `json:"program"`
	Ticket   string    `json:"ticket"`
	Pool     string    `json:"pool,omitempty"`
	Subject  string    `json:"subject,omitempty"` // the order's or hold's id
	OrderID  string    `json:"order_id,omitempty"`
	Buyer    string    `json:"buyer,omitempty"`
	CartID   string    `json:"cart_id,omitempty"`
	Quantity int64     `json:"quantity,omitempty"`
	ToPool   string    `json:"to_pool,omitempty"`
	At       time.Time `json:"at"`
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

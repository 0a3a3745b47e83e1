package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// WaitEntry is a buyer's place on a ticket's (or a pool's) waitlist.
type WaitEntry struct {
	Program  string `json:"program"`
	Ticket   string `json:"ticket"`
	Pool     string `json:"pool,omitempty"`
	Buyer    string `json:"buyer"`
	Quantity int64  `json:"quantity"`
	// State: waiting, offered (confirm Offer to buy: ConfirmHold), bought,
	// lapsed (the offer expired), declined (its hold was cancelled), left,
	// closed (the sale ended or the pool closed: no offer will come).
	State           string    `json:"state"`
	Position        int64     `json:"position,omitempty"` // 1 = next, while waiting
	Ahead           int64     `json:"ahead,omitempty"`
	OfferTTLSeconds int64     `json:"offer_ttl_seconds"`
	JoinedAt        time.Time `json:"joined_at"`
	Offer           *Hold     `json:"offer,omitempty"`
}

func waitPath(sku SKU, pool, buyer string) string {
	p := sku.path() + "/waitlist/" + url.PathEscape(buyer)
	if pool != "" {
		p += "?pool=" + url.QueryEscape(pool)
	}
	return p
}

// JoinWaitlist puts buyer on the waitlist of a sold-out ticket (pool ""
// for its public stock) for quantity units. Joining again answers the
// entry the buyer has. A ticket with stock left refuses with ErrNotSoldOut.
func (c *Client) JoinWaitlist(ctx context.Context, sku SKU, pool, buyer string, quantity int64) (WaitEntry, error) {
	var e WaitEntry
	_, err := c.call(ctx, http.MethodPut, waitPath(sku, pool, buyer), "", false, map[string]any{"quantity": quantity}, &e)
	return e, err
}

// WaitlistEntry reads buyer's place in line, or its offer
// (ErrNotOnWaitlist when it never joined).
func (c *Client) WaitlistEntry(ctx context.Context, sku SKU, pool, buyer string) (WaitEntry, error) {
	var e WaitEntry
	_, err := c.call(ctx, http.MethodGet, waitPath(sku, pool, buyer), "", false, nil, &e)
	return e, err
}

// LeaveWaitlist takes a waiting buyer off the line (ErrWaitOffered while
// it holds a live offer: cancel the offer's hold to decline it).
func (c *Client) LeaveWaitlist(ctx context.Context, sku SKU, pool, buyer string) (WaitEntry, error) {
	var e WaitEntry
	_, err := c.call(ctx, http.MethodDelete, waitPath(sku, pool, buyer), "", false, nil, &e)
	return e, err
}

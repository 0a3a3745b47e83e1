package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Access is what a purchase or hold presents to a pool: the pool (empty
// or "public": the public pool), and its channel credential or access
// code.
type Access struct {
	Pool         string
	ChannelToken string
	AccessCode   string
}

func (a Access) query() string {
	if a.Pool == "" {
		return ""
	}
	return "?pool=" + url.QueryEscape(a.Pool)
}

func (a Access) body(b map[string]any) map[string]any {
	if a.ChannelToken != "" {
		b["channel_token"] = a.ChannelToken
	}
	if a.AccessCode != "" {
		b["access_code"] = a.AccessCode
	}
	return b
}

// PurchaseIn buys quantity tickets from a pool, presenting its credential
// or code.
func (c *Client) PurchaseIn(ctx context.Context, sku SKU, a Access, key Key, buyer string, quantity int64) (Order, error) {
	var o Order
	replayed, err := c.call(ctx, http.MethodPost, sku.path()+"/purchases"+a.query(), key, false,
		a.body(map[string]any{"buyer": buyer, "quantity": quantity}), &o)
	o.Replayed = replayed
	return o, err
}

// HoldIn holds quantity tickets of a pool; ttl 0 takes the default.
func (c *Client) HoldIn(ctx context.Context, sku SKU, a Access, key Key, buyer string, quantity int64, ttl time.Duration) (Hold, error) {
	body := a.body(map[string]any{"buyer": buyer, "quantity": quantity})
	if ttl > 0 {
		body["ttl_seconds"] = int64(ttl / time.Second)
	}
	return c.hold(ctx, sku.path()+"/holds"+a.query(), key, body)
}

// PoolConfig is what an admin sets on a pool; nil and empty fields take
// their defaults (1 shard, open now, no close, access open, into public).
type PoolConfig struct {
	Allotment    int64      `json:"allotment"`
	Shards       *int       `json:"shards,omitempty"`
	OpensAt      *time.Time `json:"opens_at,omitempty"`
	ClosesAt     *time.Time `json:"closes_at,omitempty"`
	Access       string     `json:"access,omitempty"` // open, code, channel
	ChannelToken string     `json:"channel_token,omitempty"`
	Into         string     `json:"into,omitempty"`
}

// Pool is one pool of a ticket as the ledger has it.
type Pool struct {
	Pool      string     `json:"pool"`
	Allotment int64      `json:"allotment"`
	Sold      int64      `json:"sold"`
	Held      int64      `json:"held"`
	Remaining int64      `json:"remaining"`
	Shards    int        `json:"shards"`
	OpensAt   *time.Time `json:"opens_at,omitempty"`
	ClosesAt  *time.Time `json:"closes_at,omitempty"`
	ClosedAt  *time.Time `json:"closed_at,omitempty"`
	Access    string     `json:"access"`
	Into      string     `json:"into,omitempty"`
}

func (s SKU) poolsPath() string { return "/v1/admin" + s.path()[len("/v1"):] + "/pools" }

// PutPool creates or changes a pool of a ticket (admin).
func (c *Client) PutPool(ctx context.Context, sku SKU, pool string, cfg PoolConfig) (Pool, error) {
	var p Pool
	_, err := c.call(ctx, http.MethodPut, sku.poolsPath()+"/"+url.PathEscape(pool), "", true, cfg, &p)
	return p, err
}

// Pools lists a ticket's pools, the public one first (admin).
func (c *Client) Pools(ctx context.Context, sku SKU) ([]Pool, error) {
	var out struct {
		Pools []Pool `json:"pools"`
	}
	_, err := c.call(ctx, http.MethodGet, sku.poolsPath(), "", true, nil, &out)
	return out.Pools, err
}

// ClosePool closes a pool now; what it has left moves on (admin).
func (c *Client) ClosePool(ctx context.Context, sku SKU, pool string) (Pool, error) {
	var p Pool
	_, err := c.call(ctx, http.MethodPost, sku.poolsPath()+"/"+url.PathEscape(pool)+"/close", "", true, nil, &p)
	return p, err
}

// Code is an access code an admin adds.
type Code struct {
	Code    string `json:"code"`
	MaxUses int64  `json:"max_uses"`
	Buyer   string `json:"buyer,omitempty"`
}

// AddCodes adds codes to a code pool, and generate new ones with maxUses
// each, which are returned here only (admin).
func (c *Client) AddCodes(ctx context.Context, sku SKU, pool string, codes []Code, generate int, maxUses int64) (added int, generated []string, err error) {
	body := map[string]any{}
	if len(codes) > 0 {
		body["codes"] = codes
	}
	if generate > 0 {
		body["generate"], body["max_uses"] = generate, maxUses
	}
	var out struct {
		Added     int      `json:"added"`
		Generated []string `json:"generated"`
	}
	_, err = c.call(ctx, http.MethodPost, sku.poolsPath()+"/"+url.PathEscape(pool)+"/codes", "", true, body, &out)
	return out.Added, out.Generated, err
}

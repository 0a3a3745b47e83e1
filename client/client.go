// Package client is a Go client of stockgate's HTTP API: typed calls for
// every public and admin route, RFC 9457 problems as Go errors matched with
// errors.Is (ErrSoldOut, ...) and errors.As (*Problem), and retries done the
// way the API asks: a 503 or 429 is sent again with the same Idempotency-Key
// after its Retry-After, so a retry can never buy twice. A key is a Key, never
// a plain string, so it and the buyer beside it cannot be swapped.
//
//	c, err := client.New(client.Options{BaseURL: "https://gate.example"})
//	order, err := c.Purchase(ctx, client.SKU{Program: "show-1", Ticket: "ga"}, client.NewKey(), "alice", 2)
//	if errors.Is(err, client.ErrSoldOut) { ... }
package client

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Options configure New.
type Options struct {
	// BaseURL is the gateway's, e.g. "https://gate.example". Required.
	BaseURL string
	// AdminToken is sent as a bearer token on admin calls.
	AdminToken string
	// HTTPClient makes the requests; default one with a 10s timeout.
	HTTPClient *http.Client
	// Attempts bounds the tries of one call when the gateway answers 503
	// or 429 or cannot be reached; default 4, 1 for no retries.
	Attempts int
	// MaxWait caps one wait between tries (a Retry-After longer than it
	// ends the retries); default 10s.
	MaxWait time.Duration
	// Header is added to every request (a platform edge's credentials).
	Header http.Header
}

// Validate reports the first option that cannot work.
func (o Options) Validate() error {
	u, err := url.Parse(o.BaseURL)
	switch {
	case o.BaseURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("client: BaseURL %q: want http(s)://host[:port]", o.BaseURL)
	case o.Attempts < 0:
		return errors.New("client: Attempts must not be negative")
	case o.MaxWait < 0:
		return errors.New("client: MaxWait must not be negative")
	}
	return nil
}

// Client calls one gateway. It is safe for concurrent use.
type Client struct {
	opts Options
	base string
	// admission and fingerprint go out on every request of this Client
	// (see Admitted and ForDevice); empty: not sent.
	admission, fingerprint string
}

// Ptr returns a pointer to v, for the optional fields of SKUConfig and
// PoolConfig (nil keeps what is set).
func Ptr[T any](v T) *T { return &v }

// Key is a request's Idempotency-Key: the same key sends the same request
// again (a retry, from any replica) and never buys twice. It has a type
// of its own so that a key and a buyer, both strings, can't be swapped
// in a call without the compiler saying so. NewKey makes one; a key the
// platform already has (its checkout's id) converts with Key(id).
type Key string

// NewKey returns a new random key (128 bits, hex).
func NewKey() Key {
	var b [16]byte
	// Never fails from Go 1.24 on; before, only on a broken OS, where a
	// key made of zeros would replay another buyer's answer: stop instead.
	if _, err := crand.Read(b[:]); err != nil {
		panic("client: no randomness for a key: " + err.Error())
	}
	return Key(hex.EncodeToString(b[:]))
}

// New validates opts and returns a client.
func New(opts Options) (*Client, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if opts.Attempts == 0 {
		opts.Attempts = 4
	}
	if opts.MaxWait == 0 {
		opts.MaxWait = 10 * time.Second
	}
	return &Client{opts: opts, base: strings.TrimRight(opts.BaseURL, "/")}, nil
}

// SKU names a ticket type: a program (a show) and a ticket within it.
type SKU struct {
	Program string `json:"program"`
	Ticket  string `json:"ticket"`
}

func (s SKU) path() string {
	return "/v1/skus/" + url.PathEscape(s.Program) + "/" + url.PathEscape(s.Ticket)
}

// Order is a sale.
type Order struct {
	OrderID   string    `json:"order_id"`
	Program   string    `json:"program"`
	Ticket    string    `json:"ticket"`
	Buyer     string    `json:"buyer"`
	Quantity  int64     `json:"quantity"`
	HoldID    string    `json:"hold_id,omitempty"` // the hold it confirmed, if any
	Seats     []string  `json:"seats,omitempty"`   // a seated ticket's seats
	CreatedAt time.Time `json:"created_at"`
	// RefundedAt is set once the order is refunded.
	RefundedAt *time.Time `json:"refunded_at,omitempty"`
	// State is "standing", "refunded" or "resold" (every ticket resold to
	// other buyers: ResoldAt is set, and no refund took place).
	State    string     `json:"state"`
	ResoldAt *time.Time `json:"resold_at,omitempty"`
	// Units says where the order's tickets went.
	Units OrderUnits `json:"units"`
	// Replayed is true when the answer is the stored one of an earlier
	// request with the same key (nothing new was sold).
	Replayed bool `json:"-"`
}

// OrderUnits are where an order's tickets went: Began = Standing + Resold
// + Refunded + Transferred, always. A platform refunds a seller once per
// unit Resold or Refunded (docs/API.md, reconciling money).
type OrderUnits struct {
	Began       int64 `json:"began"`
	Standing    int64 `json:"standing"`
	Listed      int64 `json:"listed"` // of Standing: on sale again
	Resold      int64 `json:"resold"`
	Refunded    int64 `json:"refunded"`
	Transferred int64 `json:"transferred"`
}

// Hold is stock held for a buyer until it is confirmed, cancelled or
// expires.
type Hold struct {
	HoldID    string    `json:"hold_id"`
	Program   string    `json:"program"`
	Ticket    string    `json:"ticket"`
	Buyer     string    `json:"buyer"`
	Quantity  int64     `json:"quantity"`
	State     string    `json:"state"` // held, confirmed, cancelled, expired
	ExpiresAt time.Time `json:"expires_at"`
	OrderID   string    `json:"order_id,omitempty"`
	Seats     []string  `json:"seats,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	Replayed  bool      `json:"-"`
}

// Stock is a SKU's remaining stock as the gateway's cache sees it.
type Stock struct {
	Program   string `json:"program"`
	Ticket    string `json:"ticket"`
	Remaining int64  `json:"remaining"`
	SoldOut   bool   `json:"sold_out"`
}

// SKUConfig is what an admin sets on a SKU; nil fields keep their value
// (or take the default on a new SKU). They are pointers because a PUT
// merges: 0 is a value to set (no per-buyer cap), distinct from "leave it
// as it is". Ptr makes one from a value: SKUConfig{Total: client.Ptr[int64](500)}.
type SKUConfig struct {
	Total       *int64 `json:"total,omitempty"`
	Shards      *int   `json:"shards,omitempty"`
	MaxPerOrder *int64 `json:"max_per_order,omitempty"`
	PerBuyer    *int64 `json:"per_buyer,omitempty"`
	HoldTTL     *int64 `json:"hold_ttl_seconds,omitempty"`
	HoldTTLMax  *int64 `json:"hold_ttl_max_seconds,omitempty"`
}

// SKUState is a SKU as the ledger has it.
type SKUState struct {
	Program     string `json:"program"`
	Ticket      string `json:"ticket"`
	Total       int64  `json:"total"`
	Sold        int64  `json:"sold"`
	Held        int64  `json:"held"`
	Remaining   int64  `json:"remaining"`
	Shards      int    `json:"shards"`
	MaxPerOrder int64  `json:"max_per_order"`
	Version     int64  `json:"version"`
	PerBuyer    int64  `json:"per_buyer"`
	HoldTTL     int64  `json:"hold_ttl_seconds"`
	HoldTTLMax  int64  `json:"hold_ttl_max_seconds"`
	Ended       bool   `json:"ended"`
}

// Rebuild is the outcome of Reconcile.
type Rebuild struct {
	RedisBefore int64 `json:"redis_before"`
	Ledger      int64 `json:"ledger_remaining"`
	Shards      int   `json:"shards"`
	Rebuilt     bool  `json:"rebuilt"`
}

// Seat is one seat of a seat map.
type Seat struct {
	ID      string `json:"id"`
	Section string `json:"section"`
	Row     string `json:"row"`
	Number  int    `json:"number"`
}

// Purchase buys quantity tickets for buyer. key is the request's
// Idempotency-Key: send the same key to retry the same purchase.
func (c *Client) Purchase(ctx context.Context, sku SKU, key Key, buyer string, quantity int64) (Order, error) {
	var o Order
	replayed, err := c.call(ctx, http.MethodPost, sku.path()+"/purchases", key, false,
		map[string]any{"buyer": buyer, "quantity": quantity}, &o)
	o.Replayed = replayed
	return o, err
}

// CartLine is one line of a cart: quantity tickets of one ticket id, or
// of a seated ticket: the seats named (Quantity may be 0), or the best
// Quantity adjacent seats (in Section, when given).
type CartLine struct {
	Ticket   string   `json:"ticket"`
	Quantity int64    `json:"quantity,omitempty"`
	Seats    []string `json:"seats,omitempty"`
	Section  string   `json:"section,omitempty"`
}

// Cart is a committed cart: an order per line, in ticket order; a held
// cart has a hold per line (and once confirmed, the orders too).
type Cart struct {
	CartID    string     `json:"cart_id"`
	Program   string     `json:"program"`
	Buyer     string     `json:"buyer"`
	Orders    []Order    `json:"orders"`
	Holds     []Hold     `json:"holds,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	// Replayed is true when the answer is the stored one of an earlier
	// request with the same key.
	Replayed bool `json:"-"`
}

// PurchaseCart buys every line of a cart of one program, or none; a
// refusal's Problem names the refused line in Lines.
func (c *Client) PurchaseCart(ctx context.Context, program string, key Key, buyer string, lines []CartLine) (Cart, error) {
	return c.cart(ctx, "/v1/programs/"+url.PathEscape(program)+"/carts", key, map[string]any{"buyer": buyer, "lines": lines})
}

// HoldCart holds every line of a cart of one program, or none, until one
// expiry (ttl 0: the shortest default hold of its tickets). The cart is
// then confirmed, cancelled or expires whole.
func (c *Client) HoldCart(ctx context.Context, program string, key Key, buyer string, lines []CartLine, ttl time.Duration) (Cart, error) {
	body := map[string]any{"buyer": buyer, "lines": lines}
	if ttl > 0 {
		body["ttl_seconds"] = int64(ttl / time.Second)
	}
	return c.cart(ctx, "/v1/programs/"+url.PathEscape(program)+"/cart-holds", key, body)
}

// ConfirmCart makes every hold of a held cart an order, or none.
func (c *Client) ConfirmCart(ctx context.Context, cartID string, key Key, buyer string) (Cart, error) {
	return c.cart(ctx, "/v1/carts/"+url.PathEscape(cartID)+"/confirm", key, map[string]any{"buyer": buyer})
}

// CancelCart ends every hold of a held cart; the stock goes back once.
func (c *Client) CancelCart(ctx context.Context, cartID string, key Key, buyer string) (Cart, error) {
	return c.cart(ctx, "/v1/carts/"+url.PathEscape(cartID)+"/cancel", key, map[string]any{"buyer": buyer})
}

// RefundCart refunds every order of a cart not refunded yet (Refund one
// order for a line alone); the stock goes back once.
func (c *Client) RefundCart(ctx context.Context, cartID string, key Key, buyer string) (Cart, error) {
	return c.cart(ctx, "/v1/carts/"+url.PathEscape(cartID)+"/refund", key, map[string]any{"buyer": buyer})
}

func (c *Client) cart(ctx context.Context, path string, key Key, body any) (Cart, error) {
	var out Cart
	replayed, err := c.call(ctx, http.MethodPost, path, key, false, body, &out)
	out.Replayed = replayed
	return out, err
}

// GetCart reads a cart and its orders as they are now.
func (c *Client) GetCart(ctx context.Context, cartID string) (Cart, error) {
	var out Cart
	_, err := c.call(ctx, http.MethodGet, "/v1/carts/"+url.PathEscape(cartID), "", false, nil, &out)
	return out, err
}

// Hold holds quantity tickets for buyer; ttl 0 takes the SKU's default.
func (c *Client) Hold(ctx context.Context, sku SKU, key Key, buyer string, quantity int64, ttl time.Duration) (Hold, error) {
	body := map[string]any{"buyer": buyer, "quantity": quantity}
	if ttl > 0 {
		body["ttl_seconds"] = int64(ttl / time.Second)
	}
	return c.hold(ctx, sku.path()+"/holds", key, body)
}

// HoldSeats holds the given seats of one section, all or nothing; a
// refusal for seats already taken is ErrSeatsTaken, its Problem naming them
// in Detail.
func (c *Client) HoldSeats(ctx context.Context, sku SKU, key Key, buyer string, seats []string, ttl time.Duration) (Hold, error) {
	body := map[string]any{"buyer": buyer, "seats": seats}
	if ttl > 0 {
		body["ttl_seconds"] = int64(ttl / time.Second)
	}
	return c.hold(ctx, sku.path()+"/seat-holds", key, body)
}

// HoldBestSeats holds the best n adjacent free seats (of section, when
// given).
func (c *Client) HoldBestSeats(ctx context.Context, sku SKU, key Key, buyer, section string, n int, ttl time.Duration) (Hold, error) {
	body := map[string]any{"buyer": buyer, "quantity": n}
	if section != "" {
		body["section"] = section
	}
	if ttl > 0 {
		body["ttl_seconds"] = int64(ttl / time.Second)
	}
	return c.hold(ctx, sku.path()+"/seat-holds", key, body)
}

func (c *Client) hold(ctx context.Context, path string, key Key, body any) (Hold, error) {
	var h Hold
	replayed, err := c.call(ctx, http.MethodPost, path, key, false, body, &h)
	h.Replayed = replayed
	return h, err
}

// Confirm makes a held hold an order (pay while held).
func (c *Client) Confirm(ctx context.Context, holdID string, key Key, buyer string) (Order, error) {
	var o Order
	replayed, err := c.call(ctx, http.MethodPost, "/v1/holds/"+url.PathEscape(holdID)+"/confirm", key, false,
		map[string]any{"buyer": buyer}, &o)
	o.Replayed = replayed
	return o, err
}

// ConfirmPart makes quantity of a held hold's units an order, once; the
// rest come back to stock at once. quantity must be at least 1 (Confirm
// confirms the whole hold); a seat hold is confirmed whole.
func (c *Client) ConfirmPart(ctx context.Context, holdID string, key Key, buyer string, quantity int64) (Order, error) {
	var o Order
	replayed, err := c.call(ctx, http.MethodPost, "/v1/holds/"+url.PathEscape(holdID)+"/confirm", key, false,
		map[string]any{"buyer": buyer, "quantity": quantity}, &o)
	o.Replayed = replayed
	return o, err
}

// Cancel gives a held hold's stock back.
func (c *Client) Cancel(ctx context.Context, holdID string, key Key, buyer string) (Hold, error) {
	return c.hold(ctx, "/v1/holds/"+url.PathEscape(holdID)+"/cancel", key, map[string]any{"buyer": buyer})
}

// Extend moves a held hold's expiry to ttl from now (0: its SKU's hold
// TTL), up to the SKU's maximum lifetime; never nearer. An expired hold
// is ErrHoldExpired; one at its maximum lifetime ErrHoldAtMax.
func (c *Client) Extend(ctx context.Context, holdID string, key Key, buyer string, ttl time.Duration) (Hold, error) {
	body := map[string]any{"buyer": buyer}
	if ttl != 0 {
		// Whole seconds, rounded up: a TTL under a second asks for one; a
		// negative one is sent as it is and refused (ErrInvalid).
		body["ttl_seconds"] = int64((ttl + time.Second - 1) / time.Second)
		if ttl < 0 {
			body["ttl_seconds"] = int64(ttl / time.Second)
		}
	}
	return c.hold(ctx, "/v1/holds/"+url.PathEscape(holdID)+"/extend", key, body)
}

// Refund refunds an order once; a repeat answers the same and moves nothing.
func (c *Client) Refund(ctx context.Context, orderID string, key Key, buyer string) (Order, error) {
	var o Order
	replayed, err := c.call(ctx, http.MethodPost, "/v1/orders/"+url.PathEscape(orderID)+"/refund", key, false,
		map[string]any{"buyer": buyer}, &o)
	o.Replayed = replayed
	return o, err
}

// Transfer moves quantity of an order's tickets (0: all) from buyer to
// another buyer, once; it returns the receiver's order (the same order
// when all moved). The receiver's caps apply (ErrLimit).
func (c *Client) Transfer(ctx context.Context, orderID string, key Key, buyer, to string, quantity int64) (Order, error) {
	body := map[string]any{"buyer": buyer, "to": to}
	if quantity != 0 {
		body["quantity"] = quantity
	}
	var o Order
	replayed, err := c.call(ctx, http.MethodPost, "/v1/orders/"+url.PathEscape(orderID)+"/transfer", key, false, body, &o)
	o.Replayed = replayed
	return o, err
}

// GetHold reads a hold.
func (c *Client) GetHold(ctx context.Context, holdID string) (Hold, error) {
	var h Hold
	_, err := c.call(ctx, http.MethodGet, "/v1/holds/"+url.PathEscape(holdID), "", false, nil, &h)
	return h, err
}

// GetOrder reads an order.
func (c *Client) GetOrder(ctx context.Context, orderID string) (Order, error) {
	var o Order
	_, err := c.call(ctx, http.MethodGet, "/v1/orders/"+url.PathEscape(orderID), "", false, nil, &o)
	return o, err
}

// Stock reads a SKU's remaining stock.
func (c *Client) Stock(ctx context.Context, sku SKU) (Stock, error) {
	var s Stock
	_, err := c.call(ctx, http.MethodGet, sku.path()+"/stock", "", false, nil, &s)
	return s, err
}

// Seats reads a SKU's seat map (of one section when given) as the gateway
// answers it.
func (c *Client) Seats(ctx context.Context, sku SKU, section string) (json.RawMessage, error) {
	path := sku.path() + "/seats"
	if section != "" {
		path += "?section=" + url.QueryEscape(section)
	}
	var raw json.RawMessage
	_, err := c.call(ctx, http.MethodGet, path, "", false, nil, &raw)
	return raw, err
}

// PutSKU creates or changes a SKU (admin).
func (c *Client) PutSKU(ctx context.Context, sku SKU, cfg SKUConfig) (SKUState, error) {
	var st SKUState
	_, err := c.call(ctx, http.MethodPut, "/v1/admin"+sku.path()[len("/v1"):], "", true, cfg, &st)
	return st, err
}

// SKUState reads a SKU as the ledger has it (admin).
func (c *Client) SKUState(ctx context.Context, sku SKU) (SKUState, error) {
	var st SKUState
	_, err := c.call(ctx, http.MethodGet, "/v1/admin"+sku.path()[len("/v1"):], "", true, nil, &st)
	return st, err
}

// Reconcile rebuilds a SKU's Redis stock from the ledger now (admin).
func (c *Client) Reconcile(ctx context.Context, sku SKU) (Rebuild, error) {
	var r Rebuild
	_, err := c.call(ctx, http.MethodPost, "/v1/admin"+sku.path()[len("/v1"):]+"/reconcile", "", true, nil, &r)
	return r, err
}

// EndSale ends a SKU's sale (admin).
func (c *Client) EndSale(ctx context.Context, sku SKU) (SKUState, error) {
	var st SKUState
	_, err := c.call(ctx, http.MethodPost, "/v1/admin"+sku.path()[len("/v1"):]+"/end", "", true, nil, &st)
	return st, err
}

// PutProgram sets the per-buyer cap over all of a program's tickets; 0 is
// no cap, and no hold budgets (admin).
func (c *Client) PutProgram(ctx context.Context, program string, perBuyer int64) error {
	return c.PutProgramSettings(ctx, ProgramSettings{Program: program, PerBuyer: perBuyer})
}

// ProgramSettings are a program's caps over all of its tickets; 0 is none.
type ProgramSettings struct {
	Program string `json:"program"`
	// PerBuyer caps what one buyer holds + owns.
	PerBuyer int64 `json:"per_buyer"`
	// HoldBudget caps what one buyer holds at once (ErrHoldBudget), and
	// DeviceHoldBudget what one fingerprint does (ForDevice).
	HoldBudget       int64 `json:"hold_budget"`
	DeviceHoldBudget int64 `json:"device_hold_budget"`
}

// PutProgramSettings sets a program's caps and hold budgets (admin).
func (c *Client) PutProgramSettings(ctx context.Context, s ProgramSettings) error {
	_, err := c.call(ctx, http.MethodPut, "/v1/admin/programs/"+url.PathEscape(s.Program), "", true,
		map[string]any{"per_buyer": s.PerBuyer, "hold_budget": s.HoldBudget, "device_hold_budget": s.DeviceHoldBudget}, nil)
	return err
}

// PutSeats adds seats to a SKU's seat map and returns how many it has
// (admin).
func (c *Client) PutSeats(ctx context.Context, sku SKU, seats []Seat) (int, error) {
	var out struct {
		Seats int `json:"seats"`
	}
	_, err := c.call(ctx, http.MethodPut, "/v1/admin"+sku.path()[len("/v1"):]+"/seats", "", true,
		map[string]any{"seats": seats}, &out)
	return out.Seats, err
}

// CheckSeats compares a SKU's seats in Redis with the ledger and repairs
// Redis (admin); the report as the gateway answers it.
func (c *Client) CheckSeats(ctx context.Context, sku SKU) (json.RawMessage, error) {
	var raw json.RawMessage
	_, err := c.call(ctx, http.MethodPost, "/v1/admin"+sku.path()[len("/v1"):]+"/seats/check", "", true, nil, &raw)
	return raw, err
}

// call sends one request, retrying 503, 429 and transport errors with the
// same body and key after Retry-After (or a short backoff), and decodes a
// 2xx answer into out. It reports whether the answer was a replay.
func (c *Client) call(ctx context.Context, method, path string, key Key, admin bool, body, out any) (bool, error) {
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return false, fmt.Errorf("client: %w", err)
		}
	}
	var last error
	for attempt := 1; ; attempt++ {
		replayed, wait, err := c.once(ctx, method, path, key, admin, raw, out)
		if err == nil || wait < 0 || attempt >= c.opts.Attempts {
			return replayed, err
		}
		last = err
		if wait == 0 {
			// No Retry-After (a transport error): a short jittered backoff.
			wait = time.Duration(100<<(attempt-1))*time.Millisecond + time.Duration(rand.Int64N(int64(50*time.Millisecond)))
		}
		if wait > c.opts.MaxWait {
			return false, last
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, fmt.Errorf("client: %w (last answer: %w)", ctx.Err(), last)
		case <-t.C:
		}
	}
}

// once sends one request. wait is < 0 when the answer is final, else how
// long to wait before trying again (0: not said).
func (c *Client) once(ctx context.Context, method, path string, key Key, admin bool, raw []byte, out any) (replayed bool, wait time.Duration, err error) {
	var body io.Reader
	if raw != nil {
		body = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return false, -1, fmt.Errorf("client: %w", err)
	}
	for k, vs := range c.opts.Header {
		req.Header[k] = append(req.Header[k], vs...)
	}
	if raw != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", string(key))
	}
	if c.admission != "" {
		req.Header.Set("Admission-Token", c.admission)
	}
	if c.fingerprint != "" {
		req.Header.Set("Buyer-Fingerprint", c.fingerprint)
	}
	if admin && c.opts.AdminToken != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.AdminToken)
	}
	resp, err := c.opts.HTTPClient.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return false, -1, fmt.Errorf("client: %w", err)
		}
		// Not reached, or no answer: with a key (or a GET) the same
		// request is safe to send again.
		if key != "" || method == http.MethodGet || method == http.MethodPut {
			return false, 0, fmt.Errorf("client: %w", err)
		}
		return false, -1, fmt.Errorf("client: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return false, 0, fmt.Errorf("client: reading the answer: %w", err)
	}
	if resp.StatusCode/100 == 2 {
		if out != nil {
			if err := json.Unmarshal(b, out); err != nil {
				return false, -1, fmt.Errorf("client: %s %s: answer: %w", method, path, err)
			}
		}
		return resp.Header.Get("Idempotent-Replayed") == "true", -1, nil
	}
	p := &Problem{Status: resp.StatusCode}
	if err := json.Unmarshal(b, p); err != nil || p.Type == "" {
		p.Title, p.Detail = http.StatusText(resp.StatusCode), strings.TrimSpace(string(b))
	}
	p.Status = resp.StatusCode
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
		p.RetryAfter = time.Duration(s) * time.Second
	}
	if resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests {
		return false, max(p.RetryAfter, 0), p
	}
	return false, -1, p
}

// Listing is tickets of an order listed for resale.
type Listing struct {
	ListingID string    `json:"listing_id"`
	Program   string    `json:"program"`
	Ticket    string    `json:"ticket"`
	OrderID   string    `json:"order_id"`
	Seller    string    `json:"seller"`
	Quantity  int64     `json:"quantity"`
	Sold      int64     `json:"sold"` // settled to other buyers' sales: refund the seller for these
	Withdrawn int64     `json:"withdrawn"`
	State     string    `json:"state"` // listed, sold, withdrawn
	CreatedAt time.Time `json:"created_at"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	Replayed  bool      `json:"-"`
}

// ListForResale lists quantity of an order's tickets for resale, once
// (ErrOrderRefunded, ErrInCart, ErrNotOwner; listed tickets then refuse
// refunds and transfers with ErrOrderListed).
func (c *Client) ListForResale(ctx context.Context, orderID string, key Key, buyer string, quantity int64) (Listing, error) {
	var x Listing
	replayed, err := c.call(ctx, http.MethodPost, "/v1/orders/"+url.PathEscape(orderID)+"/resale", key, false,
		map[string]any{"buyer": buyer, "quantity": quantity}, &x)
	x.Replayed = replayed
	return x, err
}

// WithdrawListing takes a listing's unsold tickets off sale, once
// (ErrListingEnded; ErrListingSelling while they are being bought).
func (c *Client) WithdrawListing(ctx context.Context, listingID string, key Key, buyer string) (Listing, error) {
	var x Listing
	replayed, err := c.call(ctx, http.MethodPost, "/v1/listings/"+url.PathEscape(listingID)+"/withdraw", key, false,
		map[string]any{"buyer": buyer}, &x)
	x.Replayed = replayed
	return x, err
}

// GetListing reads a listing (ErrUnknownListing).
func (c *Client) GetListing(ctx context.Context, listingID string) (Listing, error) {
	var x Listing
	_, err := c.call(ctx, http.MethodGet, "/v1/listings/"+url.PathEscape(listingID), "", false, nil, &x)
	return x, err
}

// OrganizerOrder gives an order as the organizer (admin): channel "comp"
// (complimentary tickets) or "box_office" (sold at the venue). Stock and
// caps apply as to a purchase; the report counts it apart.
func (c *Client) OrganizerOrder(ctx context.Context, sku SKU, key Key, buyer string, quantity int64, channel string) (Order, error) {
	var o Order
	replayed, err := c.call(ctx, http.MethodPost, "/v1/admin"+sku.path()[len("/v1"):]+"/orders", key, true,
		map[string]any{"buyer": buyer, "quantity": quantity, "channel": channel}, &o)
	o.Replayed = replayed
	return o, err
}

package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/gin-gonic/gin"
	"golang.org/x/time/rate"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// purchaseBody is the JSON of a purchase. Quantity is a pointer so a
// missing field is told apart from 0; int64 makes encoding/json refuse 1.5,
// "1", 1e3 and 2^63 before any stock code sees them.
type purchaseBody struct {
	Buyer    string `json:"buyer"`
	Quantity *int64 `json:"quantity"`
	// What a pool's access rule asks for (the pool is the ?pool= of the
	// path, so a sold-out storm is refused before the body is read).
	ChannelToken string `json:"channel_token"`
	AccessCode   string `json:"access_code"`
}

// holdBody is the JSON of a hold.
type holdBody struct {
	purchaseBody
	TTLSeconds *int64 `json:"ttl_seconds"`
}

// ownerBody names the buyer acting on a hold or an order.
type ownerBody struct {
	Buyer string `json:"buyer"`
}

// orderView is the body of an order.
type orderView struct {
	OrderID    string     `json:"order_id"`
	Program    string     `json:"program"`
	Ticket     string     `json:"ticket"`
	Buyer      string     `json:"buyer"`
	Quantity   int64      `json:"quantity"`
	HoldID     string     `json:"hold_id,omitempty"`
	Seats      []string   `json:"seats,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	RefundedAt *time.Time `json:"refunded_at,omitempty"`
	// State is standing, refunded or resold (every ticket resold to
	// other buyers: ResoldAt, and no refunded_at).
	State    string     `json:"state"`
	ResoldAt *time.Time `json:"resold_at,omitempty"`
	Units    unitsView  `json:"units"`
}

// unitsView is where an order's tickets went: began = standing + resold
// + refunded + transferred, always (docs/API.md, reconciling money).
type unitsView struct {
	Began       int64 `json:"began"`
	Standing    int64 `json:"standing"`
	Listed      int64 `json:"listed"`
	Resold      int64 `json:"resold"`
	Refunded    int64 `json:"refunded"`
	Transferred int64 `json:"transferred"`
}

func orderViewOf(o sale.Order) orderView {
	v := orderView{OrderID: o.ID.String(), Program: o.SKU.Program.String(), Ticket: o.SKU.Ticket.String(),
		Buyer: o.Buyer.String(), Quantity: o.Quantity, HoldID: o.HoldID.String(), CreatedAt: o.CreatedAt}
	for _, id := range o.Seats {
		v.Seats = append(v.Seats, id.String())
	}
	standing, refunded, began := o.Told()
	v.Units = unitsView{Began: began, Standing: standing, Listed: o.Units.Listed, Resold: o.Units.Resold, Refunded: refunded,
		Transferred: o.Units.Transferred}
	switch {
	case o.Units.ResoldOut:
		v.State, v.ResoldAt = "resold", &o.RefundedAt
	case !o.RefundedAt.IsZero():
		v.State, v.RefundedAt = "refunded", &o.RefundedAt
	default:
		v.State = "standing"
	}
	return v
}

// holdView is the body of a hold.
type holdView struct {
	HoldID    string    `json:"hold_id"`
	Program   string    `json:"program"`
	Ticket    string    `json:"ticket"`
	Buyer     string    `json:"buyer"`
	Quantity  int64     `json:"quantity"`
	State     string    `json:"state"`
	ExpiresAt time.Time `json:"expires_at"`
	OrderID   string    `json:"order_id,omitempty"`
	Seats     []string  `json:"seats,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

func holdViewOf(h sale.Hold) holdView {
	v := holdView{HoldID: h.ID.String(), Program: h.SKU.Program.String(), Ticket: h.SKU.Ticket.String(),
		Buyer: h.Buyer.String(), Quantity: h.Quantity, State: h.State, ExpiresAt: h.ExpiresAt,
		OrderID: h.OrderID.String(), CreatedAt: h.CreatedAt}
	for _, id := range h.Seats {
		v.Seats = append(v.Seats, id.String())
	}
	return v
}

// purchase handles POST /v1/skus/:program/:ticket/purchases.
func (s *Server) purchase(c *gin.Context) { s.take(c, false) }

// postHold handles POST /v1/skus/:program/:ticket/holds.
func (s *Server) postHold(c *gin.Context) { s.take(c, true) }

func (s *Server) take(c *gin.Context, hold bool) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	ask, ok := s.ask(c)
	if !ok {
		return
	}
	pool, ok := poolQuery(c)
	if !ok {
		return
	}
	// A sold-out or ended SKU refuses a key it never sold under before the
	// body is read: the storm's answer costs no decoding. What the headers
	// alone show wrong (a body of another type, or too large) is told
	// first, as it costs nothing.
	if !bodyHeadersOK(c, s.opts.MaxBodyBytes) {
		return
	}
	if err := s.sale.Closed(c.Request.Context(), sale.PoolSKU(sku, pool), ask.Key); err != nil {
		s.writeError(c, err)
		return
	}
	var body holdBody
	var into any = &body.purchaseBody
	if hold {
		into = &body
	}
	if !s.decodeBody(c, into) {
		return
	}
	if ask.Buyer, ok = buyerField(c, body.Buyer); !ok {
		return
	}
	if body.Quantity == nil || *body.Quantity < 1 {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "quantity must be an integer >= 1", 0)
		return
	}
	t := sale.Take{Ask: ask, SKU: sku, Quantity: *body.Quantity,
		Access: sale.Access{Pool: pool, Channel: body.ChannelToken, Code: body.AccessCode}}
	if hold {
		if t.TTL, ok = holdTTL(c, body.TTLSeconds); !ok {
			return
		}
	}
	// Guessing codes is limited per client: a client out of wrong guesses
	// waits before it may present a code again.
	var guesses *rate.Limiter
	if body.AccessCode != "" {
		guesses = s.guesses.client(c.Request.Context(), c.ClientIP())
		if guesses.Tokens() < 1 {
			rec, ok, err := s.sale.Recorded(c.Request.Context(), t, hold)
			if ok {
				s.written(c, http.StatusCreated)(rec, err)
				return
			}
			if err != nil {
				// Told 429 as before; its Retry-After brings the retry back.
				s.log.WarnContext(c.Request.Context(), "a limited client's retry not looked up", "err", err)
			}
			s.http.limited.Inc()
			r := guesses.Reserve()
			wait := r.Delay()
			r.Cancel()
			writeProblem(c, http.StatusTooManyRequests, "rate-limited", "too many wrong access codes from this client", retryAfter(wait))
			return
		}
	}
	var r sale.Result
	var err error
	if hold {
		r, err = s.sale.Hold(c.Request.Context(), t)
	} else {
		r, err = s.sale.Purchase(c.Request.Context(), t)
	}
	if guesses != nil && errors.Is(err, sale.ErrCodeInvalid) {
		guesses.Allow() // one wrong guess spent
	}
	s.written(c, http.StatusCreated)(r, err)
}

// ask reads the Idempotency-Key (the buyer is filled in from the body).
func (s *Server) ask(c *gin.Context) (sale.Ask, bool) {
	key, ok := idempotencyKey(c)
	if !ok {
		return sale.Ask{}, false
	}
	for _, h := range []string{"Buyer-Fingerprint", "Admission-Token"} {
		if len(c.Request.Header.Values(h)) > 1 {
			// Which one counts against the budget, or spends the
			// admission? Neither is guessed (helper-106).
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "one "+h+" header, not several", 0)
			return sale.Ask{}, false
		}
	}
	device := c.GetHeader("Buyer-Fingerprint")
	if !sale.ValidDevice(device) {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field",
			fmt.Sprintf("the Buyer-Fingerprint header must be 1..%d printable ASCII characters", sale.MaxDevice), 0)
		return sale.Ask{}, false
	}
	return sale.Ask{Key: key, Admission: c.GetHeader("Admission-Token"), Device: device}, true
}

// written writes the result of a write with status, or its error's problem.
func (s *Server) written(c *gin.Context, status int) func(sale.Result, error) {
	return func(r sale.Result, err error) {
		if err != nil {
			s.writeError(c, err)
			return
		}
		if r.Replayed {
			c.Header("Idempotent-Replayed", "true")
		}
		if r.Listing != nil {
			c.Header("Location", "/v1/listings/"+r.Listing.ID.String())
			c.JSON(status, listingViewOf(*r.Listing))
			return
		}
		if r.Hold != nil {
			c.Header("Location", "/v1/holds/"+r.Hold.ID.String())
			c.JSON(status, holdViewOf(*r.Hold))
			return
		}
		c.Header("Location", "/v1/orders/"+r.Order.ID.String())
		c.JSON(status, orderViewOf(*r.Order))
	}
}

// holdTTL reads an optional ttl_seconds: 0 (the SKU's default) when absent,
// a 422 problem when out of the bounds any SKU allows (each SKU's own
// maximum is checked with its settings).
func holdTTL(c *gin.Context, secs *int64) (time.Duration, bool) {
	if secs == nil {
		return 0, true
	}
	if *secs < 1 || *secs > int64(sale.MaxHoldTTL/time.Second) {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "ttl_seconds out of bounds", 0)
		return 0, false
	}
	return time.Duration(*secs) * time.Second, true
}

// getHold handles GET /v1/holds/:id.
func (s *Server) getHold(c *gin.Context) {
	id, ok := idParam(c, "hold")
	if !ok {
		return
	}
	h, err := s.sale.HoldByID(c.Request.Context(), id)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, holdViewOf(h))
}

// getOrder handles GET /v1/orders/:id.
func (s *Server) getOrder(c *gin.Context) {
	id, ok := idParam(c, "order")
	if !ok {
		return
	}
	o, err := s.sale.OrderByID(c.Request.Context(), id)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, orderViewOf(o))
}

// confirmHold handles POST /v1/holds/:id/confirm: the hold becomes an
// order, once; a retry gets the same order.
func (s *Server) confirmHold(c *gin.Context) {
	var body confirmBody
	id, ask, ok := s.ownerAsk(c, "hold", &body)
	if !ok {
		return
	}
	var keep int64
	if body.Quantity != nil {
		if keep = *body.Quantity; keep < 1 || keep > stock.MaxPerOrderCap {
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "quantity out of bounds", 0)
			return
		}
	}
	s.written(c, http.StatusCreated)(s.sale.ConfirmPart(c.Request.Context(), id, ask, keep))
}

// confirmBody confirms a hold: all of it, or quantity of its units (the
// rest come back to stock).
type confirmBody struct {
	Buyer    string `json:"buyer"`
	Quantity *int64 `json:"quantity"`
}

// extendBody asks for a hold's expiry ttl_seconds from now (absent: the
// SKU's hold TTL).
type extendBody struct {
	Buyer      string `json:"buyer"`
	TTLSeconds *int64 `json:"ttl_seconds"`
}

// extendHold handles POST /v1/holds/:id/extend: the hold's expiry moves
// later, up to its SKU's maximum lifetime.
func (s *Server) extendHold(c *gin.Context) {
	var body extendBody
	id, ask, ok := s.ownerAsk(c, "hold", &body)
	if !ok {
		return
	}
	ttl, ok := holdTTL(c, body.TTLSeconds)
	if !ok {
		return
	}
	s.written(c, http.StatusOK)(s.sale.Extend(c.Request.Context(), id, ask, ttl))
}

// cancelHold handles POST /v1/holds/:id/cancel: the stock goes back, once.
func (s *Server) cancelHold(c *gin.Context) { s.ownerAction(c, http.StatusOK, s.sale.Cancel) }

// refundOrder handles POST /v1/orders/:id/refund: the stock goes back once;
// a second refund answers the same and moves nothing.
func (s *Server) refundOrder(c *gin.Context) { s.ownerAction(c, http.StatusOK, s.sale.Refund) }

// ownerAction reads the id from the path and the buyer from the body.
func (s *Server) ownerAction(c *gin.Context, status int, f func(ctx context.Context, id keys.ID, a sale.Ask) (sale.Result, error)) {
	if id, ask, ok := s.ownerAsk(c, "", &ownerBody{}); ok {
		s.written(c, status)(f(c.Request.Context(), id, ask))
	}
}

// ownerAsk reads an action on a hold, an order or a cart (what names it
// in a problem): its id from the path, its body into body, the buyer it
// names.
func (s *Server) ownerAsk(c *gin.Context, what string, body buyerNamer) (keys.ID, sale.Ask, bool) {
	id, ok := idParam(c, what)
	if !ok {
		return id, sale.Ask{}, false
	}
	ask, ok := s.ask(c)
	if !ok || !s.decodeBody(c, body) {
		return id, ask, false
	}
	ask.Buyer, ok = buyerField(c, body.buyer())
	return id, ask, ok
}

// buyerNamer is a body that names the buyer acting.
type buyerNamer interface{ buyer() string }

func (b *ownerBody) buyer() string    { return b.Buyer }
func (b *confirmBody) buyer() string  { return b.Buyer }
func (b *extendBody) buyer() string   { return b.Buyer }
func (b *transferBody) buyer() string { return b.Buyer }

// strictQuery refuses a request whose query does not parse (a ";", a bad
// "%" escape): gin's reader drops such a pair without a word, so
// "?pool=fan;x" read as no pool at all and bought a public ticket for a
// buyer who named the presale (helper-106). Anything else in the query
// is 400 invalid-id (docs/API.md), and so is this.
func strictQuery(c *gin.Context) {
	if c.Request.URL.RawQuery == "" {
		return
	}
	if _, err := url.ParseQuery(c.Request.URL.RawQuery); err != nil {
		c.Abort()
		writeProblem(c, http.StatusBadRequest, "invalid-id", "the query does not parse: "+err.Error(), 0)
	}
}

// poolQuery parses the ?pool= of a request (zero when absent: the public
// pool).
func poolQuery(c *gin.Context) (keys.ID, bool) {
	text, given := c.GetQuery("pool")
	if !given {
		return keys.ID{}, true
	}
	pool, err := keys.ParseID(text)
	if err != nil {
		writeProblem(c, http.StatusBadRequest, "invalid-id", "pool ids match [A-Za-z0-9_-]{1,64}", 0)
		return keys.ID{}, false
	}
	return pool, true
}

// noPoolQuery refuses ?pool= on an admin write of a whole ticket: read
// as the pool's, "end" would have ended the ticket and all its pools, and
// a total PUT set the public one (helper-69 #2). A pool has routes of its
// own.
func noPoolQuery(c *gin.Context) {
	if _, given := c.GetQuery("pool"); given {
		c.Abort()
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field",
			"this route acts on the whole ticket and takes no pool; a pool's are under /pools/{pool}", 0)
	}
}

// idParam parses the :id of the path (what names it in the problem).
func idParam(c *gin.Context, what string) (keys.ID, bool) {
	id, err := keys.ParseID(c.Param("id"))
	if err != nil {
		if what != "" {
			what += " "
		}
		writeProblem(c, http.StatusBadRequest, "invalid-id", what+"ids match [A-Za-z0-9_-]{1,64}", 0)
		return keys.ID{}, false
	}
	return id, true
}

// idempotencyKey reads the Idempotency-Key header: a token, or the quoted
// string form of the IETF draft (`"abc"`), either matching
// [A-Za-z0-9_-]{1,64} inside.
func idempotencyKey(c *gin.Context) (keys.ID, bool) {
	if len(c.Request.Header.Values("Idempotency-Key")) > 1 {
		// Two keys name two requests: which one would the retry use?
		writeProblem(c, http.StatusBadRequest, "invalid-idempotency-key", "one Idempotency-Key header, not several", 0)
		return keys.ID{}, false
	}
	text := c.GetHeader("Idempotency-Key")
	if len(text) >= 2 && text[0] == '"' && text[len(text)-1] == '"' {
		text = text[1 : len(text)-1]
	}
	key, err := keys.ParseID(text)
	if err != nil {
		writeProblem(c, http.StatusBadRequest, "invalid-idempotency-key",
			"an Idempotency-Key header matching [A-Za-z0-9_-]{1,64} is required (a UUID fits)", 0)
		return keys.ID{}, false
	}
	return key, true
}

// buyerField parses the body's buyer.
func buyerField(c *gin.Context, text string) (keys.ID, bool) {
	buyer, err := keys.ParseID(text)
	if err != nil {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "buyer must match [A-Za-z0-9_-]{1,64}", 0)
		return keys.ID{}, false
	}
	return buyer, true
}

// cartBody is the JSON of a cart: tickets of one program, a line each;
// a held cart's lifetime (the purchase route refuses it).
type cartBody struct {
	Buyer      string         `json:"buyer"`
	Lines      []cartLineBody `json:"lines"`
	TTLSeconds *int64         `json:"ttl_seconds"`
}

// cartLineBody is a line: a quantity of a ticket, or of a seated
// ticket's seats: the seats named, or the best adjacent ones (in section).
type cartLineBody struct {
	Ticket   string   `json:"ticket"`
	Quantity *int64   `json:"quantity"`
	Seats    []string `json:"seats"`
	Section  string   `json:"section"`
}

// cartView is the body of a cart: its orders, one per line, and for a
// held cart its holds, one per line.
type cartView struct {
	CartID    string      `json:"cart_id"`
	Program   string      `json:"program"`
	Buyer     string      `json:"buyer"`
	Orders    []orderView `json:"orders"`
	Holds     []holdView  `json:"holds,omitempty"`
	ExpiresAt *time.Time  `json:"expires_at,omitempty"`
	CreatedAt time.Time   `json:"created_at"`
}

func cartViewOf(c sale.Cart) cartView {
	v := cartView{CartID: c.ID.String(), Program: c.Program.String(), Buyer: c.Buyer.String(), CreatedAt: c.CreatedAt,
		Orders: make([]orderView, 0, len(c.Orders))}
	for _, o := range c.Orders {
		v.Orders = append(v.Orders, orderViewOf(o))
	}
	for _, h := range c.Holds {
		v.Holds = append(v.Holds, holdViewOf(h))
		v.ExpiresAt = &h.ExpiresAt
	}
	return v
}

// cartWritten answers a cart write: 201 for a new cart (and the confirm
// that makes its orders), 200 for a change of one; its Location either way.
func (s *Server) cartWritten(c *gin.Context, status int, r sale.Result, err error) {
	if err != nil {
		s.writeError(c, err)
		return
	}
	if r.Replayed {
		c.Header("Idempotent-Replayed", "true")
	}
	c.Header("Location", "/v1/carts/"+r.Cart.ID.String())
	c.JSON(status, cartViewOf(*r.Cart))
}

// postCart handles POST /v1/programs/:program/carts: every line or none.
func (s *Server) postCart(c *gin.Context) { s.cart(c, false) }

// postCartHold handles POST /v1/programs/:program/cart-holds: every line
// held or none, until one expiry.
func (s *Server) postCartHold(c *gin.Context) { s.cart(c, true) }

// confirmCart handles POST /v1/carts/:id/confirm: every hold becomes an
// order, or none.
func (s *Server) confirmCart(c *gin.Context) {
	s.cartAction(c, http.StatusCreated, s.sale.ConfirmCart)
}

// cancelCart handles POST /v1/carts/:id/cancel: every hold ends, its stock
// goes back once.
func (s *Server) cancelCart(c *gin.Context) { s.cartAction(c, http.StatusOK, s.sale.CancelCart) }

// refundCart handles POST /v1/carts/:id/refund: every order not refunded
// yet is, its stock goes back once.
func (s *Server) refundCart(c *gin.Context) { s.cartAction(c, http.StatusOK, s.sale.RefundCart) }

func (s *Server) cartAction(c *gin.Context, status int, f func(ctx context.Context, id keys.ID, a sale.Ask) (sale.Result, error)) {
	if id, ask, ok := s.ownerAsk(c, "cart", &ownerBody{}); ok {
		r, err := f(c.Request.Context(), id, ask)
		s.cartWritten(c, status, r, err)
	}
}

func (s *Server) cart(c *gin.Context, hold bool) {
	if _, given := c.GetQuery("pool"); given {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "carts buy from the public pools of their tickets; pool is not taken here", 0)
		return
	}
	program, err := keys.ParseID(c.Param("program"))
	if err != nil {
		writeProblem(c, http.StatusBadRequest, "invalid-id", "program ids match [A-Za-z0-9_-]{1,64}", 0)
		return
	}
	ask, ok := s.ask(c)
	if !ok {
		return
	}
	var body cartBody
	if !s.decodeBody(c, &body) {
		return
	}
	if ask.Buyer, ok = buyerField(c, body.Buyer); !ok {
		return
	}
	if len(body.Lines) == 0 || len(body.Lines) > sale.MaxCartLines {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", fmt.Sprintf("lines must have 1 to %d lines", sale.MaxCartLines), 0)
		return
	}
	t := sale.CartTake{Ask: ask, Program: program}
	for i, l := range body.Lines {
		ticket, err := keys.ParseID(l.Ticket)
		if err != nil {
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", fmt.Sprintf("lines[%d].ticket must match [A-Za-z0-9_-]{1,64}", i), 0)
			return
		}
		line := sale.CartLine{Ticket: ticket}
		switch {
		case l.Quantity != nil && *l.Quantity >= 1:
			line.Quantity = *l.Quantity
		case l.Quantity != nil || len(l.Seats) == 0:
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field",
				fmt.Sprintf("lines[%d].quantity must be an integer >= 1 (it may be left out when the line names its seats)", i), 0)
			return
		}
		if len(l.Seats) > stock.MaxPerOrderCap {
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", fmt.Sprintf("lines[%d].seats: at most %d seats", i, stock.MaxPerOrderCap), 0)
			return
		}
		for _, text := range l.Seats {
			id, err := keys.ParseID(text)
			if err != nil {
				writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", fmt.Sprintf("lines[%d].seats: seat %q must match [A-Za-z0-9_-]{1,64}", i, text), 0)
				return
			}
			line.Seats = append(line.Seats, id)
		}
		if l.Section != "" {
			if line.Section, err = keys.ParseID(l.Section); err != nil {
				writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", fmt.Sprintf("lines[%d].section must match [A-Za-z0-9_-]{1,64}", i), 0)
				return
			}
		}
		t.Lines = append(t.Lines, line)
	}
	if !hold {
		if body.TTLSeconds != nil {
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "ttl_seconds is for held carts (cart-holds)", 0)
			return
		}
		r, err := s.sale.PurchaseCart(c.Request.Context(), t)
		s.cartWritten(c, http.StatusCreated, r, err)
		return
	}
	if t.TTL, ok = holdTTL(c, body.TTLSeconds); !ok {
		return
	}
	r, err := s.sale.HoldCart(c.Request.Context(), t)
	s.cartWritten(c, http.StatusCreated, r, err)
}

// getCart handles GET /v1/carts/:id.
func (s *Server) getCart(c *gin.Context) {
	id, ok := idParam(c, "cart")
	if !ok {
		return
	}
	cart, err := s.sale.CartByID(c.Request.Context(), id)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, cartViewOf(cart))
}

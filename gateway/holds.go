package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

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

func holdViewOf(h ledger.Hold) holdView {
	state := h.State
	if state == ledger.Held && !time.Now().Before(h.ExpiresAt) {
		state = ledger.Expired // past its time; the sweeper will catch up
	}
	return holdView{HoldID: h.ID, Program: h.SKU.Program, Ticket: h.SKU.Ticket, Buyer: h.Buyer, Quantity: h.Quantity,
		State: state, ExpiresAt: h.ExpiresAt, OrderID: h.OrderID, Seats: h.SeatIDs, CreatedAt: h.CreatedAt}
}

type holdBody struct {
	Buyer      string `json:"buyer"`
	Quantity   *int64 `json:"quantity"`
	TTLSeconds *int64 `json:"ttl_seconds"`
}

// ownerBody names the buyer acting on a hold or an order.
type ownerBody struct {
	Buyer string `json:"buyer"`
}

var (
	ansHoldExpired   = refuse(http.StatusGone, "hold-expired", "the hold expired; nothing was sold")
	ansHoldCancelled = refuse(http.StatusConflict, "hold-cancelled", "the hold was cancelled; nothing was sold")
	ansNotOwner      = refuse(http.StatusForbidden, "not-owner", "this buyer does not own it")
	ansNoHold        = refuse(http.StatusNotFound, "unknown-hold", "no such hold")
	ansNoOrder       = refuse(http.StatusNotFound, "unknown-order", "no such order")
	ansHoldConfirmed = refuse(http.StatusConflict, "hold-confirmed", "the hold became an order; refund the order instead")
)

// postHold handles POST /v1/skus/:program/:ticket/holds.
func (s *Server) postHold(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	key, ok := idempotencyKey(c)
	if !ok {
		return
	}
	var body holdBody
	if !s.decodeBody(c, &body) {
		return
	}
	if !validBuyer(c, body.Buyer) {
		return
	}
	if body.Quantity == nil || *body.Quantity < 1 {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "quantity must be an integer >= 1", 0)
		return
	}
	ttl, ok := holdTTL(c, body.TTLSeconds)
	if !ok {
		return
	}
	w := want{sku: sku, buyer: body.Buyer, q: *body.Quantity, hold: true, ttl: ttl,
		req: newRequest(body.Buyer, key, ledger.OpHold, sku.Program, sku.Ticket, strconv.FormatInt(*body.Quantity, 10), ttl.String())}
	s.runJoined(c, w.req, func(ctx context.Context) answer { return s.take(ctx, w) })
}

// holdTTL reads an optional ttl_seconds: 0 (the SKU's default) when absent,
// a 422 problem when out of the bounds any SKU allows (each SKU's own
// maximum is checked with its settings).
func holdTTL(c *gin.Context, secs *int64) (time.Duration, bool) {
	if secs == nil {
		return 0, true
	}
	if *secs < 1 || *secs > int64(ledger.MaxHoldTTL/time.Second) {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "ttl_seconds out of bounds", 0)
		return 0, false
	}
	return time.Duration(*secs) * time.Second, true
}

// getHold handles GET /v1/holds/:id.
func (s *Server) getHold(c *gin.Context) {
	id := c.Param("id")
	if keys.CheckID(id) != nil {
		writeProblem(c, http.StatusBadRequest, "invalid-id", "hold ids match [A-Za-z0-9_-]{1,64}", 0)
		return
	}
	h, err := s.ledger.HoldByID(c.Request.Context(), id)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		s.write(c, ansNoHold)
	case err != nil:
		s.write(c, ansUnavailable)
	default:
		c.JSON(http.StatusOK, holdViewOf(h))
	}
}

// getOrder handles GET /v1/orders/:id.
func (s *Server) getOrder(c *gin.Context) {
	id := c.Param("id")
	if keys.CheckID(id) != nil {
		writeProblem(c, http.StatusBadRequest, "invalid-id", "order ids match [A-Za-z0-9_-]{1,64}", 0)
		return
	}
	o, err := s.ledger.OrderByID(c.Request.Context(), id)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		s.write(c, ansNoOrder)
	case err != nil:
		s.write(c, ansUnavailable)
	default:
		c.JSON(http.StatusOK, viewOf(o))
	}
}

// confirmHold handles POST /v1/holds/:id/confirm: the hold becomes an
// order, once; a retry gets the same order.
func (s *Server) confirmHold(c *gin.Context) {
	s.ownerAction(c, ledger.OpConfirm, func(ctx context.Context, id, buyer string, r request) answer {
		o, err := s.ledger.Confirm(ctx, id, buyer, r.ledger())
		switch {
		case err == nil:
			if section, ids, ok := parseSeatGate(o.Gate); ok {
				// The seats are sold: mark them so in the gate too. If this
				// fails they stay held by the hold's owner id, which no one
				// else can take; the consistency check repairs it.
				_ = s.redis(ctx, func(ctx context.Context) error {
					_, err := s.seats.Sell(ctx, o.SKU, section, o.GateRequest(), ids)
					return err
				})
			}
			return answer{status: http.StatusCreated, order: o}
		case errors.Is(err, ledger.ErrDuplicate):
			return answer{status: http.StatusCreated, order: o, replayed: true}
		case errors.Is(err, ledger.ErrHoldEnded):
			h, herr := s.ledger.HoldByID(ctx, id)
			if herr == nil && h.State == ledger.Cancelled {
				return ansHoldCancelled
			}
			return ansHoldExpired
		}
		return s.ownerError(ctx, err, ansNoHold)
	})
}

// cancelHold handles POST /v1/holds/:id/cancel: the stock goes back, once.
func (s *Server) cancelHold(c *gin.Context) {
	s.ownerAction(c, ledger.OpCancel, func(ctx context.Context, id, buyer string, r request) answer {
		h, changed, err := s.ledger.Cancel(ctx, id, buyer, r.ledger())
		switch {
		case errors.Is(err, ledger.ErrDuplicate):
			return answer{status: http.StatusOK, hold: &h, replayed: true}
		case errors.Is(err, ledger.ErrHoldConfirmed):
			return ansHoldConfirmed
		case err != nil:
			return s.ownerError(ctx, err, ansNoHold)
		}
		if changed {
			s.returnOwed(ctx, "hold", h.ID)
		}
		return answer{status: http.StatusOK, hold: &h}
	})
}

// refundOrder handles POST /v1/orders/:id/refund: the stock goes back once;
// a second refund answers the same and moves nothing.
func (s *Server) refundOrder(c *gin.Context) {
	s.ownerAction(c, ledger.OpRefund, func(ctx context.Context, id, buyer string, r request) answer {
		o, changed, err := s.ledger.Refund(ctx, id, buyer, r.ledger())
		switch {
		case errors.Is(err, ledger.ErrDuplicate):
			return answer{status: http.StatusOK, order: o, replayed: true}
		case err != nil:
			return s.ownerError(ctx, err, ansNoOrder)
		}
		if changed {
			s.returnOwed(ctx, "order", o.ID)
		}
		return answer{status: http.StatusOK, order: o}
	})
}

func (s *Server) ownerError(ctx context.Context, err error, notFound answer) answer {
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return notFound
	case errors.Is(err, ledger.ErrNotOwner):
		return ansNotOwner
	case errors.Is(err, ledger.ErrKeyReused):
		return ansKeyReused
	}
	s.log.ErrorContext(ctx, "hold or order action", "err", err)
	return ansUnavailable
}

// ownerAction reads the id from the path and the buyer from the body, and
// runs f detached from the client, joined with concurrent copies of the
// same request.
func (s *Server) ownerAction(c *gin.Context, op string, f func(ctx context.Context, id, buyer string, r request) answer) {
	id := c.Param("id")
	if keys.CheckID(id) != nil {
		writeProblem(c, http.StatusBadRequest, "invalid-id", "ids match [A-Za-z0-9_-]{1,64}", 0)
		return
	}
	key, ok := idempotencyKey(c)
	if !ok {
		return
	}
	var body ownerBody
	if !s.decodeBody(c, &body) || !validBuyer(c, body.Buyer) {
		return
	}
	r := newRequest(body.Buyer, key, op, id)
	s.runJoined(c, r, func(ctx context.Context) answer { return f(ctx, id, body.Buyer, r) })
}

// runJoined runs f once per request at a time on this replica, detached
// from the client so that work once begun ends in a commit or a give-back,
// and writes the answer. A concurrent request with the same key and
// another fingerprint is refused at once.
func (s *Server) runJoined(c *gin.Context, r request, f func(ctx context.Context) answer) {
	res, mismatch := s.inflight.do(r.joinKey(), r.fp, func() answer {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request.Context()), s.opts.WorkTimeout)
		defer cancel()
		return f(ctx)
	})
	if mismatch {
		res = ansKeyReused
	}
	s.write(c, res)
}

// idempotencyKey reads the Idempotency-Key header: a token, or the quoted
// string form of the IETF draft (`"abc"`), either matching
// [A-Za-z0-9_-]{1,64} inside.
func idempotencyKey(c *gin.Context) (string, bool) {
	key := c.GetHeader("Idempotency-Key")
	if len(key) >= 2 && key[0] == '"' && key[len(key)-1] == '"' {
		key = key[1 : len(key)-1]
	}
	if err := keys.CheckID(key); err != nil {
		writeProblem(c, http.StatusBadRequest, "invalid-idempotency-key",
			"an Idempotency-Key header matching [A-Za-z0-9_-]{1,64} is required (a UUID fits)", 0)
		return "", false
	}
	return key, true
}

func validBuyer(c *gin.Context, buyer string) bool {
	if err := keys.CheckID(buyer); err != nil {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "buyer must match [A-Za-z0-9_-]{1,64}", 0)
		return false
	}
	return true
}

// errOverCap: one request asks for more than the program's per-buyer cap
// (no count needed to refuse it).
var errOverCap = fmt.Errorf("%w: one request over the cap", stock.ErrLimit)

// quotaTicket is a request's counts against its buyer's caps at the gate
// (the SKU's, the program's); release gives them back when the request did
// not end in a commit.
type quotaTicket struct {
	s        *Server
	scopes   []stock.SKU
	fresh    []stock.SKU // the scopes this attempt counted (not counted before)
	buyer    string
	key      string
	released bool
}

// release gives back the request's counts: it did not commit.
func (q *quotaTicket) release(ctx context.Context) {
	if q == nil || q.released {
		return
	}
	q.released = true
	q.s.releaseQuota(ctx, q.scopes, q.buyer, q.key)
}

// replayed gives back the counts this attempt made for a request that had
// committed before: its own counts stand (or were given back with its
// stock, by a refund or a cancel), so a count made again is one too many.
func (q *quotaTicket) replayed(ctx context.Context) {
	if q == nil || q.released || len(q.fresh) == 0 {
		return
	}
	q.released = true
	q.s.releaseQuota(ctx, q.fresh, q.buyer, q.key)
}

func (s *Server) releaseQuota(ctx context.Context, scopes []stock.SKU, buyer, key string) {
	for _, scope := range scopes {
		if err := s.redis(ctx, func(ctx context.Context) error {
			return s.gate.ReleaseQuota(ctx, scope, buyer, key)
		}); err != nil {
			s.log.WarnContext(ctx, "release quota", "scope", scope.String(), "err", err)
		}
	}
}

// takeQuota counts the request against the buyer's caps in Redis (the
// SKU's, then the program's), so a flood from one buyer is turned away
// there and never reaches the ledger. The ledger checks both caps again
// when it commits. No cap, no call.
func (s *Server) takeQuota(ctx context.Context, w want, st ledger.SKUState) (*quotaTicket, error) {
	programCap, err := s.programs.Get(ctx, stock.SKU{Program: w.sku.Program})
	if err != nil {
		return nil, err
	}
	if programCap > 0 && w.q > programCap {
		return nil, errOverCap
	}
	t := &quotaTicket{s: s, buyer: w.buyer, key: w.req.gateID()}
	for _, c := range []struct {
		scope stock.SKU
		cap   int64
	}{{w.sku, st.PerBuyer}, {stock.SKU{Program: w.sku.Program}, programCap}} {
		if c.cap == 0 {
			continue
		}
		var fresh bool
		err := s.redis(ctx, func(ctx context.Context) (err error) {
			fresh, err = s.gate.TakeQuota(ctx, c.scope, w.buyer, w.req.gateID(), w.q, c.cap)
			return err
		})
		if err != nil {
			// Only the counts this attempt made: a count found (another
			// attempt of this request, in flight or committed) is not ours.
			t.scopes = t.fresh
			t.release(ctx)
			return nil, err
		}
		t.scopes = append(t.scopes, c.scope)
		if fresh {
			t.fresh = append(t.fresh, c.scope)
		}
	}
	if len(t.scopes) == 0 {
		return nil, nil
	}
	return t, nil
}

// putProgram handles PUT /v1/admin/programs/:program: {"per_buyer": n}
// caps what one buyer may hold + own of all the program's tickets; 0
// removes the cap.
func (s *Server) putProgram(c *gin.Context) {
	program := c.Param("program")
	if keys.CheckID(program) != nil {
		writeProblem(c, http.StatusBadRequest, "invalid-id", "program ids match [A-Za-z0-9_-]{1,64}", 0)
		return
	}
	var body struct {
		PerBuyer *int64 `json:"per_buyer"`
	}
	if !s.decodeBody(c, &body) {
		return
	}
	if body.PerBuyer == nil || *body.PerBuyer < 0 || *body.PerBuyer > stock.MaxTotal {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "per_buyer must be an integer >= 0", 0)
		return
	}
	if err := s.ledger.PutProgram(c.Request.Context(), program, *body.PerBuyer); err != nil {
		s.log.ErrorContext(c.Request.Context(), "put program", "program", program, "err", err)
		writeProblem(c, http.StatusServiceUnavailable, "unavailable", "ledger unavailable", 1)
		return
	}
	s.programs.Invalidate(stock.SKU{Program: program})
	c.JSON(http.StatusOK, gin.H{"program": program, "per_buyer": *body.PerBuyer})
}

// returnOwed finishes a return the ledger just made (a cancel, a refund),
// if it owes Redis anything.
func (s *Server) returnOwed(ctx context.Context, kind, id string) {
	r, ok, err := s.ledger.RestoreOwed(ctx, kind, id)
	if err != nil {
		s.log.WarnContext(ctx, "restore owed; a sweeper will do it", "kind", kind, "id", id, "err", err)
		return
	}
	if ok {
		s.returnToRedis(ctx, r)
	}
}

// returnToRedis gives Redis the stock the ledger took back (a cancelled or
// expired hold, a refund) and the buyer's counts, then clears the ledger's
// pending mark. Counted units go to the gate of the epoch the return was
// made under, once (refill.lua): a gate rebuilt since counts them already,
// one not yet rebuilt to that epoch is tried again by the sweeper. Seats
// are freed by their owner id. If Redis cannot be reached the mark stays
// and a sweeper retries; every step is idempotent.
func (s *Server) returnToRedis(ctx context.Context, r ledger.Restore) {
	if section, ids, ok := parseSeatGate(r.Gate); ok && s.seats != nil {
		// Seats come back free, whether held or sold through the hold.
		err := s.redis(ctx, func(ctx context.Context) error {
			if _, err := s.seats.Release(ctx, r.SKU, section, r.RequestID, ids); err != nil {
				return err
			}
			_, err := s.seats.ReleaseSold(ctx, r.SKU, section, r.RequestID, ids)
			return err
		})
		if err != nil {
			s.log.WarnContext(ctx, "release seats in redis; a sweeper will retry", "kind", r.Kind, "id", r.ID, "err", err)
			return
		}
	} else if !ok {
		var outcome int
		err := s.redis(ctx, func(ctx context.Context) (err error) {
			outcome, err = s.gate.Refill(ctx, r.SKU, max(r.Shards, 1), r.Kind+"-"+r.ID, r.Epoch, r.Quantity)
			if err != nil || outcome == shard.NotYet {
				return err
			}
			if err := s.gate.ReleaseQuota(ctx, r.SKU, r.Buyer, r.RequestID); err != nil {
				return err
			}
			return s.gate.ReleaseQuota(ctx, stock.SKU{Program: r.SKU.Program}, r.Buyer, r.RequestID)
		})
		if err != nil {
			s.log.WarnContext(ctx, "restore to redis; a sweeper will retry", "kind", r.Kind, "id", r.ID, "err", err)
			return
		}
		if outcome == shard.NotYet {
			return // the gate of this epoch is still being built; the sweeper comes back
		}
		s.cache.ClearSoldOut(r.SKU)
		s.stock.Invalidate(r.SKU)
		if outcome == shard.Refilled {
			s.notifyRestocked(ctx, r.SKU)
		}
	}
	if err := s.ledger.RestoreDone(ctx, r.Kind, r.ID); err != nil {
		s.log.WarnContext(ctx, "mark restore done; a sweeper will repeat it", "kind", r.Kind, "id", r.ID, "err", err)
	}
}

// RunSweeper expires due holds and finishes restores other gateways left
// unfinished, every SweepEvery until ctx is done. Any number of gateways
// run it at once: the ledger gives each hold's stock back once, and the
// Redis side of a restore is idempotent.
func (s *Server) RunSweeper(ctx context.Context) {
	t := time.NewTicker(s.opts.SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.sweep(ctx)
	}
}

func (s *Server) sweep(ctx context.Context) {
	for {
		done, err := s.ledger.ExpireDue(ctx, 200)
		if err != nil {
			s.log.WarnContext(ctx, "expire holds", "err", err)
		}
		s.metrics.expired.Add(float64(len(done)))
		for _, h := range done {
			s.returnOwed(ctx, "hold", h.ID)
		}
		if err != nil || len(done) < 200 {
			break
		}
	}
	// Work left by a gateway that died between the ledger and Redis halves,
	// or found too early for its epoch's gate.
	pending, err := s.ledger.PendingRestores(ctx, s.opts.RestoreGrace, 200)
	if err != nil {
		s.log.WarnContext(ctx, "pending restores", "err", err)
		return
	}
	for _, r := range pending {
		s.returnToRedis(ctx, r)
	}
}

// endSale handles POST /v1/admin/skus/:program/:ticket/end.
func (s *Server) endSale(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request.Context()), s.opts.WorkTimeout)
	defer cancel()
	if _, err := s.ledger.SKU(ctx, sku); errors.Is(err, stock.ErrUnknownSKU) {
		writeProblem(c, http.StatusNotFound, "unknown-sku", "no such program/ticket", 0)
		return
	}
	// Behind the fence, so no replica's gate admits anyone after the end.
	var st ledger.SKUState
	_, err := s.rebuildWith(ctx, sku, reasonAdmin, true, s.opts.ReseedWait, func(ctx context.Context) (err error) {
		st, err = s.ledger.EndSale(ctx, sku)
		return err
	})
	s.settings.Invalidate(sku)
	s.stock.Invalidate(sku)
	if st.Program == "" {
		s.log.ErrorContext(ctx, "end sale", "sku", sku.String(), "err", err)
		writeProblem(c, http.StatusServiceUnavailable, "unavailable", "could not end the sale; repeat the request", 1)
		return
	}
	if err != nil {
		s.log.ErrorContext(ctx, "end sale: gate not rebuilt", "sku", sku.String(), "err", err)
	}
	c.JSON(http.StatusOK, skuViewOf(st))
}

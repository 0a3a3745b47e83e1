package ledger

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// ErrKeyReused: the request's Idempotency-Key was used, in the same scope,
// for a request with another fingerprint. Nothing was written.
var ErrKeyReused = errors.New("ledger: idempotency key used for another request")

// Request operations, as stored.
const (
	OpPurchase = "purchase"
	OpHold     = "hold"
	OpSeatHold = "seat_hold"
	OpConfirm  = "confirm"
	OpCancel   = "cancel"
	OpRefund   = "refund"
	OpExtend   = "extend"
	OpTransfer = "transfer"
	OpResale   = "resale"
	OpWithdraw = "withdraw"
	OpCart     = "cart"
	// Held carts, and the actions on a whole cart.
	OpCartHold    = "cart_hold"
	OpCartConfirm = "cart_confirm"
	OpCartCancel  = "cart_cancel"
	OpCartRefund  = "cart_refund"
)

// Request is a client's request as the ledger remembers it: its
// Idempotency-Key within its scope (the buyer), bound to a fingerprint of
// what it asks. The requests table is the one authority on "has this
// request happened": its row is written in the same transaction as the
// movement it caused, with the answer, so a retry is answered from it on
// any replica, at any later time.
type Request struct {
	Scope       keys.ID // the buyer
	Key         keys.ID // the client's Idempotency-Key
	Fingerprint string  // what it asks, as the caller fingerprints it
	Op          string  // OpPurchase, OpHold, …
	// Trace is the W3C traceparent of the request's span ("" untraced):
	// the events its change writes keep it, so their webhook deliveries
	// join the request's trace. Neither remembered nor fingerprinted.
	Trace string
}

// IsZero reports a request with no client key: an internal write, which is
// not remembered in the requests table.
func (r Request) IsZero() bool { return r.Key.IsZero() }

func (r Request) validate() error {
	if r.Scope.IsZero() || r.Key.IsZero() || r.Fingerprint == "" || r.Op == "" {
		return fmt.Errorf("%w: request %q/%q op %q", stock.ErrInvalid, r.Scope, r.Key, r.Op)
	}
	return nil
}

// Recorded is a committed request and the answer it got.
type Recorded struct {
	Request
	SKU     stock.SKU
	Order   *Order  // purchase, confirm, refund
	Hold    *Hold   // hold, seat hold, cancel
	Cart    *Cart   // cart
	Listing keys.ID // resale, withdraw: the listing
	// ListingAt is the listing as the request answered it (nil in rows of
	// builds before it: then read as it is now).
	ListingAt *Listing
	// Refused is why a late payment was refused (RefuseLate): the
	// hold's every late payment is answered that refusal.
	Refused   string
	CreatedAt time.Time
}

// snapshot is the stored answer of a request: the order or hold as it was
// answered. It has its own field names so the row never depends on how
// Order and Hold are shown to anyone else.
type snapshot struct {
	Order *orderSnap `json:"o,omitempty"`
	Hold  *holdSnap  `json:"h,omitempty"`
	Cart  *cartSnap  `json:"c,omitempty"`
	// Listing names a listing; ListingAt is it as answered, replayed as
	// it was (a row recorded without it is read as the listing is now).
	Listing   keys.ID  `json:"l,omitzero"`
	ListingAt *Listing `json:"la,omitempty"`
	// Refused is a late payment's refusal (RefuseLate).
	Refused string `json:"x,omitempty"`
}

type cartSnap struct {
	ID, Program, Buyer keys.ID
	CreatedAt          int64
	Orders             []orderSnap
	Holds              []holdSnap `json:",omitempty"`
}

// Their ids are keys.IDs, so a stored answer is checked again as it is
// read; their JSON is the same text as before.
type orderSnap struct {
	ID, RequestID, GateKey, Program, Ticket, Buyer, HoldID keys.ID
	CartID                                                 keys.ID `json:",omitzero"`
	Quantity, CreatedAt, RefundedAt                        int64
	Seats                                                  []keys.ID `json:",omitempty"`
	// Units are where the order's units had gone when it was answered
	// (a confirm again of a resold order, a transfer): replayed as told,
	// not read as refunded (helper-38). Absent from rows before them.
	Units Units `json:",omitzero"`
}

type holdSnap struct {
	ID, RequestID, Program, Ticket, Buyer, OrderID keys.ID
	CartID                                         keys.ID `json:",omitzero"`
	State                                          string
	Quantity, ExpiresAt, CreatedAt, EndedAt        int64
	Seats                                          []keys.ID
}

func snapOrder(o *Order) *orderSnap {
	return &orderSnap{ID: o.ID, RequestID: o.IdempotencyKey, GateKey: o.GateKey, Program: o.SKU.Program,
		Ticket: o.SKU.Ticket, Buyer: o.Buyer, HoldID: o.HoldID, CartID: o.CartID, Quantity: o.Quantity,
		CreatedAt: o.CreatedAt.UnixMilli(), RefundedAt: ms(o.RefundedAt), Seats: o.SeatIDs, Units: o.Units}
}

func (o *orderSnap) order(req Request) Order {
	return Order{ID: o.ID, IdempotencyKey: o.RequestID, GateKey: o.GateKey, SKU: stock.SKU{Program: o.Program, Ticket: o.Ticket},
		Buyer: o.Buyer, HoldID: o.HoldID, CartID: o.CartID, Quantity: o.Quantity, CreatedAt: fromMS(o.CreatedAt),
		RefundedAt: fromMS(o.RefundedAt), SeatIDs: o.Seats, Units: o.Units, Req: req}
}

func encodeCart(c *Cart) string {
	s := snapshot{Cart: &cartSnap{ID: c.ID, Program: c.Program, Buyer: c.Buyer, CreatedAt: c.CreatedAt.UnixMilli()}}
	for i := range c.Orders {
		s.Cart.Orders = append(s.Cart.Orders, *snapOrder(&c.Orders[i]))
	}
	for i := range c.Holds {
		s.Cart.Holds = append(s.Cart.Holds, *snapHold(&c.Holds[i]))
	}
	b, _ := json.Marshal(s) // plain structs of strings and integers: cannot fail
	return string(b)
}

func snapHold(h *Hold) *holdSnap {
	return &holdSnap{ID: h.ID, RequestID: h.IdempotencyKey, Program: h.SKU.Program, Ticket: h.SKU.Ticket,
		Buyer: h.Buyer, State: h.State, OrderID: h.OrderID, CartID: h.CartID, Quantity: h.Quantity, ExpiresAt: ms(h.ExpiresAt),
		CreatedAt: ms(h.CreatedAt), EndedAt: ms(h.EndedAt), Seats: h.SeatIDs}
}

func (h *holdSnap) hold(req Request) Hold {
	return Hold{ID: h.ID, IdempotencyKey: h.RequestID, SKU: stock.SKU{Program: h.Program, Ticket: h.Ticket}, Buyer: h.Buyer,
		State: h.State, OrderID: h.OrderID, CartID: h.CartID, Quantity: h.Quantity, ExpiresAt: fromMS(h.ExpiresAt),
		CreatedAt: fromMS(h.CreatedAt), EndedAt: fromMS(h.EndedAt), SeatIDs: h.Seats, Req: req}
}

func encodeSnapshot(o *Order, h *Hold) string {
	var s snapshot
	if o != nil {
		s.Order = snapOrder(o)
	}
	if h != nil {
		s.Hold = snapHold(h)
	}
	b, _ := json.Marshal(s) // plain structs of strings and integers: cannot fail
	return string(b)
}

func encodeListing(x Listing) string {
	b, _ := json.Marshal(snapshot{Listing: x.ID, ListingAt: &x}) // ids, numbers and times: cannot fail
	return string(b)
}

func encodeRefusal(why string) string {
	b, _ := json.Marshal(snapshot{Refused: why}) // a string: cannot fail
	return string(b)
}

func decodeSnapshot(raw string, r *Recorded) error {
	var s snapshot
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		return fmt.Errorf("ledger: stored answer: %w", err)
	}
	r.Listing, r.ListingAt, r.Refused = s.Listing, s.ListingAt, s.Refused
	if o := s.Order; o != nil {
		ord := o.order(r.Request)
		r.Order = &ord
	}
	if c := s.Cart; c != nil {
		r.Cart = &Cart{ID: c.ID, Program: c.Program, Buyer: c.Buyer, CreatedAt: fromMS(c.CreatedAt), Req: r.Request}
		for i := range c.Orders {
			r.Cart.Orders = append(r.Cart.Orders, c.Orders[i].order(Request{}))
		}
		for i := range c.Holds {
			r.Cart.Holds = append(r.Cart.Holds, c.Holds[i].hold(Request{}))
		}
	}
	if h := s.Hold; h != nil {
		hold := h.hold(r.Request)
		r.Hold = &hold
	}
	return nil
}

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}

// claim writes the request's row inside tx, before anything moves, with
// the answer when it is already known (result may be "" and be written by
// finish). A key already taken ends the transaction's work: the caller
// gets ErrDuplicate with what was stored (same fingerprint) or
// ErrKeyReused (another one), and must roll back. Concurrent claims of one
// key wait on each other at the primary key, so one request commits.
func claim(ctx context.Context, tx *sql.Tx, r Request, sku stock.SKU, result string, now int64) error {
	if err := r.validate(); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, `
		INSERT INTO requests (scope, idem_key, fingerprint, op, program, ticket, result, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (scope, idem_key) DO NOTHING`,
		r.Scope, r.Key, r.Fingerprint, r.Op, sku.Program, sku.Ticket, result, now)
	if err != nil {
		return notCommitted("claim request", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	return errTaken
}

// errTaken is claim's signal that the key has a row; the caller rolls back
// and asks replayOf for the answer.
var errTaken = errors.New("ledger: key taken")

// replayOf is the outcome of a request whose key was taken: ErrDuplicate
// with the stored answer, or ErrKeyReused.
func (l *Ledger) replayOf(ctx context.Context, r Request) (Recorded, error) {
	rec, err := l.RequestByKey(ctx, r.Scope, r.Key)
	if err != nil {
		return rec, fmt.Errorf("ledger: key taken, row unreadable: %w", err)
	}
	if rec.Fingerprint != r.Fingerprint {
		return Recorded{}, ErrKeyReused
	}
	return rec, ErrDuplicate
}

// finish writes the answer of a claimed request whose answer is known only
// at the end of its transaction.
func finish(ctx context.Context, tx *sql.Tx, r Request, o *Order, h *Hold) error {
	if r.IsZero() {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE requests SET result = $3 WHERE scope = $1 AND idem_key = $2`,
		r.Scope, r.Key, encodeSnapshot(o, h)); err != nil {
		return notCommitted("request answer", err)
	}
	return nil
}

// stamp gives this transaction's new request rows of a SKU the row version
// its stock update produced. The SKU row stays locked until commit, so
// versions are in commit order per SKU: a reader that has seen every row
// up to version V and reads again "after V" misses nothing. Rows of other
// transactions still open are invisible here and keep their 0 until their
// own stamp.
func stamp(ctx context.Context, tx *sql.Tx, sku stock.SKU, version int64) error {
	if _, err := tx.ExecContext(ctx, `UPDATE requests SET sku_version = $3
		WHERE program = $1 AND ticket = $2 AND sku_version = 0`, sku.Program, sku.Ticket, version); err != nil {
		return notCommitted("stamp requests", err)
	}
	return nil
}

// RequestByKey returns a committed request and its answer, or ErrNotFound.
func (l *Ledger) RequestByKey(ctx context.Context, scope, key keys.ID) (Recorded, error) {
	var r Recorded
	var raw string
	var created int64
	err := l.db.QueryRowContext(ctx, `SELECT scope, idem_key, fingerprint, op, program, ticket, result, created_at
		FROM requests WHERE scope = $1 AND idem_key = $2`, scope, key).
		Scan(&r.Scope, &r.Key, &r.Fingerprint, &r.Op, &r.SKU.Program, &r.SKU.Ticket, &raw, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return r, ErrNotFound
	}
	if err != nil {
		return r, fmt.Errorf("ledger: request: %w", err)
	}
	r.CreatedAt = fromMS(created)
	if raw == "" {
		return r, nil
	}
	return r, decodeSnapshot(raw, &r)
}

// RequestDurable returns once the request row (scope, key) is known to
// be on the synchronous standby, or fails; ErrNotFound when this ledger
// has no such row. PostgreSQL commits locally before its COMMIT waits
// for the standby; while it waits, other sessions still see the
// transaction running (the row absent). A backend that ends that wait
// (cancelled, its postmaster killed, its client gone) shows the row on
// that node alone, and a failover to the standby takes it back. A 201 replayed from such a row is a sale the ledger may
// lose (TestFaultLedgerFailover: one of 2,401). So before a replay is
// answered the row is rewritten as it is: that COMMIT writes WAL, so it
// waits until the standby has all the WAL before it, this row's commit
// included. Without a synchronous standby it is a local commit; SQLite
// has no standby.
func (l *Ledger) RequestDurable(ctx context.Context, scope, key keys.ID) error {
	if l.driver != Postgres {
		return nil
	}
	res, err := l.db.ExecContext(ctx, `UPDATE requests SET result = result WHERE scope = $1 AND idem_key = $2`, scope, key)
	if err != nil {
		return fmt.Errorf("ledger: request: not known to be on the standby: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// RequestSettled returns nil once the request row (scope, key) is
// committed, and ErrNotFound once no row is committed and no transaction
// is writing one; waiting for any transaction still writing it to end.
// RequestByKey's ErrNotFound proves neither: on PostgreSQL a COMMIT in
// flight (waiting for the synchronous standby, or a backend finishing it
// after its client gave up) keeps its row unseen, and on SQLite another
// process's write is unseen until it commits. An insert of the same key
// waits for such a writer, and learns how it ended; the probe's row is
// rolled back. Bound the wait with ctx's deadline (on PostgreSQL also the
// probe's lock_timeout): a writer that never ends (a standby that never
// answers) leaves the outcome unknown.
func (l *Ledger) RequestSettled(ctx context.Context, scope, key keys.ID) error {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("ledger: request settled: %w", err)
	}
	defer tx.Rollback()
	if l.driver == Postgres {
		// The server ends the wait itself: a client that gives up only
		// closes its socket, and the backend would wait on for the
		// writer (a standby that never answers) holding a connection.
		if d, ok := ctx.Deadline(); ok {
			ms := max(time.Until(d).Milliseconds(), 1)
			if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = "+strconv.FormatInt(ms, 10)); err != nil {
				return fmt.Errorf("ledger: request settled: %w", err)
			}
		}
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO requests (scope, idem_key, fingerprint, op, program, ticket, created_at)
		VALUES ($1, $2, '', 'probe', '', '', 0) ON CONFLICT (scope, idem_key) DO NOTHING`, scope, key)
	if err != nil {
		return fmt.Errorf("ledger: request settled: %w", err)
	}
	n, err := res.RowsAffected()
	switch {
	case err != nil:
		return fmt.Errorf("ledger: request settled: %w", err)
	case n == 1:
		return ErrNotFound // the probe's own row: nobody has the key
	}
	return nil
}

// ScopedKey is one committed request's scope and key.
type ScopedKey struct{ Scope, Key keys.ID }

// Committed is what a replica needs to answer retries of a SKU that takes
// no new requests (sold out, ended) from memory: the scoped keys of the
// requests that took its stock with a row version above the one asked
// for, and the row as of the same instant.
type Committed struct {
	Version   int64 // the SKU row's version; ask "after" it next time
	Remaining int64
	Ended     bool
	Keys      []ScopedKey
}

// Sealed reports that no request can take stock of the SKU from the
// instant of the read until the row changes: nothing is left, or the sale
// ended. A set of keys read sealed is complete until stock comes back.
func (c Committed) Sealed() bool { return c.Remaining <= 0 || c.Ended }

// CommittedSince lists the stock-taking requests of a SKU stamped after
// version `after`, with the SKU row, in one statement (one snapshot).
func (l *Ledger) CommittedSince(ctx context.Context, sku stock.SKU, after int64) (Committed, error) {
	rows, err := l.db.QueryContext(ctx, `
		SELECT s.version, s.total - s.sold - s.held, s.ended_at, COALESCE(r.scope, ''), COALESCE(r.idem_key, '')
		FROM skus s LEFT JOIN requests r ON r.program = s.program AND r.ticket = s.ticket
			AND r.sku_version > $3 AND r.op IN ('purchase', 'hold', 'seat_hold')
		WHERE s.program = $1 AND s.ticket = $2`, sku.Program, sku.Ticket, after)
	if err != nil {
		return Committed{}, fmt.Errorf("ledger: committed: %w", err)
	}
	defer rows.Close()
	var c Committed
	found := false
	for rows.Next() {
		var ended int64
		var k ScopedKey
		if err := rows.Scan(&c.Version, &c.Remaining, &ended, &k.Scope, &k.Key); err != nil {
			return Committed{}, fmt.Errorf("ledger: committed: %w", err)
		}
		found, c.Ended = true, ended > 0
		if !k.Key.IsZero() {
			c.Keys = append(c.Keys, k)
		}
	}
	if err := rows.Err(); err != nil {
		return Committed{}, fmt.Errorf("ledger: committed: %w", err)
	}
	if !found {
		return Committed{}, stock.ErrUnknownSKU
	}
	return c, nil
}

package ledger

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// A program's waiting room (queue) is configured here, durable across
// Redis losses; its line (positions, the serving counter) lives in Redis.

// QueueConfig is a program's waiting room.
type QueueConfig struct {
	Program keys.ID
	// OpensAt is when admission starts; JoinFrom is when buyers may join
	// (at or before OpensAt): those who join before OpensAt are put in a
	// random order, those after it in the order they come.
	OpensAt  time.Time
	JoinFrom time.Time
	// Rate is the most buyers admitted per second.
	Rate int64
	// Window is how long an admitted buyer may take to buy.
	Window time.Duration
	// PerRemaining is how many admitted buyers who have not bought yet may
	// exist per ticket left, in thousandths (1500: 1.5 per ticket).
	PerRemaining int64
	// Secret signs the queue's tickets and admission tokens (hex, made by
	// the ledger when the queue is created, and kept).
	Secret string
	// CheckoutURL is where the waiting room's page sends an admitted
	// buyer, with admission_token and buyer added to its query ("": the
	// page shows the token).
	CheckoutURL string
	// PowBits, when not 0, is the proof of work a join must bring (leading
	// zero bits of a hash puzzle, package waitroom).
	PowBits int64
	// SoldOutShare is the share of admitted buyers the pacer may let meet
	// sold out, in thousandths (0..500): above 0 it admits past the
	// tickets left as the line's conversion allows (package waitroom).
	SoldOutShare int64
}

// MaxPowBits bounds a room's proof of work.
const MaxPowBits = 24

// Validate reports what is wrong with c.
func (c QueueConfig) Validate() error {
	switch {
	case c.Program.IsZero():
		return fmt.Errorf("%w: missing program", stock.ErrInvalid)
	case c.OpensAt.IsZero() || c.OpensAt.Year() < 2000:
		return fmt.Errorf("%w: opens_at is required", stock.ErrInvalid)
	case c.JoinFrom.After(c.OpensAt):
		return fmt.Errorf("%w: join_from after opens_at", stock.ErrInvalid)
	case c.Rate < 1 || c.Rate > 1_000_000:
		return fmt.Errorf("%w: rate %d not in 1..1000000 per second", stock.ErrInvalid, c.Rate)
	case c.Window < time.Second || c.Window > 24*time.Hour:
		return fmt.Errorf("%w: window %v not in 1s..24h", stock.ErrInvalid, c.Window)
	case c.PerRemaining < 1 || c.PerRemaining > 1_000_000:
		return fmt.Errorf("%w: per_remaining %d not in 1..1000000 thousandths", stock.ErrInvalid, c.PerRemaining)
	case c.SoldOutShare < 0 || c.SoldOutShare > 500:
		return fmt.Errorf("%w: sold_out_share %d not in 0..500 thousandths", stock.ErrInvalid, c.SoldOutShare)
	case c.PowBits < 0 || c.PowBits > MaxPowBits:
		return fmt.Errorf("%w: proof_of_work_bits %d not in 0..%d", stock.ErrInvalid, c.PowBits, MaxPowBits)
	case c.CheckoutURL != "" && !validCheckout(c.CheckoutURL):
		return fmt.Errorf("%w: checkout_url must be an absolute http(s) URL of at most 2048 bytes", stock.ErrInvalid)
	}
	return nil
}

// A line's durable facts (queue_places), per room (a waiting room turned
// off and on again is a new room, with a new secret and a new line): the
// places reserved for Redis to hand out, and what the pacer last saw of
// the line. Redis hands out places only up to what the ledger reserved, so
// a line Redis lost is made again past every place it may have given. The
// admissions spent (queue_spends) are kept here too: one per buyer, across
// any loss of Redis.

// Room is the id of c's room: a waiting room turned off and on again gets
// a new secret, so a new room and a new line.
func (c QueueConfig) Room() keys.ID {
	h := sha256.Sum256([]byte("room\x00" + c.Secret))
	return keys.MustID(hex.EncodeToString(h[:8]))
}

// QueueLine is what the ledger knows of a room's line.
type QueueLine struct {
	Program, Room keys.ID
	// PreCap and PostCap are the early and late places ever reserved.
	PreCap, PostCap int64
	// Opened, Early, Post, Serving and Old are what the pacer last saw:
	// the early count fixed at the opening (before it: the early joins),
	// the late joins, the serving counter, the last place admitted longer
	// ago than the window.
	Opened                    bool
	Early, Post, Serving, Old int64
	// Perm and EarlyGapHi, once a line was lost before its opening: only
	// the first Perm early places are drawn at random, and those after
	// them up to EarlyGapHi may or may not have been given.
	Perm, EarlyGapHi int64
}

// QueueLine reads the line facts of program's current room (zero when it
// has none, or no facts yet).
func (l *Ledger) QueueLine(ctx context.Context, program keys.ID) (QueueLine, error) {
	c, err := l.Queue(ctx, program)
	if errors.Is(err, ErrNotFound) {
		return QueueLine{Program: program}, nil
	}
	if err != nil {
		return QueueLine{Program: program}, err
	}
	return l.RoomLine(ctx, program, c.Room())
}

// RoomLine reads the line facts of a room (zero for a line never
// reserved).
func (l *Ledger) RoomLine(ctx context.Context, program, room keys.ID) (QueueLine, error) {
	q := QueueLine{Program: program, Room: room}
	var opened int64
	err := l.db.QueryRowContext(ctx, `SELECT pre_cap, post_cap, opened, early, post_seen, serving_seen, old_seen, perm, egap_hi
		FROM queue_places WHERE program = $1 AND room = $2`, program, room).Scan(&q.PreCap, &q.PostCap, &opened, &q.Early, &q.Post,
		&q.Serving, &q.Old, &q.Perm, &q.EarlyGapHi)
	if errors.Is(err, sql.ErrNoRows) {
		return q, nil
	}
	if err != nil {
		return q, fmt.Errorf("ledger: queue line: %w", err)
	}
	q.Opened = opened == 1
	return q, nil
}

// ReserveQueuePlaces reserves n more places of a kind (early or late) for a
// room's line and returns the count reserved now.
func (l *Ledger) ReserveQueuePlaces(ctx context.Context, program, room keys.ID, early bool, n int64) (int64, error) {
	if n < 1 || n > 1_000_000 {
		return 0, fmt.Errorf("%w: reserve %d places", stock.ErrInvalid, n)
	}
	col := "post_cap"
	if early {
		col = "pre_cap"
	}
	var upTo int64
	err := l.db.QueryRowContext(ctx, `INSERT INTO queue_places (program, room, `+col+`) VALUES ($1, $2, $3)
		ON CONFLICT (program, room) DO UPDATE SET `+col+` = queue_places.`+col+` + excluded.`+col+`
		RETURNING `+col, program, room, n).Scan(&upTo)
	if err != nil {
		return 0, fmt.Errorf("ledger: reserve queue places: %w", err)
	}
	return upTo, nil
}

// SeeQueueLine records what the pacer saw of a room's line. Each count
// only grows, and the early count stops at the opening, so a pacer that
// saw less (a stale replica) changes nothing.
func (l *Ledger) SeeQueueLine(ctx context.Context, q QueueLine) error {
	opened := int64(0)
	if q.Opened {
		opened = 1
	}
	_, err := l.db.ExecContext(ctx, `INSERT INTO queue_places (program, room, opened, early, post_seen, serving_seen, old_seen)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (program, room) DO UPDATE SET
			early = CASE WHEN queue_places.opened = 1 THEN queue_places.early
				WHEN excluded.opened = 1 OR excluded.early > queue_places.early THEN excluded.early ELSE queue_places.early END,
			opened = CASE WHEN queue_places.opened = 1 THEN 1 ELSE excluded.opened END,
			post_seen = CASE WHEN excluded.post_seen > queue_places.post_seen THEN excluded.post_seen ELSE queue_places.post_seen END,
			serving_seen = CASE WHEN excluded.serving_seen > queue_places.serving_seen THEN excluded.serving_seen ELSE queue_places.serving_seen END,
			old_seen = CASE WHEN excluded.old_seen > queue_places.old_seen THEN excluded.old_seen ELSE queue_places.old_seen END`,
		q.Program, q.Room, opened, q.Early, q.Post, q.Serving, q.Old)
	if err != nil {
		return fmt.Errorf("ledger: see queue line: %w", err)
	}
	return nil
}

// SetEarlyGap records, for a line lost before its opening, that only its
// first perm early places are drawn at random and those up to hi may or
// may not have been given. The first record stays (a line lost again keeps
// it); the line's facts are returned as they are now.
func (l *Ledger) SetEarlyGap(ctx context.Context, program, room keys.ID, perm, hi int64) (QueueLine, error) {
	if perm < 0 || hi < perm {
		return QueueLine{}, fmt.Errorf("%w: early gap %d..%d", stock.ErrInvalid, perm, hi)
	}
	_, err := l.db.ExecContext(ctx, `INSERT INTO queue_places (program, room, perm, egap_hi) VALUES ($1, $2, $3, $4)
		ON CONFLICT (program, room) DO UPDATE SET perm = excluded.perm, egap_hi = excluded.egap_hi
		WHERE queue_places.egap_hi = 0`, program, room, max(perm, 1), hi)
	if err != nil {
		return QueueLine{}, fmt.Errorf("ledger: set early gap: %w", err)
	}
	return l.RoomLine(ctx, program, room)
}

// Spend is an admission spent: buyer's, admitted at Position, by Request
// (whose Idempotency-Key, in the buyer's scope, is Key).
type Spend struct {
	Buyer    keys.ID
	Position int64
	Request  keys.ID
	Key      keys.ID
}

// SpendAdmission records that request spent buyer's admission of a room,
// unless another request did: it returns the request that holds it, and
// whether the holder's key had a committed request when the spend was
// recorded (before). A request commits after its spend is recorded, so a
// request that bought with the admission never has before set: a retry
// of one that has committed before the admission (before the room, or in
// an earlier one). A request still committing when the spend is recorded
// reads as not before, the safe side (its admission stays spent).
func (l *Ledger) SpendAdmission(ctx context.Context, program, room keys.ID, sp Spend) (keys.ID, bool, error) {
	var holder string
	var before int64
	err := l.db.QueryRowContext(ctx, `INSERT INTO queue_spends (program, room, buyer, position, request, request_before)
		VALUES ($1, $2, $3, $4, $5, CASE WHEN EXISTS (SELECT 1 FROM requests WHERE scope = $3 AND idem_key = $6) THEN 1 ELSE 0 END)
		ON CONFLICT (program, room, buyer) DO UPDATE SET request = queue_spends.request
		RETURNING request, request_before`, program, room, sp.Buyer, sp.Position, sp.Request, sp.Key).Scan(&holder, &before)
	if err != nil {
		return keys.ID{}, false, fmt.Errorf("ledger: spend admission: %w", err)
	}
	id, err := keys.ParseID(holder)
	if err != nil {
		return keys.ID{}, false, fmt.Errorf("ledger: spend admission: %w", err)
	}
	return id, before == 1, nil
}

// ReleaseAdmission gives buyer's admission back, if request holds it.
func (l *Ledger) ReleaseAdmission(ctx context.Context, program, room, buyer, request keys.ID) error {
	_, err := l.db.ExecContext(ctx, `DELETE FROM queue_spends WHERE program = $1 AND room = $2 AND buyer = $3 AND request = $4`,
		program, room, buyer, request)
	if err != nil {
		return fmt.Errorf("ledger: release admission: %w", err)
	}
	return nil
}

// AdmissionSpends lists a room's spent admissions.
func (l *Ledger) AdmissionSpends(ctx context.Context, program, room keys.ID) ([]Spend, error) {
	rows, err := l.db.QueryContext(ctx, `SELECT buyer, position, request FROM queue_spends WHERE program = $1 AND room = $2 ORDER BY position`,
		program, room)
	if err != nil {
		return nil, fmt.Errorf("ledger: admission spends: %w", err)
	}
	defer rows.Close()
	var out []Spend
	for rows.Next() {
		var b, r string
		var sp Spend
		if err := rows.Scan(&b, &sp.Position, &r); err != nil {
			return nil, fmt.Errorf("ledger: admission spends: %w", err)
		}
		if sp.Buyer, err = keys.ParseID(b); err != nil {
			return nil, fmt.Errorf("ledger: admission spends: %w", err)
		}
		if sp.Request, err = keys.ParseID(r); err != nil {
			return nil, fmt.Errorf("ledger: admission spends: %w", err)
		}
		out = append(out, sp)
	}
	return out, rows.Err()
}

// PutQueue turns a program's waiting room on, or changes it (its secret
// stays what it was).
func (l *Ledger) PutQueue(ctx context.Context, c QueueConfig) (QueueConfig, error) {
	if err := c.Validate(); err != nil {
		return c, err
	}
	if c.JoinFrom.IsZero() {
		c.JoinFrom = c.OpensAt
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	// A program moved away from this primary gets no room here (no row
	// inserted: ErrMoving).
	fence := " WHERE true" // SQLite needs a WHERE before ON CONFLICT here
	if l.schema.Version >= directoryStep {
		fence = ` WHERE NOT EXISTS (SELECT 1 FROM program_moves WHERE program = $1 AND to_primary <> '')` // '': arriving
	}
	err := l.db.QueryRowContext(ctx, `INSERT INTO queues (program, opens_at, join_from, rate, window_ms, per_remaining, secret, checkout_url, pow_bits, sold_out_share)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10`+fence+`
		ON CONFLICT (program) DO UPDATE SET opens_at = excluded.opens_at, join_from = excluded.join_from, rate = excluded.rate,
			window_ms = excluded.window_ms, per_remaining = excluded.per_remaining, checkout_url = excluded.checkout_url,
			pow_bits = excluded.pow_bits, sold_out_share = excluded.sold_out_share
		RETURNING secret`, c.Program, c.OpensAt.UnixMilli(), c.JoinFrom.UnixMilli(), c.Rate, c.Window.Milliseconds(),
		c.PerRemaining, hex.EncodeToString(b[:]), c.CheckoutURL, c.PowBits, c.SoldOutShare).Scan(&c.Secret)
	if errors.Is(err, sql.ErrNoRows) {
		return c, fmt.Errorf("%w: %w: %s", ErrNotCommitted, ErrMoving, c.Program)
	}
	if err != nil {
		return c, fmt.Errorf("ledger: put queue: %w", err)
	}
	return l.Queue(ctx, c.Program)
}

// Queue returns a program's waiting room, or ErrNotFound.
func (l *Ledger) Queue(ctx context.Context, program keys.ID) (QueueConfig, error) {
	c := QueueConfig{Program: program}
	var opens, from, window int64
	err := l.db.QueryRowContext(ctx, `SELECT opens_at, join_from, rate, window_ms, per_remaining, secret, checkout_url, pow_bits, sold_out_share
		FROM queues WHERE program = $1`, program).Scan(&opens, &from, &c.Rate, &window, &c.PerRemaining, &c.Secret, &c.CheckoutURL, &c.PowBits,
		&c.SoldOutShare)
	if errors.Is(err, sql.ErrNoRows) {
		return c, ErrNotFound
	}
	if err != nil {
		return c, fmt.Errorf("ledger: queue: %w", err)
	}
	c.OpensAt, c.JoinFrom, c.Window = time.UnixMilli(opens).UTC(), time.UnixMilli(from).UTC(), time.Duration(window)*time.Millisecond
	return c, nil
}

// DeleteQueue turns a program's waiting room off; false when it had none.
func (l *Ledger) DeleteQueue(ctx context.Context, program keys.ID) (bool, error) {
	res, err := l.db.ExecContext(ctx, `DELETE FROM queues WHERE program = $1`, program)
	if err != nil {
		return false, fmt.Errorf("ledger: delete queue: %w", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// QueuedPrograms lists the programs with a waiting room and their rooms
// (for the pacer), in one query.
func (l *Ledger) QueuedPrograms(ctx context.Context) ([]QueueConfig, error) {
	rows, err := l.queryRepeated(ctx, `SELECT program, opens_at, join_from, rate, window_ms, per_remaining, secret, checkout_url, pow_bits, sold_out_share
		FROM queues ORDER BY program`)
	if err != nil {
		return nil, fmt.Errorf("ledger: queued programs: %w", err)
	}
	defer rows.Close()
	var out []QueueConfig
	for rows.Next() {
		var c QueueConfig
		var opens, from, window int64
		if err := rows.Scan(&c.Program, &opens, &from, &c.Rate, &window, &c.PerRemaining, &c.Secret, &c.CheckoutURL, &c.PowBits,
			&c.SoldOutShare); err != nil {
			return nil, fmt.Errorf("ledger: queued programs: %w", err)
		}
		c.OpensAt, c.JoinFrom, c.Window = time.UnixMilli(opens).UTC(), time.UnixMilli(from).UTC(), time.Duration(window)*time.Millisecond
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: queued programs: %w", err)
	}
	return out, nil
}

// ProgramStock is what a program has to sell, over every ticket and pool
// whose sale has not ended. Remaining and Held count only what a buyer
// the line admits could buy now: a pool not open yet, or one of an
// organizer's channel (which sells around the line), is left out, or the
// room admitted buyers for tickets none of them could buy, and they met
// sold out (helper-51). A code's pool counts: a presale's line is its
// code holders.
type ProgramStock struct {
	Ended     int64 // tickets and pools whose sale ended
	SKUs      int64 // tickets and pools on sale
	Remaining int64 // total - sold - held
	Held      int64
}

// SoldOut: the program has had tickets, and those still on sale have
// nothing left nor held (only a refund could bring one back), or none is
// on sale any more.
func (p ProgramStock) SoldOut() bool {
	return p.SKUs+p.Ended > 0 && (p.SKUs == 0 || p.Remaining <= 0 && p.Held <= 0)
}

// ProgramStock reads what program has to sell.
func (l *Ledger) ProgramStock(ctx context.Context, program keys.ID) (ProgramStock, error) {
	var p ProgramStock
	const sells = `ended_at = 0 AND pool_access <> '` + AccessChannel + `' AND pool_opens_at <= $2`
	err := l.queryRowRepeated(ctx, `SELECT
			COALESCE(SUM(CASE WHEN ended_at = 0 THEN 0 ELSE 1 END), 0),
			COALESCE(SUM(CASE WHEN ended_at = 0 THEN 1 ELSE 0 END), 0),
			COALESCE(SUM(CASE WHEN `+sells+` THEN total - sold - held ELSE 0 END), 0),
			COALESCE(SUM(CASE WHEN `+sells+` THEN held ELSE 0 END), 0)
		FROM skus WHERE program = $1`, program, l.now().UnixMilli()).Scan(&p.Ended, &p.SKUs, &p.Remaining, &p.Held)
	if err != nil {
		return p, fmt.Errorf("ledger: program stock: %w", err)
	}
	return p, nil
}

// validCheckout says u is an absolute http(s) URL of at most 2048 bytes.
func validCheckout(u string) bool {
	p, err := url.Parse(u)
	return err == nil && len(u) <= 2048 && (p.Scheme == "http" || p.Scheme == "https") && p.Host != ""
}

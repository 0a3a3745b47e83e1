package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// The waitlist gives stock that comes back to the buyers who asked for it
// first. A buyer joins a SKU's line once it is sold out. Every return of
// units to the ledger (a hold cancelled or expired, an order refunded, a
// closed pool's stock moved on) offers them, in the same transaction, to
// the head of the line: each offer is a hold of the entry's quantity for
// its buyer with the entry's own TTL, so no buyer refreshing the page can
// take the units in between. Only what no entry takes goes back to Redis.
// An offer is a hold like any other: confirmed it becomes an order, and
// cancelled or expired its units come back, and are offered on.

// Waitlist entry states. An offered entry's outcome is its hold's state. A
// waiting entry of a SKU whose sale ended, or of a pool closed or no
// longer open to all, is Closed: no offer will come.
const (
	Waiting = "waiting"
	Offered = "offered"
	Left    = "left"
)

// offerGate is the gate record of an offer's hold. Its units were taken at
// the gate by the hold or order they came back from, and the gate still
// counts them taken: when the offer ends they are owed to the gate like a
// gate-admitted hold's.
const offerGate = "waitlist"

// Errors of the waitlist.
var (
	// ErrNotSoldOut: the SKU has the quantity left; buy it instead.
	ErrNotSoldOut = errors.New("ledger: stock left")
	// ErrOffered: the entry has a live offer; leaving does not end it
	// (cancel its hold to decline it).
	ErrOffered = errors.New("ledger: entry offered")
	// ErrSeatedWait: a seated SKU has no waitlist (its seats are specific).
	ErrSeatedWait = errors.New("ledger: seated ticket has no waitlist")
	// ErrQueuedWait: the program sells through a waiting room, whose line
	// gets the returns; a waitlist's entry would never be offered any.
	ErrQueuedWait = errors.New("ledger: program behind a waiting room has no waitlist")
)

// WaitEntry is a buyer's place on a SKU's waitlist.
type WaitEntry struct {
	SKU      stock.SKU
	Buyer    keys.ID
	Quantity int64
	// Seq orders the line; Ahead is how many waiting entries are before
	// this one (filled by WaitEntryOf for a waiting entry).
	Seq      int64
	Ahead    int64
	State    string
	OfferTTL time.Duration
	JoinedAt time.Time
	// HoldID names the offer's hold once offered; Offer is that hold
	// (filled by WaitEntryOf and JoinWaitlist).
	HoldID keys.ID
	Offer  *Hold
	// Closed: the SKU's sale ended, or its pool closed or is no longer
	// open to all; a waiting entry will get no offer.
	Closed bool
}

// IsOffer reports whether h is a waitlist offer.
func (h Hold) IsOffer() bool { return h.Gate == offerGate }

// JoinWaitlist puts buyer on sku's waitlist for q units, whose offer will
// be held for ttl. A buyer has one entry per SKU: joining again while
// waiting, or while an offer is live, answers the entry as it is (created
// false); after leaving or after an offer ended the buyer joins again at
// the back of the line. It refuses with ErrNotSoldOut while the ledger has
// q units left, stock.ErrSaleEnded, ErrPoolClosed, ErrSeatedWait,
// stock.ErrLimit when q is over the buyer's cap of the ticket, and
// stock.ErrUnknownSKU.
func (l *Ledger) JoinWaitlist(ctx context.Context, sku stock.SKU, buyer keys.ID, q int64, ttl time.Duration) (_ WaitEntry, created bool, err error) {
	defer l.observe("waitlist_join", time.Now(), &err)
	if q < 1 || buyer.IsZero() || ttl <= 0 {
		return WaitEntry{}, false, fmt.Errorf("%w: waitlist quantity %d ttl %v", stock.ErrInvalid, q, ttl)
	}
	now := l.now().UTC().Truncate(time.Millisecond)
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return WaitEntry{}, false, notCommitted("waitlist: begin", err)
	}
	defer tx.Rollback()
	left, seq, err := lockForWait(ctx, tx, sku, q, now)
	if err != nil {
		return WaitEntry{}, false, err
	}
	cur, err := entryOf(ctx, tx, sku, buyer, now)
	switch {
	case err == nil && (cur.State == Waiting || cur.State == Offered && cur.Offer.stateAt(now) == Held):
		return cur, false, nil
	case err != nil && !errors.Is(err, ErrNotFound):
		return cur, false, err
	}
	if left >= q {
		return WaitEntry{}, false, ErrNotSoldOut
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO waitlist (program, ticket, buyer, seq, quantity, state, offer_ttl_ms, joined_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)
		ON CONFLICT (program, ticket, buyer) DO UPDATE SET seq = excluded.seq, quantity = excluded.quantity,
			state = excluded.state, offer_ttl_ms = excluded.offer_ttl_ms, hold_id = '', joined_at = excluded.joined_at,
			updated_at = excluded.updated_at`,
		sku.Program, sku.Ticket, buyer, seq, q, Waiting, ttl.Milliseconds(), now.UnixMilli()); err != nil {
		return WaitEntry{}, false, notCommitted("waitlist: join", err)
	}
	e := WaitEntry{SKU: sku, Buyer: buyer, Quantity: q, Seq: seq, State: Waiting, OfferTTL: ttl.Truncate(time.Millisecond), JoinedAt: now}
	if e.Ahead, err = aheadOf(ctx, tx, e); err != nil {
		return e, false, err
	}
	if err := emitCommit(ctx, tx, now, "waitlist join", Event{Type: EventWaitlistJoined, SKU: sku, Buyer: buyer, Quantity: q}); err != nil {
		return e, false, err
	}
	return e, true, nil
}

// lockForWait locks sku's row for a join of q units, and takes the
// join's place in line (seq); it returns the units the ledger has left.
// It refuses what JoinWaitlist refuses from the SKU and its program.
//
// The SKU row's lock orders joins with the returns that offer: a return
// either sees the entry, or committed before the join read the stock it
// freed (and the join is refused: buy it).
func lockForWait(ctx context.Context, tx *sql.Tx, sku stock.SKU, q int64, now time.Time) (left, seq int64, err error) {
	var ended, seated, closed, closes, perBuyer, maxPer int64
	err = tx.QueryRowContext(ctx, `UPDATE skus SET wait_seq = wait_seq + 1 WHERE program = $1 AND ticket = $2
		RETURNING total - sold - held, ended_at, seated, pool_closed_at, pool_closes_at, per_buyer, max_per_order, wait_seq`,
		sku.Program, sku.Ticket).Scan(&left, &ended, &seated, &closed, &closes, &perBuyer, &maxPer, &seq)
	switch {
	case err == nil && closedBy(closes, now):
		return 0, 0, ErrPoolClosed
	case errors.Is(err, sql.ErrNoRows):
		return 0, 0, stock.ErrUnknownSKU
	case err != nil:
		return 0, 0, notCommitted("waitlist: lock sku", err)
	case ended > 0 && closed > 0:
		return 0, 0, ErrPoolClosed
	case ended > 0:
		return 0, 0, stock.ErrSaleEnded
	case seated != 0:
		return 0, 0, ErrSeatedWait
	case q > maxPer:
		return 0, 0, fmt.Errorf("%w: quantity %d over %d per order", stock.ErrInvalid, q, maxPer)
	case perBuyer > 0 && q > perBuyer:
		return 0, 0, stock.ErrLimit
	}
	// Over the program's cap no offer could ever be made: the entry would
	// stand first in line for good.
	// Behind a waiting room no offer is made either (offerBack): the
	// replica's view of the rooms may be a second old, this read is not.
	var programCap, queued int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE((SELECT per_buyer FROM programs WHERE program = $1), 0),
			(SELECT COUNT(*) FROM queues WHERE program = $1)`,
		sku.Program).Scan(&programCap, &queued); err != nil {
		return 0, 0, notCommitted("waitlist: program cap", err)
	}
	switch {
	case queued > 0:
		return 0, 0, ErrQueuedWait
	case programCap > 0 && q > programCap:
		return 0, 0, stock.ErrLimit
	}
	return left, seq, nil
}

// LeaveWaitlist takes a waiting buyer off the line. Leaving again answers
// the entry as it is; an entry with a live offer is refused with
// ErrOffered; ErrNotFound when the buyer never joined.
func (l *Ledger) LeaveWaitlist(ctx context.Context, sku stock.SKU, buyer keys.ID) (WaitEntry, error) {
	now := l.now().UTC().Truncate(time.Millisecond)
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return WaitEntry{}, notCommitted("waitlist: begin", err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `UPDATE waitlist SET state = $4, updated_at = $5
		WHERE program = $1 AND ticket = $2 AND buyer = $3 AND state = $6`,
		sku.Program, sku.Ticket, buyer, Left, now.UnixMilli(), Waiting)
	if err != nil {
		return WaitEntry{}, notCommitted("waitlist: leave", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		if err := emitCommit(ctx, tx, now, "waitlist leave", Event{Type: EventWaitlistLeft, SKU: sku, Buyer: buyer}); err != nil {
			return WaitEntry{}, err
		}
	} else {
		tx.Rollback()
	}
	e, err := l.WaitEntryOf(ctx, sku, buyer)
	if err == nil && e.State == Offered && e.Offer != nil && e.Offer.stateAt(now) == Held {
		return e, ErrOffered
	}
	return e, err
}

// WaitEntryOf returns buyer's entry on sku's waitlist with its place in
// line, or ErrNotFound.
func (l *Ledger) WaitEntryOf(ctx context.Context, sku stock.SKU, buyer keys.ID) (WaitEntry, error) {
	tx, err := l.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: l.driver == Postgres})
	if err != nil {
		return WaitEntry{}, fmt.Errorf("ledger: waitlist: %w", err)
	}
	defer tx.Rollback()
	e, err := entryOf(ctx, tx, sku, buyer, l.now())
	if err != nil {
		return e, err
	}
	return e, tx.Commit()
}

// entryOf reads buyer's entry with its place in line or its offer.
func entryOf(ctx context.Context, tx *sql.Tx, sku stock.SKU, buyer keys.ID, now time.Time) (WaitEntry, error) {
	e, err := scanEntry(tx.QueryRowContext(ctx, selectEntry+` WHERE program = $1 AND ticket = $2 AND buyer = $3`,
		sku.Program, sku.Ticket, buyer))
	if err != nil {
		return e, err
	}
	switch e.State {
	case Waiting:
		// Closed where offerBack offers nothing: a waiting entry there
		// will never be offered a unit (a pool closed or made a code's or
		// a channel's, a seat map loaded, a waiting room put in front).
		var ended, closed, closes, seated, queued int64
		var access string
		if err := tx.QueryRowContext(ctx, `SELECT ended_at, pool_closed_at, pool_closes_at, seated, pool_access,
				(SELECT COUNT(*) FROM queues WHERE queues.program = skus.program)
			FROM skus WHERE program = $1 AND ticket = $2`,
			sku.Program, sku.Ticket).Scan(&ended, &closed, &closes, &seated, &access, &queued); err != nil {
			return e, fmt.Errorf("ledger: waitlist sku: %w", err)
		}
		e.Closed = ended > 0 || closed > 0 || closedBy(closes, now) || seated != 0 || access != AccessOpen || queued > 0
		e.Ahead, err = aheadOf(ctx, tx, e)
	case Offered:
		var h Hold
		if h, err = scanHold(tx.QueryRowContext(ctx, selectHold+` WHERE id = $1`, e.HoldID)); err != nil {
			return e, fmt.Errorf("ledger: waitlist offer: %w", err)
		}
		e.Offer = &h
	}
	return e, err
}

// WaitlistLength counts the entries waiting on sku's line.
func (l *Ledger) WaitlistLength(ctx context.Context, sku stock.SKU) (int64, error) {
	var n int64
	err := l.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM waitlist WHERE program = $1 AND ticket = $2 AND state = $3`,
		sku.Program, sku.Ticket, Waiting).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("ledger: waitlist length: %w", err)
	}
	return n, nil
}

const selectEntry = `SELECT program, ticket, buyer, seq, quantity, state, offer_ttl_ms, hold_id, joined_at FROM waitlist`

func scanEntry(r rowScanner) (WaitEntry, error) {
	var e WaitEntry
	var ttl, joined int64
	err := r.Scan(&e.SKU.Program, &e.SKU.Ticket, &e.Buyer, &e.Seq, &e.Quantity, &e.State, &ttl, &e.HoldID, &joined)
	if errors.Is(err, sql.ErrNoRows) {
		return e, ErrNotFound
	}
	if err != nil {
		return e, fmt.Errorf("ledger: waitlist entry: %w", err)
	}
	e.OfferTTL = time.Duration(ttl) * time.Millisecond
	e.JoinedAt = time.UnixMilli(joined).UTC()
	return e, nil
}

func aheadOf(ctx context.Context, tx *sql.Tx, e WaitEntry) (int64, error) {
	var n int64
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM waitlist WHERE program = $1 AND ticket = $2 AND state = $3 AND seq < $4`,
		e.SKU.Program, e.SKU.Ticket, Waiting, e.Seq).Scan(&n); err != nil {
		return 0, fmt.Errorf("ledger: waitlist place: %w", err)
	}
	return n, nil
}

// backRow is a hold or order whose units came back, for offerBack to take
// the offered units off what it owes Redis.
type backRow struct {
	table   string // holds or orders
	id      keys.ID
	q       int64
	pending int // what the return owes Redis (isOwed)
}

// offersPage is how many waiting entries offerBack reads at a time.
const offersPage = 100

// offerBack offers units that came back to sku, inside the transaction
// that returned them (which holds the SKU row), to the head of its
// waitlist: entry by entry in line order, each offered its whole quantity
// as a hold if the units left cover it and the buyer's caps allow it (an
// entry that does not fit stays in line, in its place). The offered units
// are taken off what rows owe Redis: first off rows that owe it nothing
// (their units were never taken from this gate), then off rows that owe
// units, a row all of whose units were offered owing only its counts. An
// ended sale, a closed pool and seated stock offer nothing. It returns the
// offers' events.
func offerBack(ctx context.Context, tx *sql.Tx, sku stock.SKU, units int64, rows []backRow, now time.Time) ([]Event, error) {
	if units <= 0 {
		return nil, nil
	}
	var events []Event
	var offered int64
	var after int64 = -1
	var epoch int64
	checked := false
	for units > 0 {
		page, err := waitingPage(ctx, tx, sku, after)
		if err != nil || len(page) == 0 {
			if err != nil {
				return nil, err
			}
			break
		}
		if !checked {
			checked = true
			var ended, closed, opens, closes, seated, queued int64
			var access string
			if err := tx.QueryRowContext(ctx, `SELECT gate_epoch, ended_at, pool_closed_at, pool_opens_at, pool_closes_at, seated, pool_access,
					(SELECT COUNT(*) FROM queues WHERE queues.program = skus.program)
				FROM skus WHERE program = $1 AND ticket = $2`, sku.Program, sku.Ticket).Scan(&epoch, &ended, &closed, &opens, &closes, &seated, &access, &queued); err != nil {
				return nil, notCommitted("waitlist: read sku", err)
			}
			// A pool past its window's end sells nothing, and the
			// sweeper's close moves what it has on: an offer now passed
			// the window by, and the unit never reached the line it
			// moves to (helper-68).
			if closedBy(closes, now) {
				closed = 1
			}
			// A pool whose window an admin moved later, after buyers
			// joined its line, sells nothing until it opens: an offer now
			// would pass the window by (helper-84). The unit goes back to
			// its stock, and the line waits for later returns.
			if opens > now.UnixMilli() {
				return nil, nil
			}
			// A pool whose rule became a code or a channel after buyers
			// joined its line offers nothing: an offer would pass the
			// rule by. So does a program behind a waiting room: its
			// returns go back to the gate, and the room lets the next
			// buyers in.
			if ended > 0 || closed > 0 || seated != 0 || access != AccessOpen || queued > 0 {
				return nil, nil
			}
		}
		for _, e := range page {
			after = e.Seq
			if e.Quantity > units {
				continue
			}
			h, ok, err := offer(ctx, tx, e, epoch, now)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
			units -= h.Quantity
			offered += h.Quantity
			events = append(events, Event{Type: EventOfferMade, SKU: sku, Subject: h.ID, Buyer: h.Buyer, Quantity: h.Quantity})
			if units == 0 {
				break
			}
		}
		if len(page) < offersPage {
			break
		}
	}
	if offered == 0 {
		return nil, nil
	}
	return events, takeOffOwed(ctx, tx, rows, offered)
}

// waitingPage reads the next entries of sku's line after seq.
func waitingPage(ctx context.Context, tx *sql.Tx, sku stock.SKU, after int64) ([]WaitEntry, error) {
	rows, err := tx.QueryContext(ctx, selectEntry+` WHERE program = $1 AND ticket = $2 AND state = $3 AND seq > $4
		ORDER BY seq LIMIT $5`, sku.Program, sku.Ticket, Waiting, after, offersPage)
	if err != nil {
		return nil, notCommitted("waitlist: read line", err)
	}
	defer rows.Close()
	var out []WaitEntry
	for rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			return nil, notCommitted("waitlist: read line", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, notCommitted("waitlist: read line", err)
	}
	return out, nil
}

// offer makes entry e's offer: its buyer counted under the caps (a
// savepoint undoes a refused count, and the entry keeps its place), the
// entry marked offered, the hold written and the SKU's held raised. ok is
// false when the caps refused it or the entry left meanwhile.
func offer(ctx context.Context, tx *sql.Tx, e WaitEntry, epoch int64, now time.Time) (h Hold, ok bool, err error) {
	if _, err := tx.ExecContext(ctx, `SAVEPOINT offer`); err != nil {
		return h, false, notCommitted("waitlist: savepoint", err)
	}
	undo := func() error {
		if _, err := tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT offer`); err != nil {
			return notCommitted("waitlist: rollback to savepoint", err)
		}
		return nil
	}
	refused, err := countBuyers(ctx, tx, []buyerRow{{e.SKU.Base(), e.Buyer, e.Quantity}, {e.SKU.Whole(), e.Buyer, e.Quantity}})
	if err != nil {
		return h, false, err
	}
	if refused != nil {
		return h, false, undo()
	}
	h = Hold{ID: NewIDOf(e.SKU), IdempotencyKey: NewID(), SKU: e.SKU, Buyer: e.Buyer, Quantity: e.Quantity, Gate: offerGate,
		State: Held, CreatedAt: now, ExpiresAt: now.Add(e.OfferTTL), TakeEpoch: epoch}
	res, err := tx.ExecContext(ctx, `UPDATE waitlist SET state = $4, hold_id = $5, updated_at = $6
		WHERE program = $1 AND ticket = $2 AND buyer = $3 AND state = $7`,
		e.SKU.Program, e.SKU.Ticket, e.Buyer, Offered, h.ID, now.UnixMilli(), Waiting)
	if err != nil {
		return h, false, notCommitted("waitlist: offer", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return h, false, undo()
	}
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO holds (id, idem_key, request_hash, program, ticket, buyer, quantity, gate, state, expires_at, created_at, take_epoch)
		VALUES ($1, $2, '', $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		h.ID, h.IdempotencyKey, h.SKU.Program, h.SKU.Ticket, h.Buyer, h.Quantity, h.Gate, Held,
		h.ExpiresAt.UnixMilli(), h.CreatedAt.UnixMilli(), h.TakeEpoch); err != nil {
		return h, false, notCommitted("waitlist: offer hold", err)
	}
	res, err = tx.ExecContext(ctx, `UPDATE skus SET held = held + $3, version = version + 1, updated_at = $4
		WHERE program = $1 AND ticket = $2 AND total - sold - held >= $3`, e.SKU.Program, e.SKU.Ticket, e.Quantity, now.UnixMilli())
	if err != nil {
		return h, false, notCommitted("waitlist: offer stock", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		// The return freed the units under this transaction's lock: not
		// having them is a bug, and nothing may commit.
		return h, false, fmt.Errorf("ledger: waitlist offer of %d units of %s: not there", e.Quantity, e.SKU)
	}
	if _, err := tx.ExecContext(ctx, `RELEASE SAVEPOINT offer`); err != nil {
		return h, false, notCommitted("waitlist: release savepoint", err)
	}
	return h, true, nil
}

// takeOffOwed takes offered units off what rows owe Redis (see offerBack).
func takeOffOwed(ctx context.Context, tx *sql.Tx, rows []backRow, offered int64) error {
	for _, r := range rows {
		if r.pending != owedUnits {
			// Units Redis is not owed (a take around the gate: owed its
			// counts at most) are offered first.
			offered -= min(offered, r.q)
		}
	}
	for _, r := range rows {
		if offered == 0 {
			break
		}
		if r.pending != owedUnits {
			continue
		}
		take := min(offered, r.q)
		offered -= take
		pending := owedUnits
		if take == r.q {
			pending = owedCounts
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+r.table+` SET offered = $2, restore_pending = $3 WHERE id = $1`,
			r.id, take, pending); err != nil {
			return notCommitted("waitlist: owed", err)
		}
	}
	return nil
}

// closedBy reports whether a pool's window (closes, Unix ms; 0: none) has
// ended by now, closed by the sweeper or not yet.
func closedBy(closes int64, now time.Time) bool {
	return closes > 0 && closes <= now.UnixMilli()
}

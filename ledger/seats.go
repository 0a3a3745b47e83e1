package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// Seat states in the ledger.
const (
	seatFree = "free"
	seatHeld = "held"
	seatSold = "sold"
)

// Seat is one seat of a SKU's map, with its state.
type Seat struct {
	ID      keys.ID `json:"id"`
	Section keys.ID `json:"section"`
	Row     string  `json:"row"`
	Number  int     `json:"number"`
	State   string  `json:"state"`   // free, held, sold
	HoldID  keys.ID `json:"hold_id"` // the hold holding it, or sold through
}

// SeatsTakenError names the seats a seat hold could not have.
type SeatsTakenError struct{ Seats []string }

func (e *SeatsTakenError) Error() string { return fmt.Sprintf("ledger: seats taken: %v", e.Seats) }

// ErrSeatsTaken is matched by errors.Is on a *SeatsTakenError.
var ErrSeatsTaken = errors.New("ledger: seats taken")

func (e *SeatsTakenError) Is(target error) bool { return target == ErrSeatsTaken }

// LoadSeats adds seats to a SKU's map (seats it has keep their state) and
// sets the SKU's total to the map's size, refused (stock.ErrInvalid) if
// that is below what is sold and held, or if a seat the map has is given
// with another section, row or number (a seat never moves: Redis keeps
// seats by section, and holds name them).
func (l *Ledger) LoadSeats(ctx context.Context, sku stock.SKU, seats []Seat) (int64, error) {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("ledger: load seats: %w", err)
	}
	defer tx.Rollback()
	noPools := func() error {
		if pooled, err := pooledTotal(ctx, tx, sku); err != nil {
			return err
		} else if pooled > 0 || !sku.Pool().IsZero() {
			return fmt.Errorf("%w: a ticket with pools sells counted stock; it cannot take a seat map", stock.ErrInvalid)
		}
		return nil
	}
	if err := noPools(); err != nil {
		return 0, err
	}
	for _, s := range seats {
		res, err := tx.ExecContext(ctx, `INSERT INTO seats (program, ticket, seat_id, section, row_label, number)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (program, ticket, seat_id) DO NOTHING`,
			sku.Program, sku.Ticket, s.ID, s.Section, s.Row, s.Number)
		if err != nil {
			return 0, fmt.Errorf("ledger: load seats: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			continue
		}
		var same int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM seats WHERE program = $1 AND ticket = $2 AND seat_id = $3
			AND section = $4 AND row_label = $5 AND number = $6`,
			sku.Program, sku.Ticket, s.ID, s.Section, s.Row, s.Number).Scan(&same); err != nil {
			return 0, fmt.Errorf("ledger: load seats: %w", err)
		}
		if same != 1 {
			return 0, fmt.Errorf("%w: seat %s is in the map with another section, row or number", stock.ErrInvalid, s.ID)
		}
	}
	// The pools are counted again under the ticket's row lock, taken
	// last, after the seats (as a take takes them: seats, then the row),
	// so a map being loaded never freezes the ticket's sales nor closes a
	// cycle with them. A pool being made holds the row until it commits,
	// and read committed reads each statement anew: the count sees that
	// pool, and a seat map never lands beside one (PutPool checks
	// seated = 0 under the same lock).
	if _, err := tx.ExecContext(ctx, `SELECT 1 FROM skus WHERE program = $1 AND ticket = $2`+l.forUpdate(),
		sku.Program, sku.Ticket); err != nil {
		return 0, fmt.Errorf("ledger: load seats: lock: %w", err)
	}
	if err := noPools(); err != nil {
		return 0, err
	}
	// Counted under the lock too: another load of the map committed its
	// seats while this one waited, and the total is both maps' (counted
	// before, two loads of disjoint seats each wrote its own count, and
	// the last one's total left the other's seats out; helper-38).
	var n int64
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM seats WHERE program = $1 AND ticket = $2`,
		sku.Program, sku.Ticket).Scan(&n); err != nil {
		return 0, fmt.Errorf("ledger: load seats: %w", err)
	}
	// Two ids at one place (this load's beside a seat loaded before, or
	// beside another load's that committed while this one waited) are one
	// seat the venue would sell twice.
	var section, row string
	var number int
	switch err := tx.QueryRowContext(ctx, `SELECT section, row_label, number FROM seats WHERE program = $1 AND ticket = $2
		GROUP BY section, row_label, number HAVING COUNT(*) > 1 LIMIT 1`, sku.Program, sku.Ticket).Scan(&section, &row, &number); {
	case err == nil:
		return 0, fmt.Errorf("%w: two seats at one place (section %s, row %q, number %d)", stock.ErrInvalid, section, row, number)
	case !errors.Is(err, sql.ErrNoRows):
		return 0, fmt.Errorf("ledger: load seats: %w", err)
	}
	// A ticket that sold or holds counted units cannot become seated:
	// those units have no seats, and the map's seats would be sold twice.
	res, err := tx.ExecContext(ctx, `UPDATE skus SET total = $3, seated = 1, version = version + 1, bypass_seq = bypass_seq + 1
		WHERE program = $1 AND ticket = $2 AND sold + held <= $3 AND (seated = 1 OR sold + held = 0)`, sku.Program, sku.Ticket, n)
	if err != nil {
		return 0, fmt.Errorf("ledger: load seats: %w", err)
	}
	if k, _ := res.RowsAffected(); k != 1 {
		return 0, fmt.Errorf("%w: seat map of %d below sold + held, a ticket that sold or holds counted units, or no such SKU", stock.ErrInvalid, n)
	}
	return n, tx.Commit()
}

// releaseOrderSeats frees the seats a refunded order sold (held under its
// hold's id, or its own for a cart's seat line) and reports whether it had
// any.
func releaseOrderSeats(ctx context.Context, tx *sql.Tx, o Order) (bool, error) {
	holder, ok := o.seatHolder()
	if !ok {
		return false, nil
	}
	var n int64
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM seats WHERE hold_id = $1 AND state = $2`, holder, seatSold).Scan(&n); err != nil {
		return false, notCommitted("refund seats", err)
	}
	if n == 0 {
		return false, nil
	}
	return true, moveSeats(ctx, tx, holder, seatSold, seatFree)
}

// seatHolder is the id the order's seats are held under in the seats
// table: its hold's, or its own for a cart's seat line bought at once; ok
// is false for an order that can have no seats.
func (o Order) seatHolder() (keys.ID, bool) {
	switch {
	case !o.HoldID.IsZero():
		return o.HoldID, true
	case len(o.SeatIDs) > 0:
		return o.ID, true
	}
	return keys.ID{}, false
}

// moveSeats moves the seats of a hold from one state to another inside tx.
func moveSeats(ctx context.Context, tx *sql.Tx, holdID keys.ID, from, to string) error {
	hold := holdID
	if to == seatFree {
		hold = keys.ID{}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE seats SET state = $3, hold_id = $4 WHERE hold_id = $1 AND state = $2`,
		holdID, from, to, hold); err != nil {
		return notCommitted("move seats", err)
	}
	return nil
}

// Seats lists a SKU's seats in a section ("" for all), in seat id order.
func (l *Ledger) Seats(ctx context.Context, sku stock.SKU, section keys.ID) ([]Seat, error) {
	rows, err := l.db.QueryContext(ctx, `SELECT seat_id, section, row_label, number, state, hold_id FROM seats
		WHERE program = $1 AND ticket = $2 AND ($3 = '' OR section = $3) ORDER BY seat_id`, sku.Program, sku.Ticket, section)
	if err != nil {
		return nil, fmt.Errorf("ledger: seats: %w", err)
	}
	defer rows.Close()
	var out []Seat
	for rows.Next() {
		var s Seat
		if err := rows.Scan(&s.ID, &s.Section, &s.Row, &s.Number, &s.State, &s.HoldID); err != nil {
			return nil, fmt.Errorf("ledger: seats: %w", err)
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// SeatFact is what the ledger says a seat's gate state must be: free, or
// held or sold under the Idempotency-Key of its hold (the id the gate uses).
type SeatFact struct {
	ID, Section keys.ID
	State       string // free, held, sold
	HoldKey     string
}

// SeatFacts lists a SKU's seats with the key of the hold on each.
func (l *Ledger) SeatFacts(ctx context.Context, sku stock.SKU) ([]SeatFact, error) {
	// A seat's holder is a hold, or the order of a cart line that bought
	// it at once; the gate knows either by its row key.
	rows, err := l.db.QueryContext(ctx, `SELECT s.seat_id, s.section, s.state, COALESCE(h.idem_key, o.idem_key, '')
		FROM seats s LEFT JOIN holds h ON h.id = s.hold_id LEFT JOIN orders o ON o.id = s.hold_id
		WHERE s.program = $1 AND s.ticket = $2 ORDER BY s.seat_id`, sku.Program, sku.Ticket)
	if err != nil {
		return nil, fmt.Errorf("ledger: seat facts: %w", err)
	}
	defer rows.Close()
	var out []SeatFact
	for rows.Next() {
		var f SeatFact
		if err := rows.Scan(&f.ID, &f.Section, &f.State, &f.HoldKey); err != nil {
			return nil, fmt.Errorf("ledger: seat facts: %w", err)
		}
		out = append(out, f)
	}
	return out, rows.Err()
}

// splitIDs reads a seat hold's seat ids back from their column (written
// with keys.Join), checking each again.
func splitIDs(s string) ([]keys.ID, error) {
	if s == "" {
		return nil, nil
	}
	var out []keys.ID
	for text := range strings.SplitSeq(s, ",") {
		id, err := keys.ParseID(text)
		if err != nil {
			return nil, fmt.Errorf("ledger: seat ids: %w", err)
		}
		out = append(out, id)
	}
	return out, nil
}

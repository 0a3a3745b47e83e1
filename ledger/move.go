package ledger

// Moving a program's rows from one PostgreSQL primary to another (package
// fleet runs it, with the directory): while its sale is closed, copied in
// one transaction on the target under the source's row locks, checked
// table by table, then deleted from the source.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/stockgate/stockgate/keys"
)

// ErrSaleOpen: a program still selling (a SKU not ended, a live hold, a
// listing open) is not moved.
var ErrSaleOpen = errors.New("ledger: the program's sale is not closed")

// programTables are the tables holding a program's rows, each with the
// condition that picks them ($1 the program) and the columns left to the
// target (an outbox sequence is the target's own: the events are written
// there in their seq order, so they keep it under the new numbers, all
// above the source's last: see seqPast). The
// program's outbox events go along: the target's relay announces them
// again under their event ids (webhook-id), as at-least-once delivery may
// anyway.
var programTables = []struct {
	name, where, skip string
}{
	{"skus", "program = $1", ""},
	{"programs", "program = $1", ""},
	{"orders", "program = $1", ""},
	{"holds", "program = $1", ""},
	{"requests", "program = $1", ""},
	{"buyer_units", "program = $1", ""},
	{"access_codes", "program = $1", ""},
	{"seats", "program = $1", ""},
	{"waitlist", "program = $1", ""},
	{"queues", "program = $1", ""},
	{"queue_places", "program = $1", ""},
	{"queue_spends", "program = $1", ""},
	{"listings", "program = $1", ""},
	{"resale_prior_holds", "program = $1", ""},
	{"resale_listing_holds", "program = $1", ""},
	{"order_listings", "order_id IN (SELECT id FROM orders WHERE program = $1)", ""},
	{"order_channels", "order_id IN (SELECT id FROM orders WHERE program = $1)", ""},
	{"events", "program = $1", "seq"},
}

// TableCount is one table's rows of a program on the source and, once
// copied, on the target.
type TableCount struct {
	Table          string
	Source, Target int64
	// Skipped are request rows the target holds already under their
	// key: a buyer's Idempotency-Key used for a program there too. The
	// key stays the other program's there.
	Skipped int64
}

// Move is a program's move in progress: the source's rows locked and read.
// Copy writes and checks them on the target; Finish deletes them from the
// source; Abort undoes what was copied.
type Move struct {
	program  keys.ID
	token    string // the move's, on its tombstone
	from, to *Ledger
	src      *sql.Tx
	rows     map[string]tableRows
	Counts   []TableCount
	Sums     [2][3]int64 // source, target: the SKUs' total, sold and held
	copied   bool
	// lastSeq is the last event seq the source handed out: the target
	// numbers the program's events above it (see seqPast).
	lastSeq int64
}

type tableRows struct {
	cols []string
	vals [][]any
}

// BeginMove locks program's SKU and order rows on from (so a replica still
// writing there waits, then finds them gone), checks its sale is closed,
// and reads every row of it. to must hold none of the program's rows.
//
// Before it reads, a tombstone of the program is committed on from (a
// write that would create its rows there is refused from then on: see
// fenceMoved), and the source's transaction takes the program's move lock,
// so writes creating rows of it that began before wait for it and those
// after see the tombstone. Abort lifts the tombstone (if still token's);
// Finish keeps it.
func BeginMove(ctx context.Context, from, to *Ledger, program keys.ID, toName, token string) (_ *Move, err error) {
	if from.driver != Postgres || to.driver != Postgres {
		return nil, errors.New("ledger: move: both ledgers must be PostgreSQL")
	}
	if from.ID() == to.ID() {
		return nil, errors.New("ledger: move: source and target are the same ledger")
	}
	held, err := to.programRows(ctx, to.db, program)
	if err != nil {
		return nil, err
	}
	if held > 0 {
		return nil, fmt.Errorf("%w: the target already holds %d rows of %s", ErrConflict, held, program)
	}
	if _, err := from.db.ExecContext(ctx, `INSERT INTO program_moves (program, to_primary, mover, moved_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (program) DO UPDATE SET to_primary = excluded.to_primary, mover = excluded.mover, moved_at = excluded.moved_at`,
		program, toName, token, from.now().UnixMilli()); err != nil {
		return nil, fmt.Errorf("ledger: move: tombstone: %w", err)
	}
	m := &Move{program: program, token: token, from: from, to: to, rows: map[string]tableRows{}}
	defer func() {
		if err != nil {
			if m.src != nil {
				m.src.Rollback()
			}
			_ = from.LiftTombstone(context.WithoutCancel(ctx), program, token)
		}
	}()
	if m.src, err = from.db.BeginTx(ctx, nil); err != nil {
		return nil, fmt.Errorf("ledger: move: %w", err)
	}
	if _, err := m.src.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, moveLock(program)); err != nil {
		return nil, fmt.Errorf("ledger: move: lock: %w", err)
	}
	var open, live, listed int64
	if err := m.src.QueryRowContext(ctx, `SELECT COUNT(*) FILTER (WHERE ended_at = 0), COALESCE(SUM(listed), 0) FROM
		(SELECT ended_at, listed FROM skus WHERE program = $1 ORDER BY ticket FOR UPDATE) s`, program).Scan(&open, &listed); err != nil {
		return nil, fmt.Errorf("ledger: move: skus: %w", err)
	}
	// Every row a write by id changes waits for the move, then finds it
	// gone from here.
	for _, t := range []string{"orders", "holds", "listings", "waitlist"} {
		if _, err := m.src.ExecContext(ctx, `SELECT 1 FROM `+t+` WHERE program = $1 FOR UPDATE`, program); err != nil {
			return nil, fmt.Errorf("ledger: move: lock %s: %w", t, err)
		}
	}
	if err := m.src.QueryRowContext(ctx, `SELECT COUNT(*) FROM holds WHERE program = $1 AND state = $2`, program, Held).Scan(&live); err != nil {
		return nil, fmt.Errorf("ledger: move: holds: %w", err)
	}
	switch {
	case open > 0:
		return nil, fmt.Errorf("%w: %d of its SKUs not ended", ErrSaleOpen, open)
	case live > 0:
		return nil, fmt.Errorf("%w: %d holds live", ErrSaleOpen, live)
	case listed > 0:
		return nil, fmt.Errorf("%w: %d tickets listed for resale", ErrSaleOpen, listed)
	}
	for _, t := range programTables {
		// A column left to the target is numbered there in the order the
		// rows are written: read them in its order on the source, so the
		// target's numbers keep it (the outbox's seq orders a SKU's
		// events; a scan in the order the rows lie on disk does not).
		order := ""
		if t.skip != "" {
			order = ` ORDER BY ` + t.skip
		}
		rows, err := m.src.QueryContext(ctx, `SELECT * FROM `+t.name+` WHERE `+t.where+order, program)
		if err != nil {
			return nil, fmt.Errorf("ledger: move: read %s: %w", t.name, err)
		}
		tr, err := readAll(rows, t.skip)
		if err != nil {
			return nil, fmt.Errorf("ledger: move: read %s: %w", t.name, err)
		}
		m.rows[t.name] = tr
		m.Counts = append(m.Counts, TableCount{Table: t.name, Source: int64(len(tr.vals))})
	}
	if m.Sums[0], err = skuSums(ctx, m.src, program); err != nil {
		return nil, err
	}
	var last sql.NullInt64
	if err := m.src.QueryRowContext(ctx, `SELECT pg_sequence_last_value(pg_get_serial_sequence('events', 'seq')::regclass)`).Scan(&last); err != nil {
		return nil, fmt.Errorf("ledger: move: events seq: %w", err)
	}
	m.lastSeq = last.Int64
	return m, nil
}

// seqPast moves l's event sequence past seq, if it is not already: a
// program's feed read on the source left its reader's cursor at up to
// the source's last seq, and the target's own numbers may be far below
// it, where every event written after the move would hide behind that
// cursor. Numbered above it, the program's events copied there are read
// again (under their ids, to de-duplicate by) and none written after is
// missed. The table is locked while the sequence moves, so that no insert
// takes a seq meanwhile (setval could otherwise set back one handed
// out); lock_timeout bounds the wait behind a long transaction, which
// fails the move (to run again) rather than hold every write back.
func (l *Ledger) seqPast(ctx context.Context, seq int64) error {
	// Already past it (the sequence only grows): no lock.
	var now sql.NullInt64
	if err := l.db.QueryRowContext(ctx, `SELECT pg_sequence_last_value(pg_get_serial_sequence('events', 'seq')::regclass)`).Scan(&now); err != nil {
		return fmt.Errorf("ledger: move: events seq: %w", err)
	}
	if now.Int64 >= seq {
		return nil
	}
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("ledger: move: events seq: %w", err)
	}
	defer tx.Rollback()
	for _, q := range []string{`SET LOCAL lock_timeout = '2s'`, `LOCK TABLE events IN EXCLUSIVE MODE`} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("ledger: move: events seq: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `SELECT setval(pg_get_serial_sequence('events', 'seq'), $1::bigint)
		WHERE $1::bigint > COALESCE(pg_sequence_last_value(pg_get_serial_sequence('events', 'seq')::regclass), 0)`, seq); err != nil {
		return fmt.Errorf("ledger: move: events seq: %w", err)
	}
	return tx.Commit()
}

// readAll reads every row, leaving out the column skip.
func readAll(rows *sql.Rows, skip string) (tableRows, error) {
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return tableRows{}, err
	}
	keep := make([]int, 0, len(cols))
	var tr tableRows
	for i, c := range cols {
		if c != skip {
			keep = append(keep, i)
			tr.cols = append(tr.cols, c)
		}
	}
	for rows.Next() {
		v := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range v {
			ptrs[i] = &v[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return tableRows{}, err
		}
		row := make([]any, 0, len(keep))
		for _, i := range keep {
			row = append(row, v[i])
		}
		tr.vals = append(tr.vals, row)
	}
	return tr, rows.Err()
}

// skuSums adds up the program's SKU rows: total, sold, held.
func skuSums(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, program keys.ID) ([3]int64, error) {
	var s [3]int64
	if err := q.QueryRowContext(ctx, `SELECT COALESCE(SUM(total), 0), COALESCE(SUM(sold), 0), COALESCE(SUM(held), 0) FROM skus WHERE program = $1`,
		program).Scan(&s[0], &s[1], &s[2]); err != nil {
		return s, fmt.Errorf("ledger: move: sums: %w", err)
	}
	return s, nil
}

// programRows counts program's rows in every table of it.
func (l *Ledger) programRows(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, program keys.ID) (int64, error) {
	var all int64
	for _, t := range programTables {
		var n int64
		if err := q.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+t.name+` WHERE `+t.where, program).Scan(&n); err != nil {
			return 0, fmt.Errorf("ledger: count %s: %w", t.name, err)
		}
		all += n
	}
	return all, nil
}

// Copy writes the rows read to the target in one transaction and checks,
// before it commits, that every table has as many rows there as on the
// source and the SKUs add up to the same stock: the verify step.
func (m *Move) Copy(ctx context.Context) error {
	if err := m.to.seqPast(ctx, m.lastSeq); err != nil {
		return err
	}
	tx, err := m.to.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("ledger: move: %w", err)
	}
	defer tx.Rollback()
	// Moving in: a tombstone of an earlier move out goes, and the copy is
	// marked arriving until Arrived.
	if _, err := tx.ExecContext(ctx, `INSERT INTO program_moves (program, to_primary, mover, moved_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (program) DO UPDATE SET to_primary = excluded.to_primary, mover = excluded.mover, moved_at = excluded.moved_at`,
		m.program, arriving, m.token, m.to.now().UnixMilli()); err != nil {
		return fmt.Errorf("ledger: move: arrival mark: %w", err)
	}
	for i, t := range programTables {
		tr := m.rows[t.name]
		onConflict := ""
		if t.name == "requests" {
			onConflict = " ON CONFLICT (scope, idem_key) DO NOTHING"
		}
		for chunk := range slices.Chunk(tr.vals, max(1, 4000/max(1, len(tr.cols)))) {
			vals := make([]string, len(chunk))
			args := make([]any, 0, len(chunk)*len(tr.cols))
			for i, row := range chunk {
				vals[i] = placeholders(len(args), len(tr.cols))
				args = append(args, row...)
			}
			res, err := tx.ExecContext(ctx, `INSERT INTO `+t.name+` (`+strings.Join(tr.cols, ", ")+`) VALUES `+strings.Join(vals, ", ")+onConflict,
				args...)
			if err != nil {
				return fmt.Errorf("ledger: move: write %s: %w", t.name, err)
			}
			n, _ := res.RowsAffected()
			m.Counts[i].Skipped += int64(len(chunk)) - n
		}
	}
	for i, t := range programTables {
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+t.name+` WHERE `+t.where, m.program).Scan(&m.Counts[i].Target); err != nil {
			return fmt.Errorf("ledger: move: verify %s: %w", t.name, err)
		}
		if c := m.Counts[i]; c.Target+c.Skipped != c.Source {
			return fmt.Errorf("ledger: move: verify %s: %d rows on the target, %d on the source", t.name, c.Target, c.Source)
		}
	}
	if m.Sums[1], err = skuSums(ctx, tx, m.program); err != nil {
		return err
	}
	if m.Sums[1] != m.Sums[0] {
		return fmt.Errorf("ledger: move: verify skus: total, sold, held %v on the target, %v on the source", m.Sums[1], m.Sums[0])
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("ledger: move: commit on the target: %w", err)
	}
	m.copied = true
	return nil
}

// Finish deletes the program's rows from the source (after the directory
// names the target) and commits.
func (m *Move) Finish(ctx context.Context) error {
	if !m.copied {
		return errors.New("ledger: move: finish before copy")
	}
	if err := deleteProgram(ctx, m.src, m.program); err != nil {
		m.src.Rollback()
		return err
	}
	if err := m.src.Commit(); err != nil {
		return fmt.Errorf("ledger: move: commit on the source: %w", err)
	}
	return nil
}

// Arrived lifts the copy's arrival mark on the target, once the directory
// names it: a replica that cannot read the directory finds the program
// there from then on (see LivesHere).
func (m *Move) Arrived(ctx context.Context) error {
	return m.to.LiftTombstone(ctx, m.program, m.token)
}

// Abort deletes whatever Copy wrote to the target (first, while the
// source's transaction still holds the program's move lock, so no other
// move's copy is there yet), releases the source, and lifts its
// tombstone if it is still this move's.
func (m *Move) Abort(ctx context.Context) error {
	var err error
	if m.copied {
		err = m.to.DropProgram(ctx, m.program)
	}
	m.src.Rollback()
	return errors.Join(err, m.from.LiftTombstone(ctx, m.program, m.token))
}

// Release ends the move's hold on the source and leaves everything as it
// is (the directory's state unknown: a run again decides).
func (m *Move) Release() { m.src.Rollback() }

// DropProgram deletes every row of program from this ledger, and a move's
// arrival mark: what a move left on a primary the directory does not name.
func (l *Ledger) DropProgram(ctx context.Context, program keys.ID) error {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("ledger: drop program: %w", err)
	}
	defer tx.Rollback()
	if err := deleteProgram(ctx, tx, program); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM program_moves WHERE program = $1 AND to_primary = $2`, program, arriving); err != nil {
		return fmt.Errorf("ledger: drop program: arrival mark: %w", err)
	}
	return tx.Commit()
}

// deleteProgram deletes program's rows in tx, the tables keyed by its
// orders before the orders.
func deleteProgram(ctx context.Context, tx *sql.Tx, program keys.ID) error {
	// The relay's dead letters of its events first (they name the events
	// by seq here).
	if _, err := tx.ExecContext(ctx, `DELETE FROM relay_dead WHERE event_id IN (SELECT event_id FROM events WHERE program = $1)`,
		program); err != nil {
		return fmt.Errorf("ledger: delete dead letters: %w", err)
	}
	for i := len(programTables) - 1; i >= 0; i-- {
		t := programTables[i]
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+t.name+` WHERE `+t.where, program); err != nil {
			return fmt.Errorf("ledger: delete %s: %w", t.name, err)
		}
	}
	return nil
}

package ledger

// The program directory: on a ledger split over several PostgreSQL
// primaries (package fleet), which primary holds each program's rows. The
// first primary keeps it; the others carry the table unused.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/stockgate/stockgate/keys"
)

// Placement is where a program's rows live.
type Placement struct {
	Program keys.ID
	Primary string // the primary's name (fleet.Primary.Name)
	// Moving is set while a move copies the program elsewhere: its
	// writes are refused until the directory names the primary it is on.
	Moving    bool
	UpdatedAt time.Time
}

// directoryStep is the schema step that added the directory and the
// moves' tombstones.
const directoryStep = 5

// arriving is a move's mark on its target (program_moves.to_primary),
// written with the copy and lifted once the directory names the target:
// until then the copy is nobody's home for a replica that cannot read the
// directory (LivesHere), though writes the directory routes there go on
// (fenceMoved ignores it), so a move that stops between the copy and the
// switch leaves no copy a refund could be written on.
const arriving = ""

// ErrMoving: the program is being moved between primaries.
var ErrMoving = errors.New("ledger: program being moved between primaries")

// directoryUp adds the directory (read on the first primary) and, on
// every primary, the programs moved out of it or being moved (their
// tombstones: a write that would create one of them here is refused).
func (l *Ledger) directoryUp(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS program_primaries (
	program      TEXT    PRIMARY KEY,
	primary_name TEXT    NOT NULL,
	moving       INTEGER NOT NULL DEFAULT 0,
	-- the move holding the mark (its token), and since when: a move
	-- that stopped is taken over only after its lease
	mover        TEXT    NOT NULL DEFAULT '',
	updated_at   BIGINT  NOT NULL
)`)
	if err == nil {
		// to_primary is arriving ('') on a move's target until the
		// directory names it (see Move.Copy).
		_, err = tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS program_moves (
	program    TEXT   PRIMARY KEY,
	to_primary TEXT   NOT NULL,
	-- the move that wrote it (its token): only that move lifts it
	mover      TEXT   NOT NULL DEFAULT '',
	moved_at   BIGINT NOT NULL
)`)
	}
	return err
}

func (l *Ledger) directoryDown(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `DROP TABLE IF EXISTS program_primaries`)
	if err == nil {
		_, err = tx.ExecContext(ctx, `DROP TABLE IF EXISTS program_moves`)
	}
	return err
}

const selectPlacement = `SELECT program, primary_name, moving, updated_at FROM program_primaries`

func scanPlacement(row interface{ Scan(...any) error }) (Placement, error) {
	var p Placement
	var moving, at int64
	if err := row.Scan(&p.Program, &p.Primary, &moving, &at); err != nil {
		return Placement{}, err
	}
	p.Moving, p.UpdatedAt = moving != 0, time.UnixMilli(at).UTC()
	return p, nil
}

// PlacementOf reads where program lives (ErrNotFound: nowhere yet).
func (l *Ledger) PlacementOf(ctx context.Context, program keys.ID) (Placement, error) {
	p, err := scanPlacement(l.db.QueryRowContext(ctx, selectPlacement+` WHERE program = $1`, program))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Placement{}, ErrNotFound
	case err != nil:
		return Placement{}, fmt.Errorf("ledger: placement: %w", err)
	}
	return p, nil
}

// Place puts program on the primary among names holding the fewest
// programs (the first of them on a tie), unless it is placed already, and
// returns where it is. Replicas placing one program at once agree: the
// first row written stands.
func (l *Ledger) Place(ctx context.Context, program keys.ID, names []string) (Placement, error) {
	if len(names) == 0 {
		return Placement{}, errors.New("ledger: place: no primaries")
	}
	if p, err := l.PlacementOf(ctx, program); !errors.Is(err, ErrNotFound) {
		return p, err
	}
	count := map[string]int64{}
	rows, err := l.db.QueryContext(ctx, `SELECT primary_name, COUNT(*) FROM program_primaries GROUP BY primary_name`)
	if err != nil {
		return Placement{}, fmt.Errorf("ledger: place: %w", err)
	}
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			rows.Close()
			return Placement{}, fmt.Errorf("ledger: place: %w", err)
		}
		count[name] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Placement{}, fmt.Errorf("ledger: place: %w", err)
	}
	pick := names[0]
	for _, n := range names[1:] {
		if count[n] < count[pick] {
			pick = n
		}
	}
	if _, err := l.db.ExecContext(ctx, `INSERT INTO program_primaries (program, primary_name, moving, updated_at) VALUES ($1, $2, 0, $3)
		ON CONFLICT (program) DO NOTHING`, program, pick, l.now().UnixMilli()); err != nil {
		return Placement{}, fmt.Errorf("ledger: place: %w", err)
	}
	return l.PlacementOf(ctx, program)
}

// Placements reads the whole directory, in program order.
func (l *Ledger) Placements(ctx context.Context) ([]Placement, error) {
	rows, err := l.db.QueryContext(ctx, selectPlacement+` ORDER BY program`)
	if err != nil {
		return nil, fmt.Errorf("ledger: placements: %w", err)
	}
	defer rows.Close()
	var out []Placement
	for rows.Next() {
		p, err := scanPlacement(rows)
		if err != nil {
			return nil, fmt.Errorf("ledger: placements: %w", err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// SetPlacement places a program not placed yet on the primary to (the
// first write stands: ErrConflict if it is placed already).
func (l *Ledger) SetPlacement(ctx context.Context, program keys.ID, to string) error {
	res, err := l.db.ExecContext(ctx, `INSERT INTO program_primaries (program, primary_name, moving, updated_at) VALUES ($1, $2, 0, $3)
		ON CONFLICT (program) DO NOTHING`, program, to, l.now().UnixMilli())
	if err != nil {
		return fmt.Errorf("ledger: set placement: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("%w: %s is placed already", ErrConflict, program)
	}
	return nil
}

// ErrMoveRunning: another move of the program holds its mark.
var ErrMoveRunning = errors.New("ledger: a move of the program is running")

// MarkMoving marks program, placed on from, as moving under the move's
// token: if no move holds it, or the one that does has not renewed its
// mark for lease (it stopped). ErrMoveRunning otherwise; ErrConflict if
// the program is not on from.
func (l *Ledger) MarkMoving(ctx context.Context, program keys.ID, from, token string, lease time.Duration) error {
	now := l.now().UnixMilli()
	res, err := l.db.ExecContext(ctx, `UPDATE program_primaries SET moving = 1, mover = $3, updated_at = $4
		WHERE program = $1 AND primary_name = $2 AND (moving = 0 OR mover = $3 OR updated_at < $5)`,
		program, from, token, now, now-lease.Milliseconds())
	if err != nil {
		return fmt.Errorf("ledger: mark moving: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	p, err := l.PlacementOf(ctx, program)
	switch {
	case err != nil:
		return err
	case p.Primary != from:
		return fmt.Errorf("%w: %s is on %q, not %q", ErrConflict, program, p.Primary, from)
	}
	return fmt.Errorf("%w: %s, marked %s ago; a move that stopped is taken over %s after its mark", ErrMoveRunning, program,
		l.now().Sub(p.UpdatedAt).Round(time.Second), lease)
}

// EndMoving ends the move holding program's mark: the program is on to
// (its source, when the move gave up) and writable. ErrMoveRunning if the
// mark is not the move's any more (another took it over).
func (l *Ledger) EndMoving(ctx context.Context, program keys.ID, token, to string) error {
	res, err := l.db.ExecContext(ctx, `UPDATE program_primaries SET primary_name = $3, moving = 0, mover = '', updated_at = $4
		WHERE program = $1 AND mover = $2 AND moving = 1`, program, token, to, l.now().UnixMilli())
	if err != nil {
		return fmt.Errorf("ledger: end moving: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("%w: %s: the mark is not this move's", ErrMoveRunning, program)
	}
	return nil
}

// Programs lists the programs that have rows here (a SKU, settings or a
// waiting room), in order: what a directory is rebuilt from, and what a
// move checks is gone.
func (l *Ledger) Programs(ctx context.Context) ([]keys.ID, error) {
	rows, err := l.db.QueryContext(ctx, `SELECT program FROM skus UNION SELECT program FROM programs UNION SELECT program FROM queues
		ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("ledger: programs: %w", err)
	}
	defer rows.Close()
	var out []keys.ID
	for rows.Next() {
		var p keys.ID
		if err := rows.Scan(&p); err != nil {
			return nil, fmt.Errorf("ledger: programs: %w", err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// HasProgram reports whether program has rows here (a SKU, settings or a
// waiting room): where a replica that cannot read the directory finds it.
func (l *Ledger) HasProgram(ctx context.Context, program keys.ID) (bool, error) {
	var n int64
	if err := l.db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM skus WHERE program = $1) + (SELECT COUNT(*) FROM programs WHERE program = $1)
		+ (SELECT COUNT(*) FROM queues WHERE program = $1)`, program).Scan(&n); err != nil {
		return false, fmt.Errorf("ledger: has program: %w", err)
	}
	return n > 0, nil
}

// LivesHere reports whether program's rows are here, not moved away (no
// tombstone) and not a move's copy the directory may not name yet (no
// arrival mark): where a replica that cannot read the directory, or a
// program's first write, finds its home.
func (l *Ledger) LivesHere(ctx context.Context, program keys.ID) (bool, error) {
	has, err := l.HasProgram(ctx, program)
	if err != nil || !has || l.schema.Version < directoryStep {
		return has, err
	}
	var n int64
	if err := l.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM program_moves WHERE program = $1`, program).Scan(&n); err != nil {
		return false, fmt.Errorf("ledger: tombstone: %w", err)
	}
	return n == 0, nil
}

// LiftTombstone lets program's rows be created here again: the tombstone
// the move of token wrote (any, with token ""), when that move gave up
// or the program's home is here after all.
func (l *Ledger) LiftTombstone(ctx context.Context, program keys.ID, token string) error {
	if _, err := l.db.ExecContext(ctx, `DELETE FROM program_moves WHERE program = $1 AND ($2 = '' OR mover = $2)`, program, token); err != nil {
		return fmt.Errorf("ledger: lift tombstone: %w", err)
	}
	return nil
}

// ProgramOfRow is the program of the row id names here: an order, a
// hold, a cart (its lines') or a listing; ErrNotFound when none is here.
func (l *Ledger) ProgramOfRow(ctx context.Context, id keys.ID) (keys.ID, error) {
	var p keys.ID
	err := l.db.QueryRowContext(ctx, `SELECT program FROM (
		SELECT program FROM orders WHERE id = $1 UNION ALL SELECT program FROM holds WHERE id = $1
		UNION ALL SELECT program FROM listings WHERE id = $1
		UNION ALL SELECT program FROM (SELECT program FROM orders WHERE cart_id = $1 AND cart_id <> '' LIMIT 1) o
		UNION ALL SELECT program FROM (SELECT program FROM holds WHERE cart_id = $1 AND cart_id <> '' LIMIT 1) h) r LIMIT 1`, id).Scan(&p)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return p, ErrNotFound
	case err != nil:
		return p, fmt.Errorf("ledger: row's program: %w", err)
	}
	return p, nil
}

// fenceMoved refuses, inside tx, a write that would create rows of a
// program moved away from this primary or being moved (ErrMoving). On
// PostgreSQL it first waits for a move copying the program now (the move
// holds the program's advisory lock; each such write shares it), so no
// new row of the program lands behind the copy.
func (l *Ledger) fenceMoved(ctx context.Context, tx *sql.Tx, program keys.ID) error {
	if l.schema.Version < directoryStep {
		return nil // no move without the step, on any primary
	}
	if l.driver == Postgres {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock_shared($1)`, moveLock(program)); err != nil {
			return notCommitted("move fence", err)
		}
	}
	var n int64
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM program_moves WHERE program = $1 AND to_primary <> $2`,
		program, arriving).Scan(&n); err != nil {
		return notCommitted("move fence", err)
	}
	if n > 0 {
		return fmt.Errorf("%w: %w: %s", ErrNotCommitted, ErrMoving, program)
	}
	return nil
}

// moveLock is the advisory lock key of program's moves.
func moveLock(program keys.ID) int64 {
	h := fnv.New64a()
	h.Write([]byte("stockgate-move:" + program.String()))
	return int64(h.Sum64())
}

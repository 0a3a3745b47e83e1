package ledger

// The program directory: on a ledger split over several PostgreSQL
// primaries (package fleet), which primary holds each program's rows. The
// first primary keeps it; the others carry the table unused.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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

// ErrMoving: the program is being moved between primaries.
var ErrMoving = errors.New("ledger: program being moved between primaries")

func (l *Ledger) directoryUp(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS program_primaries (
	program      TEXT    PRIMARY KEY,
	primary_name TEXT    NOT NULL,
	moving       INTEGER NOT NULL DEFAULT 0,
	updated_at   BIGINT  NOT NULL
)`)
	return err
}

func (l *Ledger) directoryDown(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `DROP TABLE IF EXISTS program_primaries`)
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

// SetPlacement writes where program lives, and whether it is moving, if
// the directory still says from (the one who began a move finishes it):
// ErrConflict otherwise. An empty from places a program not placed yet.
func (l *Ledger) SetPlacement(ctx context.Context, program keys.ID, from, to string, moving bool) error {
	m := 0
	if moving {
		m = 1
	}
	var res sql.Result
	var err error
	if from == "" {
		res, err = l.db.ExecContext(ctx, `INSERT INTO program_primaries (program, primary_name, moving, updated_at) VALUES ($1, $2, $3, $4)
			ON CONFLICT (program) DO NOTHING`, program, to, m, l.now().UnixMilli())
	} else {
		res, err = l.db.ExecContext(ctx, `UPDATE program_primaries SET primary_name = $3, moving = $4, updated_at = $5
			WHERE program = $1 AND primary_name = $2`, program, from, to, m, l.now().UnixMilli())
	}
	if err != nil {
		return fmt.Errorf("ledger: set placement: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("%w: %s is not on %q", ErrConflict, program, from)
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

// HasRow reports whether a row of id lives here: an order, a hold, a cart
// (its lines') or a listing.
func (l *Ledger) HasRow(ctx context.Context, id keys.ID) (bool, error) {
	var n int64
	if err := l.db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM orders WHERE id = $1) + (SELECT COUNT(*) FROM holds WHERE id = $1)
		+ (SELECT COUNT(*) FROM listings WHERE id = $1) + (SELECT COUNT(*) FROM (SELECT 1 FROM orders WHERE cart_id = $1 AND cart_id <> '' LIMIT 1) o)
		+ (SELECT COUNT(*) FROM (SELECT 1 FROM holds WHERE cart_id = $1 AND cart_id <> '' LIMIT 1) h)`, id).Scan(&n); err != nil {
		return false, fmt.Errorf("ledger: has row: %w", err)
	}
	return n > 0, nil
}

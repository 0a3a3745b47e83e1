package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// A program's row: its per-buyer cap and hold budgets.

// Program is a program's own settings: caps across all of its tickets.
type Program struct {
	ID keys.ID
	// PerBuyer caps what one buyer may hold + own of all of the program's
	// tickets together; 0: no cap.
	PerBuyer int64
	// HoldBudget caps the units one buyer may hold at once (held, not
	// bought) across the program, and DeviceHoldBudget those held under
	// one device or payment fingerprint; 0: no budget. The gate enforces
	// them (they need schema 2).
	HoldBudget, DeviceHoldBudget int64
}

// MaxHoldBudget is the largest hold budget: a budget is a handful of
// tickets, and the gate keeps one entry per hold under it.
const MaxHoldBudget = 10_000

// Validate refuses a setting out of bounds (stock.ErrInvalid).
func (p Program) Validate() error {
	switch {
	case p.ID.IsZero():
		return fmt.Errorf("%w: missing program", stock.ErrInvalid)
	case p.PerBuyer < 0 || p.PerBuyer > stock.MaxTotal:
		return fmt.Errorf("%w: per_buyer %d", stock.ErrInvalid, p.PerBuyer)
	case p.HoldBudget < 0 || p.HoldBudget > MaxHoldBudget:
		return fmt.Errorf("%w: hold_budget %d", stock.ErrInvalid, p.HoldBudget)
	case p.DeviceHoldBudget < 0 || p.DeviceHoldBudget > MaxHoldBudget:
		return fmt.Errorf("%w: device_hold_budget %d", stock.ErrInvalid, p.DeviceHoldBudget)
	}
	return nil
}

// budgeted reports whether p sets a hold budget.
func (p Program) budgeted() bool { return p.HoldBudget > 0 || p.DeviceHoldBudget > 0 }

// holdBudgetsStep is the schema step that added the hold budgets.
const holdBudgetsStep = 2

// SetProgram sets a program's settings. Hold budgets need a ledger at
// schema 2 (ErrSchema before it: run `stockgate migrate`).
func (l *Ledger) SetProgram(ctx context.Context, p Program) error {
	if err := p.Validate(); err != nil {
		return err
	}
	budgets := l.schema.Version >= holdBudgetsStep
	if p.budgeted() && !budgets {
		return fmt.Errorf("%w: hold budgets need schema %d, the ledger is at %d: run `stockgate migrate`", ErrSchema, holdBudgetsStep, l.schema.Version)
	}
	program, perBuyer := p.ID, p.PerBuyer
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("ledger: put program: %w", err)
	}
	defer tx.Rollback()
	// First, before any row: a transfer waiting for it holds its order.
	if err := l.capLock(ctx, tx, stock.SKU{Program: program}, true); err != nil {
		return err
	}
	if err := l.fenceMoved(ctx, tx, program); err != nil {
		return err
	}
	// The program's SKU rows first, in order, as every take takes them: no
	// take of the program commits while its cap changes and is counted.
	rows, err := tx.QueryContext(ctx, `SELECT ticket FROM skus WHERE program = $1 ORDER BY ticket`+l.forUpdate(), program)
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	if err != nil {
		return fmt.Errorf("ledger: put program: %w", err)
	}
	var wasCapped int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE((SELECT per_buyer FROM programs WHERE program = $1), 0)`, program).Scan(&wasCapped); err != nil {
		return fmt.Errorf("ledger: put program: %w", err)
	}
	if budgets {
		_, err = tx.ExecContext(ctx, `INSERT INTO programs (program, per_buyer, hold_budget, device_hold_budget) VALUES ($1, $2, $3, $4)
		ON CONFLICT (program) DO UPDATE SET per_buyer = excluded.per_buyer, hold_budget = excluded.hold_budget,
			device_hold_budget = excluded.device_hold_budget`, program, perBuyer, p.HoldBudget, p.DeviceHoldBudget)
	} else {
		_, err = tx.ExecContext(ctx, `INSERT INTO programs (program, per_buyer) VALUES ($1, $2)
		ON CONFLICT (program) DO UPDATE SET per_buyer = excluded.per_buyer`, program, perBuyer)
	}
	if err != nil {
		return fmt.Errorf("ledger: put program: %w", err)
	}
	if perBuyer > 0 && wasCapped == 0 {
		if err := recountBuyers(ctx, tx, stock.SKU{Program: program}); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("ledger: put program: commit: %w", err)
	}
	return nil
}

// Program is a program's settings; all zero when it has none.
func (l *Ledger) Program(ctx context.Context, program keys.ID) (Program, error) {
	p := Program{ID: program}
	q, into := `SELECT per_buyer FROM programs WHERE program = $1`, []any{&p.PerBuyer}
	if l.schema.Version >= holdBudgetsStep {
		q, into = `SELECT per_buyer, hold_budget, device_hold_budget FROM programs WHERE program = $1`,
			[]any{&p.PerBuyer, &p.HoldBudget, &p.DeviceHoldBudget}
	}
	err := l.db.QueryRowContext(ctx, q, program).Scan(into...)
	if errors.Is(err, sql.ErrNoRows) {
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("ledger: program: %w", err)
	}
	return p, nil
}

// ProgramUnits is what a buyer holds + owns of all of a program's tickets.
func (l *Ledger) ProgramUnits(ctx context.Context, program, buyer keys.ID) (int64, error) {
	return l.BuyerUnits(ctx, stock.SKU{Program: program}, buyer)
}

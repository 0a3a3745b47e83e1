package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// MoveReport is what a move did: the rows of each table on both sides
// and the stock they add up to (total, sold, held).
type MoveReport struct {
	Program  keys.ID
	From, To string
	Counts   []ledger.TableCount
	Sums     [3]int64
	// Dropped are the primaries a leftover copy was deleted from (a move
	// that stopped half-way, run again).
	Dropped []string
}

// Move moves program's rows to the primary named to while its sale is
// closed (every SKU ended, no live hold, nothing listed for resale):
//
//  1. the directory marks it moving: replicas refuse its writes once they
//     read that, so Move waits PlaceTTL and a second for them;
//  2. the source's rows are locked and read, and copied to the target in
//     one transaction that commits only if every table has as many rows
//     there and the SKUs add up to the same stock (the verify step);
//  3. the directory names the target;
//  4. the source's rows are deleted.
//
// Run again after a failure, it finishes the job: a copy the directory does
// not name is deleted first, and rows left behind on the source after step
// 3 are deleted.
func (f *Fleet) Move(ctx context.Context, program keys.ID, to string) (MoveReport, error) {
	r := MoveReport{Program: program, To: to}
	if len(f.ps) < 2 {
		return r, errors.New("fleet: move: one primary; nowhere to move to")
	}
	dst := f.byName[to]
	if dst == nil {
		return r, fmt.Errorf("fleet: move: no primary named %q (have %v)", to, f.Primaries())
	}
	dir := f.ps[0].l
	pl, err := dir.PlacementOf(ctx, program)
	if errors.Is(err, ledger.ErrNotFound) {
		return r, fmt.Errorf("fleet: move: %s is on no primary", program)
	}
	if err != nil {
		return r, err
	}
	src := f.byName[pl.Primary]
	if src == nil {
		return r, fmt.Errorf("%w: %s on %q", ErrUnplaced, program, pl.Primary)
	}
	r.From = src.name
	if src == dst {
		// Already there: what a move stopped after step 3 left elsewhere.
		return r, f.dropElsewhere(ctx, program, dst, &r)
	}
	if pl.Moving {
		// A move stopped before step 3: the target's copy, if any, goes.
		if err := dst.l.DropProgram(ctx, program); err != nil {
			return r, err
		}
	} else if err := dir.SetPlacement(ctx, program, src.name, src.name, true); err != nil {
		return r, err
	}
	unmark := func(cause error) error {
		if err := dir.SetPlacement(context.WithoutCancel(ctx), program, src.name, src.name, false); err != nil {
			return errors.Join(cause, fmt.Errorf("fleet: move: still marked moving: %w", err))
		}
		return cause
	}
	select {
	case <-ctx.Done():
		return r, unmark(ctx.Err())
	case <-time.After(f.ttl + time.Second):
	}
	m, err := ledger.BeginMove(ctx, src.l, dst.l, program)
	if err != nil {
		return r, unmark(err)
	}
	if err := m.Copy(ctx); err != nil {
		return r, unmark(errors.Join(err, m.Abort(context.WithoutCancel(ctx))))
	}
	r.Counts, r.Sums = m.Counts, m.Sums[1]
	if err := dir.SetPlacement(ctx, program, src.name, dst.name, false); err != nil {
		return r, unmark(errors.Join(err, m.Abort(context.WithoutCancel(ctx))))
	}
	f.mu.Lock()
	f.places[program] = place{p: dst, read: time.Now()}
	f.mu.Unlock()
	if err := m.Finish(ctx); err != nil {
		return r, fmt.Errorf("fleet: move: %s is on %s now, but its rows are still on %s (run the move again to delete them): %w",
			program, dst.name, src.name, err)
	}
	return r, nil
}

// dropElsewhere deletes program's rows from every primary but at.
func (f *Fleet) dropElsewhere(ctx context.Context, program keys.ID, at *primary, r *MoveReport) error {
	for _, p := range f.ps {
		if p == at {
			continue
		}
		has, err := p.l.HasProgram(ctx, program)
		if err != nil {
			return err
		}
		if has {
			if err := p.l.DropProgram(ctx, program); err != nil {
				return err
			}
			r.Dropped = append(r.Dropped, p.name)
		}
	}
	return nil
}

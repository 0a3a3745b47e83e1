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

// MoveLease is how long a move's mark stands without the move renewing it
// (at each step): a run of Move finds the mark of a move that stopped
// and takes it over only after this.
const MoveLease = 2 * time.Minute

// Move moves program's rows to the primary named to while its sale is
// closed (every SKU ended, no live hold, nothing listed for resale):
//
//  1. the directory marks it moving under this run's token (another run's
//     mark stands until its lease lapses: ErrMoveRunning): replicas refuse
//     its writes once they read that, and Move waits PlaceTTL and a second
//     for them;
//  2. a tombstone on the source refuses any write that would create rows
//     of the program there, whoever sends it, and the source's rows are
//     locked and read (ledger.BeginMove); they are copied to the target in
//     one transaction that commits only if every table has as many rows
//     there and the SKUs add up to the same stock (the verify step);
//  3. the directory names the target, if the mark is still this run's,
//     and the copy's arrival mark is lifted (until then a replica that
//     cannot read the directory finds no home there: ledger.LivesHere);
//  4. the source's rows are deleted (the tombstone stays).
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
	if f.ttl+time.Second > MoveLease/2 {
		return r, fmt.Errorf("fleet: move: PlaceTTL %s is too long for a move's lease of %s", f.ttl, MoveLease)
	}
	token := ledger.NewID().String()
	if err := dir.MarkMoving(ctx, program, src.name, token, MoveLease); err != nil {
		return r, err
	}
	// giveUp leaves the program where it is, writable: the mark ends and,
	// if it was still this run's, no tombstone stays at its home (one a
	// stopped run left there included).
	giveUp := func(cause error) error {
		ctx := context.WithoutCancel(ctx)
		if err := dir.EndMoving(ctx, program, token, src.name); err != nil {
			return errors.Join(cause, err)
		}
		f.mu.Lock()
		f.places[program] = place{p: src, read: time.Now()}
		f.mu.Unlock()
		return errors.Join(cause, src.l.LiftTombstone(ctx, program, ""))
	}
	if src == dst {
		// Already there: what a move that stopped after step 3 left
		// elsewhere goes, and the program is writable.
		return r, giveUp(f.dropElsewhere(ctx, program, dst, &r))
	}
	// A copy a stopped move left on the target (the directory never named
	// it) goes.
	if err := dst.l.DropProgram(ctx, program); err != nil {
		return r, giveUp(err)
	}
	select {
	case <-ctx.Done():
		return r, giveUp(ctx.Err())
	case <-time.After(f.ttl + time.Second):
	}
	renew := func() error { return dir.MarkMoving(ctx, program, src.name, token, MoveLease) }
	if err := renew(); err != nil {
		return r, err // taken over meanwhile: the other run decides
	}
	m, err := ledger.BeginMove(ctx, src.l, dst.l, program, dst.name, token)
	if err != nil {
		return r, giveUp(err)
	}
	if err := renew(); err != nil {
		return r, errors.Join(err, m.Abort(context.WithoutCancel(ctx)))
	}
	if err := m.Copy(ctx); err != nil {
		return r, giveUp(errors.Join(err, m.Abort(context.WithoutCancel(ctx))))
	}
	r.Counts, r.Sums = m.Counts, m.Sums[1]
	if err := dir.EndMoving(ctx, program, token, dst.name); err != nil {
		// Its answer lost, the flip may have happened: the directory says.
		pl, perr := dir.PlacementOf(context.WithoutCancel(ctx), program)
		switch {
		case perr != nil:
			// Unknown: nothing is dropped; the rows are on both, the
			// directory names one, and a run again finishes.
			m.Release()
			return r, fmt.Errorf("fleet: move: %w; the directory could not be read after (%w): run the move again", err, perr)
		case pl.Primary != dst.name:
			// Not flipped: the program stays on the source. If the mark
			// is still this run's, giveUp ends it (the program writable
			// now, not after the lease); if another run's, its EndMoving
			// refuses and that run's mark and tombstone stand. (Named
			// the target and moving again is flipped, and another run
			// moving it on: the target's rows are the program's, never
			// dropped here.)
			return r, giveUp(errors.Join(err, m.Abort(context.WithoutCancel(ctx))))
		}
	}
	f.mu.Lock()
	f.places[program] = place{p: dst, read: time.Now()}
	f.mu.Unlock()
	arrived := m.Arrived(ctx)
	if err := m.Finish(ctx); err != nil {
		return r, fmt.Errorf("fleet: move: %s is on %s now, but its rows are still on %s (run the move again to delete them): %w",
			program, dst.name, src.name, errors.Join(err, arrived))
	}
	if arrived != nil {
		// Until a run again lifts it, a replica that cannot read the
		// directory finds the program nowhere (503), not on a copy.
		return r, fmt.Errorf("fleet: move: %s is on %s now, but its arrival mark stands there (run the move again to lift it): %w",
			program, dst.name, arrived)
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

package fleet

// The ledger's calls, each sent where its rows live (see the package doc).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// --- SKUs and programs: the program's primary; a new one is placed ---

func (f *Fleet) PutSKU(ctx context.Context, c ledger.SKUConfig) (ledger.SKUState, error) {
	return onSKU(ctx, f, c.SKU, true, true, func(l *ledger.Ledger) (ledger.SKUState, error) { return l.PutSKU(ctx, c) })
}

func (f *Fleet) SKU(ctx context.Context, sku stock.SKU) (ledger.SKUState, error) {
	return onSKU(ctx, f, sku, false, false, func(l *ledger.Ledger) (ledger.SKUState, error) { return l.SKU(ctx, sku) })
}

func (f *Fleet) EndSale(ctx context.Context, sku stock.SKU) (ledger.SKUState, error) {
	return onSKU(ctx, f, sku, true, false, func(l *ledger.Ledger) (ledger.SKUState, error) { return l.EndSale(ctx, sku) })
}

func (f *Fleet) SetShards(ctx context.Context, sku stock.SKU, n int) error {
	_, err := onSKU(ctx, f, sku, true, false, func(l *ledger.Ledger) (struct{}, error) { return struct{}{}, l.SetShards(ctx, sku, n) })
	return err
}

func (f *Fleet) SetProgram(ctx context.Context, p ledger.Program) error {
	_, err := writeProgram(ctx, f, p.ID, true, func(l *ledger.Ledger) (struct{}, error) { return struct{}{}, l.SetProgram(ctx, p) })
	return err
}

func (f *Fleet) Program(ctx context.Context, program keys.ID) (ledger.Program, error) {
	return onProgram(ctx, f, program, func(l *ledger.Ledger) (ledger.Program, error) { return l.Program(ctx, program) })
}

func (f *Fleet) MarkGateSeeded(ctx context.Context, sku stock.SKU, seq int64) error {
	_, err := onSKU(ctx, f, sku, false, false, func(l *ledger.Ledger) (struct{}, error) { return struct{}{}, l.MarkGateSeeded(ctx, sku, seq) })
	return err
}

// AdvanceGate runs during a moving program too: a gate's rebuild moves no
// stock, and the move has the SKU rows locked.
func (f *Fleet) AdvanceGate(ctx context.Context, sku stock.SKU) (ledger.SKUState, error) {
	return onSKU(ctx, f, sku, false, false, func(l *ledger.Ledger) (ledger.SKUState, error) { return l.AdvanceGate(ctx, sku) })
}

func (f *Fleet) Report(ctx context.Context, program keys.ID) ([]ledger.StockReport, error) {
	return onProgram(ctx, f, program, func(l *ledger.Ledger) ([]ledger.StockReport, error) { return l.Report(ctx, program) })
}

// SKUs pages through every primary's SKUs in SKU order: limit of them
// after after, from the primaries that answered (the error names the
// others).
func (f *Fleet) SKUs(ctx context.Context, after stock.SKU, limit int) ([]ledger.SKUState, error) {
	if len(f.ps) == 1 {
		return f.ps[0].l.SKUs(ctx, after, limit)
	}
	all, err := everywhere(ctx, f, func(l *ledger.Ledger) ([]ledger.SKUState, error) { return l.SKUs(ctx, after, limit) })
	slices.SortFunc(all, func(a, b ledger.SKUState) int { return a.SKU.Compare(b.SKU) })
	if len(all) > limit {
		all = all[:limit]
	}
	return all, err
}

// --- takes ---

// Commit sends each take to its program's primary, each primary's share
// in one call, all at once; a take whose primary cannot be named fails
// with nothing written.
func (f *Fleet) Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult {
	if len(f.ps) == 1 {
		return f.ps[0].l.Commit(ctx, takes, direct)
	}
	out := make([]ledger.TakeResult, len(takes))
	shares := map[*primary][]int{}
	for i, t := range takes {
		sku := takeSKU(t)
		p, err := f.write(ctx, sku.Program, false)
		if err != nil {
			out[i] = ledger.TakeResult{Take: t, Err: err}
			continue
		}
		f.seen(sku)
		shares[p] = append(shares[p], i)
	}
	fanOut(shares, func(p *primary, idx []int) {
		mine := make([]ledger.Take, len(idx))
		for k, i := range idx {
			mine[k] = takes[i]
		}
		for k, r := range p.l.Commit(ctx, mine, direct) {
			out[idx[k]] = r
		}
	})
	return out
}

// takeSKU is the SKU of a take's first line: every line of a take is of
// one program.
func takeSKU(t ledger.Take) stock.SKU {
	if len(t.Orders) > 0 {
		return t.Orders[0].SKU
	}
	if len(t.Holds) > 0 {
		return t.Holds[0].SKU
	}
	return stock.SKU{}
}

// fanOut runs f for each primary's share at once and waits for all.
func fanOut(shares map[*primary][]int, f func(p *primary, idx []int)) {
	if len(shares) == 1 {
		for p, idx := range shares {
			f(p, idx)
		}
		return
	}
	done := make(chan struct{}, len(shares))
	for p, idx := range shares {
		go func() { // owned by fanOut, which waits for it
			defer func() { done <- struct{}{} }()
			f(p, idx)
		}()
	}
	for range shares {
		<-done
	}
}

func (f *Fleet) OrderByKey(ctx context.Context, key keys.ID) (ledger.Order, error) {
	return first(ctx, f, func(l *ledger.Ledger) (ledger.Order, error) { return l.OrderByKey(ctx, key) })
}

func (f *Fleet) HoldByKey(ctx context.Context, key keys.ID) (ledger.Hold, error) {
	return first(ctx, f, func(l *ledger.Ledger) (ledger.Hold, error) { return l.HoldByKey(ctx, key) })
}

// A request's row is on the primary of the program it took from, which
// alone is asked when the caller names it: keys are unique per buyer
// within a primary, and another primary's row under the same key is
// another request, never this one's answer (its retry answered 422 when
// the first primary in the configured order had it), nor is another
// primary's outage this one's (a refusal on a healthy primary answered
// 503 while asking a dead one). Zero program: every primary is asked.

func (f *Fleet) RequestDurable(ctx context.Context, program, scope, key keys.ID) error {
	_, err := byKey(ctx, f, program, func(l *ledger.Ledger) (struct{}, error) { return struct{}{}, l.RequestDurable(ctx, scope, key) })
	return err
}

func (f *Fleet) RequestSettled(ctx context.Context, program, scope, key keys.ID) error {
	_, err := byKey(ctx, f, program, func(l *ledger.Ledger) (struct{}, error) { return struct{}{}, l.RequestSettled(ctx, scope, key) })
	return err
}

func (f *Fleet) RequestByKey(ctx context.Context, program, scope, key keys.ID) (ledger.Recorded, error) {
	return byKey(ctx, f, program, func(l *ledger.Ledger) (ledger.Recorded, error) { return l.RequestByKey(ctx, scope, key) })
}

// byKey runs a read by a request's key on program's primary, or on every
// primary when program is zero (first). A program read as moving may
// have arrived on its target since, its source's rows deleted: a row the
// source lacks is asked of the primary the directory names now
// (helper-50), as byID's locate does for rows by id.
func byKey[T any](ctx context.Context, f *Fleet, program keys.ID, call func(l *ledger.Ledger) (T, error)) (T, error) {
	if program.IsZero() || len(f.ps) == 1 {
		return first(ctx, f, call)
	}
	var zero T
	pl, found, err := f.lookup(ctx, program)
	switch {
	case err != nil:
		return zero, unavailable(err)
	case !found:
		return call(f.ps[0].l) // placed nowhere: it has no rows, and the first says so
	}
	v, err := call(pl.p.l)
	if !errors.Is(err, ledger.ErrNotFound) || !pl.moving {
		return v, err
	}
	// Read as moving: never cached, so this reads the directory again.
	if now, found, lerr := f.lookup(ctx, program); lerr == nil && found && now.p != pl.p {
		return call(now.p.l)
	}
	return v, err
}

func (f *Fleet) OrderByID(ctx context.Context, id keys.ID) (ledger.Order, error) {
	return byID(ctx, f, id, false, func(l *ledger.Ledger) (ledger.Order, error) { return l.OrderByID(ctx, id) })
}

func (f *Fleet) HoldByID(ctx context.Context, id keys.ID) (ledger.Hold, error) {
	return byID(ctx, f, id, false, func(l *ledger.Ledger) (ledger.Hold, error) { return l.HoldByID(ctx, id) })
}

func (f *Fleet) CartByID(ctx context.Context, id keys.ID) (ledger.Cart, error) {
	return byID(ctx, f, id, false, func(l *ledger.Ledger) (ledger.Cart, error) { return l.CartByID(ctx, id) })
}

func (f *Fleet) CommittedSince(ctx context.Context, sku stock.SKU, after int64) (ledger.Committed, error) {
	return onSKU(ctx, f, sku, false, false, func(l *ledger.Ledger) (ledger.Committed, error) { return l.CommittedSince(ctx, sku, after) })
}

// --- ends of holds, orders and carts: where the row is ---

func (f *Fleet) Confirm(ctx context.Context, holdID, buyer keys.ID, req ledger.Request) (ledger.Order, error) {
	return byID(ctx, f, holdID, true, func(l *ledger.Ledger) (ledger.Order, error) { return l.Confirm(ctx, holdID, buyer, req) })
}

func (f *Fleet) ConfirmPart(ctx context.Context, holdID, buyer keys.ID, keep int64, req ledger.Request) (ledger.Order, error) {
	return byID(ctx, f, holdID, true, func(l *ledger.Ledger) (ledger.Order, error) { return l.ConfirmPart(ctx, holdID, buyer, keep, req) })
}

func (f *Fleet) AnswerWith(ctx context.Context, req ledger.Request, o ledger.Order) (ledger.Order, error) {
	return byID(ctx, f, o.ID, true, func(l *ledger.Ledger) (ledger.Order, error) { return l.AnswerWith(ctx, req, o) })
}

// twoOf carries a call's two answers through byID.
type twoOf[A, B any] struct {
	a A
	b B
}

func (f *Fleet) RefuseLate(ctx context.Context, r ledger.LateRefusal) (ledger.Recorded, error) {
	return onSKU(ctx, f, r.SKU, true, false, func(l *ledger.Ledger) (ledger.Recorded, error) { return l.RefuseLate(ctx, r) })
}

func (f *Fleet) ExpireHold(ctx context.Context, id keys.ID) (ledger.Hold, bool, error) {
	r, err := byID(ctx, f, id, true, func(l *ledger.Ledger) (twoOf[ledger.Hold, bool], error) {
		h, ok, err := l.ExpireHold(ctx, id)
		return twoOf[ledger.Hold, bool]{h, ok}, err
	})
	return r.a, r.b, err
}

func (f *Fleet) Transfer(ctx context.Context, orderID, from, to keys.ID, q int64, req ledger.Request) (ledger.Order, error) {
	return byID(ctx, f, orderID, true, func(l *ledger.Ledger) (ledger.Order, error) { return l.Transfer(ctx, orderID, from, to, q, req) })
}

func (f *Fleet) Cancel(ctx context.Context, holdID, buyer keys.ID, req ledger.Request) (ledger.Hold, bool, error) {
	r, err := byID(ctx, f, holdID, true, func(l *ledger.Ledger) (twoOf[ledger.Hold, bool], error) {
		h, ok, err := l.Cancel(ctx, holdID, buyer, req)
		return twoOf[ledger.Hold, bool]{h, ok}, err
	})
	return r.a, r.b, err
}

func (f *Fleet) Extend(ctx context.Context, holdID, buyer keys.ID, ttl time.Duration, req ledger.Request) (ledger.Hold, error) {
	return byID(ctx, f, holdID, true, func(l *ledger.Ledger) (ledger.Hold, error) { return l.Extend(ctx, holdID, buyer, ttl, req) })
}

func (f *Fleet) Refund(ctx context.Context, orderID, buyer keys.ID, req ledger.Request) (ledger.Order, bool, error) {
	r, err := byID(ctx, f, orderID, true, func(l *ledger.Ledger) (twoOf[ledger.Order, bool], error) {
		o, ok, err := l.Refund(ctx, orderID, buyer, req)
		return twoOf[ledger.Order, bool]{o, ok}, err
	})
	return r.a, r.b, err
}

func (f *Fleet) ConfirmCart(ctx context.Context, id, buyer keys.ID, req ledger.Request) (ledger.Cart, error) {
	return byID(ctx, f, id, true, func(l *ledger.Ledger) (ledger.Cart, error) { return l.ConfirmCart(ctx, id, buyer, req) })
}

func (f *Fleet) CancelCart(ctx context.Context, id, buyer keys.ID, req ledger.Request) (ledger.Cart, []keys.ID, error) {
	r, err := byID(ctx, f, id, true, func(l *ledger.Ledger) (twoOf[ledger.Cart, []keys.ID], error) {
		c, ids, err := l.CancelCart(ctx, id, buyer, req)
		return twoOf[ledger.Cart, []keys.ID]{c, ids}, err
	})
	return r.a, r.b, err
}

func (f *Fleet) RefundCart(ctx context.Context, id, buyer keys.ID, req ledger.Request) (ledger.Cart, []keys.ID, error) {
	r, err := byID(ctx, f, id, true, func(l *ledger.Ledger) (twoOf[ledger.Cart, []keys.ID], error) {
		c, ids, err := l.RefundCart(ctx, id, buyer, req)
		return twoOf[ledger.Cart, []keys.ID]{c, ids}, err
	})
	return r.a, r.b, err
}

// batchByID sends each request of a batch to the primary of its row's
// program (known from the id's lane or an earlier call), each
// primary's share in one call, all at once. A row not on the primary it
// was sent to comes back split (a batch decides only rows it has, with
// nothing written for the others), as does every request of a share whose
// call failed or whose program is moving: the caller asks for each alone,
// through byID, so one primary down fails only its own.
func batchByID[R any](ctx context.Context, f *Fleet, ids []keys.ID, split R, call func(l *ledger.Ledger, idx []int) ([]R, error)) ([]R, error) {
	if len(f.ps) == 1 {
		idx := make([]int, len(ids))
		for i := range idx {
			idx[i] = i
		}
		return call(f.ps[0].l, idx)
	}
	out := make([]R, len(ids))
	shares := map[*primary][]int{}
	for i, id := range ids {
		// A row whose program is not known here yet is decided alone:
		// byID finds it where the directory says (a copy elsewhere, a
		// move's leftover, is never written).
		programs := f.programsOf(id)
		if len(programs) != 1 {
			out[i] = split
			continue
		}
		p, err := f.write(ctx, programs[0], false)
		if err != nil {
			out[i] = split
			continue
		}
		shares[p] = append(shares[p], i)
	}
	var mu sync.Mutex
	fanOut(shares, func(p *primary, idx []int) {
		got, err := call(p.l, idx)
		mu.Lock()
		defer mu.Unlock()
		for k, i := range idx {
			if err != nil || k >= len(got) {
				out[i] = split
			} else {
				out[i] = got[k]
			}
		}
	})
	return out, nil
}

func (f *Fleet) ConfirmBatch(ctx context.Context, cs []ledger.HoldRequest) ([]ledger.BatchResult, error) {
	ids := make([]keys.ID, len(cs))
	for i, c := range cs {
		ids[i] = c.HoldID
	}
	return batchByID(ctx, f, ids, ledger.BatchResult{Err: ledger.ErrSplit}, func(l *ledger.Ledger, idx []int) ([]ledger.BatchResult, error) {
		return l.ConfirmBatch(ctx, pick(cs, idx))
	})
}

func (f *Fleet) CancelBatch(ctx context.Context, cs []ledger.HoldRequest) ([]ledger.HoldResult, error) {
	ids := make([]keys.ID, len(cs))
	for i, c := range cs {
		ids[i] = c.HoldID
	}
	return batchByID(ctx, f, ids, ledger.HoldResult{Err: ledger.ErrSplit}, func(l *ledger.Ledger, idx []int) ([]ledger.HoldResult, error) {
		return l.CancelBatch(ctx, pick(cs, idx))
	})
}

func (f *Fleet) RefundBatch(ctx context.Context, rs []ledger.OrderRequest) ([]ledger.OrderResult, error) {
	ids := make([]keys.ID, len(rs))
	for i, r := range rs {
		ids[i] = r.OrderID
	}
	return batchByID(ctx, f, ids, ledger.OrderResult{Err: ledger.ErrSplit}, func(l *ledger.Ledger, idx []int) ([]ledger.OrderResult, error) {
		return l.RefundBatch(ctx, pick(rs, idx))
	})
}

// pick is xs at the indexes idx.
func pick[T any](xs []T, idx []int) []T {
	out := make([]T, len(idx))
	for k, i := range idx {
		out[k] = xs[i]
	}
	return out
}

// --- the sweepers' work: every primary's ---

func (f *Fleet) ExpireDue(ctx context.Context, limit int) ([]ledger.Hold, error) {
	return everywhere(ctx, f, func(l *ledger.Ledger) ([]ledger.Hold, error) { return l.ExpireDue(ctx, limit) })
}

func (f *Fleet) PendingRestores(ctx context.Context, olderThan time.Duration, limit int) ([]ledger.Restore, error) {
	return everywhere(ctx, f, func(l *ledger.Ledger) ([]ledger.Restore, error) { return l.PendingRestores(ctx, olderThan, limit) })
}

func (f *Fleet) SettleDue(ctx context.Context, limit int) ([]ledger.Event, error) {
	return everywhere(ctx, f, func(l *ledger.Ledger) ([]ledger.Event, error) { return l.SettleDue(ctx, limit) })
}

func (f *Fleet) PoolsDue(ctx context.Context, limit int) ([]stock.SKU, error) {
	return everywhere(ctx, f, func(l *ledger.Ledger) ([]stock.SKU, error) { return l.PoolsDue(ctx, limit) })
}

func (f *Fleet) QueuedPrograms(ctx context.Context) ([]ledger.QueueConfig, error) {
	return everywhere(ctx, f, func(l *ledger.Ledger) ([]ledger.QueueConfig, error) { return l.QueuedPrograms(ctx) })
}

// --- restores: where the row is ---

func (f *Fleet) RestoreOwed(ctx context.Context, kind string, id keys.ID) (ledger.Restore, bool, error) {
	r, err := byID(ctx, f, id, false, func(l *ledger.Ledger) (twoOf[ledger.Restore, bool], error) {
		r, ok, err := l.RestoreOwed(ctx, kind, id)
		if err == nil && !ok && len(f.ps) > 1 {
			// Owed nothing here may be "not here": only the row's
			// primary answers for it.
			if _, herr := l.ProgramOfRow(ctx, id); errors.Is(herr, ledger.ErrNotFound) {
				return twoOf[ledger.Restore, bool]{}, ledger.ErrNotFound
			}
		}
		return twoOf[ledger.Restore, bool]{r, ok}, err
	})
	return r.a, r.b, err
}

func (f *Fleet) RestoreDurable(ctx context.Context, kind string, id keys.ID) error {
	_, err := byID(ctx, f, id, true, func(l *ledger.Ledger) (struct{}, error) {
		if len(f.ps) > 1 {
			// Nothing rewritten may be "not here": only the row's
			// primary vouches for it.
			if _, err := l.ProgramOfRow(ctx, id); err != nil {
				return struct{}{}, err
			}
		}
		return struct{}{}, l.RestoreDurable(ctx, kind, id)
	})
	return err
}

func (f *Fleet) RestoreDone(ctx context.Context, kind string, id keys.ID) error {
	_, err := byID(ctx, f, id, true, func(l *ledger.Ledger) (struct{}, error) {
		if len(f.ps) > 1 {
			if _, err := l.ProgramOfRow(ctx, id); err != nil {
				return struct{}{}, err
			}
		}
		return struct{}{}, l.RestoreDone(ctx, kind, id)
	})
	return err
}

// --- events, seats, pools, waitlists, resale: the program's primary ---

// ErrFeedPerProgram: on several primaries, events are read per program
// (each primary numbers its own; no one order spans them).
var ErrFeedPerProgram = fmt.Errorf("%w: name a program: the ledger is split over several primaries, each numbering its own events",
	stock.ErrInvalid)

// KnownEvents are those of ids any primary has: an event lives on its
// program's primary, and a sink's event does not say which that was when
// it was written (a program may have moved since).
func (f *Fleet) KnownEvents(ctx context.Context, ids []keys.ID) ([]keys.ID, error) {
	return everywhere(ctx, f, func(l *ledger.Ledger) ([]keys.ID, error) { return l.KnownEvents(ctx, ids) })
}

// Events reads a program's events from its primary. Every program's (no
// program named) are one primary's only: on several, ErrFeedPerProgram.
func (f *Fleet) Events(ctx context.Context, program keys.ID, after int64, limit int) ([]ledger.Event, error) {
	if program.IsZero() && len(f.ps) > 1 {
		return nil, ErrFeedPerProgram
	}
	return onProgram(ctx, f, program, func(l *ledger.Ledger) ([]ledger.Event, error) { return l.Events(ctx, program, after, limit) })
}

func (f *Fleet) LoadSeats(ctx context.Context, sku stock.SKU, seats []ledger.Seat) (int64, error) {
	return onSKU(ctx, f, sku, true, false, func(l *ledger.Ledger) (int64, error) { return l.LoadSeats(ctx, sku, seats) })
}

func (f *Fleet) Seats(ctx context.Context, sku stock.SKU, section keys.ID) ([]ledger.Seat, error) {
	return onSKU(ctx, f, sku, false, false, func(l *ledger.Ledger) ([]ledger.Seat, error) { return l.Seats(ctx, sku, section) })
}

func (f *Fleet) SeatFacts(ctx context.Context, sku stock.SKU) ([]ledger.SeatFact, error) {
	return onSKU(ctx, f, sku, false, false, func(l *ledger.Ledger) ([]ledger.SeatFact, error) { return l.SeatFacts(ctx, sku) })
}

func (f *Fleet) PutPool(ctx context.Context, c ledger.PoolConfig) (ledger.SKUState, error) {
	return onSKU(ctx, f, c.SKU, true, false, func(l *ledger.Ledger) (ledger.SKUState, error) { return l.PutPool(ctx, c) })
}

func (f *Fleet) ClosePool(ctx context.Context, pool stock.SKU, due bool) (int64, stock.SKU, error) {
	r, err := onSKU(ctx, f, pool, true, false, func(l *ledger.Ledger) (twoOf[int64, stock.SKU], error) {
		n, into, err := l.ClosePool(ctx, pool, due)
		return twoOf[int64, stock.SKU]{n, into}, err
	})
	return r.a, r.b, err
}

func (f *Fleet) Pools(ctx context.Context, ticket stock.SKU) ([]ledger.SKUState, error) {
	return onSKU(ctx, f, ticket, false, false, func(l *ledger.Ledger) ([]ledger.SKUState, error) { return l.Pools(ctx, ticket) })
}

func (f *Fleet) PutCodes(ctx context.Context, pool stock.SKU, codes []ledger.Code) (int, error) {
	return onSKU(ctx, f, pool, true, false, func(l *ledger.Ledger) (int, error) { return l.PutCodes(ctx, pool, codes) })
}

func (f *Fleet) CodeOf(ctx context.Context, pool stock.SKU, hash string) (ledger.Code, error) {
	return onSKU(ctx, f, pool, false, false, func(l *ledger.Ledger) (ledger.Code, error) { return l.CodeOf(ctx, pool, hash) })
}

func (f *Fleet) CodeUses(ctx context.Context, pool stock.SKU, hash string) (int64, error) {
	return onSKU(ctx, f, pool, false, false, func(l *ledger.Ledger) (int64, error) { return l.CodeUses(ctx, pool, hash) })
}

func (f *Fleet) JoinWaitlist(ctx context.Context, sku stock.SKU, buyer keys.ID, q int64, ttl time.Duration) (ledger.WaitEntry, bool, error) {
	r, err := onSKU(ctx, f, sku, true, false, func(l *ledger.Ledger) (twoOf[ledger.WaitEntry, bool], error) {
		e, ok, err := l.JoinWaitlist(ctx, sku, buyer, q, ttl)
		return twoOf[ledger.WaitEntry, bool]{e, ok}, err
	})
	return r.a, r.b, err
}

func (f *Fleet) LeaveWaitlist(ctx context.Context, sku stock.SKU, buyer keys.ID) (ledger.WaitEntry, error) {
	return onSKU(ctx, f, sku, true, false, func(l *ledger.Ledger) (ledger.WaitEntry, error) { return l.LeaveWaitlist(ctx, sku, buyer) })
}

func (f *Fleet) WaitEntryOf(ctx context.Context, sku stock.SKU, buyer keys.ID) (ledger.WaitEntry, error) {
	return onSKU(ctx, f, sku, false, false, func(l *ledger.Ledger) (ledger.WaitEntry, error) { return l.WaitEntryOf(ctx, sku, buyer) })
}

func (f *Fleet) WaitlistLength(ctx context.Context, sku stock.SKU) (int64, error) {
	return onSKU(ctx, f, sku, false, false, func(l *ledger.Ledger) (int64, error) { return l.WaitlistLength(ctx, sku) })
}

func (f *Fleet) List(ctx context.Context, orderID, seller keys.ID, q int64, req ledger.Request) (ledger.Listing, error) {
	return byID(ctx, f, orderID, true, func(l *ledger.Ledger) (ledger.Listing, error) { return l.List(ctx, orderID, seller, q, req) })
}

func (f *Fleet) Withdraw(ctx context.Context, listingID, seller keys.ID, expect, epoch int64, req ledger.Request) (ledger.Listing, []ledger.Event, error) {
	var settled []ledger.Event
	x, err := byID(ctx, f, listingID, true, func(l *ledger.Ledger) (ledger.Listing, error) {
		x, sold, err := l.Withdraw(ctx, listingID, seller, expect, epoch, req)
		settled = append(settled, sold...)
		return x, err
	})
	return x, settled, err
}

func (f *Fleet) ListingByID(ctx context.Context, id keys.ID) (ledger.Listing, error) {
	return byID(ctx, f, id, false, func(l *ledger.Ledger) (ledger.Listing, error) { return l.ListingByID(ctx, id) })
}

func (f *Fleet) Settle(ctx context.Context, sku stock.SKU) ([]ledger.Event, error) {
	return onSKU(ctx, f, sku, false, false, func(l *ledger.Ledger) ([]ledger.Event, error) { return l.Settle(ctx, sku) })
}

// --- buyers' counts and sales totals (reports and tests) ---

func (f *Fleet) BuyerUnits(ctx context.Context, sku stock.SKU, buyer keys.ID) (int64, error) {
	return onSKU(ctx, f, sku, false, false, func(l *ledger.Ledger) (int64, error) { return l.BuyerUnits(ctx, sku, buyer) })
}

func (f *Fleet) ProgramUnits(ctx context.Context, program, buyer keys.ID) (int64, error) {
	return onProgram(ctx, f, program, func(l *ledger.Ledger) (int64, error) { return l.ProgramUnits(ctx, program, buyer) })
}

func (f *Fleet) OrderTotals(ctx context.Context, sku stock.SKU) (orders, units int64, err error) {
	r, err := onSKU(ctx, f, sku, false, false, func(l *ledger.Ledger) (twoOf[int64, int64], error) {
		o, u, err := l.OrderTotals(ctx, sku)
		return twoOf[int64, int64]{o, u}, err
	})
	return r.a, r.b, err
}

// --- waiting rooms: the program's primary ---

func (f *Fleet) PutQueue(ctx context.Context, c ledger.QueueConfig) (ledger.QueueConfig, error) {
	return writeProgram(ctx, f, c.Program, true, func(l *ledger.Ledger) (ledger.QueueConfig, error) { return l.PutQueue(ctx, c) })
}

func (f *Fleet) Queue(ctx context.Context, program keys.ID) (ledger.QueueConfig, error) {
	return onProgram(ctx, f, program, func(l *ledger.Ledger) (ledger.QueueConfig, error) { return l.Queue(ctx, program) })
}

func (f *Fleet) DeleteQueue(ctx context.Context, program keys.ID) (bool, error) {
	return writeProgram(ctx, f, program, false, func(l *ledger.Ledger) (bool, error) { return l.DeleteQueue(ctx, program) })
}

func (f *Fleet) ProgramStock(ctx context.Context, program keys.ID) (ledger.ProgramStock, error) {
	return onProgram(ctx, f, program, func(l *ledger.Ledger) (ledger.ProgramStock, error) { return l.ProgramStock(ctx, program) })
}

func (f *Fleet) QueueLine(ctx context.Context, program keys.ID) (ledger.QueueLine, error) {
	return onProgram(ctx, f, program, func(l *ledger.Ledger) (ledger.QueueLine, error) { return l.QueueLine(ctx, program) })
}

func (f *Fleet) RoomLine(ctx context.Context, program, room keys.ID) (ledger.QueueLine, error) {
	return onProgram(ctx, f, program, func(l *ledger.Ledger) (ledger.QueueLine, error) { return l.RoomLine(ctx, program, room) })
}

func (f *Fleet) ReserveQueuePlaces(ctx context.Context, program, room keys.ID, early bool, n int64) (int64, error) {
	return writeProgram(ctx, f, program, false, func(l *ledger.Ledger) (int64, error) {
		return l.ReserveQueuePlaces(ctx, program, room, early, n)
	})
}

func (f *Fleet) SeeQueueLine(ctx context.Context, q ledger.QueueLine) error {
	_, err := writeProgram(ctx, f, q.Program, false, func(l *ledger.Ledger) (struct{}, error) { return struct{}{}, l.SeeQueueLine(ctx, q) })
	return err
}

func (f *Fleet) SetEarlyGap(ctx context.Context, program, room keys.ID, perm, hi int64) (ledger.QueueLine, error) {
	return writeProgram(ctx, f, program, false, func(l *ledger.Ledger) (ledger.QueueLine, error) {
		return l.SetEarlyGap(ctx, program, room, perm, hi)
	})
}

func (f *Fleet) SpendAdmission(ctx context.Context, program, room keys.ID, sp ledger.Spend) (keys.ID, bool, error) {
	type spent struct {
		holder keys.ID
		before bool
	}
	s, err := writeProgram(ctx, f, program, false, func(l *ledger.Ledger) (spent, error) {
		holder, before, err := l.SpendAdmission(ctx, program, room, sp)
		return spent{holder, before}, err
	})
	return s.holder, s.before, err
}

func (f *Fleet) ReleaseAdmission(ctx context.Context, program, room, buyer, request keys.ID) error {
	_, err := writeProgram(ctx, f, program, false, func(l *ledger.Ledger) (struct{}, error) {
		return struct{}{}, l.ReleaseAdmission(ctx, program, room, buyer, request)
	})
	return err
}

func (f *Fleet) AdmissionSpends(ctx context.Context, program, room keys.ID) ([]ledger.Spend, error) {
	return onProgram(ctx, f, program, func(l *ledger.Ledger) ([]ledger.Spend, error) { return l.AdmissionSpends(ctx, program, room) })
}

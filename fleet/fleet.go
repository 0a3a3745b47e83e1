// Package fleet is one ledger over several PostgreSQL primaries. Each
// program's rows live on one primary (its SKUs, orders, holds, carts,
// waiting room and caps never span two), so every transaction stays on one
// server; a directory on the first primary says which, assigned when a
// program is first written and changed only by Move, while its sale is
// closed. With one primary a Fleet is that ledger, with nothing between.
//
// Calls naming a program or SKU go to its primary. Calls naming a row by
// id go where the id's SKU lane was last seen (ledger.NewIDOf), and to the
// others when it is not there. Calls across programs (the sweepers'
// ExpireDue, PendingRestores, SettleDue, PoolsDue; SKUs; QueuedPrograms)
// run on every primary and answer what the reachable ones hold, with the
// others' errors: one primary down stops only its own programs.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockgate/stockgate/internal/opt"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// Primary is one PostgreSQL primary of the fleet.
type Primary struct {
	// Name is how the directory names it: an id ([A-Za-z0-9_-]{1,64}),
	// never changed once programs are placed on it.
	Name   string
	Ledger ledger.Options
}

// Options configures a Fleet.
type Options struct {
	// Primaries are the ledgers; the first keeps the directory. One
	// primary (of either driver) is a plain ledger; more must all be
	// PostgreSQL.
	Primaries []Primary
	// PlaceTTL is how long a replica trusts what it read of a program's
	// place before it reads the directory again; Move waits it out after
	// marking a program as moving. Default 5 s.
	PlaceTTL time.Duration
	// Metrics receives the ledgers' metrics (labelled by primary when
	// there are several). Default: none.
	Metrics prometheus.Registerer
	Logger  *slog.Logger // default slog.Default()
}

// DefaultPlaceTTL is Options.PlaceTTL's default.
const DefaultPlaceTTL = 5 * time.Second

// Validate reports the first setting that cannot work.
func (o Options) Validate() error {
	if len(o.Primaries) == 0 {
		return opt.Bad("Primaries", "name at least one ledger")
	}
	seen := map[string]bool{}
	for i, p := range o.Primaries {
		if err := p.Ledger.Validate(); err != nil {
			return opt.In(fmt.Sprintf("Primaries[%d].Ledger", i), err)
		}
		if _, err := keys.ParseID(p.Name); err != nil {
			return opt.Bad(fmt.Sprintf("Primaries[%d].Name", i), "must match [A-Za-z0-9_-]{1,64}")
		}
		if seen[p.Name] {
			return opt.Bad(fmt.Sprintf("Primaries[%d].Name", i), "names "+p.Name+" twice")
		}
		seen[p.Name] = true
		if len(o.Primaries) > 1 && p.Ledger.Driver != ledger.Postgres {
			return opt.Bad(fmt.Sprintf("Primaries[%d].Ledger.Driver", i), "several primaries must all be PostgreSQL")
		}
	}
	if len(o.Primaries) > 256 {
		return opt.Bad("Primaries", "at most 256 (a dead letter's seq names its primary in 8 bits)")
	}
	if o.PlaceTTL < 0 {
		return opt.Bad("PlaceTTL", "must not be negative")
	}
	return nil
}

// Fleet is the ledger over its primaries.
type Fleet struct {
	ps     []*primary
	byName map[string]*primary
	ttl    time.Duration
	log    *slog.Logger

	mu     sync.Mutex
	places map[keys.ID]place      // what this replica read of the directory
	lanes  map[uint32][]stock.SKU // the SKUs of each lane (ledger.NewIDOf) seen
	ids    map[keys.ID]keys.ID    // the program of rows found by asking every primary (bounded)
}

type primary struct {
	name string
	l    *ledger.Ledger
}

// place is a program's placement as read at a time.
type place struct {
	p      *primary
	moving bool
	read   time.Time
}

// idMemory bounds ids: rows found by asking every primary.
const idMemory = 1 << 16

// Open opens every primary (migrating each as its options say) and
// returns the fleet. On error what was opened is closed.
func Open(ctx context.Context, o Options) (_ *Fleet, err error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	opt.Fill(&o.PlaceTTL, DefaultPlaceTTL)
	f := &Fleet{byName: map[string]*primary{}, ttl: o.PlaceTTL, log: o.Logger, places: map[keys.ID]place{},
		lanes: map[uint32][]stock.SKU{}, ids: map[keys.ID]keys.ID{}}
	if f.log == nil {
		f.log = slog.Default()
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	for _, p := range o.Primaries {
		lo := p.Ledger
		lo.Metrics = o.Metrics
		if o.Metrics != nil && len(o.Primaries) > 1 {
			lo.Metrics = prometheus.WrapRegistererWith(prometheus.Labels{"primary": p.Name}, o.Metrics)
		}
		l, err := ledger.Open(ctx, lo)
		if err != nil {
			return nil, fmt.Errorf("fleet: primary %s: %w", p.Name, err)
		}
		q := &primary{name: p.Name, l: l}
		f.ps = append(f.ps, q)
		f.byName[p.Name] = q
	}
	if len(f.ps) > 1 {
		if err := f.adopt(ctx); err != nil {
			return nil, err
		}
		if err := f.loadDirectory(ctx); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// adopt places every program that has rows on a primary but no place in
// the directory (a ledger that was one primary before others were added)
// where its rows are, so no write puts it anywhere else.
func (f *Fleet) adopt(ctx context.Context) error {
	return f.Each(ctx, func(ctx context.Context, name string, l *ledger.Ledger) error {
		programs, err := l.Programs(ctx)
		if err != nil {
			return err
		}
		for _, program := range programs {
			if err := f.ps[0].l.SetPlacement(ctx, program, name); err != nil && !errors.Is(err, ledger.ErrConflict) {
				return err
			}
		}
		return nil
	})
}

// Place puts a program not placed yet on the named primary (the first
// write stands): how a test or an operator chooses instead of the
// least-loaded rule.
func (f *Fleet) Place(ctx context.Context, program keys.ID, name string) error {
	if f.byName[name] == nil {
		return fmt.Errorf("fleet: no primary named %q", name)
	}
	return f.ps[0].l.SetPlacement(ctx, program, name)
}

// Close closes every primary's ledger.
func (f *Fleet) Close() error {
	var errs []error
	for _, p := range f.ps {
		errs = append(errs, p.l.Close())
	}
	return errors.Join(errs...)
}

// Primaries are the primaries' names, the directory's first.
func (f *Fleet) Primaries() []string {
	out := make([]string, len(f.ps))
	for i, p := range f.ps {
		out[i] = p.name
	}
	return out
}

// Primary is the named primary's ledger (nil if none).
func (f *Fleet) Primary(name string) *ledger.Ledger {
	if p := f.byName[name]; p != nil {
		return p.l
	}
	return nil
}

// First is the first primary's ledger: the directory's, and the only one
// of a fleet of one.
func (f *Fleet) First() *ledger.Ledger { return f.ps[0].l }

// Each runs fn on every primary's ledger at once and joins their errors,
// each named by its primary.
func (f *Fleet) Each(ctx context.Context, fn func(ctx context.Context, name string, l *ledger.Ledger) error) error {
	if len(f.ps) == 1 {
		return fn(ctx, f.ps[0].name, f.ps[0].l)
	}
	errs := make([]error, len(f.ps))
	var wg sync.WaitGroup
	for i, p := range f.ps {
		wg.Go(func() {
			if err := fn(ctx, p.name, p.l); err != nil {
				errs[i] = fmt.Errorf("primary %s: %w", p.name, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// ID is the fleet's id: its first primary's.
func (f *Fleet) ID() keys.ID { return f.ps[0].l.ID() }

// loadDirectory reads the whole directory into the replica's memory, so a
// replica that has read it keeps routing while the first primary is down.
func (f *Fleet) loadDirectory(ctx context.Context) error {
	all, err := f.ps[0].l.Placements(ctx)
	if err != nil {
		return fmt.Errorf("fleet: directory: %w", err)
	}
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, pl := range all {
		if p := f.byName[pl.Primary]; p != nil {
			f.places[pl.Program] = place{p: p, moving: pl.Moving, read: now}
		} else {
			f.log.Error("fleet: the directory names a primary this replica does not know", "program", pl.Program.String(),
				"primary", pl.Primary)
		}
	}
	return nil
}

// ErrUnplaced: the directory names a primary this replica was not given.
var ErrUnplaced = errors.New("fleet: program on a primary this replica does not know")

// lookup is where program lives: the directory as read within PlaceTTL,
// read again after it; while the directory cannot be read, what was read
// before if that primary still has the program at home, or failing that
// the primary that holds the program's rows.
// found is false for a program placed nowhere.
//
// A place read as moving is read again every time: the move flips the
// directory and deletes the source's rows at once, so a replica that
// went on reading there for the rest of PlaceTTL answered 404 for rows
// the target had (an order, a hold, a committed purchase's retry). A
// move costs its program one directory read per call while it runs.
func (f *Fleet) lookup(ctx context.Context, program keys.ID) (pl place, found bool, err error) {
	f.mu.Lock()
	pl, ok := f.places[program]
	f.mu.Unlock()
	if ok && !pl.moving && time.Since(pl.read) < f.ttl {
		return pl, true, nil
	}
	// Stamped with when it was asked: a read that began before a move was
	// marked and answered late must not count as one after it (the move
	// waits PlaceTTL from the mark for every replica to see it).
	asked := time.Now()
	got, err := f.ps[0].l.PlacementOf(ctx, program)
	switch {
	case err == nil:
		p := f.byName[got.Primary]
		if p == nil {
			return place{}, false, fmt.Errorf("%w: %s on %q", ErrUnplaced, program, got.Primary)
		}
		pl = place{p: p, moving: got.Moving, read: asked}
		f.mu.Lock()
		f.places[program] = pl
		f.mu.Unlock()
		return pl, true, nil
	case errors.Is(err, ledger.ErrNotFound):
		f.mu.Lock()
		delete(f.places, program)
		f.mu.Unlock()
		return place{}, false, nil
	case ok:
		// The directory's primary is down: what was read stands, unless
		// that primary says the program is not at home there now (moved
		// away since, or a copy a move back left unswitched: a write
		// there would be lost with it). Unknown stands as read.
		if home, herr := pl.p.l.LivesHere(ctx, program); herr != nil || home {
			return pl, true, nil
		}
	}
	// Nothing read before: the primary holding the program's rows.
	for _, p := range f.ps[1:] {
		if home, herr := p.l.LivesHere(ctx, program); herr == nil && home {
			return place{p: p, read: time.Now()}, true, nil
		}
	}
	return place{}, false, fmt.Errorf("fleet: directory: %w", err)
}

// read is the primary to read program's rows on: the first when it is
// placed nowhere (it has none, and answers so).
func (f *Fleet) read(ctx context.Context, program keys.ID) (*primary, error) {
	if len(f.ps) == 1 {
		return f.ps[0], nil
	}
	pl, found, err := f.lookup(ctx, program)
	switch {
	case err != nil:
		return nil, unavailable(err)
	case !found:
		return f.ps[0], nil
	}
	return pl.p, nil
}

// write is the primary to write program's rows on, placing the program
// first when create is set and it is placed nowhere. A moving program's
// writes are refused (nothing written).
func (f *Fleet) write(ctx context.Context, program keys.ID, create bool) (*primary, error) {
	if len(f.ps) == 1 {
		return f.ps[0], nil
	}
	pl, found, err := f.lookup(ctx, program)
	if err != nil {
		return nil, unavailable(err)
	}
	if !found {
		if !create {
			return f.ps[0], nil
		}
		// A program with rows but no place (written by a build before the
		// directory, or while this one adopted) stays where its rows are.
		names := f.Primaries()
		for _, p := range f.ps {
			if home, err := p.l.LivesHere(ctx, program); err != nil {
				return nil, unavailable(err)
			} else if home {
				names = []string{p.name}
				break
			}
		}
		got, err := f.ps[0].l.Place(ctx, program, names)
		if err != nil {
			return nil, unavailable(err)
		}
		p := f.byName[got.Primary]
		if p == nil {
			return nil, unavailable(fmt.Errorf("%w: %s on %q", ErrUnplaced, program, got.Primary))
		}
		pl = place{p: p, moving: got.Moving, read: time.Now()}
		f.mu.Lock()
		f.places[program] = pl
		f.mu.Unlock()
	}
	if pl.moving {
		return nil, fmt.Errorf("%w: %w", ledger.ErrNotCommitted, ledger.ErrMoving)
	}
	return pl.p, nil
}

// unavailable marks a routing failure as a write that did not happen.
func unavailable(err error) error {
	return fmt.Errorf("%w: %w", ledger.ErrNotCommitted, err)
}

// seen notes sku's lane, so ids of its rows are routed by its program.
func (f *Fleet) seen(sku stock.SKU) {
	if len(f.ps) == 1 {
		return
	}
	lane := ledger.SKULane(sku)
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Contains(f.lanes[lane], sku) {
		f.lanes[lane] = append(f.lanes[lane], sku)
	}
}

// programsOf are the programs the row id names may be of: the one found
// for it before, or those of the SKUs of its lane seen here.
func (f *Fleet) programsOf(id keys.ID) []keys.ID {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.ids[id]; ok {
		return []keys.ID{p}
	}
	var out []keys.ID
	for _, s := range f.lanes[ledger.LaneOf(id)] {
		if !slices.Contains(out, s.Program) {
			out = append(out, s.Program)
		}
	}
	return out
}

// found remembers the program of a row asked for everywhere.
func (f *Fleet) found(id, program keys.ID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.ids) >= idMemory {
		clear(f.ids)
	}
	f.ids[id] = program
}

// byID runs call on the primary the directory names for the program of
// the row id names (an order, a hold, a cart, a listing): the program is
// known from the id's lane, or found by asking every primary; a copy of
// the row on a primary the directory does not name (a move's leftover) is
// never used. A write (write set) of a moving program is refused. call
// must write nothing where the row is not (every ledger call by id reads
// the row first).
func byID[T any](ctx context.Context, f *Fleet, id keys.ID, write bool, call func(l *ledger.Ledger) (T, error)) (T, error) {
	if len(f.ps) == 1 {
		return call(f.ps[0].l)
	}
	var zero T
	var failed error
	tried := map[*primary]bool{}
	for _, program := range f.programsOf(id) {
		p, err := f.routeRow(ctx, program, write)
		if err != nil {
			failed = err
			continue
		}
		if tried[p] {
			continue
		}
		tried[p] = true
		if v, err := call(p.l); !errors.Is(err, ledger.ErrNotFound) {
			return v, err
		}
	}
	program, err := f.locate(ctx, id)
	switch {
	case errors.Is(err, ledger.ErrNotFound) && failed != nil:
		return zero, failed
	case err != nil:
		return zero, err
	}
	f.found(id, program)
	p, err := f.routeRow(ctx, program, write)
	if err != nil {
		return zero, err
	}
	return call(p.l)
}

// routeRow is the primary of program's rows, for a read or a write.
func (f *Fleet) routeRow(ctx context.Context, program keys.ID, write bool) (*primary, error) {
	if write {
		return f.write(ctx, program, false)
	}
	return f.read(ctx, program)
}

// locate asks every primary at once for the program of the row id names,
// and answers the program whose primary (as the directory says) holds the
// row: ledger.ErrNotFound when none does and all answered.
func (f *Fleet) locate(ctx context.Context, id keys.ID) (keys.ID, error) {
	var mu sync.Mutex
	at := map[string]keys.ID{}
	err := f.Each(ctx, func(ctx context.Context, name string, l *ledger.Ledger) error {
		program, err := l.ProgramOfRow(ctx, id)
		if errors.Is(err, ledger.ErrNotFound) {
			return nil
		}
		if err == nil {
			mu.Lock()
			at[name] = program
			mu.Unlock()
		}
		return err
	})
	for name, program := range at {
		p, err := f.read(ctx, program)
		if err == nil && p.name == name {
			return program, nil
		}
	}
	if err != nil {
		return keys.ID{}, unavailable(err)
	}
	return keys.ID{}, ledger.ErrNotFound
}

// first asks every primary at once and answers the first that found
// something (not ledger.ErrNotFound): a read by a request's key.
func first[T any](ctx context.Context, f *Fleet, call func(l *ledger.Ledger) (T, error)) (T, error) {
	if len(f.ps) == 1 {
		return call(f.ps[0].l)
	}
	type answer struct {
		v   T
		err error
	}
	got := make([]answer, len(f.ps))
	var wg sync.WaitGroup
	for i, p := range f.ps {
		wg.Go(func() {
			v, err := call(p.l)
			got[i] = answer{v, err}
		})
	}
	wg.Wait()
	var failed error
	for i, a := range got {
		switch {
		case a.err == nil:
			return a.v, nil
		case !errors.Is(a.err, ledger.ErrNotFound):
			failed = errors.Join(failed, fmt.Errorf("primary %s: %w", f.ps[i].name, a.err))
		}
	}
	var zero T
	if failed != nil {
		return zero, unavailable(failed)
	}
	return zero, got[0].err
}

// onProgram runs call on the primary holding program (read).
func onProgram[T any](ctx context.Context, f *Fleet, program keys.ID, call func(l *ledger.Ledger) (T, error)) (T, error) {
	p, err := f.read(ctx, program)
	if err != nil {
		var zero T
		return zero, err
	}
	return call(p.l)
}

// writeProgram runs call on the primary holding program, placing it there
// first when create is set.
func writeProgram[T any](ctx context.Context, f *Fleet, program keys.ID, create bool, call func(l *ledger.Ledger) (T, error)) (T, error) {
	p, err := f.write(ctx, program, create)
	if err != nil {
		var zero T
		return zero, err
	}
	return call(p.l)
}

// onSKU runs call on the primary holding sku's program, noting its lane.
func onSKU[T any](ctx context.Context, f *Fleet, sku stock.SKU, write, create bool, call func(l *ledger.Ledger) (T, error)) (T, error) {
	var p *primary
	var err error
	if write {
		p, err = f.write(ctx, sku.Program, create)
	} else {
		p, err = f.read(ctx, sku.Program)
	}
	if err != nil {
		var zero T
		return zero, err
	}
	f.seen(sku)
	return call(p.l)
}

// everywhere runs call on every primary at once and returns what each
// answered, in the primaries' order, with the failures joined.
func everywhere[T any](ctx context.Context, f *Fleet, call func(l *ledger.Ledger) ([]T, error)) ([]T, error) {
	if len(f.ps) == 1 {
		return call(f.ps[0].l)
	}
	got := make([][]T, len(f.ps))
	err := f.Each(ctx, func(ctx context.Context, name string, l *ledger.Ledger) error {
		v, err := call(l)
		got[indexOf(f, name)] = v
		return err
	})
	var out []T
	for _, g := range got {
		out = append(out, g...)
	}
	return out, err
}

func indexOf(f *Fleet, name string) int {
	for i, p := range f.ps {
		if p.name == name {
			return i
		}
	}
	return -1
}

package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Group is the relays of a ledger split over several primaries (package
// fleet), one per primary, shown to admins as one: a sink's figures add
// up, and a dead letter's seq names its primary too (seq × len(Group) +
// the primary's index; with one primary the seq is the ledger's own).
type Group []*Relay

// Run runs every relay until ctx ends.
func (g Group) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, r := range g {
		wg.Go(func() { r.Run(ctx) }) // owned by Run, which waits for it
	}
	wg.Wait()
}

// Sinks adds up every relay's figures per sink.
func (g Group) Sinks(ctx context.Context) ([]SinkStats, error) {
	if len(g) == 1 {
		return g[0].Sinks(ctx)
	}
	var out []SinkStats
	var errs []error
	for _, r := range g {
		got, err := r.Sinks(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if out == nil {
			out = got
			continue
		}
		for i, s := range got {
			o := &out[i]
			o.Backlog += s.Backlog
			o.Dead += s.Dead
			o.Leased += s.Leased
			if !s.Oldest.IsZero() && (o.Oldest.IsZero() || s.Oldest.Before(o.Oldest)) {
				o.Oldest = s.Oldest
				o.Lag = max(time.Since(s.Oldest), 0)
			}
		}
	}
	if out == nil && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// DeadLetters are up to limit of sink's dead letters after seq, every
// primary's, in seq order.
func (g Group) DeadLetters(ctx context.Context, sink string, after int64, limit int) ([]DeadLetter, error) {
	if len(g) == 1 {
		return g[0].DeadLetters(ctx, sink, after, limit)
	}
	if after < 0 {
		return nil, fmt.Errorf("%w: after >= 0", ErrInvalid)
	}
	n := int64(len(g))
	var out []DeadLetter
	for i, r := range g {
		got, err := r.DeadLetters(ctx, sink, max(after/n-1, 0), limit)
		if err != nil {
			return nil, err
		}
		for _, d := range got {
			d.Event.Seq = d.Event.Seq*n + int64(i)
			if d.Event.Seq > after {
				out = append(out, d)
			}
		}
	}
	slices.SortFunc(out, func(a, b DeadLetter) int { return cmp.Compare(a.Event.Seq, b.Event.Seq) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Redeliver redelivers the dead letter of seq (as DeadLetters numbers it).
func (g Group) Redeliver(ctx context.Context, sink string, seq int64) (DeadLetter, error) {
	if len(g) == 1 {
		return g[0].Redeliver(ctx, sink, seq)
	}
	if seq < 0 {
		return DeadLetter{}, fmt.Errorf("%w: %s seq %d", ErrUnknownDeadLetter, sink, seq)
	}
	n := int64(len(g))
	d, err := g[seq%n].Redeliver(ctx, sink, seq/n)
	d.Event.Seq = seq
	return d, err
}

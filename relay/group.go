package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// Group is the relays of a ledger split over several primaries (package
// fleet), one per primary in the fleet's order, shown to admins as one: a
// sink's figures add up, and a dead letter's seq names its primary too:
// seq × DeadStride + the primary's index (with one primary the seq is the
// ledger's own). The stride does not change with the number of primaries,
// so a seq listed by a replica still names the same letter on one that
// has a primary more (added at the end).
type Group []*Relay

// DeadStride is the dead-letter seq's multiplier on several primaries: at
// most this many primaries.
const DeadStride = 256

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
	if after < 0 || limit < 1 || limit > MaxDeadLettersPage {
		return nil, fmt.Errorf("%w: after >= 0 and limit in 1..%d", ErrInvalid, MaxDeadLettersPage)
	}
	var out []DeadLetter
	// A primary that filled its page may have more below another's last:
	// the page ends at the lowest last seq of those.
	upTo := int64(math.MaxInt64)
	for i, r := range g {
		from := int64(0)
		if after >= int64(i) {
			from = (after - int64(i)) / DeadStride // its seqs above this are above after
		}
		got, err := r.DeadLetters(ctx, sink, from, limit)
		if err != nil {
			return nil, err
		}
		for _, d := range got {
			d.Event.Seq = d.Event.Seq*DeadStride + int64(i)
			out = append(out, d)
		}
		if len(got) == limit {
			upTo = min(upTo, out[len(out)-1].Event.Seq)
		}
	}
	slices.SortFunc(out, func(a, b DeadLetter) int { return cmp.Compare(a.Event.Seq, b.Event.Seq) })
	out = slices.DeleteFunc(out, func(d DeadLetter) bool { return d.Event.Seq > upTo })
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
	if seq < 0 || seq%DeadStride >= int64(len(g)) {
		return DeadLetter{}, fmt.Errorf("%w: %s seq %d", ErrUnknownDeadLetter, sink, seq)
	}
	d, err := g[seq%DeadStride].Redeliver(ctx, sink, seq/DeadStride)
	d.Event.Seq = seq
	return d, err
}

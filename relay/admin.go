package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/client/webhook"
	"github.com/stockgate/stockgate/ledger"
)

// The admin side, for the gateway's /v1/admin/relay routes: what admins
// see of the relay and ask of it, in the relay's own words.

// Errors of the admin side. Any other error is the ledger's: unavailable.
var (
	ErrUnknownSink       = errors.New("relay: no sink of that name")
	ErrUnknownDeadLetter = errors.New("relay: no dead letter of that sink and seq")
	ErrRedeliveryFailed  = errors.New("relay: the sink refused the redelivery; the dead letter is kept")
	ErrInvalid           = errors.New("relay: invalid page")
)

// SinkStats are a sink's delivery figures, fleet-wide.
type SinkStats struct {
	Name string
	// Backlog is the events not yet delivered; Oldest is when the oldest
	// of them was written (zero with no backlog), Lag how long ago.
	Backlog int64
	Oldest  time.Time
	Lag     time.Duration
	Dead    int64 // dead letters kept
	Leased  int   // partitions some relay holds
}

// DeadLetter is an event a sink gave up on after its attempts.
type DeadLetter struct {
	Sink      string
	Event     webhook.Event
	Attempts  int
	LastError string
	DeadAt    time.Time
}

// MaxDeadLettersPage is the most dead letters one read returns.
const MaxDeadLettersPage = 1000

// Sinks are every sink's figures, fleet-wide.
func (r *Relay) Sinks(ctx context.Context) ([]SinkStats, error) {
	var out []SinkStats
	for _, s := range r.o.Sinks {
		st, err := r.ledger.RelayStats(ctx, s.Name())
		if err != nil {
			return nil, fmt.Errorf("relay: stats: %w", err)
		}
		v := SinkStats{Name: s.Name(), Backlog: st.Backlog, Oldest: st.Oldest, Dead: st.Dead, Leased: st.Leased}
		if !st.Oldest.IsZero() {
			v.Lag = max(time.Since(st.Oldest), 0)
		}
		out = append(out, v)
	}
	return out, nil
}

func (r *Relay) sink(name string) (Sink, error) {
	s := r.sinks[name]
	if s == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownSink, name)
	}
	return s, nil
}

func deadLetterOf(d ledger.DeadLetter) DeadLetter {
	return DeadLetter{Sink: d.Sink, Event: d.Event.Wire(), Attempts: d.Attempts, LastError: d.LastError, DeadAt: d.DeadAt}
}

// DeadLetters are up to limit of sink's dead letters after seq.
func (r *Relay) DeadLetters(ctx context.Context, sink string, after int64, limit int) ([]DeadLetter, error) {
	if _, err := r.sink(sink); err != nil {
		return nil, err
	}
	if after < 0 || limit < 1 || limit > MaxDeadLettersPage {
		return nil, fmt.Errorf("%w: after >= 0 and limit in 1..%d", ErrInvalid, MaxDeadLettersPage)
	}
	got, err := r.ledger.DeadLetters(ctx, sink, after, limit)
	if err != nil {
		return nil, fmt.Errorf("relay: dead letters: %w", err)
	}
	out := make([]DeadLetter, len(got))
	for i, d := range got {
		out[i] = deadLetterOf(d)
	}
	return out, nil
}

// Redeliver delivers sink's dead letter of seq now, out of its partition's
// order (the partition has moved past it), and forgets it once delivered.
// Two redeliveries at once may both deliver: receivers de-duplicate by id.
func (r *Relay) Redeliver(ctx context.Context, sink string, seq int64) (DeadLetter, error) {
	s, err := r.sink(sink)
	if err != nil {
		return DeadLetter{}, err
	}
	d, err := r.ledger.DeadLetter(ctx, sink, seq)
	if errors.Is(err, ledger.ErrNotFound) {
		return DeadLetter{}, fmt.Errorf("%w: %s seq %d", ErrUnknownDeadLetter, sink, seq)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("relay: dead letter: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, r.o.AttemptTimeout)
	defer cancel()
	if err := s.Deliver(dctx, d.Event); err != nil {
		r.metrics.failed.WithLabelValues(sink).Inc()
		return DeadLetter{}, fmt.Errorf("%w: %w", ErrRedeliveryFailed, err)
	}
	r.metrics.delivered.WithLabelValues(sink).Inc()
	// Already forgotten: another redelivery got there first; both count.
	if err := r.ledger.ForgetDeadLetter(ctx, sink, seq); err != nil && !errors.Is(err, ledger.ErrNotFound) {
		return DeadLetter{}, fmt.Errorf("relay: delivered, not yet forgotten: %w", err)
	}
	return deadLetterOf(d), nil
}

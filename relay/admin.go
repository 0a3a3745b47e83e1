package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
)

// The admin side (sale.Relay), for the gateway's /v1/admin/relay routes.

var _ sale.Relay = (*Relay)(nil)

// Sinks are every sink's figures, fleet-wide.
func (r *Relay) Sinks(ctx context.Context) ([]sale.RelaySink, error) {
	var out []sale.RelaySink
	for _, s := range r.o.Sinks {
		st, err := r.ledger.RelayStats(ctx, s.Name())
		if err != nil {
			return nil, fmt.Errorf("%w: %w", sale.ErrUnavailable, err)
		}
		v := sale.RelaySink{Name: s.Name(), Backlog: st.Backlog, Oldest: st.Oldest, Dead: st.Dead, Leased: st.Leased}
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
		return nil, fmt.Errorf("%w: %q", sale.ErrUnknownSink, name)
	}
	return s, nil
}

func deadLetterOf(d ledger.DeadLetter) sale.DeadLetter {
	return sale.DeadLetter{Sink: d.Sink, Event: sale.EventOf(d.Event), Attempts: d.Attempts, LastError: d.LastError, DeadAt: d.DeadAt}
}

// DeadLetters are up to limit of sink's dead letters after seq.
func (r *Relay) DeadLetters(ctx context.Context, sink string, after int64, limit int) ([]sale.DeadLetter, error) {
	if _, err := r.sink(sink); err != nil {
		return nil, err
	}
	if after < 0 || limit < 1 || limit > sale.MaxDeadLettersPage {
		return nil, fmt.Errorf("%w: after >= 0 and limit in 1..%d", sale.ErrInvalid, sale.MaxDeadLettersPage)
	}
	got, err := r.ledger.DeadLetters(ctx, sink, after, limit)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", sale.ErrUnavailable, err)
	}
	out := make([]sale.DeadLetter, len(got))
	for i, d := range got {
		out[i] = deadLetterOf(d)
	}
	return out, nil
}

// Redeliver delivers sink's dead letter of seq now, out of its partition's
// order (the partition has moved past it), and forgets it once delivered.
// Two redeliveries at once may both deliver: receivers de-duplicate by id.
func (r *Relay) Redeliver(ctx context.Context, sink string, seq int64) (sale.DeadLetter, error) {
	s, err := r.sink(sink)
	if err != nil {
		return sale.DeadLetter{}, err
	}
	d, err := r.ledger.DeadLetter(ctx, sink, seq)
	if errors.Is(err, ledger.ErrNotFound) {
		return sale.DeadLetter{}, fmt.Errorf("%w: %s seq %d", sale.ErrUnknownDeadLetter, sink, seq)
	}
	if err != nil {
		return sale.DeadLetter{}, fmt.Errorf("%w: %w", sale.ErrUnavailable, err)
	}
	dctx, cancel := context.WithTimeout(ctx, r.o.AttemptTimeout)
	defer cancel()
	if err := s.Deliver(dctx, d.Event); err != nil {
		r.metrics.failed.WithLabelValues(sink).Inc()
		return sale.DeadLetter{}, fmt.Errorf("%w: %w", sale.ErrRedeliveryFailed, err)
	}
	r.metrics.delivered.WithLabelValues(sink).Inc()
	// Already forgotten: another redelivery got there first; both count.
	if err := r.ledger.ForgetDeadLetter(ctx, sink, seq); err != nil && !errors.Is(err, ledger.ErrNotFound) {
		return sale.DeadLetter{}, fmt.Errorf("%w: delivered, not yet forgotten: %w", sale.ErrUnavailable, err)
	}
	return deadLetterOf(d), nil
}

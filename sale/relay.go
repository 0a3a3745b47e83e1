package sale

import (
	"context"
	"time"
)

// The relay's admin side: what the gateway shows of the outbox relay and
// asks of it. Package relay implements Relay; these are its values.

// RelaySink is a sink's delivery figures, fleet-wide.
type RelaySink struct {
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
	Event     Event
	Attempts  int
	LastError string
	DeadAt    time.Time
}

// MaxDeadLettersPage is the most dead letters one read returns.
const MaxDeadLettersPage = 1000

// Relay is the outbox relay as admins see it. Errors: ErrUnknownSink,
// ErrUnknownDeadLetter, ErrRedeliveryFailed, ErrInvalid, ErrUnavailable.
type Relay interface {
	// Sinks are every sink's figures.
	Sinks(ctx context.Context) ([]RelaySink, error)
	// DeadLetters are up to limit of sink's dead letters after seq.
	DeadLetters(ctx context.Context, sink string, after int64, limit int) ([]DeadLetter, error)
	// Redeliver delivers sink's dead letter of seq now and, once
	// delivered, forgets it.
	Redeliver(ctx context.Context, sink string, seq int64) (DeadLetter, error)
}

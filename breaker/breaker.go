// Package breaker is the fuse around the Redis gate: a gobreaker circuit
// breaker that knows which errors are failures. A stock outcome (sold out,
// not seeded, fenced, bad input) is an answer from a working Redis and counts
// as a success; a call whose caller went away (client cancellation, the
// caller's own deadline) counts as nothing at all, so a flood of impatient
// clients can neither trip the breaker nor hold it half-open; only errors of
// Redis itself (timeouts, refused connections, CLUSTERDOWN) count as failures.
//
// State and transitions are exported as Prometheus metrics.
package breaker

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"

	"github.com/stockgate/stockgate/internal/opt"
)

// ErrOpen: the breaker refused the call without running it (open, or
// half-open with its probes already out). Nothing was sent.
var ErrOpen = errors.New("breaker: open")

// ErrCallerOutOfTime marks a caller's own deadline (set as its context's
// cause, context.WithTimeoutCause): a call cut short by it is the caller
// giving up, never a failure, whatever Options.Deadlines says. A request
// whose work timed out waiting on something else (a cut ledger link)
// must not open the breakers of the Redis nodes it asked last.
var ErrCallerOutOfTime = errors.New("breaker: the caller's deadline passed")

// State of a breaker.
type State = gobreaker.State

// States.
const (
	Closed   = gobreaker.StateClosed
	HalfOpen = gobreaker.StateHalfOpen
	Open     = gobreaker.StateOpen
)

// Options configures a Breaker. The defaults trip on a Redis that fails
// most calls for a second or so, and probe again two seconds later.
type Options struct {
	// Name labels the metrics. Default "redis".
	Name string
	// ConsecutiveFailures in a row trip the breaker. Default 5.
	ConsecutiveFailures uint32
	// FailureRatio of the calls in Window, once there are at least
	// MinRequests of them, trips it too. Defaults 0.5 and 20.
	FailureRatio float64
	MinRequests  uint32
	// Window is the rolling window the ratio is counted over, in 1s buckets.
	// Default 10s.
	Window time.Duration
	// OpenFor is how long the breaker stays open before it lets probes
	// through (half-open). Default 2s.
	OpenFor time.Duration
	// Probes is how many calls half-open lets through; that many successes
	// in a row close the breaker, one failure opens it again. Default 3.
	Probes uint32
	// IsOutcome reports errors that are answers, not failures. Default none.
	IsOutcome func(error) bool
	// Deadlines counts a call that ran out of its context's deadline as a
	// failure (unless IsOutcome says otherwise), not as the caller giving
	// up: for calls whose deadline is the time budget the dependency gets,
	// set per call (the Redis node breakers: a node that does not answer
	// within it is failing). A cancelled call still counts as nothing.
	Deadlines bool
	// OnChange is told of every transition (after the metrics). When the
	// breaker opens, cause is a failure that opened it (with concurrent
	// failures, the latest one counted); otherwise nil. It runs under the
	// breaker's lock: it must not call the Breaker.
	OnChange func(from, to State, cause error)
	// Registerer receives the metrics. Optional.
	Registerer prometheus.Registerer
}

// Breaker wraps calls to one dependency.
type Breaker struct {
	cb        *gobreaker.CircuitBreaker[struct{}]
	isOutcome func(error) bool
	rejected  prometheus.Counter
	// failure is the latest error counted as a failure: what OnChange is
	// told opened the breaker. gobreaker decides to open right after the
	// call that returned it, under its lock, without the error.
	failure   atomic.Pointer[error]
	node      string
	openFor   time.Duration
	idleAfter time.Duration // a Set's node no call named for this long is not in use
	deadlines bool
	// openUntil is when the breaker last opened plus OpenFor (Unix ns):
	// when it lets probes through again.
	openUntil atomic.Int64
	// called is when Do was last called (Unix ns): a Set leaves out of its
	// State a node no call has named for a while.
	called atomic.Int64
}

// DefaultOptions are the settings a zero field takes.
func DefaultOptions() Options {
	return Options{Name: "redis", ConsecutiveFailures: 5, FailureRatio: 0.5, MinRequests: 20,
		Window: 10 * time.Second, OpenFor: 2 * time.Second, Probes: 3}
}

// Validate reports the first field that cannot work (an *opt.Error).
func (o Options) Validate() error {
	switch {
	case o.FailureRatio < 0 || o.FailureRatio > 1:
		return opt.Bad("FailureRatio", "must be in (0, 1]")
	case o.Window != 0 && o.Window < time.Second:
		return opt.Bad("Window", "must be at least 1s")
	case o.OpenFor != 0 && o.OpenFor < 10*time.Millisecond:
		return opt.Bad("OpenFor", "must be at least 10ms")
	}
	return nil
}

// New validates opts and returns a closed Breaker.
func New(opts Options) (*Breaker, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("breaker: %w", err)
	}
	return newBreaker(opts, "")
}

// newBreaker is New for a valid opts; node, when set, labels the metrics
// of one node's breaker in a Set.
func newBreaker(opts Options, node string) (*Breaker, error) {
	d := DefaultOptions()
	opt.Fill(&opts.Name, d.Name)
	opt.Fill(&opts.ConsecutiveFailures, d.ConsecutiveFailures)
	opt.Fill(&opts.FailureRatio, d.FailureRatio)
	opt.Fill(&opts.MinRequests, d.MinRequests)
	opt.Fill(&opts.Window, d.Window)
	opt.Fill(&opts.OpenFor, d.OpenFor)
	opt.Fill(&opts.Probes, d.Probes)
	if opts.IsOutcome == nil {
		opts.IsOutcome = func(error) bool { return false }
	}

	b := &Breaker{isOutcome: opts.IsOutcome, node: node, openFor: opts.OpenFor, deadlines: opts.Deadlines,
		idleAfter: min(opts.Window, 2*opts.OpenFor)}
	labels := prometheus.Labels{"breaker": opts.Name}
	if node != "" {
		labels["node"] = node
	}
	transitions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "stockgate_breaker_transitions_total",
		Help:        "Circuit breaker state changes, by the state left and the state entered.",
		ConstLabels: labels,
	}, []string{"from", "to"})
	// The four transitions there are, exported at zero from the start so a
	// dashboard or alert sees the series before the first one happens.
	for _, tr := range [][2]State{{Closed, Open}, {Open, HalfOpen}, {HalfOpen, Closed}, {HalfOpen, Open}} {
		transitions.WithLabelValues(tr[0].String(), tr[1].String())
	}
	b.rejected = prometheus.NewCounter(prometheus.CounterOpts{
		Name:        "stockgate_breaker_rejected_total",
		Help:        "Calls the circuit breaker refused without running them.",
		ConstLabels: labels,
	})
	b.cb = gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         opts.Name,
		MaxRequests:  opts.Probes,
		Interval:     opts.Window,
		BucketPeriod: time.Second,
		Timeout:      opts.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			if c.ConsecutiveFailures >= opts.ConsecutiveFailures {
				return true
			}
			counted := c.TotalSuccesses + c.TotalFailures
			return counted >= opts.MinRequests && float64(c.TotalFailures) >= opts.FailureRatio*float64(counted)
		},
		IsSuccessful: func(err error) bool { return err == nil || errors.As(err, new(outcome)) },
		IsExcluded:   func(err error) bool { return errors.As(err, new(excluded)) },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			transitions.WithLabelValues(from.String(), to.String()).Inc()
			if to == Open {
				b.openUntil.Store(time.Now().Add(opts.OpenFor).UnixNano())
			}
			if opts.OnChange != nil {
				var cause error
				if p := b.failure.Load(); to == Open && p != nil {
					cause = *p
				}
				opts.OnChange(from, to, cause)
			}
		},
	})
	if opts.Registerer != nil {
		state := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "stockgate_breaker_state",
			Help:        "Circuit breaker state: 0 closed, 1 half-open, 2 open.",
			ConstLabels: labels,
		}, func() float64 { return float64(b.inUseState()) })
		for _, c := range []prometheus.Collector{transitions, b.rejected, state} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("breaker: metrics: %w", err)
			}
		}
	}
	return b, nil
}

// State is the breaker's state now.
func (b *Breaker) State() State { return b.cb.State() }

// inUseState is State, but Closed for a node of a Set that no call named
// for twice OpenFor (at most the Window): a node in the client's routing
// is called, refused or not, while one it no longer routes to (a master
// replaced in a failover, a replica asked once for the slot map) keeps its
// last state for ever, and must neither hold an alert nor a Set's State.
func (b *Breaker) inUseState() State {
	if b.node != "" && time.Since(time.Unix(0, b.called.Load())) > b.idleAfter {
		return Closed
	}
	return b.cb.State()
}

// probesAt is when a refused call may be tried again: when the breaker
// lets probes through (half-open with its probes out: a moment later).
func (b *Breaker) probesAt() time.Time {
	if at := time.Unix(0, b.openUntil.Load()); at.After(time.Now()) {
		return at
	}
	return time.Now().Add(b.openFor / 10)
}

// OpenError is a call a breaker refused (errors.Is ErrOpen): Node names
// the breaker's node in a Set ("" for a lone Breaker), Until when it lets
// calls through again, so a refusal can say when to come back.
type OpenError struct {
	Node  string
	Until time.Time
	err   error
}

func (e *OpenError) Error() string {
	if e.Node == "" {
		return ErrOpen.Error() + ": " + e.err.Error()
	}
	return ErrOpen.Error() + ": node " + e.Node + ": " + e.err.Error()
}

// Is matches ErrOpen.
func (e *OpenError) Is(target error) bool { return target == ErrOpen }

// Unwrap is gobreaker's refusal.
func (e *OpenError) Unwrap() error { return e.err }

// excluded carries an error the breaker must not count.
type excluded struct{ err error }

func (e excluded) Error() string { return e.err.Error() }

// outcome carries an error that is an answer, counted as a success.
type outcome struct{ err error }

func (e outcome) Error() string { return e.err.Error() }

// Do runs f unless the breaker is open, and counts its result. It returns
// f's error unchanged, or an error wrapping ErrOpen when f did not run.
func (b *Breaker) Do(ctx context.Context, f func(ctx context.Context) error) error {
	b.called.Store(time.Now().UnixNano())
	deadlines := b.deadlines
	_, err := b.cb.Execute(func() (struct{}, error) {
		err := f(ctx)
		switch {
		case err == nil:
			return struct{}{}, nil
		case errors.Is(err, ErrOpen), errors.Is(err, gobreaker.ErrOpenState), errors.Is(err, gobreaker.ErrTooManyRequests):
			// A breaker inside f refused (go-redis re-running a command
			// that met this or another node's breaker, whose refusal can
			// come back unwrapped): it says nothing about the node.
			return struct{}{}, excluded{err}
		case ctx.Err() != nil && (!(deadlines && errors.Is(ctx.Err(), context.DeadlineExceeded)) ||
			errors.Is(context.Cause(ctx), ErrCallerOutOfTime)):
			// The caller gave up (cancelled or out of time): whatever Redis
			// did, this call says nothing about it.
			return struct{}{}, excluded{err}
		case b.isOutcome(err):
			return struct{}{}, outcome{err}
		}
		b.failure.Store(&err)
		return struct{}{}, err
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, gobreaker.ErrOpenState), errors.Is(err, gobreaker.ErrTooManyRequests):
		b.rejected.Inc()
		return &OpenError{Node: b.node, Until: b.probesAt(), err: err}
	}
	var ex excluded
	if errors.As(err, &ex) {
		return ex.err
	}
	var oc outcome
	if errors.As(err, &oc) {
		return oc.err
	}
	return err
}

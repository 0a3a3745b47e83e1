// Package relay delivers the ledger's outbox to sinks (signed webhooks,
// Redis Streams): at least once, in seq order per partition (so per SKU),
// with retries under exponential backoff and dead letters after the last.
//
// Any number of replicas run it. A relay delivers a partition only while
// it holds the partition's lease in the ledger, one event at a time: the
// next waits for the previous one's delivery or dead letter, and every
// step forward is fenced by the lease, so no partition is delivered by two
// relays at once and none moves under a relay that lost it. An attempt
// never outlasts the lease it started under.
package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockgate/stockgate/internal/opt"
	"github.com/stockgate/stockgate/ledger"
)

// Sink is where a relay delivers events.
type Sink interface {
	// Name names the sink in the ledger (its cursors and dead letters) and
	// in metrics: [A-Za-z0-9_-]{1,64}, stable across restarts.
	Name() string
	// Deliver delivers e; an error is a failed attempt, retried.
	Deliver(ctx context.Context, e ledger.Event) error
}

// Ledger is what a relay needs of the ledger (*ledger.Ledger).
type Ledger interface {
	ClaimPartitions(ctx context.Context, sink, owner string, ttl time.Duration) (ledger.Claim, error)
	ReleasePartitions(ctx context.Context, sink, owner string, partitions ...int) error
	PartitionState(ctx context.Context, sink string, partition int) (ledger.RelayPartition, error)
	PartitionEvents(ctx context.Context, partition int, after, upTo int64, limit int) ([]ledger.Event, error)
	PendingPartitions(ctx context.Context, sink string, upTo int64) ([]int, error)
	SettledSeq(ctx context.Context) (int64, error)
	Advance(ctx context.Context, sink string, partition int, owner string, seq int64) error
	RecordFailure(ctx context.Context, sink string, partition int, owner string, attempts int, next time.Time, why string) error
	Bury(ctx context.Context, sink, owner string, e ledger.Event, attempts int, why string) error
	DeadLetters(ctx context.Context, sink string, after int64, limit int) ([]ledger.DeadLetter, error)
	DeadLetter(ctx context.Context, sink string, seq int64) (ledger.DeadLetter, error)
	ForgetDeadLetter(ctx context.Context, sink string, seq int64) error
	RelayStats(ctx context.Context, sink string) (ledger.RelayStats, error)
}

// Options configures a Relay. A zero setting takes its default
// (DefaultOptions).
type Options struct {
	// Owner names this relay in the leases; unique per replica. Default:
	// the host name and a random suffix.
	Owner string
	// Sinks are where events go; names unique. Required (at least one).
	Sinks []Sink
	// LeaseTTL is how long a partition's lease lasts unrenewed: how soon
	// another relay takes over the partitions of one that died. Renewed
	// every LeaseTTL/3. Default 15s.
	LeaseTTL time.Duration
	// Poll is how often idle partitions are looked at. Default 250ms.
	Poll time.Duration
	// BackoffBase and BackoffMax bound the wait after a failed attempt:
	// BackoffBase doubled per attempt, at most BackoffMax, jittered
	// between half and all of it. Defaults 500ms and 1m.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// MaxAttempts is how many failed attempts dead-letter an event.
	// Default 12.
	MaxAttempts int
	// AttemptTimeout caps one attempt (and at most a third of the lease
	// left). Default 10s.
	AttemptTimeout time.Duration
	// Batch is how many events one read of a partition takes. Default 100.
	Batch int
	// Parallel is how many deliveries run at once per sink (partitions
	// in parallel, each one event at a time). Default 16.
	Parallel int
	// StatsEvery is how often the backlog and lag gauges are read.
	// Default 5s.
	StatsEvery time.Duration
	Metrics    prometheus.Registerer // optional
	Logger     *slog.Logger          // default slog.Default()
	// KeepLeases leaves the leases to lapse when Run ends instead of
	// releasing them: what a crash does (tests).
	KeepLeases bool
}

// DefaultOptions are the settings a zero field takes.
func DefaultOptions() Options {
	return Options{LeaseTTL: 15 * time.Second, Poll: 250 * time.Millisecond, BackoffBase: 500 * time.Millisecond,
		BackoffMax: time.Minute, MaxAttempts: 12, AttemptTimeout: 10 * time.Second, Batch: 100, Parallel: 16,
		StatsEvery: 5 * time.Second}
}

var sinkName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Validate reports the first field that cannot work (an *opt.Error).
func (o Options) Validate() error {
	seen := map[string]bool{}
	for _, s := range o.Sinks {
		if s == nil || !sinkName.MatchString(s.Name()) || seen[s.Name()] {
			return opt.Bad("Sinks", "need unique names matching [A-Za-z0-9_-]{1,64}")
		}
		seen[s.Name()] = true
	}
	switch {
	case len(o.Sinks) == 0:
		return opt.Bad("Sinks", "needs at least one sink")
	case o.LeaseTTL < 0 || (o.LeaseTTL > 0 && o.LeaseTTL < 300*time.Millisecond):
		return opt.Bad("LeaseTTL", "must be at least 300ms")
	case o.Poll < 0:
		return opt.Bad("Poll", "must be positive")
	case o.BackoffBase < 0 || o.BackoffMax < 0 || (o.BackoffMax > 0 && o.BackoffMax < o.BackoffBase):
		return opt.Bad("BackoffMax", "must be positive and at least BackoffBase")
	case o.MaxAttempts < 0:
		return opt.Bad("MaxAttempts", "must be at least 1")
	case o.AttemptTimeout < 0 || o.Batch < 0 || o.Parallel < 0 || o.StatsEvery < 0:
		return opt.Bad("AttemptTimeout", "timeouts and sizes must be positive")
	}
	return nil
}

// Relay delivers the outbox to its sinks.
type Relay struct {
	ledger  Ledger
	o       Options
	sinks   map[string]Sink
	log     *slog.Logger
	sem     map[string]chan struct{} // per sink: its deliveries at once
	metrics metrics
}

type metrics struct {
	delivered, failed, dead *prometheus.CounterVec
	backlog, lag, leases    *prometheus.GaugeVec
}

// New returns a relay over l; Run starts it.
func New(l Ledger, o Options) (*Relay, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	d := DefaultOptions()
	for _, f := range []struct{ v, d *time.Duration }{{&o.LeaseTTL, &d.LeaseTTL}, {&o.Poll, &d.Poll},
		{&o.BackoffBase, &d.BackoffBase}, {&o.BackoffMax, &d.BackoffMax}, {&o.AttemptTimeout, &d.AttemptTimeout}, {&o.StatsEvery, &d.StatsEvery}} {
		opt.Fill(f.v, *f.d)
	}
	o.BackoffMax = max(o.BackoffMax, o.BackoffBase)
	opt.Fill(&o.MaxAttempts, d.MaxAttempts)
	opt.Fill(&o.Batch, d.Batch)
	opt.Fill(&o.Parallel, d.Parallel)
	if o.Owner == "" {
		host, _ := os.Hostname()
		o.Owner = fmt.Sprintf("%s-%08x", cmp.Or(host, "relay"), rand.Uint32())
	}
	r := &Relay{ledger: l, o: o, sinks: map[string]Sink{}, log: cmp.Or(o.Logger, slog.Default()), sem: map[string]chan struct{}{}}
	for _, s := range o.Sinks {
		r.sinks[s.Name()] = s
		// Each sink its own slots: a receiver that hangs holds up its
		// own deliveries only.
		r.sem[s.Name()] = make(chan struct{}, o.Parallel)
	}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"sink"})
	}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"sink"})
	}
	r.metrics = metrics{
		delivered: counter("stockgate_relay_delivered_total", "Events a sink accepted (redeliveries included)."),
		failed:    counter("stockgate_relay_failed_attempts_total", "Delivery attempts that failed (retried, or dead-lettered after the last)."),
		dead:      counter("stockgate_relay_dead_lettered_total", "Events dead-lettered after their last attempt."),
		backlog:   gauge("stockgate_relay_backlog", "Events not yet delivered to a sink (fleet-wide, as this replica last read it)."),
		lag:       gauge("stockgate_relay_lag_seconds", "Age of the oldest event not yet delivered to a sink (0 with none)."),
		leases:    gauge("stockgate_relay_leases", "Partitions of a sink this replica holds."),
	}
	if o.Metrics != nil {
		for _, c := range []prometheus.Collector{r.metrics.delivered, r.metrics.failed, r.metrics.dead, r.metrics.backlog,
			r.metrics.lag, r.metrics.leases} {
			if err := o.Metrics.Register(c); err != nil {
				return nil, fmt.Errorf("relay: metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Owner is the name this relay holds leases under.
func (r *Relay) Owner() string { return r.o.Owner }

// Run delivers until ctx ends, then stops every goroutine it started and
// (unless KeepLeases) gives its leases back.
func (r *Relay) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, s := range r.o.Sinks {
		wg.Go(func() { r.runSink(ctx, s) })
	}
	wg.Go(func() { r.runStats(ctx) })
	wg.Wait()
}

// runStats sets the backlog and lag gauges.
func (r *Relay) runStats(ctx context.Context) {
	t := time.NewTicker(r.o.StatsEvery)
	defer t.Stop()
	for {
		for _, s := range r.o.Sinks {
			st, err := r.ledger.RelayStats(ctx, s.Name())
			if err != nil {
				if ctx.Err() == nil {
					r.log.WarnContext(ctx, "relay stats", "sink", s.Name(), "err", err)
				}
				continue
			}
			r.metrics.backlog.WithLabelValues(s.Name()).Set(float64(st.Backlog))
			lag := 0.0
			if !st.Oldest.IsZero() {
				lag = max(time.Since(st.Oldest).Seconds(), 0)
			}
			r.metrics.lag.WithLabelValues(s.Name()).Set(lag)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// worker delivers one partition of one sink while its lease holds.
type worker struct {
	partition int
	until     atomic.Int64 // the lease's end, Unix ns
	release   atomic.Bool  // give the partition back when idle
	wake      chan struct{}
	stop      context.CancelFunc
	done      chan struct{}
}

func (w *worker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// runSink keeps the sink's leases and a worker per partition held.
func (r *Relay) runSink(ctx context.Context, s Sink) {
	name := s.Name()
	workers := map[int]*worker{}
	var upTo atomic.Int64
	var wg sync.WaitGroup
	defer func() {
		for _, w := range workers {
			w.stop()
		}
		wg.Wait()
		r.metrics.leases.WithLabelValues(name).Set(0)
		if !r.o.KeepLeases {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := r.ledger.ReleasePartitions(ctx, name, r.o.Owner); err != nil {
				r.log.WarnContext(ctx, "relay release", "sink", name, "err", err)
			}
		}
	}()
	t := time.NewTicker(r.o.Poll)
	defer t.Stop()
	var claimed time.Time
	for {
		// Workers that stopped (lease lost, partition given back) leave.
		for p, w := range workers {
			select {
			case <-w.done:
				delete(workers, p)
			default:
			}
		}
		if time.Since(claimed) >= r.o.LeaseTTL/3 {
			// The lease runs out by the ledger's clock: this replica counts
			// it from before it asked, so it never thinks it has more.
			asked := time.Now()
			c, err := r.ledger.ClaimPartitions(ctx, name, r.o.Owner, r.o.LeaseTTL)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				r.log.WarnContext(ctx, "relay claim", "sink", name, "err", err)
			} else {
				claimed = time.Now()
				held := map[int]bool{}
				for _, p := range c.Held {
					held[p] = true
					w := workers[p]
					if w == nil {
						wctx, stop := context.WithCancel(ctx)
						w = &worker{partition: p, wake: make(chan struct{}, 1), stop: stop, done: make(chan struct{})}
						workers[p] = w
						wg.Go(func() {
							defer close(w.done)
							r.deliverPartition(wctx, s, w, &upTo)
						})
					}
					w.until.Store(asked.Add(r.o.LeaseTTL).UnixNano())
				}
				for p, w := range workers {
					if !held[p] { // lapsed and taken: stop at once
						w.stop()
						delete(workers, p)
					}
				}
				// Over the fair share: give back the highest partitions.
				excess := len(c.Held) - c.Share
				for i := len(c.Held) - 1; i >= 0 && excess > 0; i-- {
					if w := workers[c.Held[i]]; w != nil {
						w.release.Store(true)
						w.poke()
						excess--
					}
				}
				r.metrics.leases.WithLabelValues(name).Set(float64(len(c.Held)))
			}
		}
		if seq, err := r.ledger.SettledSeq(ctx); err == nil {
			upTo.Store(seq)
			if pending, err := r.ledger.PendingPartitions(ctx, name, seq); err == nil {
				for _, p := range pending {
					if w := workers[p]; w != nil {
						w.poke()
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// deliverPartition delivers w's partition, one event at a time, until its
// context ends, its lease is lost, or it is to be given back.
func (r *Relay) deliverPartition(ctx context.Context, s Sink, w *worker, upTo *atomic.Int64) {
	name, p := s.Name(), w.partition
	st, err := r.ledger.PartitionState(ctx, name, p)
	if err != nil {
		if ctx.Err() == nil {
			r.log.WarnContext(ctx, "relay partition state", "sink", name, "partition", p, "err", err)
		}
		return
	}
	cursor, attempts, next := st.Delivered, st.Attempts, st.NextAt
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		}
		for {
			if w.release.Load() {
				r.giveBack(ctx, name, p)
				return
			}
			events, err := r.ledger.PartitionEvents(ctx, p, cursor, upTo.Load(), r.o.Batch)
			if err != nil || len(events) == 0 {
				if err != nil && ctx.Err() == nil {
					r.log.WarnContext(ctx, "relay read", "sink", name, "partition", p, "err", err)
				}
				break
			}
			for _, e := range events {
				for done := false; !done; {
					if wait := time.Until(next); wait > 0 {
						if !sleep(ctx, wait) {
							return
						}
					}
					if short, lapsed := r.leaseShort(ctx, w); lapsed {
						return // the claim loop starts again if it gets it back
					} else if short {
						continue
					}
					derr := r.attempt(ctx, s, e, w)
					if ctx.Err() != nil {
						return // stopping: the attempt was cut short, not failed
					}
					if errors.Is(derr, errLeaseShort) {
						continue // waited for a slot past the renewal: check the lease again
					}
					var lerr error
					done, attempts, next, lerr = r.record(ctx, name, p, e, derr, attempts)
					if lerr != nil {
						if !errors.Is(lerr, ledger.ErrLeaseLost) && ctx.Err() == nil {
							r.log.WarnContext(ctx, "relay progress", "sink", name, "partition", p, "err", lerr)
						}
						return // lost, or unknown: the next holder starts from the ledger
					}
					if done {
						cursor = e.Seq
					}
				}
			}
		}
	}
}

// giveBack releases partition p of sink name, as asked: within 5 s even
// when ctx is ending (the replica stopping), so another takes it at once.
func (r *Relay) giveBack(ctx context.Context, name string, p int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := r.ledger.ReleasePartitions(ctx, name, r.o.Owner, p); err != nil {
		r.log.WarnContext(ctx, "relay release", "sink", name, "partition", p, "err", err)
	}
}

// leaseShort waits a poll when w's lease has less than a third of its TTL
// left (not renewed lately), rather than start an attempt that could
// outlive it: short says it waited, lapsed that the lease is gone (or
// ctx ended) and the partition must be left.
func (r *Relay) leaseShort(ctx context.Context, w *worker) (short, lapsed bool) {
	if time.Until(time.Unix(0, w.until.Load())) >= r.o.LeaseTTL/3 {
		return false, false
	}
	if !sleep(ctx, r.o.Poll) {
		return true, true
	}
	return true, time.Until(time.Unix(0, w.until.Load())) <= 0
}

// record records in the ledger how delivering e went (derr), after
// attempts failed before it: delivered or buried, e is done and the next
// event starts afresh (no attempts, no wait); failed, it is tried again
// at next. err is the ledger's (a lease lost, or unknown).
func (r *Relay) record(ctx context.Context, name string, p int, e ledger.Event, derr error, attempts int) (done bool, tried int, next time.Time, err error) {
	switch {
	case derr == nil:
		r.metrics.delivered.WithLabelValues(name).Inc()
		return true, 0, time.Time{}, r.ledger.Advance(ctx, name, p, r.o.Owner, e.Seq)
	case attempts+1 >= r.o.MaxAttempts:
		r.metrics.failed.WithLabelValues(name).Inc()
		if err := r.ledger.Bury(ctx, name, r.o.Owner, e, attempts+1, derr.Error()); err != nil {
			return true, 0, time.Time{}, err
		}
		r.metrics.dead.WithLabelValues(name).Inc()
		r.log.WarnContext(ctx, "relay dead letter", "sink", name, "seq", e.Seq, "event", e.ID, "attempts", attempts+1, "err", derr)
		return true, 0, time.Time{}, nil
	}
	r.metrics.failed.WithLabelValues(name).Inc()
	attempts++
	next = time.Now().Add(r.backoff(attempts))
	return false, attempts, next, r.ledger.RecordFailure(ctx, name, p, r.o.Owner, attempts, next, derr.Error())
}

// errLeaseShort: an attempt got its slot with too little of w's lease
// left to start.
var errLeaseShort = errors.New("relay: lease too short to start an attempt")

// attempt delivers e once, under the bound on the sink's deliveries at
// once, within a third of what is left of w's lease when it gets its slot
// (the wait for a slot may have eaten the rest): an attempt never
// outlasts the lease it started under.
func (r *Relay) attempt(ctx context.Context, s Sink, e ledger.Event, w *worker) error {
	sem := r.sem[s.Name()]
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-sem }()
	left := time.Until(time.Unix(0, w.until.Load()))
	if left < r.o.LeaseTTL/3 {
		return errLeaseShort
	}
	ctx, cancel := context.WithTimeout(ctx, min(r.o.AttemptTimeout, left/3))
	defer cancel()
	return s.Deliver(ctx, e)
}

// backoff is the wait after the attempts-th failure: BackoffBase doubled
// per attempt up to BackoffMax, jittered to between half and all of it
// so that partitions failing together do not retry together.
func (r *Relay) backoff(attempts int) time.Duration {
	d := r.o.BackoffBase
	for i := 1; i < attempts && d < r.o.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, r.o.BackoffMax)
	return d/2 + rand.N(d/2+1)
}

// sleep waits d or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

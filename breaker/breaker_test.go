package breaker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/internal/wait"
)

var (
	errRedis   = errors.New("redis: i/o timeout")
	errSoldOut = errors.New("sold out")
)

func newBreaker(t *testing.T, reg prometheus.Registerer) *breaker.Breaker {
	t.Helper()
	b, err := breaker.New(breaker.Options{
		ConsecutiveFailures: 3, OpenFor: 50 * time.Millisecond, Probes: 2,
		IsOutcome:  func(err error) bool { return errors.Is(err, errSoldOut) },
		Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func fails(err error) func(context.Context) error {
	return func(context.Context) error { return err }
}

func TestTripsOnFailuresOnly(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := newBreaker(t, reg)
	ctx := context.Background()
	for range 100 {
		if err := b.Do(ctx, fails(errSoldOut)); !errors.Is(err, errSoldOut) {
			t.Fatalf("Do = %v, want the outcome back", err)
		}
	}
	if b.State() != breaker.Closed {
		t.Fatalf("100 outcomes left the breaker %v", b.State())
	}
	for range 3 {
		if err := b.Do(ctx, fails(errRedis)); !errors.Is(err, errRedis) {
			t.Fatalf("Do = %v, want the failure back", err)
		}
	}
	ran := false
	err := b.Do(ctx, func(context.Context) error { ran = true; return nil })
	if !errors.Is(err, breaker.ErrOpen) || ran || b.State() != breaker.Open {
		t.Fatalf("after 3 failures: Do = %v, ran %v, state %v; want ErrOpen, not run, open", err, ran, b.State())
	}
	expect(t, reg, `
# HELP stockgate_breaker_rejected_total Calls the circuit breaker refused without running them.
# TYPE stockgate_breaker_rejected_total counter
stockgate_breaker_rejected_total{breaker="redis"} 1
# HELP stockgate_breaker_transitions_total Circuit breaker state changes, by the state left and the state entered.
# TYPE stockgate_breaker_transitions_total counter
stockgate_breaker_transitions_total{breaker="redis",from="closed",to="open"} 1
stockgate_breaker_transitions_total{breaker="redis",from="half-open",to="closed"} 0
stockgate_breaker_transitions_total{breaker="redis",from="half-open",to="open"} 0
stockgate_breaker_transitions_total{breaker="redis",from="open",to="half-open"} 0
`, "stockgate_breaker_rejected_total", "stockgate_breaker_transitions_total")
	// Recovery: half-open after OpenFor, closed after Probes successes.
	time.Sleep(60 * time.Millisecond) // time under test: OpenFor (50 ms) lapses
	for range 2 {
		if err := b.Do(ctx, fails(nil)); err != nil {
			t.Fatal(err)
		}
	}
	if b.State() != breaker.Closed {
		t.Errorf("after 2 successful probes the breaker is %v", b.State())
	}
	expect(t, reg, `
# HELP stockgate_breaker_state Circuit breaker state: 0 closed, 1 half-open, 2 open.
# TYPE stockgate_breaker_state gauge
stockgate_breaker_state{breaker="redis"} 0
`, "stockgate_breaker_state")
}

// Cancelled callers count neither way: 1,000 of them cannot trip a closed
// breaker, and in half-open they do not use up the probes.
func TestCancellationsNeitherTripNorStick(t *testing.T) {
	b := newBreaker(t, nil)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for range 1000 {
		_ = b.Do(cancelled, func(ctx context.Context) error { return ctx.Err() })
	}
	if b.State() != breaker.Closed {
		t.Fatalf("1000 cancellations left the breaker %v", b.State())
	}
	for range 3 {
		_ = b.Do(context.Background(), fails(errRedis))
	}
	time.Sleep(60 * time.Millisecond) // time under test: OpenFor (50 ms) lapses
	// Half-open with 2 probes: many cancelled probes in a row.
	for range 100 {
		err := b.Do(cancelled, func(ctx context.Context) error { return ctx.Err() })
		if errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("a cancelled probe was refused: the probes are stuck (%v)", err)
		}
	}
	if b.State() != breaker.HalfOpen {
		t.Fatalf("after cancelled probes the breaker is %v, want half-open", b.State())
	}
	for range 2 {
		if err := b.Do(context.Background(), fails(nil)); err != nil {
			t.Fatalf("probe after cancellations = %v", err)
		}
	}
	if b.State() != breaker.Closed {
		t.Errorf("breaker %v after two good probes, want closed", b.State())
	}
}

// OnChange says which failure opened the breaker, both from closed and
// from half-open, and never blames a cancelled caller or an outcome.
func TestOnChangeGivesTheCause(t *testing.T) {
	type change struct {
		from, to breaker.State
		cause    error
	}
	var changes []change
	b, err := breaker.New(breaker.Options{
		ConsecutiveFailures: 2, OpenFor: 20 * time.Millisecond, Probes: 1,
		IsOutcome: func(err error) bool { return errors.Is(err, errSoldOut) },
		OnChange:  func(from, to breaker.State, cause error) { changes = append(changes, change{from, to, cause}) },
	})
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	errTimeout := errors.New("redis: deadline")
	_ = b.Do(context.Background(), fails(errRedis))
	_ = b.Do(context.Background(), fails(errSoldOut))
	_ = b.Do(cancelled, func(ctx context.Context) error { return ctx.Err() })
	_ = b.Do(context.Background(), fails(errRedis))
	_ = b.Do(context.Background(), fails(errTimeout)) // closed → open
	wait.For(t, 10*time.Second, "half-open once OpenFor (20 ms) lapsed", func() bool { return b.State() == breaker.HalfOpen })
	_ = b.Do(cancelled, func(ctx context.Context) error { return ctx.Err() })
	_ = b.Do(context.Background(), fails(errRedis)) // half-open → open
	wait.For(t, 10*time.Second, "half-open once OpenFor (20 ms) lapsed", func() bool { return b.State() == breaker.HalfOpen })
	_ = b.Do(context.Background(), fails(nil)) // half-open → closed
	want := []change{
		{breaker.Closed, breaker.Open, errTimeout},
		{breaker.Open, breaker.HalfOpen, nil},
		{breaker.HalfOpen, breaker.Open, errRedis},
		{breaker.Open, breaker.HalfOpen, nil},
		{breaker.HalfOpen, breaker.Closed, nil},
	}
	if len(changes) != len(want) {
		t.Fatalf("changes %v, want %v", changes, want)
	}
	for i, c := range changes {
		if c.from != want[i].from || c.to != want[i].to || c.cause != want[i].cause {
			t.Errorf("change %d = %v → %v (%v), want %v → %v (%v)", i, c.from, c.to, c.cause, want[i].from, want[i].to, want[i].cause)
		}
	}
}

func TestNewValidates(t *testing.T) {
	for _, o := range []breaker.Options{{FailureRatio: 2}, {Window: time.Millisecond}, {OpenFor: time.Microsecond}} {
		if _, err := breaker.New(o); err == nil {
			t.Errorf("New(%+v) succeeded", o)
		}
	}
}

func expect(t *testing.T, reg *prometheus.Registry, text string, names ...string) {
	t.Helper()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(text), names...); err != nil {
		t.Error(err)
	}
}

// A Set opens only the failing node's breaker; the others serve, and its
// refusal says when the node is probed again.
func TestSetOpensOnlyTheFailingNode(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := breaker.NewSet(breaker.Options{ConsecutiveFailures: 3, OpenFor: time.Minute, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	var opened []string
	s.Listen(func(node string, _, to breaker.State, _ error) {
		if to == breaker.Open {
			opened = append(opened, node)
		}
	})
	ctx := context.Background()
	for range 3 {
		_ = s.Do(ctx, "a:1", fails(errRedis))
		if err := s.Do(ctx, "b:1", fails(nil)); err != nil {
			t.Fatalf("a healthy node's call = %v", err)
		}
	}
	err = s.Do(ctx, "a:1", fails(nil))
	if !errors.Is(err, breaker.ErrOpen) {
		t.Fatalf("the failed node's call = %v, want ErrOpen", err)
	}
	if d, ok := breaker.RetryIn(err); !ok || d < 50*time.Second || d > time.Minute {
		t.Errorf("RetryIn = %v %v, want about a minute", d, ok)
	}
	if err := s.Do(ctx, "b:1", fails(nil)); err != nil {
		t.Errorf("the healthy node's call after the other opened = %v", err)
	}
	if s.State() != breaker.Open || s.States()["b:1"] != breaker.Closed || len(opened) != 1 || opened[0] != "a:1" {
		t.Errorf("state %v, states %v, opened %v; want a:1 alone open", s.State(), s.States(), opened)
	}
	if got := testutil.ToFloat64(mustGauge(t, reg, "a:1")); got != 2 {
		t.Errorf("a:1's state gauge = %v, want 2 (open)", got)
	}
}

// mustGauge is node's stockgate_breaker_state series in reg.
func mustGauge(t *testing.T, reg *prometheus.Registry, node string) prometheus.Collector {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "stockgate_breaker_state" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "node" && l.GetValue() == node {
					g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
					g.Set(m.GetGauge().GetValue())
					return g
				}
			}
		}
	}
	t.Fatalf("no stockgate_breaker_state{node=%q}", node)
	return nil
}

// A node no call names any more (a master replaced in a failover) stops
// counting in the Set's State, and its gauge reads closed, though its own
// breaker stays where it was.
func TestSetForgetsANodeNoCallNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := breaker.NewSet(breaker.Options{ConsecutiveFailures: 1, OpenFor: time.Hour, Window: time.Second, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Do(context.Background(), "dead:1", fails(errRedis))
	if s.State() != breaker.Open {
		t.Fatalf("state %v after the failure, want open", s.State())
	}
	wait.For(t, 10*time.Second, "closed state after the last call (the node is not in use)", func() bool { return s.State() == breaker.Closed })
	if got := testutil.ToFloat64(mustGauge(t, reg, "dead:1")); got != 0 || s.States()["dead:1"] != breaker.Open {
		t.Errorf("gauge %v, own state %v; want 0 and still open", got, s.States()["dead:1"])
	}
}

// With Deadlines, a call out of its own deadline is a failure, and one
// cut short by its caller's deadline (ErrCallerOutOfTime, a request whose
// work timed out waiting on its ledger) is not: a cut ledger link once
// opened the Redis node breakers under load (TestFaultLedgerLinkBlackHole).
func TestCallersDeadlineIsNoFailure(t *testing.T) {
	b, err := breaker.New(breaker.Options{ConsecutiveFailures: 3, OpenFor: time.Minute, Deadlines: true})
	if err != nil {
		t.Fatal(err)
	}
	expired := func(cause error) context.Context {
		ctx, cancel := context.WithDeadlineCause(context.Background(), time.Now().Add(-time.Second), cause)
		t.Cleanup(cancel)
		return ctx
	}
	out := func(ctx context.Context) error { return ctx.Err() }
	// The request's deadline, with the call's own beneath it, as sale's
	// Redis calls are made.
	for range 10 {
		call, cancel := context.WithTimeout(expired(breaker.ErrCallerOutOfTime), time.Second)
		_ = b.Do(call, out)
		cancel()
	}
	if b.State() != breaker.Closed {
		t.Fatalf("10 calls past their caller's deadline left the breaker %v", b.State())
	}
	for range 3 {
		_ = b.Do(expired(nil), out)
	}
	if b.State() != breaker.Open {
		t.Errorf("3 calls past their own deadline left the breaker %v, want open", b.State())
	}
}

package systest

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Counter reads a counter's (or a gauge's) value from a registry, summed
// over the series whose labels include labels.
func Counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	var sum float64
	for _, m := range series(t, reg, name, labels) {
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		}
	}
	return sum
}

// series are the series of a metric whose labels include labels.
func series(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) []*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []*dto.Metric
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			out = append(out, m)
		}
	}
	return out
}

// WaitCounter waits until a metric of the replica reaches at least want,
// or fails.
func WaitCounter(t *testing.T, e *Env, name string, labels map[string]string, want float64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for Counter(t, e.Registry, name, labels) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v after %v, want >= %v", name, labels, Counter(t, e.Registry, name, labels), within, want)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

// Hist is a histogram's cumulative buckets at one moment.
type Hist struct {
	Count  uint64
	Sum    float64
	Bounds []float64
	Cum    []uint64
}

// Histogram reads a histogram from a registry, summed over the series
// whose labels include labels (the zero Hist if none has).
func Histogram(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) Hist {
	t.Helper()
	var s Hist
	for _, m := range series(t, reg, name, labels) {
		h := m.GetHistogram()
		if h == nil {
			continue
		}
		s.Count += h.GetSampleCount()
		s.Sum += h.GetSampleSum()
		for i, b := range h.GetBucket() {
			if i == len(s.Bounds) {
				s.Bounds = append(s.Bounds, b.GetUpperBound())
				s.Cum = append(s.Cum, 0)
			}
			s.Cum[i] += b.GetCumulativeCount()
		}
	}
	return s
}

// Past is how many observations exceeded bound, which must be one of the
// histogram's bucket bounds (ok false otherwise).
func (s Hist) Past(bound float64) (n uint64, ok bool) {
	for i, b := range s.Bounds {
		if b == bound {
			return s.Count - s.Cum[i], true
		}
	}
	return 0, false
}

// Mean is the mean of the observations, 0 without any.
func (s Hist) Mean() float64 {
	if s.Count == 0 {
		return 0
	}
	return s.Sum / float64(s.Count)
}

// Quantile is the upper bound of the bucket holding the q-quantile.
func (s Hist) Quantile(q float64) float64 {
	want := uint64(q * float64(s.Count))
	for i, c := range s.Cum {
		if c >= want {
			return s.Bounds[i]
		}
	}
	return -1
}

// RedisFaulted reports whether the replica's gate and ledger may differ
// by design until a consistency check repairs the gate: a node's breaker
// opened or a cart's lock could not be taken (takes went around the
// gate), or a refused take's give-back failed its retries (the units
// stay taken in Redis). On a busy machine a Redis call can time out with
// no fault injected.
func (e *Env) RedisFaulted(t *testing.T) bool {
	t.Helper()
	return Counter(t, e.Registry, "stockgate_breaker_transitions_total", map[string]string{"to": "open"}) > 0 ||
		Counter(t, e.Registry, "stockgate_purchases_total", map[string]string{"path": "ledger"}) > 0 ||
		Counter(t, e.Registry, "stockgate_gate_restore_failures_total", nil) > 0
}

package cache

import (
	"time"

	"github.com/maypok86/otter/v2/stats"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics turns otter's statistics into Prometheus counters, labelled by
// cache name (a handful of fixed names, never a key).
type Metrics struct {
	hits, misses, evictions, loadFailures *prometheus.CounterVec
	loads                                 *prometheus.HistogramVec
}

// NewMetrics registers the cache counters on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockgate_cache_hits_total", Help: "Local cache lookups answered from memory, by cache.",
		}, []string{"cache"}),
		misses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockgate_cache_misses_total", Help: "Local cache lookups not in memory, by cache.",
		}, []string{"cache"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockgate_cache_evictions_total", Help: "Entries evicted for space, by cache.",
		}, []string{"cache"}),
		loadFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockgate_cache_load_failures_total", Help: "Loads that failed, by cache.",
		}, []string{"cache"}),
		loads: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "stockgate_cache_load_duration_seconds", Help: "Time of successful loads, by cache.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 8),
		}, []string{"cache"}),
	}
	for _, c := range []prometheus.Collector{m.hits, m.misses, m.evictions, m.loadFailures, m.loads} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Recorder is otter's stats.Recorder for the cache called name. A nil
// Metrics records nothing.
func (m *Metrics) Recorder(name string) stats.Recorder {
	if m == nil {
		return nil
	}
	return recorder{
		hits: m.hits.WithLabelValues(name), misses: m.misses.WithLabelValues(name),
		evictions: m.evictions.WithLabelValues(name), loadFailures: m.loadFailures.WithLabelValues(name),
		loads: m.loads.WithLabelValues(name),
	}
}

type recorder struct {
	hits, misses, evictions, loadFailures prometheus.Counter
	loads                                 prometheus.Observer
}

func (r recorder) RecordHits(n int)                  { r.hits.Add(float64(n)) }
func (r recorder) RecordMisses(n int)                { r.misses.Add(float64(n)) }
func (r recorder) RecordEviction(uint32)             { r.evictions.Inc() }
func (r recorder) RecordLoadSuccess(d time.Duration) { r.loads.Observe(d.Seconds()) }
func (r recorder) RecordLoadFailure(time.Duration)   { r.loadFailures.Inc() }

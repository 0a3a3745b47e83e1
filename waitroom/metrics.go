package waitroom

import "github.com/prometheus/client_golang/prometheus"

// metrics are the waiting rooms' (the gauges over the programs this
// replica paces).
type metrics struct {
	joins      prometheus.Counter
	powRefused *prometheus.CounterVec
	admitted   prometheus.Counter
	unused     prometheus.Gauge
	waiting    prometheus.Gauge
	left       prometheus.Gauge
	abandoned  prometheus.Gauge
	wait       prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		joins: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockgate_queue_joins_total",
			Help: "Buyers this replica put in a waiting room's line (joining again is not counted).",
		}),
		powRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockgate_queue_pow_refused_total",
			Help: "Joins this replica refused for their proof of work, by reason: required (none sent) or invalid (wrong, expired, another buyer's); each got a new puzzle.",
		}, []string{"reason"}),
		admitted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockgate_queue_admitted_total",
			Help: "Buyers admitted by this replica's pacer.",
		}),
		unused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockgate_queue_admitted_unused",
			Help: "Admitted buyers within their window who have not bought, over the programs this gateway paces.",
		}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockgate_queue_waiting",
			Help: "Buyers in line not admitted yet, over the programs this gateway paces (the length of the line).",
		}),
		left: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockgate_queue_stock_left",
			Help: "Tickets left to sell, over the programs with a line that this gateway paces.",
		}),
		abandoned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockgate_queue_abandoned",
			Help: "Admitted buyers whose window passed without a purchase, over the programs this gateway paces.",
		}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "stockgate_queue_wait_seconds",
			Help: "How long buyers who bought waited in line: from joining (or the opening, for a buyer who joined before it) to admission, observed when the admission is first spent.",
			// From a second to two hours.
			Buckets: []float64{1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200},
		}),
	}
	for _, c := range []prometheus.Collector{m.joins, m.powRefused, m.admitted, m.unused, m.waiting, m.left, m.abandoned, m.wait} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

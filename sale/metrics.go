package sale

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are this replica's own series. No label takes a user's, a SKU's
// or a key's value: their number stays fixed however many SKUs exist.
type metrics struct {
	purchases      *prometheus.CounterVec // by path and result
	ledgerRefusals prometheus.Counter     // Redis admitted, the ledger refused
	restoreFailed  prometheus.Counter     // give-backs Redis never took
	reseeds        *prometheus.CounterVec // by reason
	driftUnits     prometheus.Gauge
	driftSKUs      prometheus.Gauge
	remaining      prometheus.Gauge
	driftRepairs   prometheus.Counter
	expired        prometheus.Counter
	latePayments   *prometheus.CounterVec
	probes         prometheus.Histogram
	seatDrift      prometheus.Gauge
	seatRepairs    prometheus.Counter
	poolRefusals   *prometheus.CounterVec // by reason
	budgetRefusals *prometheus.CounterVec // by identity: buyer, device
	listings       *prometheus.CounterVec // resale units, by what happened: listed, sold, withdrawn
	afterSale      *prometheus.CounterVec // units moved after the first click: transferred, released
	extended       prometheus.Counter
	poolMoved      prometheus.Counter
	waitJoins      prometheus.Counter
	ledgerWait     *prometheus.HistogramVec // by work
	ledgerShed     *prometheus.CounterVec   // by work and where (laneMetrics.refused)
	primaryWaits   prometheus.Counter       // takes that waited for a primary (awaitPrimary)
	parked         prometheus.Gauge         // takes waiting for a primary out of the in-flight bound (flight.park)
}

// batchMetrics is what a batcher of one kind of work reports.
func (m *metrics) batchMetrics(work string) laneMetrics {
	return laneMetrics{name: work, wait: m.ledgerWait.WithLabelValues(work), shed: m.ledgerShed.MustCurryWith(prometheus.Labels{"work": work})}
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		purchases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockgate_purchases_total",
			Help: "Purchase answers by path (gate: through Redis; ledger: breaker fallback) and result.",
		}, []string{"path", "result"}),
		primaryWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockgate_ledger_primary_waits_total",
			Help: "Waits of a take before sending its write again, having found no PostgreSQL server that takes writes (a failover under way).",
		}),
		parked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockgate_ledger_takes_parked",
			Help: "Takes waiting for a PostgreSQL server that takes writes (a failover under way), their places in flight given to new work.",
		}),
		ledgerRefusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockgate_gate_ledger_refusals_total",
			Help: "Purchases Redis admitted and the ledger refused (Redis was ahead of the truth); their stock went back.",
		}),
		restoreFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockgate_gate_restore_failures_total",
			Help: "Refused takes whose units Redis did not take back after their retries: they stay taken there until the drift check or a re-seed returns them.",
		}),
		reseeds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockgate_reseeds_total",
			Help: "Fenced rebuilds of a SKU's Redis shards from the ledger, by reason.",
		}, []string{"reason"}),
		driftUnits: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockgate_drift_units",
			Help: "Sum over SKUs of |ledger remaining - Redis remaining| at the last drift check.",
		}),
		driftSKUs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockgate_drift_skus",
			Help: "SKUs whose Redis remaining differed from the ledger at the last drift check.",
		}),
		remaining: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockgate_stock_remaining_units",
			Help: "Units left to hold or sell over all SKUs, per the ledger at the last drift check.",
		}),
		driftRepairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockgate_drift_repairs_total",
			Help: "SKUs re-seeded by the drift check because Redis and the ledger disagreed.",
		}),
		probes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "stockgate_purchase_probes",
			Help:    "Shard scripts one purchase or hold ran in Redis (1 is the best case; more near the end of a sale).",
			Buckets: []float64{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256},
		}),
		seatDrift: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockgate_seat_drift_seats",
			Help: "Seats whose Redis state differed from the ledger at the last periodic check.",
		}),
		seatRepairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockgate_seat_repairs_total",
			Help: "Seats whose Redis state was rewritten from the ledger by a consistency check.",
		}),
		poolRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockgate_pool_refusals_total",
			Help: "Requests a pool's window or access rule refused, by reason (not-open, closed, denied, code-invalid, code-used-up, code-guessing).",
		}, []string{"reason"}),
		budgetRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockgate_hold_budget_refusals_total",
			Help: "Holds refused at the gate because the buyer, or the device fingerprint, held its program's hold budget already, by identity (buyer, device).",
		}, []string{"identity"}),
		listings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockgate_resale_units_total",
			Help: "Units of orders listed for resale (listed), settled to other buyers' sales (sold: refund the seller) and taken back off sale (withdrawn).",
		}, []string{"what"}),
		afterSale: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockgate_after_sale_units_total",
			Help: "Units moved after the sale by what moved them: transferred (to another buyer), released (the rest of a hold confirmed in part, back on sale).",
		}, []string{"what"}),
		extended: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockgate_holds_extended_total",
			Help: "Holds extended by their buyers (a retry not counted).",
		}),
		poolMoved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockgate_pool_moved_units_total",
			Help: "Units closed pools moved into another pool (usually the public one).",
		}),
		ledgerWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stockgate_ledger_queue_wait_seconds",
			Help:    "How long requests waited for their ledger batch to start, by work (takes, confirms, cancels, refunds).",
			Buckets: []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1},
		}, []string{"work"}),
		ledgerShed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockgate_ledger_shed_total",
			Help: "Requests refused 503 overloaded, by work: takes, confirms, cancels, refunds (the ledger could not take them within the wait budget), in_flight (the replica had as many takes in flight as it answers within the budget); and by where: door (on arrival, the queue ahead past the budget), door_patient (the same in a failover's backlog, past half the request's time), full (no room in the queue), withdrawn (the request's deadline came while queued), flush (at its batch's start, waited past the budget or too late), behind (queued behind a flush running past the budget).",
		}, []string{"work", "at"}),
		waitJoins: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockgate_waitlist_joins_total",
			Help: "Buyers this replica put on a waitlist (a buyer joining again while in line is not counted).",
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockgate_holds_expired_total",
			Help: "Holds this replica's sweeper expired and gave back.",
		}),
		latePayments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockgate_late_payments_total",
			Help: "Confirms of holds past their expiry within the late-payment window, by outcome: sold (the units taken again), refused (gone: the platform refunds).",
		}, []string{"outcome"}),
	}
	for _, c := range []prometheus.Collector{m.purchases, m.ledgerRefusals, m.restoreFailed, m.reseeds, m.driftUnits, m.driftSKUs, m.remaining, m.driftRepairs, m.expired, m.probes, m.seatDrift, m.seatRepairs, m.poolRefusals, m.budgetRefusals, m.listings, m.afterSale, m.extended, m.poolMoved, m.waitJoins, m.ledgerWait, m.ledgerShed, m.latePayments, m.primaryWaits, m.parked} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

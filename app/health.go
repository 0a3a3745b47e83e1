package app

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The ledger health loop asks every primary each healthEvery whether it
// takes writes, on a connection of its own (never queued behind the
// pool's writers), within healthWithin: a slow ledger still sells, and
// only one that does not answer at all, or refuses writes, is down.
// healthMisses failed rounds in a row make /readyz fail, and one round
// that passes makes it ready again.
const (
	healthEvery  = time.Second
	healthWithin = 3 * time.Second
	healthMisses = 2
)

// ledgerHealth is the state of the ledger health loop.
type ledgerHealth struct {
	writable    *prometheus.GaugeVec
	synchronous *prometheus.GaugeVec
}

func newLedgerHealth(reg prometheus.Registerer) (*ledgerHealth, error) {
	h := &ledgerHealth{
		writable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stockgate_ledger_writable",
			Help: "1 when the primary took writes at the last check (reachable, not a standby, not read-only), else 0.",
		}, []string{"primary"}),
		synchronous: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stockgate_ledger_synchronous",
			Help: "1 when the primary waits for a synchronous standby to have each commit (a failover loses none), else 0.",
		}, []string{"primary"}),
	}
	for _, c := range []prometheus.Collector{h.writable, h.synchronous} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// runHealth checks the ledger every healthEvery until ctx ends, keeping
// the gauges and /readyz up to date. /readyz fails only while no
// primary takes writes: with several, a program on a failing primary is
// answered 503 by any replica alike, and the others still sell.
func (a *App) runHealth(ctx context.Context) {
	t := time.NewTicker(healthEvery)
	defer t.Stop()
	misses := 0
	said := map[string]string{} // what was logged of each primary
	for {
		cctx, cancel := context.WithTimeout(ctx, healthWithin)
		hs := a.Ledger.Health(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		var down []string
		for _, h := range hs {
			var state string
			if h.Err != nil {
				state = h.Err.Error()
				if errors.Is(h.Err, context.DeadlineExceeded) {
					state = "no answer within " + healthWithin.String()
				}
				down = append(down, h.Primary+": "+state)
				a.health.writable.WithLabelValues(h.Primary).Set(0)
			} else {
				a.health.writable.WithLabelValues(h.Primary).Set(1)
				a.health.synchronous.WithLabelValues(h.Primary).Set(b2f(h.Durability.Synchronous))
				if h.Durability.Synchronous {
					state = "writable, synchronous (" + h.Durability.Standbys + ")"
				} else {
					state = "writable, not synchronous: a failover may lose acknowledged commits"
				}
			}
			if said[h.Primary] != state {
				// Once per change, not once a second.
				a.log.InfoContext(ctx, "ledger primary", "primary", h.Primary, "state", state)
				said[h.Primary] = state
			}
		}
		if len(down) < len(hs) {
			misses = 0
			a.Server.SetLedger("")
		} else if misses++; misses >= healthMisses {
			a.Server.SetLedger(strings.Join(down, "; "))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

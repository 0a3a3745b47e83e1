package sale

import (
	"context"
	"errors"
	"time"

	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// RunDrift compares every SKU's Redis remaining with the ledger each
// DriftEvery until ctx is done, exports the difference, and repairs a SKU
// whose difference stays the same across two checks while its ledger row
// does not change (a difference that moves is purchases in flight). It also
// rebuilds SKUs the ledger sold around Redis, so an idle SKU is right before
// its next buyer arrives.
func (s *Service) RunDrift(ctx context.Context) {
	t := time.NewTicker(s.opts.DriftEvery)
	defer t.Stop()
	seen := map[stock.SKU]driftSeen{}
	quiet := map[stock.SKU]quietSince{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.redisTrouble.Swap(false) {
			clear(quiet) // Redis failed meanwhile: it may have lost writes
		}
		seen = s.checkDrift(ctx, seen, quiet)
	}
}

type driftSeen struct{ version, redis int64 }

// quietSince is a SKU whose Redis agreed with its ledger row at version,
// checked first at `at`. While the row keeps that version nothing moved
// its stock through the ledger, so its Redis is read again only every
// driftQuietEvery checks (a fault can still change Redis alone): a
// replica with a thousand idle SKUs reads none of them most of the time.
type quietSince struct {
	version int64
	at      time.Time
}

// driftQuietEvery is how many drift periods an idle SKU goes unread.
const driftQuietEvery = 10

const driftPage = 500

func (s *Service) checkDrift(ctx context.Context, prev map[stock.SKU]driftSeen, quiet map[stock.SKU]quietSince) map[stock.SKU]driftSeen {
	if s.breakers.State() == breaker.Open {
		return prev // a master is not serving; its SKUs have nothing to compare
	}
	next := map[stock.SKU]driftSeen{}
	var units, skus, left, seatDiffs int64
	after := stock.SKU{}
	for {
		page, err := s.ledger.SKUs(ctx, after, driftPage)
		if err != nil {
			// A ledger over several primaries answers the reachable ones'
			// SKUs with the others' error: those are checked still.
			s.log.WarnContext(ctx, "drift check", "err", err)
			if len(page) == 0 {
				return prev
			}
		}
		for _, st := range page {
			if ctx.Err() != nil {
				return prev
			}
			if st.EndedAt.IsZero() {
				left += st.Remaining()
			}
			if st.Seated {
				seatDiffs += s.checkSeatsPeriodic(ctx, st.SKU)
				continue
			}
			if s.collapse(ctx, st) {
				continue
			}
			q, wasQuiet := quiet[st.SKU]
			if wasQuiet && q.version == st.Version && time.Since(q.at) < driftQuietEvery*s.opts.DriftEvery {
				continue
			}
			d, ok := s.driftOf(ctx, st)
			want := st.Remaining()
			if !st.EndedAt.IsZero() {
				want = 0 // an ended sale's gate is rebuilt empty: it admits no one
			}
			if !ok || d.redis == want {
				if !ok {
					delete(quiet, st.SKU)
				} else if !wasQuiet || q.version != st.Version || time.Since(q.at) >= driftQuietEvery*s.opts.DriftEvery {
					// Staggered by SKU, so each check reads a tenth of the
					// idle SKUs rather than all of them every tenth check.
					phase := time.Duration(ledger.SKULane(st.SKU)%driftQuietEvery) * s.opts.DriftEvery
					quiet[st.SKU] = quietSince{version: st.Version, at: time.Now().Add(-phase)}
				}
				continue
			}
			delete(quiet, st.SKU)
			units += abs(want - d.redis)
			skus++
			if p, ok := prev[st.SKU]; ok && p == d {
				if err := s.reseed(ctx, st.SKU, reasonDrift, true); err != nil {
					s.log.WarnContext(ctx, "drift repair", "sku", st.SKU.String(), "err", err)
					next[st.SKU] = d
					continue
				}
				s.metrics.driftRepairs.Inc()
				continue
			}
			next[st.SKU] = d
		}
		if len(page) < driftPage {
			break
		}
		after = page[len(page)-1].SKU
	}
	s.metrics.driftUnits.Set(float64(units))
	s.metrics.driftSKUs.Set(float64(skus))
	s.metrics.remaining.Set(float64(left))
	s.metrics.seatDrift.Set(float64(seatDiffs))
	return next
}

// driftOf reads the SKU's Redis remaining. It rebuilds at once (and reports
// !ok) when the gate is stale, missing or left closed.
func (s *Service) driftOf(ctx context.Context, st ledger.SKUState) (driftSeen, bool) {
	var shards []shard.ShardStock
	err := s.redis(ctx, "gate.read", func(ctx context.Context) (err error) {
		shards, err = s.gate.Read(ctx, st.SKU, st.Shards)
		return err
	})
	if err != nil {
		return driftSeen{}, false
	}
	var left int64
	open := true
	for _, sh := range shards {
		open = open && sh.Seeded && !sh.Fenced && sh.Epoch == st.GateEpoch
		left += sh.Avail
	}
	if st.GateStale() || !open {
		reason := reasonBypass
		if !open {
			reason = reasonNotSeeded
		}
		if err := s.reseed(ctx, st.SKU, reason, false); err != nil && !errors.Is(err, lock.ErrBusy) {
			s.log.WarnContext(ctx, "drift check re-seed", "sku", st.SKU.String(), "err", err)
		}
		return driftSeen{}, false
	}
	return driftSeen{version: st.Version, redis: left}, true
}

// collapse moves the tail of a sale onto one shard when a SKU spread over
// several has CollapseAt units per shard or fewer left: a fenced resize (the
// gate closes, the ledger records one shard, the shard is built from the
// ledger facts, the old shards are retired, the gate reopens), so a crash
// part-way leaves the gate closed until the next rebuild, and nothing is
// lost or doubled. It reports whether it ran.
func (s *Service) collapse(ctx context.Context, st ledger.SKUState) bool {
	left := st.Remaining()
	if s.opts.CollapseAt < 0 || st.Shards == 1 || left <= 0 || left > s.opts.CollapseAt*int64(st.Shards) || !st.EndedAt.IsZero() {
		return false
	}
	if _, err := s.Collapse(ctx, st.SKU); err != nil && !errors.Is(err, lock.ErrBusy) {
		s.log.WarnContext(ctx, "collapse tail", "sku", st.SKU.String(), "err", err)
	}
	return true
}

// Collapse moves a SKU's Redis stock onto one shard now, behind the fence,
// unless another replica is rebuilding it (lock.ErrBusy).
func (s *Service) Collapse(ctx context.Context, sku stock.SKU) (Rebuild, error) {
	if sku.Program.IsZero() || sku.Ticket.IsZero() {
		return Rebuild{}, refuse(ErrInvalid, "program and ticket ids must match [A-Za-z0-9_-]{1,64}")
	}
	return s.rebuildWith(ctx, sku, reasonCollapse, true, 0, func(ctx context.Context) error {
		return s.ledger.SetShards(ctx, sku, 1)
	})
}

// checkSeatsPeriodic runs the seat consistency check for the drift loop,
// repairing only what differed the same way at its previous run.
func (s *Service) checkSeatsPeriodic(ctx context.Context, sku stock.SKU) int64 {
	if s.seats == nil {
		return 0
	}
	s.seatSeen.mu.Lock()
	prev := s.seatSeen.m[sku]
	s.seatSeen.mu.Unlock()
	if prev == nil {
		prev = map[keys.ID]string{}
	}
	r, now, err := s.checkSeats(ctx, sku, prev)
	if err != nil {
		s.log.WarnContext(ctx, "seat check", "sku", sku.String(), "err", err)
		return 0
	}
	s.seatSeen.mu.Lock()
	if s.seatSeen.m == nil {
		s.seatSeen.m = map[stock.SKU]map[keys.ID]string{}
	}
	s.seatSeen.m[sku] = now
	s.seatSeen.mu.Unlock()
	return int64(len(r.Differed))
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

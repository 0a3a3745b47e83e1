package waitroom

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// The pacer: one replica at a time (a lock per ledger) steps every open
// room, admitting at the pace the room's sales and walk-aways allow.

// linePace estimates a line's admissions per second from the serving
// counter a replica reads: a moving average over about paceSpan.
type linePace struct {
	mu      sync.Mutex
	span    time.Duration // 0: paceSpan
	serving int64
	at      time.Time
	rate    float64
	known   bool
}

const paceSpan = 10 * time.Second

// drainPace is a line's sales pace: the faster of a slow average and one
// over drainFastSpan. The end of a sale is often its fastest part (the
// pacer lets in the line's last buyers at once), and a slow average alone
// read 15 tickets a second while the last 134 sold in about one, so the
// buyers told to look again in 4.5 s heard of the sell-out 4 s late.
type drainPace struct {
	slow, fast linePace
	mu         sync.Mutex
	peak       float64
}

const drainFastSpan = time.Second

// see returns the pace and the fastest pace seen since the counts last
// started again (stock that came back, a line made again).
func (d *drainPace) see(sold int64, now time.Time) (pace, peak float64) {
	slow, fresh := d.slow.seeFresh(sold, now)
	pace = max(slow, d.fast.see(sold, now))
	d.mu.Lock()
	defer d.mu.Unlock()
	if fresh {
		d.peak = 0
	}
	d.peak = max(d.peak, pace)
	return pace, d.peak
}

func (p *linePace) see(serving int64, now time.Time) float64 {
	rate, _ := p.seeFresh(serving, now)
	return rate
}

// seeFresh is see, and whether the estimate started again at this look.
func (p *linePace) seeFresh(serving int64, now time.Time) (float64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.at.IsZero() || serving < p.serving {
		p.serving, p.at = serving, now // the first look, or a line made again
		return p.get(), true
	}
	dt := now.Sub(p.at)
	if dt < Refresh/2 {
		return p.get(), false
	}
	inst := float64(serving-p.serving) / dt.Seconds()
	if !p.known {
		p.rate, p.known = inst, true
	} else {
		span := p.span
		if span == 0 {
			span = paceSpan
		}
		a := dt.Seconds() / (span.Seconds() + dt.Seconds())
		p.rate += a * (inst - p.rate)
	}
	p.serving, p.at = serving, now
	return p.rate, false
}

func (p *linePace) get() float64 {
	if !p.known {
		return -1
	}
	return p.rate
}

// RunPacer admits queued buyers until ctx is done. One replica at a time
// paces every waiting room: the one holding the pacer lock (a replica
// that dies stops renewing, and another takes over after the lock's
// TTL); the others try for it once a second. Each tick it steps the line
// of each room that has something to do, and a room that has nothing
// costs nothing: a room not open yet sleeps until its opening, and a
// sold-out or ended one until stock comes back (a restock notice, from
// any replica, wakes it; a read of its stock every few seconds makes up
// for a lost notice), and an open room nobody waits in steps once a
// second (a join on this replica wakes it).
func (s *Rooms) RunPacer(ctx context.Context) {
	const tick = 200 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	var lease interface {
		Context() context.Context
		Release(context.Context) error
	}
	defer func() {
		if lease != nil {
			_ = lease.Release(context.WithoutCancel(ctx)) // an unreleased lease lapses at its TTL
		}
	}()
	var tried, listed time.Time
	var programs []ledger.QueueConfig
	rooms := map[keys.ID]*pacing{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		if lease == nil || lease.Context().Err() != nil {
			if now.Sub(tried) < time.Second {
				continue
			}
			tried = now
			// Named by the ledger: replicas of another ledger on the same
			// Redis pace their own rooms.
			l, err := s.locker.Acquire(ctx, keys.Lock(s.ledger.ID(), lockQueue, lockPacer), 0)
			if err != nil {
				lease = nil
				continue // another replica paces, or Redis is away
			}
			lease, rooms = l, map[keys.ID]*pacing{} // a new pacer starts by looking
		}
		if now.Sub(listed) >= time.Second || s.roomsChanged.Swap(false) {
			got, err := s.ledger.QueuedPrograms(ctx)
			if err != nil {
				// Part of a ledger over several primaries not answering:
				// the rooms the others list are paced still, with those
				// listed before (listed again next round).
				s.log.WarnContext(ctx, "queued programs", "err", err)
				programs = mergeRooms(programs, got)
			} else {
				programs, listed = got, now
			}
		}
		live := map[keys.ID]bool{}
		var sum paced
		for _, c := range programs {
			live[c.Program] = true
			p := rooms[c.Program]
			if p == nil || p.config != c {
				p = &pacing{config: c, last: now, serving: -1}
				if old := rooms[c.Program]; old != nil && old.config.Room() == c.Room() {
					// The same room, new settings: what it learned holds.
					// A room made again starts over (its first step only
					// looks).
					p.serving, p.unused, p.seen, p.carry = old.serving, old.unused, old.seen, old.carry
					p.spent, p.abandoned, p.soldOutOnce, p.conv, p.cohorts = old.spent, old.abandoned, old.soldOutOnce, old.conv, old.cohorts
				}
				rooms[c.Program] = p
			}
			if _, woken := s.roomWakes.LoadAndDelete(c.Program); woken {
				p.until, p.check = time.Time{}, time.Time{}
			}
			if p.sleeps(ctx, s, now) {
				sum.add(p.saw)
				continue
			}
			p.saw = s.pace(lease.Context(), c, p)
			sum.add(p.saw)
		}
		s.metrics.waiting.Set(float64(sum.waiting))
		s.metrics.left.Set(float64(sum.left))
		s.metrics.unused.Set(float64(sum.unused))
		s.metrics.abandoned.Set(float64(sum.abandoned))
		for program := range rooms {
			if !live[program] {
				delete(rooms, program)
			}
		}
	}
}

// How long a room with nothing to do sleeps: a sold-out one between reads
// of its stock (a lost restock notice costs at most this) and between
// whole steps, an open one nobody waits in between steps.
const (
	soldOutCheck = 10 * time.Second
	soldOutStep  = 2 * time.Minute
	emptyStep    = time.Second
)

// pacing is a room the pacer steps: its config, the rate's fraction of a
// buyer carried from step to step, and when it may sleep until.
type pacing struct {
	config  ledger.QueueConfig
	last    time.Time
	carry   float64
	serving int64 // the serving counter after the last step; -1 before the first
	unused  int64 // the admitted-but-unused the last step counted
	// spent and abandoned: the admitted who bought, and who let their
	// window pass, as the last step counted (the line's conversion);
	// soldOutOnce: the line has sold out since this pacer paced it.
	spent, abandoned int64
	conv             convTrack // the conversion the line's recent outcomes show
	cohorts          [3]Cohort // the last step's (Step.Cohorts)
	soldOutOnce      bool
	seen             ledger.QueueLine // what the ledger has of the line, as this pacer wrote it
	saw              paced            // what the last step saw, for the gauges while it sleeps
	// until: no step before then (zero: step); check, for a sold-out
	// room: its stock is read again then, and a room with some wakes.
	until, check time.Time
	soldOut      bool
}

// sleeps reports whether p has nothing to do at now. A sold-out room
// whose stock read shows some left wakes.
func (p *pacing) sleeps(ctx context.Context, s *Rooms, now time.Time) bool {
	if !now.Before(p.until) {
		return false
	}
	if !p.soldOut || now.Before(p.check) {
		return true
	}
	p.check = now.Add(soldOutCheck)
	ps, err := s.ledger.ProgramStock(ctx, p.config.Program)
	if err != nil || ps.SoldOut() {
		return true
	}
	p.until = time.Time{}
	return false
}

// paced is what a pacer step saw of a line, for the gauges.
type paced struct{ waiting, left, unused, abandoned int64 }

func (p *paced) add(q paced) {
	p.waiting += q.waiting
	p.left += q.left
	p.unused += q.unused
	p.abandoned += q.abandoned
}

// pace admits as many of c's line as the rate allows since the last step
// and the stock allows now (nobody before the opening, even a postponed
// one), and records what it saw in the ledger (so a line Redis loses is
// made again from there).
func (s *Rooms) pace(ctx context.Context, lc ledger.QueueConfig, p *pacing) paced {
	c := roomOf(lc)
	now := time.Now()
	prev, wasSoldOut := p.serving, p.soldOut
	p.carry += float64(c.Rate) * min(now.Sub(p.last), time.Second).Seconds()
	p.last = now
	most := int64(p.carry)
	if now.Before(c.OpensAt) {
		most, p.carry = 0, 0
	}
	// The stock is read before the line, so a buyer who buys in between
	// (the ticket counted as left, the buyer no longer as unused) would
	// let one more in than the stock allows: the line counts at least the
	// admitted-but-unused of the last step, read before this stock. Every
	// buyer who had not bought by this read was counted then (only this
	// pacer admits). A pacer's first step has no such count: it only
	// looks.
	floor := p.unused
	if p.serving < 0 {
		most = 0
	}
	ps, err := s.ledger.ProgramStock(ctx, c.Program)
	if err != nil {
		s.log.WarnContext(ctx, "pacer: stock left", "program", c.Program.String(), "err", err)
		return paced{}
	}
	left := max(ps.Remaining, 0)
	limit := p.limit(now, c, left)
	advance := func() (Step, error) {
		return s.store.Advance(ctx, c.Program, c.id, now, c.OpensAt, most, limit, floor, c.Window, ps.SoldOut())
	}
	step, err := advance()
	switch {
	case errors.Is(err, ErrLost):
		// Redis has no line, or another room's: a room made again since
		// the rooms were listed keeps its line (restoreLine asks the
		// ledger), and the pacer reads the rooms again.
		switch err = s.restoreLine(ctx, c); {
		case errors.Is(err, errRoomChanged):
			return paced{left: left}
		case err == nil:
			step, err = advance()
		}
	case errors.Is(err, ErrMoved):
		if err = s.resumeLine(ctx, c); err == nil {
			step, err = advance()
		}
	}
	if err != nil {
		s.log.WarnContext(ctx, "pacer: advance", "program", c.Program.String(), "err", err)
		return paced{left: left}
	}
	if p.serving >= 0 && step.Serving > p.serving {
		admitted := step.Serving - p.serving
		s.metrics.admitted.Add(float64(admitted))
		p.carry -= float64(admitted)
	}
	p.serving, p.unused = step.Serving, step.Unused
	p.spent, p.abandoned = step.Serving-step.Unused-step.Abandoned, step.Abandoned
	p.cohorts = step.Cohorts
	seen := ledger.QueueLine{Program: c.Program, Room: c.id, Opened: step.Opened, Early: step.Early, Post: step.Late,
		Serving: step.Serving, Old: step.Old}
	if seen != p.seen {
		if err := s.ledger.SeeQueueLine(ctx, seen); err != nil {
			s.log.WarnContext(ctx, "pacer: record the line", "program", c.Program.String(), "err", err)
		} else {
			p.seen = seen
		}
	}
	// At most a second's worth carried: a lull does not store up a burst.
	p.carry = min(max(p.carry, 0), float64(c.Rate))
	// Nothing to do until...
	p.soldOut, p.until, p.check = ps.SoldOut(), time.Time{}, time.Time{}
	p.soldOutOnce = p.soldOutOnce || p.soldOut
	if prev >= 0 && (step.Serving != prev || p.soldOut != wasSoldOut) {
		s.announce(ctx, c.Program) // every replica's buyers hear it now
	}
	p.rest(now, c, step, prev)
	return paced{waiting: max(step.Joined-step.Serving, 0), left: left, unused: step.Unused, abandoned: step.Abandoned}
}

// limit is how many of c's line may be served in all at now, with left
// tickets left.
func (p *pacing) limit(now time.Time, c room, left int64) int64 {
	// Rounded up: a factor under 1 must still let a buyer in for the last
	// ticket.
	limit := int64(math.Ceil(float64(left) * float64(c.PerRemaining) / 1000))
	if c.SoldOutShare > 0 && c.PerRemaining >= 1000 && !p.soldOutOnce {
		// Past the tickets left as far as the line's buyers convert
		// (conversion.go), from the outcomes the last step counted. A
		// room asking fewer admitted than tickets left paces on purpose:
		// its per_remaining rules. Once the line has sold out, its
		// buyers turned away count as walk-aways the pacer cannot tell
		// apart, and the share was spent: a re-opened line (a refund)
		// admits no more than tickets left.
		conv := p.conv.estimate(now, c.Window, p.serving, p.unused, p.spent, p.abandoned, p.cohorts[:]...)
		limit = max(limit, conversionLimit(left, p.spent+p.abandoned, conv, float64(c.SoldOutShare)/1000))
	}
	return limit
}

// rest sets when p's line needs no step before (until) and no stock
// check before (check), after a step that left it at step from prev.
func (p *pacing) rest(now time.Time, c room, step Step, prev int64) {
	switch {
	case now.Before(c.OpensAt) && prev >= 0:
		p.until = c.OpensAt // the opening (this first look is done)
	case p.soldOut && step.Serving == prev:
		p.until, p.check = now.Add(soldOutStep), now.Add(soldOutCheck) // stock comes back
	case !p.soldOut && step.Joined == step.Serving && prev >= 0:
		p.until = now.Add(emptyStep) // someone joins
	}
}

var (
	lockQueue = keys.MustID("queue")
	lockPacer = keys.MustID("pacer")
)

package sale

import (
	"context"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/queue"
)

// A program's waiting room: buyers join its line (one place each), a
// pacer on one replica at a time admits them in order as fast as the rate
// ceiling and the stock allow, and an admitted buyer's token lets one
// order through. The line lives in Redis (package queue); its settings in
// the ledger.

// QueueConfig is a program's waiting room as admin sets it.
type QueueConfig struct {
	Program keys.ID
	// OpensAt is when admission starts; JoinFrom (default OpensAt) when
	// buyers may join. Those who join before OpensAt are ordered at random.
	OpensAt, JoinFrom time.Time
	// Rate is the most buyers admitted per second.
	Rate int64
	// Window is how long an admitted buyer may take to buy.
	Window time.Duration
	// PerRemaining is how many admitted buyers who have not bought yet may
	// exist per ticket left (1.5: half again as many as there are tickets).
	PerRemaining float64
	// CheckoutURL is where the waiting room's page sends an admitted buyer.
	CheckoutURL string
}

// Queue states a buyer's check answers.
const (
	QueueWaiting  = "waiting"
	QueueAdmitted = "admitted"
	QueueSoldOut  = "sold-out"
)

// QueueRefresh is how long a replica answers checks from its memory of a
// line before reading it from Redis again.
const QueueRefresh = 250 * time.Millisecond

// QueueStatus is where a buyer stands in a line.
type QueueStatus struct {
	Program keys.ID
	Buyer   keys.ID
	Ticket  string // the signed queue ticket the buyer checks with
	State   string
	// Position is the place in line (0 before the opening for an early
	// join: its place is drawn at the opening); Ahead the places before
	// it not yet admitted.
	Position int64
	Ahead    int64
	// Wait is the estimated wait; RetryAfter when to check again.
	Wait, RetryAfter time.Duration
	// Admission is the token an admitted buyer buys with (header
	// Admission-Token), for Window from its admission.
	Admission string
	OpensAt   time.Time
}

// QueueView is a waiting room's settings and line, for admin.
type QueueView struct {
	QueueConfig
	Joined, Serving, Unused, Abandoned int64
	SoldOut, Opened                    bool
}

func queueOfLedger(c ledger.QueueConfig) QueueConfig {
	return QueueConfig{Program: c.Program, OpensAt: c.OpensAt, JoinFrom: c.JoinFrom, Rate: c.Rate, Window: c.Window,
		PerRemaining: float64(c.PerRemaining) / 1000, CheckoutURL: c.CheckoutURL}
}

// PutQueue turns a program's waiting room on, or changes it.
func (s *Service) PutQueue(ctx context.Context, c QueueConfig) (QueueConfig, error) {
	if s.queue == nil {
		return c, refuse(ErrNoQueue, "")
	}
	lc := ledger.QueueConfig{Program: c.Program, OpensAt: c.OpensAt, JoinFrom: c.JoinFrom, Rate: c.Rate, Window: c.Window,
		PerRemaining: int64(c.PerRemaining*1000 + 0.5), CheckoutURL: c.CheckoutURL}
	if lc.JoinFrom.IsZero() {
		lc.JoinFrom = lc.OpensAt
	}
	if err := lc.Validate(); err != nil {
		return c, refuse(ErrInvalid, err.Error())
	}
	got, err := s.ledger.PutQueue(ctx, lc)
	if err != nil {
		s.log.ErrorContext(ctx, "put queue", "program", c.Program.String(), "err", err)
		return c, refuse(ErrUnavailable, "ledger unavailable; repeat the request")
	}
	s.queues.forget(c.Program)
	return queueOfLedger(got), nil
}

// DeleteQueue turns a program's waiting room off: its purchases need no
// admission any more.
func (s *Service) DeleteQueue(ctx context.Context, program keys.ID) error {
	ok, err := s.ledger.DeleteQueue(ctx, program)
	if err != nil {
		return refuse(ErrUnavailable, "ledger unavailable; repeat the request")
	}
	s.queues.forget(program)
	if !ok {
		return ErrNoQueue
	}
	return nil
}

// Queue reads a program's waiting room and its line.
func (s *Service) Queue(ctx context.Context, program keys.ID) (QueueView, error) {
	c, err := s.queueConfig(ctx, program)
	if err != nil {
		return QueueView{}, err
	}
	st, err := s.queue.State(ctx, program)
	if err != nil {
		return QueueView{}, refuse(ErrUnavailable, "Redis unavailable; repeat the request")
	}
	return QueueView{QueueConfig: queueOfLedger(c), Joined: st.Joined(), Serving: st.Serving, Unused: st.Unused,
		Abandoned: st.Abandoned, SoldOut: st.SoldOut, Opened: st.Opened}, nil
}

// JoinQueue gives buyer its one place in program's line and the signed
// ticket to check it with; joining again answers the same place (created
// false).
func (s *Service) JoinQueue(ctx context.Context, program, buyer keys.ID) (QueueStatus, bool, error) {
	c, err := s.queueConfig(ctx, program)
	if err != nil {
		return QueueStatus{}, false, err
	}
	now := time.Now()
	if now.Before(c.JoinFrom) {
		return QueueStatus{}, false, refuse(ErrQueueNotOpen, "the line opens at "+c.JoinFrom.UTC().Format(time.RFC3339))
	}
	place, created, err := s.queue.Join(ctx, program, buyer, now, c.OpensAt)
	if err != nil {
		s.log.WarnContext(ctx, "join queue", "program", program.String(), "err", err)
		return QueueStatus{}, false, refuse(ErrUnavailable, "Redis unavailable; repeat the request")
	}
	if created {
		s.metrics.queueJoins.Inc()
	}
	st, err := s.QueueCheck(ctx, program, queue.Ticket(queueSecret(c), program, buyer, place))
	return st, created, err
}

// QueueCheck answers where the holder of ticket stands, from this
// replica's memory of the line (read from Redis a few times a second per
// program, whoever asks): polls cost no Redis call.
func (s *Service) QueueCheck(ctx context.Context, program keys.ID, ticket string) (QueueStatus, error) {
	c, err := s.queueConfig(ctx, program)
	if err != nil {
		return QueueStatus{}, err
	}
	secret := queueSecret(c)
	buyer, place, err := queue.ParseTicket(secret, program, ticket)
	if err != nil {
		return QueueStatus{}, refuse(ErrQueueTicket, "not a queue ticket of this program")
	}
	st, err := s.lines.get(ctx, program, func(ctx context.Context) (queue.State, error) { return s.queue.State(ctx, program) })
	if err != nil {
		return QueueStatus{}, refuse(ErrUnavailable, "Redis unavailable; check again")
	}
	out := QueueStatus{Program: program, Buyer: buyer, Ticket: ticket, State: QueueWaiting, OpensAt: c.OpensAt}
	rate := max(c.Rate, 1)
	if !st.Opened {
		// An early join's place is drawn at the opening.
		if !place.Early {
			out.Position = st.Early + place.N // cannot happen before the opening; kept coherent
		}
		out.Wait = time.Until(c.OpensAt)
		out.RetryAfter = min(max(out.Wait/2, time.Second), 30*time.Second)
		return out, nil
	}
	out.Position = queue.Position(secret, place, st.Early)
	if out.Position == 0 {
		return QueueStatus{}, refuse(ErrQueueTicket, "not a place in this line")
	}
	switch {
	case out.Position <= st.Serving:
		out.State = QueueAdmitted
		out.Admission = queue.Admission(secret, program, buyer, out.Position)
	case st.SoldOut:
		out.State = QueueSoldOut
	default:
		out.Ahead = out.Position - st.Serving - 1
		out.Wait = time.Duration(float64(out.Ahead+1) / float64(rate) * float64(time.Second))
		out.RetryAfter = min(max(out.Wait/4, time.Second), 30*time.Second)
	}
	return out, nil
}

// admitQueue lets a request of a queued program through with its admission
// token, spending it on the request (the same request again: a retry);
// programs without a waiting room pass.
func (s *Service) admitQueue(ctx context.Context, program, buyer keys.ID, token string, r request) error {
	c, err := s.queueConfig(ctx, program)
	if errors.Is(err, ErrNoQueue) {
		return nil
	}
	if err != nil {
		return err
	}
	if token == "" {
		return refuse(ErrAdmissionRequired, "this program sells through its waiting room: send the Admission-Token the queue gave")
	}
	pos, err := queue.ParseAdmission(queueSecret(c), program, buyer, token)
	if err != nil {
		return refuse(ErrAdmissionInvalid, "the admission token is not this buyer's for this program")
	}
	err = s.queue.Spend(ctx, program, pos, r.gateID(), time.Now(), c.Window)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, queue.ErrSpent):
		return ErrAdmissionUsed
	case errors.Is(err, queue.ErrExpired):
		return ErrAdmissionExpired
	case errors.Is(err, queue.ErrNotAdmitted):
		return refuse(ErrAdmissionInvalid, "this place in line is not admitted yet")
	}
	s.log.WarnContext(ctx, "spend admission", "program", program.String(), "err", err)
	return refuse(ErrUnavailable, "Redis unavailable; retry with the same Idempotency-Key")
}

// queueConfig is program's waiting room (cached for a second), or
// ErrNoQueue.
func (s *Service) queueConfig(ctx context.Context, program keys.ID) (ledger.QueueConfig, error) {
	if s.queue == nil {
		return ledger.QueueConfig{}, ErrNoQueue
	}
	return s.queues.get(ctx, program, func(ctx context.Context) (ledger.QueueConfig, error) {
		c, err := s.ledger.Queue(ctx, program)
		if errors.Is(err, ledger.ErrNotFound) {
			return c, ErrNoQueue
		}
		if err != nil {
			return c, refuse(ErrUnavailable, "ledger unavailable; repeat the request")
		}
		return c, nil
	})
}

func queueSecret(c ledger.QueueConfig) []byte {
	b, err := hex.DecodeString(c.Secret)
	if err != nil {
		return []byte(c.Secret)
	}
	return b
}

// RunPacer admits queued buyers until ctx is done: every tick it steps the
// line of each program with a waiting room whose pacer lock it holds (one
// replica per program at a time; a replica that dies stops renewing, and
// another takes over after the lock's TTL).
func (s *Service) RunPacer(ctx context.Context) {
	const tick = 200 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	held := map[keys.ID]*pacing{}
	defer func() {
		for _, p := range held {
			p.lease.Release(context.WithoutCancel(ctx))
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		programs, err := s.ledger.QueuedPrograms(ctx)
		if err != nil {
			s.log.WarnContext(ctx, "queued programs", "err", err)
			continue
		}
		live := map[keys.ID]bool{}
		var sum paced
		for _, c := range programs {
			live[c.Program] = true
			p := held[c.Program]
			if p != nil && p.lease.Context().Err() != nil {
				delete(held, c.Program)
				p = nil
			}
			if p == nil {
				lease, err := s.locker.Acquire(ctx, keys.Lock(c.Program, lockQueue, lockPacer), 0)
				if err != nil {
					continue // another replica paces it, or Redis is away
				}
				p = &pacing{lease: lease, last: time.Now(), serving: -1}
				held[c.Program] = p
			}
			sum.add(s.pace(p.lease.Context(), c, p))
		}
		s.metrics.queueWaiting.Set(float64(sum.waiting))
		s.metrics.queueLeft.Set(float64(sum.left))
		s.metrics.queueUnused.Set(float64(sum.unused))
		s.metrics.queueAbandoned.Set(float64(sum.abandoned))
		for program, p := range held {
			if !live[program] {
				p.lease.Release(ctx)
				delete(held, program)
			}
		}
	}
}

var (
	lockQueue = keys.MustID("queue")
	lockPacer = keys.MustID("pacer")
)

// pacing is a program this replica paces: its lock, and the rate's
// fraction of a buyer carried from step to step.
type pacing struct {
	lease interface {
		Context() context.Context
		Release(context.Context) error
	}
	last    time.Time
	carry   float64
	serving int64 // the serving counter after the last step; -1 before the first
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
// and the stock allows now.
func (s *Service) pace(ctx context.Context, c ledger.QueueConfig, p *pacing) paced {
	now := time.Now()
	p.carry += float64(c.Rate) * min(now.Sub(p.last), time.Second).Seconds()
	p.last = now
	most := int64(p.carry)
	left, err := s.ledger.ProgramRemaining(ctx, c.Program)
	if err != nil {
		s.log.WarnContext(ctx, "pacer: stock left", "program", c.Program.String(), "err", err)
		return paced{}
	}
	limit := int64(float64(left) * float64(c.PerRemaining) / 1000)
	step, err := s.queue.Advance(ctx, c.Program, now, c.OpensAt, most, limit, c.Window, left == 0)
	if err != nil {
		s.log.WarnContext(ctx, "pacer: advance", "program", c.Program.String(), "err", err)
		return paced{left: left}
	}
	if p.serving >= 0 && step.Serving > p.serving {
		admitted := step.Serving - p.serving
		s.metrics.queueAdmitted.Add(float64(admitted))
		p.carry -= float64(admitted)
	}
	p.serving = step.Serving
	// At most a second's worth carried: a lull does not store up a burst.
	p.carry = min(max(p.carry, 0), float64(c.Rate))
	return paced{waiting: max(step.Joined-step.Serving, 0), left: left, unused: step.Unused, abandoned: step.Abandoned}
}

// ttlCache keeps one value per program for a short time, loading it once
// at a time.
type ttlCache[V any] struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[keys.ID]*ttlEntry[V]
}

type ttlEntry[V any] struct {
	once sync.Once
	at   time.Time
	v    V
	err  error
}

func newTTLCache[V any](ttl time.Duration) *ttlCache[V] {
	return &ttlCache[V]{ttl: ttl, m: map[keys.ID]*ttlEntry[V]{}}
}

func (c *ttlCache[V]) get(ctx context.Context, k keys.ID, load func(context.Context) (V, error)) (V, error) {
	c.mu.Lock()
	e := c.m[k]
	if e == nil || time.Since(e.at) > c.ttl && !e.at.IsZero() {
		e = &ttlEntry[V]{}
		c.m[k] = e
	}
	c.mu.Unlock()
	e.once.Do(func() {
		e.v, e.err = load(ctx)
		c.mu.Lock()
		e.at = time.Now()
		if e.err != nil && !errors.Is(e.err, ErrNoQueue) {
			delete(c.m, k) // a failure is not remembered
		}
		c.mu.Unlock()
	})
	return e.v, e.err
}

func (c *ttlCache[V]) forget(k keys.ID) {
	c.mu.Lock()
	delete(c.m, k)
	c.mu.Unlock()
}

// admitted takes w once its request is let through the program's waiting
// room (when the program has one).
func (s *Service) admitted(ctx context.Context, a Ask, program keys.ID, r request, w want) answer {
	if err := s.admitQueue(ctx, program, a.Buyer, a.Admission, r); err != nil {
		return fail(err)
	}
	return s.take(ctx, w)
}

// QueuePage is what the waiting room's page of program needs: where it
// sends an admitted buyer (ErrNoQueue when the program has none).
func (s *Service) QueuePage(ctx context.Context, program keys.ID) (checkoutURL string, err error) {
	c, err := s.queueConfig(ctx, program)
	return c.CheckoutURL, err
}

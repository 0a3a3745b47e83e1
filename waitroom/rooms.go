package waitroom

import (
	"context"
	"encoding/hex"
	"errors"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
)

// Ledger is what the waiting rooms keep in the ledger: their settings, the
// facts a lost line is made again from, the admissions spent, and what a
// program has left to sell.
type Ledger interface {
	ID() keys.ID
	PutQueue(ctx context.Context, c ledger.QueueConfig) (ledger.QueueConfig, error)
	Queue(ctx context.Context, program keys.ID) (ledger.QueueConfig, error)
	DeleteQueue(ctx context.Context, program keys.ID) (bool, error)
	QueuedPrograms(ctx context.Context) ([]ledger.QueueConfig, error)
	ProgramStock(ctx context.Context, program keys.ID) (ledger.ProgramStock, error)
	RoomLine(ctx context.Context, program, room keys.ID) (ledger.QueueLine, error)
	ReserveQueuePlaces(ctx context.Context, program, room keys.ID, early bool, n int64) (int64, error)
	SeeQueueLine(ctx context.Context, q ledger.QueueLine) error
	SetEarlyGap(ctx context.Context, program, room keys.ID, perm, hi int64) (ledger.QueueLine, error)
	SpendAdmission(ctx context.Context, program, room keys.ID, sp ledger.Spend) (keys.ID, error)
	ReleaseAdmission(ctx context.Context, program, room, buyer, request keys.ID) error
	AdmissionSpends(ctx context.Context, program, room keys.ID) ([]ledger.Spend, error)
}

// Options configures Rooms.
type Options struct {
	Ledger Ledger       // required
	Store  *Store       // required: the lines in Redis
	Locker *lock.Locker // required: one pacer at a time, on the Store's Redis
	Logger *slog.Logger // default slog.Default()
	// Registry receives the metrics. Default: a new registry.
	Registry prometheus.Registerer
}

// Rooms are the programs' waiting rooms as one replica serves them (a nil
// *Rooms has none: every program answers ErrNoRoom): the
// admin's settings, joins and checks (answered from memory), the door a
// request of a queued program goes through (Admit), and the pacer
// (RunPacer).
type Rooms struct {
	ledger  Ledger
	store   *Store
	locker  *lock.Locker
	log     *slog.Logger
	metrics *metrics
	// queues caches each program's waiting room, lines each line's
	// counters, for the checks answered from memory.
	queues *ttlCache[room]
	lines  *ttlCache[lineView]
	// reserving makes one reservation of line places at a time per
	// program and kind; blocks sizes them (*placeBlock by the same key).
	reserving singleflight.Group
	blocks    sync.Map
	// paces estimates each line's admission pace, drains its sales pace
	// (*linePace by program).
	paces, drains sync.Map
	// roomWakes are the programs whose waiting room the pacer steps at
	// its next tick, asleep or not; roomsChanged makes it read the rooms
	// again (see RunPacer).
	roomWakes    sync.Map
	roomsChanged atomic.Bool
	// nets counts joins per client network, for the puzzles' difficulty.
	nets *netMeter
	// watch wakes the event streams of a line that changed (notices.go).
	watch watchers
}

// New returns the waiting rooms of opts.Ledger, their lines in opts.Store.
func New(opts Options) (*Rooms, error) {
	if opts.Ledger == nil || opts.Store == nil || opts.Locker == nil {
		return nil, errors.New("waitroom: Options.Ledger, Store and Locker are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	m, err := newMetrics(opts.Registry)
	if err != nil {
		return nil, err
	}
	return &Rooms{ledger: opts.Ledger, store: opts.Store, locker: opts.Locker, log: opts.Logger, metrics: m,
		queues: newTTLCache[room](time.Second), lines: newTTLCache[lineView](Refresh), nets: newNetMeter()}, nil
}

// Wake makes the pacer step program's room at its next tick, asleep or
// not: stock came back, a buyer joined.
func (s *Rooms) Wake(program keys.ID) {
	s.roomWakes.Store(program, struct{}{})
	// What the line shows (its stock) changed: read again, streams look.
	s.changed(program)
}

// Queued reports whether program sells through a waiting room.
func (s *Rooms) Queued(ctx context.Context, program keys.ID) (bool, error) {
	_, err := s.config(ctx, program)
	if errors.Is(err, ErrNoRoom) {
		return false, nil
	}
	return err == nil, err
}

// Config is a program's waiting room as admin sets it.
type Config struct {
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
	// SoldOutShare is the share of admitted buyers the pacer may let meet
	// sold out (0..0.5): above 0 it admits past the tickets left as the
	// line's conversion allows; 0 admits no more than per_remaining says.
	SoldOutShare float64
	// PowBits, when not 0, is the proof of work a join must bring: a
	// puzzle of at least this many leading zero bits (1..ledger.MaxPowBits),
	// more for a network that joins fast.
	PowBits int
}

// Queue states a buyer's check answers.
const (
	Waiting  = "waiting"
	Admitted = "admitted"
	SoldOut  = "sold-out"
	// Expired: admitted, and the admission window has passed.
	Expired = "expired"
)

// Refresh is how long a replica answers checks from its memory of a
// line before reading it from Redis again.
const Refresh = 250 * time.Millisecond

// Status is where a buyer stands in a line.
type Status struct {
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

// View is a waiting room's settings and line, for admin.
type View struct {
	Config
	Joined, Serving, Unused, Abandoned int64
	SoldOut, Opened                    bool
	// Conversion is the share of admitted buyers who buy, as the pacer
	// estimates it from those whose outcome is known.
	Conversion float64
}

func configOf(c ledger.QueueConfig) Config {
	return Config{Program: c.Program, OpensAt: c.OpensAt, JoinFrom: c.JoinFrom, Rate: c.Rate, Window: c.Window,
		PerRemaining: float64(c.PerRemaining) / 1000, CheckoutURL: c.CheckoutURL, PowBits: int(c.PowBits),
		SoldOutShare: float64(c.SoldOutShare) / 1000}
}

// Put turns a program's waiting room on, or changes it.
func (s *Rooms) Put(ctx context.Context, c Config) (Config, error) {
	if s == nil {
		return c, ErrNoRoom
	}

	lc := ledger.QueueConfig{Program: c.Program, OpensAt: c.OpensAt, JoinFrom: c.JoinFrom, Rate: c.Rate, Window: c.Window,
		PerRemaining: int64(c.PerRemaining*1000 + 0.5), CheckoutURL: c.CheckoutURL, PowBits: int64(c.PowBits),
		SoldOutShare: int64(math.Round(c.SoldOutShare * 1000))}
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
	s.announceRoom(ctx, c.Program)
	return configOf(got), nil
}

// Delete turns a program's waiting room off: its purchases need no
// admission any more.
func (s *Rooms) Delete(ctx context.Context, program keys.ID) error {
	if s == nil {
		return ErrNoRoom
	}

	ok, err := s.ledger.DeleteQueue(ctx, program)
	if err != nil {
		return refuse(ErrUnavailable, "ledger unavailable; repeat the request")
	}
	s.announceRoom(ctx, program)
	if !ok {
		return ErrNoRoom
	}
	return nil
}

// Get reads a program's waiting room and its line.
func (s *Rooms) Get(ctx context.Context, program keys.ID) (View, error) {
	c, err := s.config(ctx, program)
	if err != nil {
		return View{}, err
	}
	v, err := s.loadLine(ctx, c)
	if err != nil {
		return View{}, err
	}
	st := v.st
	return View{Config: configOf(c.QueueConfig), Joined: st.Joined(), Serving: st.Serving, Unused: st.Unused,
		Abandoned: st.Abandoned, SoldOut: v.soldOut(), Opened: st.Opened,
		Conversion: conversion(st.Serving-st.Unused-st.Abandoned, st.Abandoned)}, nil
}

// JoinAsk is a buyer asking for a place in line.
type JoinAsk struct {
	Buyer keys.ID
	// Ticket, when not "", is the buyer's ticket of an earlier join: a
	// buyer whose place Redis lost keeps it.
	Ticket string
	// Proof is the solved puzzle a room with PowBits asks for.
	Proof Proof
	// Client is the caller's address, whose network's join rate sets the
	// puzzles' difficulty.
	Client string
}

// Join gives the buyer its one place in program's line and the signed
// ticket to check it with; joining again answers the same place (created
// false). A room that asks for proof of work refuses a join without a
// solved puzzle with a *PuzzleError.
func (s *Rooms) Join(ctx context.Context, program keys.ID, j JoinAsk) (Status, bool, error) {
	c, err := s.config(ctx, program)
	if err != nil {
		return Status{}, false, err
	}
	now := time.Now()
	if now.Before(c.JoinFrom) {
		return Status{}, false, refuse(ErrNotOpen, "the line opens at "+c.JoinFrom.UTC().Format(time.RFC3339))
	}
	buyer, ticket := j.Buyer, j.Ticket
	if c.PowBits > 0 {
		if err := s.proven(c, j, now); err != nil {
			return Status{}, false, err
		}
	}
	var had *Place
	if ticket != "" {
		b, p, err := c.sign.ParseTicket(program, ticket)
		if err != nil || b != buyer {
			return Status{}, false, refuse(ErrTicket, "not a queue ticket of this buyer in this program")
		}
		had = &p
	}
	var place Place
	created := false
	for attempt := 0; ; attempt++ {
		place, created, err = s.store.Join(ctx, program, c.id, buyer, now, c.OpensAt, had)
		if err == nil {
			break
		}
		if attempt < 4 {
			switch {
			case errors.Is(err, ErrLost):
				err = s.restoreLine(ctx, c)
			case errors.Is(err, ErrMoved):
				err = s.resumeLine(ctx, c)
			case errors.Is(err, ErrFull):
				err = s.reservePlaces(ctx, c, place.Early)
			}
			if err == nil {
				continue
			}
		}
		s.log.WarnContext(ctx, "join queue", "program", program.String(), "err", err)
		return Status{}, false, refuse(ErrUnavailable, "Redis unavailable; repeat the request")
	}
	if created {
		s.metrics.joins.Inc()
		s.Wake(program)
	}
	st, err := s.Check(ctx, program, c.sign.Ticket(program, buyer, place))
	return st, created, err
}

// Check answers where the holder of ticket stands, from this
// replica's memory of the line (read from Redis and the ledger at most
// once per Refresh per program, whoever asks): polls cost no Redis
// call. A line whose last ticket sold is answered sold-out by every
// replica within Refresh of that sale's answer.
func (s *Rooms) Check(ctx context.Context, program keys.ID, ticket string) (Status, error) {
	c, err := s.config(ctx, program)
	if err != nil {
		return Status{}, err
	}
	buyer, place, err := c.sign.ParseTicket(program, ticket)
	if err != nil {
		return Status{}, refuse(ErrTicket, "not a queue ticket of this program")
	}
	load := func(ctx context.Context) (lineView, error) { return s.loadLine(ctx, c) }
	v, err := s.lines.get(ctx, program, load)
	if err == nil && v.room != c.id {
		// The line remembered is another room's (the room was made
		// again): never judge this room's ticket against it.
		s.lines.forget(program)
		v, err = s.lines.get(ctx, program, load)
	}
	if err != nil {
		return Status{}, err
	}
	if v.room != c.id {
		return Status{}, refuse(ErrUnavailable, "the waiting room changed; check again")
	}
	return queueStatus(c, v, buyer, place, ticket), nil
}

// proven is nil when j brings a solved puzzle of c's room, else a
// *PuzzleError with a new puzzle, as hard as the join rate of j's network
// makes it.
func (s *Rooms) proven(c room, j JoinAsk, now time.Time) error {
	network := networkOf(j.Client)
	var err error
	switch {
	case j.Proof == Proof{}:
		s.metrics.powRefused.WithLabelValues("required").Inc()
		err = refuse(ErrProofRequired, "")
	default:
		why := c.checkProof(j.Buyer, j.Proof, int(c.PowBits), now)
		if why == "" {
			s.nets.add(network, now) // a join that did the work counts
			return nil
		}
		s.metrics.powRefused.WithLabelValues("invalid").Inc()
		err = refuse(ErrProofInvalid, why)
	}
	return &PuzzleError{err: err, Puzzle: c.puzzle(j.Buyer, powBits(int(c.PowBits), s.nets.count(network, now)), now)}
}

// queueStatus is where a buyer with place stands in a line seen as v.
func queueStatus(c room, v lineView, buyer keys.ID, place Place, ticket string) Status {
	st := v.st
	out := Status{Program: c.Program, Buyer: buyer, Ticket: ticket, State: Waiting, OpensAt: c.OpensAt}
	if !st.Opened {
		// An early join's place is drawn at the opening.
		out.Wait = time.Until(c.OpensAt)
		out.RetryAfter = min(max(out.Wait/2, time.Second), 30*time.Second)
		return out
	}
	out.Position = c.sign.Position(place, st.Early, st.Perm)
	if out.Position == 0 {
		// An early place past the early count fixed at the opening: no
		// ticket this line gave (the count covers every early place the
		// ledger reserved). It waits, never admitted in another's place.
		out.RetryAfter = 30 * time.Second
		return out
	}
	switch {
	case v.soldOut():
		out.State = SoldOut
		// Only a return (a refund) brings a ticket back, and the line
		// goes on from where it stood: a buyer still looking hears it.
		out.RetryAfter = soldOutRecheck
	case out.Position <= st.Old:
		out.State = Expired
	case out.Position <= st.Serving:
		out.State = Admitted
		out.Admission = c.sign.Admission(c.Program, buyer, out.Position, place.At)
	default:
		out.Ahead = out.Position - st.Serving - 1
		// The wait at the pace the line has been admitted at lately
		// (the stock, not the rate ceiling, sets it in a sale).
		pace := max(v.pace, 1) // a stalled line still moves when stock comes back
		if v.pace < 0 {
			pace = float64(max(c.Rate, 1)) // not seen moving yet: the ceiling
		}
		out.Wait = time.Duration(min(float64(out.Ahead+1)/pace, 86400) * float64(time.Second))
		// Never longer than half the window: a buyer admitted meanwhile
		// comes back while it can still buy.
		out.RetryAfter = min(max(out.Wait/4, time.Second), 30*time.Second, max(c.Window/2, time.Second))
		// A buyer the next admission may reach (as many as may be
		// admitted and not yet bought for the tickets left) asks again
		// in a second, whatever the pace: admissions come in bursts as
		// stock comes back.
		if float64(out.Ahead) < float64(v.stock.Remaining)*float64(c.PerRemaining)/1000 {
			out.RetryAfter = time.Second
		}
		// As the stock runs down, sooner: at most a third of the time the
		// tickets left (and held) last at the fastest pace they have sold at,
		// so a polling buyer hears of the sell-out about a second after it.
		// Nothing left but holds, or the last few tickets within reach of
		// buyers admitted already: any purchase may end it.
		left := v.stock.Remaining + v.stock.Held
		switch {
		case v.stock.Remaining <= 0:
			out.RetryAfter = time.Second
		case v.stock.Remaining <= st.Unused && float64(v.stock.Remaining) <= max(v.drain, 1)*lastFewSeconds:
			out.RetryAfter = time.Second
		case v.stock.Remaining <= st.Unused && c.SoldOutShare > 0 && c.PerRemaining >= 1000 &&
			float64(v.stock.Remaining) <= max(v.peak, 1)*lastFewSeconds:
			// Admitted past the tickets left: the pacer waits for these
			// buyers to buy or for their windows to end, and then lets in
			// the rest at once, who may buy the last tickets within a
			// second however slowly they sold before. (A buyer told 2 s
			// in such a pause heard of the sell-out 2.3 s after it.) Only
			// for the last few tickets at the fastest pace the line has
			// sold at: earlier, the whole line polling each second would
			// cost more than it tells.
			out.RetryAfter = time.Second
		case v.drain > 0:
			// A third, in whole seconds (the header's unit, which the
			// gateway rounds up), at the fastest pace the line has sold
			// at: a pace that doubles near the end, or picks up again
			// after the pacer's pause, still leaves the buyer's next look
			// before the sell-out, or a second after it. (At the pace of
			// the moment, 15 a second in a pause after 70, 135 left read
			// 9 s: buyers told 2 s heard of the sell-out 2.5 s after it.)
			last := time.Duration(min(float64(left)/max(v.drain, v.peak), 86400) * float64(time.Second))
			out.RetryAfter = min(out.RetryAfter, max((last/3).Truncate(time.Second), time.Second))
		}
	}
	return out
}

// lastFewSeconds: tickets the line sells in this long at its pace are its
// last few.
const lastFewSeconds = 10

// soldOutRecheck is the Retry-After of a sold-out answer: a buyer who keeps
// looking learns of a returned ticket that soon (a stream, at once).
const soldOutRecheck = 5 * time.Second

// lineView is what a replica remembers of a line: its counters in Redis
// and what its program has left in the ledger.
type lineView struct {
	room  keys.ID // the room whose line this is
	st    State
	stock ledger.ProgramStock
	// pace is the line's recent admissions per second as this replica
	// saw them (-1: not known yet); drain the tickets sold per second
	// (the fall of what is left and held; -1: not known yet).
	pace, drain float64
	// peak is the fastest sales pace seen since the stock last came back.
	peak float64
}

// soldOut: the line is closed, by the pacer or because the ledger has
// nothing left to sell nor held.
func (v lineView) soldOut() bool { return v.st.SoldOut || v.stock.SoldOut() }

// loadLine reads a line's counters and its program's stock; a line Redis
// lost, or cannot answer for now, is read from the ledger's facts (the
// pacer restores a lost one).
func (s *Rooms) loadLine(ctx context.Context, c room) (lineView, error) {
	v := lineView{room: c.id}
	var err error
	program := c.Program
	if v.stock, err = s.ledger.ProgramStock(ctx, program); err != nil {
		s.log.WarnContext(ctx, "queue: program stock", "program", program.String(), "err", err)
		return v, refuse(ErrUnavailable, "ledger unavailable; check again")
	}
	// A check must answer fast, Redis or not: a read that does not come
	// back within lineReadTimeout is answered from the ledger's facts, as
	// a lost line is (the line stands still without Redis anyway).
	rctx, cancel := context.WithTimeout(ctx, lineReadTimeout)
	v.st, err = s.store.State(rctx, program, c.id)
	cancel()
	if err != nil {
		s.log.WarnContext(ctx, "queue: read the line (answered from the ledger)", "program", program.String(), "err", err)
		v.st.Lost = true
	}
	if v.st.Lost {
		ln, err := s.ledger.RoomLine(ctx, program, c.id)
		if err != nil {
			return v, refuse(ErrUnavailable, "ledger unavailable; check again")
		}
		f := lineFacts(ln)
		v.st = State{Opened: f.Opened, Early: f.Early, Late: ln.Post, Serving: f.Serving, Old: min(f.Old, f.Serving), Perm: f.Perm, Lost: true}
	}
	now := time.Now()
	p, _ := s.paces.LoadOrStore(program, &linePace{})
	v.pace = p.(*linePace).see(v.st.Serving, now)
	// Sold is what went from left and held; stock that comes back starts
	// the estimate again (as a line made again does the pace's).
	d, _ := s.drains.LoadOrStore(program, &drainPace{fast: linePace{span: drainFastSpan}})
	v.drain, v.peak = d.(*drainPace).see(-(v.stock.Remaining + v.stock.Held), now)
	return v, nil
}

// lineReadTimeout bounds a replica's read of a line from Redis.
const lineReadTimeout = 300 * time.Millisecond

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

// lineFacts are the facts a lost line is made again from: every count past
// what the ledger reserved, the serving counter as the pacer last saw it,
// and the late places reserved since then as a gap (given or not, nobody
// can tell).
func lineFacts(ln ledger.QueueLine) Facts {
	f := Facts{Pre: ln.PreCap, Post: ln.PostCap, Serving: ln.Serving, Old: ln.Old}
	switch {
	case ln.Opened:
		f.Opened, f.Early = true, ln.Early
	case ln.PostCap > 0:
		// It opened after the pacer last looked: late places were
		// reserved, so every early place came before them.
		f.Opened, f.Early = true, ln.PreCap
	}
	if f.Opened && ln.PostCap > ln.Post {
		f.GapLo, f.GapHi = f.Early+ln.Post+1, f.Early+ln.PostCap
	}
	if ln.EarlyGapHi > 0 {
		// Lost before its opening once: the early joins the ledger had seen
		// are drawn at random; the places reserved after them keep their
		// order and are a gap.
		f.Perm = ln.Perm
		if ln.EarlyGapHi > ln.Perm {
			f.EGapLo, f.EGapHi = ln.Perm+1, ln.EarlyGapHi
		}
	}
	return f
}

// restoreLine makes the line of c's room in Redis from the ledger's facts
// (a new room, or a line Redis lost), then puts the admissions spent back.
func (s *Rooms) restoreLine(ctx context.Context, c room) error {
	ln, err := s.ledger.RoomLine(ctx, c.Program, c.id)
	if err != nil {
		return err
	}
	if !ln.Opened && ln.PreCap > ln.Early && ln.EarlyGapHi == 0 {
		// Lost before the opening (as far as the ledger saw) with early
		// places reserved past the early joins it saw: those may or may not
		// have been given. The first such loss fixes the gap.
		if ln, err = s.ledger.SetEarlyGap(ctx, c.Program, c.id, ln.Early, ln.PreCap); err != nil {
			return err
		}
	}
	f := lineFacts(ln)
	made, err := s.store.Restore(ctx, c.Program, c.id, f, time.Now(), c.Window)
	if err != nil || !made {
		return err
	}
	if ln.PreCap > 0 || ln.PostCap > 0 {
		s.log.WarnContext(ctx, "queue: line restored from the ledger (Redis had lost it)", "program", c.Program.String(),
			"early", f.Pre, "late", f.Post, "serving", f.Serving, "gap_from", f.GapLo, "gap_to", f.GapHi)
	}
	spends, err := s.ledger.AdmissionSpends(ctx, c.Program, c.id)
	if err != nil {
		return err
	}
	spent := make([]Spent, 0, len(spends))
	for _, sp := range spends {
		spent = append(spent, Spent{Buyer: sp.Buyer, Position: sp.Position, Request: sp.Request})
	}
	return s.store.Respend(ctx, c.Program, spent)
}

// resumeLine fences the line of c's room after Redis changed under it (a
// failover, a restart from files): every place the ledger reserved counts
// as given, so none is given twice; a line still before its opening keeps
// the early joins it has drawn at random, and the ledger records that (as
// a loss before the opening does).
func (s *Rooms) resumeLine(ctx context.Context, c room) error {
	ln, err := s.ledger.RoomLine(ctx, c.Program, c.id)
	if err != nil {
		return err
	}
	early, opened, fenced, err := s.store.Resume(ctx, c.Program, c.id, ln.PreCap, ln.PostCap)
	if errors.Is(err, ErrLost) {
		return s.restoreLine(ctx, c)
	}
	if err != nil || !fenced {
		return err
	}
	s.log.WarnContext(ctx, "queue: line fenced after Redis changed under it (failover or restart)", "program", c.Program.String(),
		"early_reserved", ln.PreCap, "late_reserved", ln.PostCap)
	if !opened && ln.PreCap > early && ln.EarlyGapHi == 0 {
		_, err = s.ledger.SetEarlyGap(ctx, c.Program, c.id, early, ln.PreCap)
	}
	return err
}

// reservePlaces reserves more places of a kind for program's line in the
// ledger, then lets Redis hand them out. The block grows while joins come
// fast (about one reservation a second per replica at any join rate) and
// shrinks when they slow, so a lost line skips few places.
func (s *Rooms) reservePlaces(ctx context.Context, c room, early bool) error {
	program := c.Program
	key := program.String() + "/late"
	if early {
		key = program.String() + "/early"
	}
	// One reservation for every joiner waiting on it: not cut short by the
	// first one's client leaving.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err, _ := s.reserving.Do(key, func() (any, error) {
		b, _ := s.blocks.LoadOrStore(key, &placeBlock{n: minPlaceBlock})
		blk := b.(*placeBlock)
		blk.mu.Lock()
		switch since := time.Since(blk.at); {
		case since < time.Second:
			blk.n = min(blk.n*2, maxPlaceBlock)
		case since > 5*time.Second:
			blk.n = max(blk.n/2, minPlaceBlock)
		}
		blk.at = time.Now()
		n := blk.n
		blk.mu.Unlock()
		upTo, err := s.ledger.ReserveQueuePlaces(ctx, program, c.id, early, n)
		if err != nil {
			return nil, err
		}
		err = s.store.Reserve(ctx, program, c.id, early, upTo)
		if errors.Is(err, ErrLost) {
			return nil, s.restoreLine(ctx, c) // made past every reserved place, this block's too
		}
		return nil, err
	})
	return err
}

// The places one reservation adds: grown and shrunk by how fast they go.
const (
	minPlaceBlock = 64
	maxPlaceBlock = 16384
)

type placeBlock struct {
	mu sync.Mutex
	at time.Time
	n  int64
}

// settleAdmission ends request's use of buyer's admission in Redis; when
// that gives the admission back (the last copy of the request in flight
// was refused, none committed), the ledger's spend goes too (inLedger).
// A failure leaves it spent: the buyer retries the request.
func (s *Rooms) settleAdmission(ctx context.Context, c room, buyer, request keys.ID, how Outcome, inLedger bool) {
	// Settled even when the client has gone: until then the pacer counts
	// the buyer as admitted-but-unused and the admission is not given back.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	released, err := s.store.Settle(ctx, c.Program, buyer, request, how)
	if errors.Is(err, ErrLost) {
		// Redis lost the line since this request spent: the ledger's spend
		// is all there is, and a refused request gives it back.
		released, err = how == Refused, nil
	}
	if err != nil {
		s.log.WarnContext(ctx, "settle admission", "program", c.Program.String(), "err", err)
		return
	}
	if released && inLedger {
		if err := s.ledger.ReleaseAdmission(ctx, c.Program, c.id, buyer, request); err != nil {
			s.log.WarnContext(ctx, "release admission", "program", c.Program.String(), "err", err)
		}
	}
}

// settleTimeout bounds a settle made after its request's client left.
const settleTimeout = 2 * time.Second

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// room is a program's waiting room as a replica keeps it: its settings and
// the Signer of its secret.
type room struct {
	ledger.QueueConfig
	id   keys.ID // the room (Room of the settings)
	sign *Signer
}

func roomOf(c ledger.QueueConfig) room {
	secret, err := hex.DecodeString(c.Secret)
	if err != nil {
		secret = []byte(c.Secret)
	}
	return room{QueueConfig: c, id: c.Room(), sign: NewSigner(secret)}
}

// queueConfig is program's waiting room (cached for a second), or
// ErrNoRoom.
func (s *Rooms) config(ctx context.Context, program keys.ID) (room, error) {
	if s == nil {
		return room{}, ErrNoRoom // no waiting rooms at all
	}

	return s.queues.get(ctx, program, func(ctx context.Context) (room, error) {
		c, err := s.ledger.Queue(ctx, program)
		if errors.Is(err, ledger.ErrNotFound) {
			return room{QueueConfig: c}, ErrNoRoom
		}
		if err != nil {
			return room{QueueConfig: c}, refuse(ErrUnavailable, "ledger unavailable; repeat the request")
		}
		return roomOf(c), nil
	})
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

var (
	lockQueue = keys.MustID("queue")
	lockPacer = keys.MustID("pacer")
)

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
	advance := func() (Step, error) {
		return s.store.Advance(ctx, c.Program, c.id, now, c.OpensAt, most, limit, floor, c.Window, ps.SoldOut())
	}
	step, err := advance()
	switch {
	case errors.Is(err, ErrLost):
		// Redis has no line, or another room's: a room made again since
		// the rooms were listed must not have its line replaced by this
		// older room's. The ledger says which room is current.
		if cur, cerr := s.ledger.Queue(ctx, c.Program); cerr != nil || cur.Room() != c.id {
			s.roomsChanged.Store(true)
			return paced{left: left}
		}
		if err = s.restoreLine(ctx, c); err == nil {
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
	switch {
	case now.Before(c.OpensAt) && prev >= 0:
		p.until = c.OpensAt // the opening (this first look is done)
	case p.soldOut && step.Serving == prev:
		p.until, p.check = now.Add(soldOutStep), now.Add(soldOutCheck) // stock comes back
	case !p.soldOut && step.Joined == step.Serving && prev >= 0:
		p.until = now.Add(emptyStep) // someone joins
	}
	return paced{waiting: max(step.Joined-step.Serving, 0), left: left, unused: step.Unused, abandoned: step.Abandoned}
}

// ttlCache keeps one value per program for a short time, loading it once
// at a time.
type ttlCache[V any] struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[keys.ID]*ttlEntry[V]
	// slow: the last load to end took longer than staleAfter or failed.
	// A caller then waits for no reload, since every purchase at the door
	// would otherwise pay staleAfter while the source stays slow
	// (stockbench faults, PostgreSQL 500 ms slower: every 503 took 252 ms,
	// where the wait budget promises one at once). The next load that
	// ends in time clears it.
	slow atomic.Bool
}

type ttlEntry[V any] struct {
	done    chan struct{} // closed when the load ended: v and err are set
	started time.Time     // made (and its load started) then: its value is never older than ttl
	v       V
	err     error
	// last is the value this entry replaces (nil: none, or it failed),
	// answered while this one's load is slow or fails.
	last *ttlValue[V]
}

type ttlValue[V any] struct {
	v   V
	err error
}

// staleAfter is how long a caller waits for a reload before it is
// answered the value the reload replaces: a ledger that is slow or cut
// off (a failover, a lost link) keeps the door at its last known setting
// instead of holding every purchase for the load's 5 s. Every purchase of
// a queued program meets the door before the ledger's wait budget
// (250 ms) starts, so this wait adds to it at the onset of a slow ledger:
// at 250 ms, the 503s of a black-holed link's first second took 500 ms
// (stockbench faults). A room's row is read in about a millisecond.
const staleAfter = 50 * time.Millisecond

func newTTLCache[V any](ttl time.Duration) *ttlCache[V] {
	return &ttlCache[V]{ttl: ttl, m: map[keys.ID]*ttlEntry[V]{}}
}

// get returns k's value, loading it when the one remembered is older than
// ttl. A caller waits for a load in flight only if it started within ttl,
// so every answer reflects the source as of ttl ago or later, but while
// the source does not answer within staleAfter (or fails): then it is
// the last value the source gave, at once while the source stays slow.
func (c *ttlCache[V]) get(ctx context.Context, k keys.ID, load func(context.Context) (V, error)) (V, error) {
	c.mu.Lock()
	e := c.m[k]
	if e == nil || time.Since(e.started) > c.ttl {
		if e == nil && len(c.m) >= ttlCacheMax {
			c.sweep()
		}
		n := &ttlEntry[V]{started: time.Now(), done: make(chan struct{}), last: lastOf(e)}
		c.m[k] = n
		e = n
		// One load for every caller, not cut short by any of them
		// leaving; it ends by itself within 5 s.
		go c.load(context.WithoutCancel(ctx), k, e, load)
	}
	c.mu.Unlock()
	if e.last == nil {
		<-e.done
		return e.v, e.err
	}
	select {
	case <-e.done:
		// Loaded already, the common case: no timer for it (this is one
		// call per purchase at the door).
		if e.err == nil || errors.Is(e.err, ErrNoRoom) {
			return e.v, e.err
		}
		return e.last.v, e.last.err
	default:
	}
	if c.slow.Load() {
		return e.last.v, e.last.err
	}
	t := time.NewTimer(staleAfter)
	defer t.Stop()
	select {
	case <-e.done:
		if e.err == nil || errors.Is(e.err, ErrNoRoom) {
			return e.v, e.err
		}
	case <-t.C:
		// The load has run staleAfter: the source is slow now, whatever
		// its last load said, and the callers after this one are answered
		// at once until a load ends in time. Marked only when a load
		// ended, every purchase at the door waited staleAfter for as long
		// as the first slow load ran: with the ledger's link black-holed,
		// 5 s of 503s that each took 250 ms (stockbench faults).
		c.slow.Store(true)
	}
	return e.last.v, e.last.err
}

// lastOf is what an entry replacing e answers while it loads: e's value
// when its load ended well, else what e itself answered while loading.
func lastOf[V any](e *ttlEntry[V]) *ttlValue[V] {
	if e == nil {
		return nil
	}
	select {
	case <-e.done:
		if e.err == nil || errors.Is(e.err, ErrNoRoom) {
			return &ttlValue[V]{v: e.v, err: e.err}
		}
	default:
	}
	return e.last
}

func (c *ttlCache[V]) load(ctx context.Context, k keys.ID, e *ttlEntry[V], load func(context.Context) (V, error)) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	began := time.Now()
	v, err := load(ctx)
	c.slow.Store(time.Since(began) > staleAfter || err != nil && !errors.Is(err, ErrNoRoom))
	if err != nil && !errors.Is(err, ErrNoRoom) && e.last == nil {
		c.mu.Lock()
		if c.m[k] == e {
			delete(c.m, k) // a failure is not remembered
		}
		c.mu.Unlock()
	}
	e.v, e.err = v, err
	close(e.done)
}

// ttlCacheMax bounds a ttlCache: requests name programs, so a client
// naming made-up ones must not grow it without end.
const ttlCacheMax = 10_000

// sweep drops the entries past their ttl, and if that is not enough, half
// of the rest (any: they are a ttl's worth of loads at most). c.mu is held.
func (c *ttlCache[V]) sweep() {
	for k, e := range c.m {
		if time.Since(e.started) > c.ttl {
			delete(c.m, k)
		}
	}
	for k := range c.m {
		if len(c.m) < ttlCacheMax/2 {
			break
		}
		delete(c.m, k)
	}
}

// expire makes k's value due for a reload at its next get, which answers
// as one past its ttl does (the old value while the reload is slow).
func (c *ttlCache[V]) expire(k keys.ID) {
	c.mu.Lock()
	if e := c.m[k]; e != nil {
		e.started = time.Time{}
	}
	c.mu.Unlock()
}

func (c *ttlCache[V]) forget(k keys.ID) {
	c.mu.Lock()
	delete(c.m, k)
	c.mu.Unlock()
}

// Page is what the waiting room's page of program needs: where it
// sends an admitted buyer (ErrNoRoom when the program has none).
func (s *Rooms) Page(ctx context.Context, program keys.ID) (checkoutURL string, err error) {
	c, err := s.config(ctx, program)
	return c.CheckoutURL, err
}

// mergeRooms is old with got's rooms put in (got's settings win).
func mergeRooms(old, got []ledger.QueueConfig) []ledger.QueueConfig {
	out := slices.Clone(got)
	for _, c := range old {
		if !slices.ContainsFunc(got, func(g ledger.QueueConfig) bool { return g.Program == c.Program }) {
			out = append(out, c)
		}
	}
	return out
}

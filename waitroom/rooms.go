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
	SpendAdmission(ctx context.Context, program, room keys.ID, sp ledger.Spend) (holder keys.ID, before bool, err error)
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
		queues: newTTLCache[room](time.Second), lines: newTTLCache[lineView](Refresh).answerStaleAfterIdle(LineIdle, LineIdleWait), nets: newNetMeter()}, nil
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

// LineIdle and LineIdleWait: a check that finds nobody checked the line
// on this replica for LineIdle (its memory was last reloaded longer ago)
// waits up to LineIdleWait for the reload before it is answered the last
// reading; a line checked steadily is reloaded every Refresh and answered
// the last reading once a reload takes staleAfter (or at once while
// reloads are slow). Either way the answer's as_of says which reading.
const (
	LineIdle     = 2 * Refresh
	LineIdleWait = time.Second
)

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
	// AsOf is when the replica read the line this answer comes from: at
	// most Refresh before the answer, unless a reload was slow (then the
	// freshest reading the replica has: see LineIdle).
	AsOf time.Time
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
	st, created, err := s.join(ctx, program, j)
	if errors.Is(err, errRoomChanged) {
		// This replica's room was turned off and on again: join the room
		// as it is now (its cache was dropped).
		st, created, err = s.join(ctx, program, j)
	}
	if errors.Is(err, errRoomChanged) {
		return st, created, refuse(ErrUnavailable, "the waiting room was just turned off and on again; repeat the request")
	}
	return st, created, err
}

func (s *Rooms) join(ctx context.Context, program keys.ID, j JoinAsk) (Status, bool, error) {
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
		if errors.Is(err, errRoomChanged) {
			return Status{}, false, err
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
	out := Status{Program: c.Program, Buyer: buyer, Ticket: ticket, State: Waiting, OpensAt: c.OpensAt, AsOf: v.at}
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
		// is all there is, and a refused request gives it back, as does a
		// replay of a request that committed before the spend (every copy
		// of it replays).
		released, err = how == Refused || how == replayedBefore, nil
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

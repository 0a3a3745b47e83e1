package waitroom

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// A room's line as a join or a check reads it (lineView), and the
// ledger's copy of the line's counters: restored into Redis after a loss,
// resumed after a pause, places reserved in blocks.

// lastFewSeconds: tickets the line sells in this long at its pace are its
// last few.
const lastFewSeconds = 10

// soldOutRecheck is the Retry-After of a sold-out answer: a buyer who keeps
// looking learns of a returned ticket that soon (a stream, at once).
const soldOutRecheck = 5 * time.Second

// lineView is what a replica remembers of a line: its counters in Redis
// and what its program has left in the ledger.
type lineView struct {
	room keys.ID // the room whose line this is
	// at is when this replica began to read it: the view holds every
	// change to Redis and the ledger made before then.
	at    time.Time
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
	v := lineView{room: c.id, at: time.Now()}
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
//
// c may be a room turned off and on again since this replica read it (its
// cache keeps a room a second, longer when the room's notice was lost):
// Redis's line is then the new room's, and making the old one's over it
// would drop the new line's joins and spends (helper-109). The ledger
// says which room is current; for another, restoreLine makes nothing,
// forgets the old room and answers errRoomChanged. One ledger read, paid
// only when Redis has no line of c's room.
func (s *Rooms) restoreLine(ctx context.Context, c room) error {
	switch cur, err := s.ledger.Queue(ctx, c.Program); {
	case err != nil && !errors.Is(err, ledger.ErrNotFound):
		return err
	case err != nil || cur.Room() != c.id:
		s.roomChanged(c.Program)
		return errRoomChanged
	}
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

package waitroom

import (
	"context"
	"strings"
	"sync"

	"github.com/stockgate/stockgate/keys"
)

// Line notices: when the pacer moves a line (admits buyers, closes it as
// sold out, opens it again) it publishes the program (and a replica that
// puts or deletes a room publishes "room:" and the program, so every
// replica reads the room's settings again and every pacer its rooms), and every replica
// reads the line again at its next check and wakes the event streams that
// follow it. Without them a replica tells a change within two refreshes
// (its memory of the line, then a stream's next look); with them, within
// a Redis publish. Stock that comes back (a refund, a lapsed hold) is told
// by the sale's restock notice, which reaches Wake on every replica. A
// lost notice costs only that bounded wait.

// noticeChannel is the Redis pub/sub channel of line notices.
const noticeChannel = "sg:notices:queue"

// watchers wakes the event streams of each program once its line changed:
// a stream waits on the channel of its program, closed at the change.
type watchers struct {
	mu sync.Mutex
	ch map[keys.ID]chan struct{}
}

// of is the channel closed at program's next change.
func (w *watchers) of(program keys.ID) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = map[keys.ID]chan struct{}{}
	}
	c := w.ch[program]
	if c == nil {
		c = make(chan struct{})
		w.ch[program] = c
	}
	return c
}

// wake closes program's channel: its streams look again.
func (w *watchers) wake(program keys.ID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c := w.ch[program]; c != nil {
		close(c)
		delete(w.ch, program)
	}
}

// Changes is a channel closed when program's line next changes on any
// replica (as far as notices tell): an event stream waits on it beside
// its refresh. Take a new one after each change.
func (s *Rooms) Changes(program keys.ID) <-chan struct{} { return s.watch.of(program) }

// changed makes this replica read program's line again at its next check
// (answering the old one meanwhile as a reload does) and wakes its streams.
func (s *Rooms) changed(program keys.ID) {
	s.lines.expire(program)
	s.watch.wake(program)
}

// announce tells every replica, this one first, that program's line moved.
// Best effort: a lost notice is made up for by the refresh.
func (s *Rooms) announce(ctx context.Context, program keys.ID) {
	s.changed(program)
	if err := s.store.rdb.Publish(ctx, noticeChannel, program.String()).Err(); err != nil {
		s.log.DebugContext(ctx, "publish line notice", "program", program.String(), "err", err)
	}
}

// roomNotice prefixes a notice that a program's room was put or deleted:
// every replica reads its settings again, and the pacer its rooms.
const roomNotice = "room:"

// roomChanged drops what this replica remembers of program's room.
func (s *Rooms) roomChanged(program keys.ID) {
	s.queues.forget(program)
	s.lines.forget(program)
	s.roomsChanged.Store(true)
	s.watch.wake(program)
}

// announceRoom tells every replica, this one first, that program's room
// was put or deleted.
func (s *Rooms) announceRoom(ctx context.Context, program keys.ID) {
	s.roomChanged(program)
	if err := s.store.rdb.Publish(ctx, noticeChannel, roomNotice+program.String()).Err(); err != nil {
		s.log.DebugContext(ctx, "publish room notice", "program", program.String(), "err", err)
	}
}

// RunNotices applies the line notices of every replica until ctx is done.
func (s *Rooms) RunNotices(ctx context.Context) {
	if s == nil {
		return
	}
	sub := s.store.rdb.Subscribe(ctx, noticeChannel)
	defer sub.Close()
	ch := sub.Channel() // go-redis subscribes again by itself after a broken connection
	for {
		select {
		case <-ctx.Done():
			return
		case msg, ok := <-ch:
			if !ok {
				return
			}
			// Another replica's message: parsed like any input.
			payload, room := strings.CutPrefix(msg.Payload, roomNotice)
			program, err := keys.ParseID(payload)
			switch {
			case err != nil:
			case room:
				s.roomChanged(program)
			default:
				s.changed(program)
			}
		}
	}
}

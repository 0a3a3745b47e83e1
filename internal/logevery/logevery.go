// Package logevery lets one log line of a kind through each second and
// counts the rest. A dependency that fails every request (a ledger that is
// down, a Redis node that refuses dials, a replica shedding a crowd) then
// writes a line a second saying how many it left out, not one per request:
// a flood of identical lines costs CPU when the replica has least of it,
// and buries the line that says what changed.
package logevery

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Limiter is one set of kinds, each let through once a second. Its zero
// value is ready; it is safe for concurrent use. Kinds must come from a
// bounded set (a route and a status, a format string): each is kept.
type Limiter struct {
	mu   sync.Mutex
	last map[string]time.Time // when a line of the kind last went through
	left map[string]int       // lines of the kind left out since
}

// Allow reports whether a line of kind goes through at now, and how many
// of that kind were left out before it.
func (l *Limiter) Allow(kind string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last, l.left = map[string]time.Time{}, map[string]int{}
	}
	if at, ok := l.last[kind]; ok && now.Sub(at) < time.Second {
		l.left[kind]++
		return false, 0
	}
	n := l.left[kind]
	l.last[kind], l.left[kind] = now, 0
	return true, n
}

// Wrap is l with its warnings and errors limited: one line of a message
// (and of the attributes the logger was given with With) a second, the
// next one that goes through carrying left_out. Lines below Warn pass
// untouched, and so do those that already carry left_out: their caller
// limits them by a finer kind (the gateway's failures by route and
// problem). The 87 places the sale logs a failing dependency, the relay's
// and the waiting room's among them, are then bounded without each
// counting its own.
func Wrap(l *slog.Logger) *slog.Logger {
	if _, ok := l.Handler().(*handler); ok {
		return l
	}
	return slog.New(&handler{next: l.Handler(), lim: &Limiter{}})
}

type handler struct {
	next  slog.Handler
	lim   *Limiter // shared by the handlers With and WithGroup derive
	scope string   // the attributes and groups added by With, as a key
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn || counted(r) {
		return h.next.Handle(ctx, r)
	}
	at := r.Time
	if at.IsZero() {
		at = time.Now()
	}
	ok, left := h.lim.Allow(r.Level.String()+" "+h.scope+r.Message, at)
	if !ok {
		return nil
	}
	if left > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("left_out", left))
	}
	return h.next.Handle(ctx, r)
}

// counted reports whether r already says how many lines it stands for.
func counted(r slog.Record) (found bool) {
	r.Attrs(func(a slog.Attr) bool {
		found = a.Key == "left_out"
		return !found
	})
	return found
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	scope := h.scope
	for _, a := range as {
		scope += a.String() + " "
	}
	return &handler{next: h.next.WithAttrs(as), lim: h.lim, scope: scope}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{next: h.next.WithGroup(name), lim: h.lim, scope: h.scope + name + ". "}
}

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
	"strings"
	"sync"
	"time"
)

// idleFor is how long a kind with nothing left out is kept after its last
// line: kinds that name an item (a SKU, a node) come and go.
const idleFor = time.Minute

// maxKinds is the most kinds a Limiter keeps: lines that name an item
// no other line names (a hold) are kinds of one line each, and a flood of
// them (every hold of a sale, every SKU of a drift pass) would grow the
// set by one a line for a minute. Past it, a new kind is counted under
// the broader one its caller names (AllowOr), or overflowKind.
const maxKinds = 10_000

// overflowKind is the kind of a line whose own kind found the set full
// and whose caller named no broader one.
const overflowKind = "(kinds past the limiter's most)"

// Limiter is one set of kinds, each let through once a second. Its zero
// value is ready; it is safe for concurrent use.
type Limiter struct {
	mu    sync.Mutex
	kinds map[string]*kind
	swept time.Time
}

type kind struct {
	last time.Time // when a line of the kind last went through
	left int       // lines of the kind left out since
}

// Allow reports whether a line of kind goes through at now, and how many
// of that kind were left out before it.
func (l *Limiter) Allow(k string, now time.Time) (bool, int) {
	return l.AllowOr(k, overflowKind, now)
}

// AllowOr is Allow, counting a line under broader when its own kind k is
// new and the set holds maxKinds already: a line about one SKU then
// shares a kind with its message's other lines rather than with every
// other message (a breaker's change of state kept apart from a drift
// pass's flood).
func (l *Limiter) AllowOr(k, broader string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.kinds == nil {
		l.kinds = map[string]*kind{}
	}
	v := l.kinds[k]
	if v == nil && len(l.kinds) >= maxKinds {
		k = "(past the most) " + broader
		v = l.kinds[k]
	}
	if v == nil {
		l.kinds[k] = &kind{last: now}
		return true, 0
	}
	if now.Sub(v.last) < time.Second {
		v.left++
		return false, 0
	}
	n := v.left
	v.last, v.left = now, 0
	return true, n
}

// Unsaid returns, at most once a second, the kinds whose second has
// passed with lines left out and no line since to say so, and their
// counts (which it then clears): a burst followed by silence would
// otherwise never tell how many lines it lost. It forgets the kinds idle
// for a minute, so kinds that name an item do not pile up.
func (l *Limiter) Unsaid(now time.Time) map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.swept) < time.Second {
		return nil
	}
	l.swept = now
	var out map[string]int
	for k, v := range l.kinds {
		switch {
		case v.left > 0 && now.Sub(v.last) >= time.Second:
			if out == nil {
				out = map[string]int{}
			}
			out[k] = v.left
			v.left = 0
		case v.left == 0 && now.Sub(v.last) >= idleFor:
			delete(l.kinds, k)
		}
	}
	return out
}

// Wrap is l with its warnings and errors limited: one line a second of
// each kind, the next one that goes through carrying left_out. A kind is
// the level, the message, and the text attributes of the line and of the
// logger (With): the item it is about (a SKU, a node, a primary, a state),
// not its error, numbers or times, which differ from line to line of one
// cause. Lines below Warn pass untouched, and so do those that already
// carry left_out: their caller limits them by a kind of its own (the
// gateway's failures by route and problem). Lines left out with no later
// line of their kind to say so are counted in a "log lines left out" line,
// written with the next warning or error of any kind a second or more
// later. The places the sale, the relay and the waiting rooms log a
// failing dependency are then bounded without each counting its own.
func Wrap(l *slog.Logger) *slog.Logger {
	if _, ok := l.Handler().(*handler); ok {
		return l
	}
	return slog.New(&handler{next: l.Handler(), root: l.Handler(), lim: &Limiter{}})
}

type handler struct {
	next  slog.Handler
	root  slog.Handler // the wrapped logger's, for the "left out" lines
	lim   *Limiter     // shared by the handlers With and WithGroup derive
	scope string       // the text attributes and groups added by With, as a key
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
	var k strings.Builder
	k.WriteString(r.Level.String())
	k.WriteString(" ")
	k.WriteString(h.scope)
	k.WriteString(r.Message)
	broader := k.String()
	r.Attrs(func(a slog.Attr) bool {
		writeKey(&k, a)
		return true
	})
	ok, left := h.lim.AllowOr(k.String(), broader, at)
	for kind, n := range h.lim.Unsaid(at) { // after Allow: this line's own count rides on it
		lost := slog.NewRecord(at, slog.LevelWarn, "log lines left out", 0)
		lost.AddAttrs(slog.String("kind", kind), slog.Int("left_out", n))
		_ = h.root.Handle(ctx, lost)
	}
	if !ok {
		return nil
	}
	if left > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("left_out", left))
	}
	return h.next.Handle(ctx, r)
}

// perLine are the attributes that differ on every line of one kind: the
// request and trace a line was logged in (the gateway adds them, outside
// this handler), and a panic's value and stack (kilobytes each).
var perLine = map[string]bool{"request_id": true, "trace_id": true, "span_id": true, "panic": true, "stack": true}

// maxKeyText is the most of one attribute's text a kind holds.
const maxKeyText = 128

// writeKey adds a to a kind when it names an item: a text or a bool, not
// an error, a number, a time or the request.
func writeKey(k *strings.Builder, a slog.Attr) {
	if perLine[a.Key] {
		return
	}
	switch v := a.Value.Resolve(); v.Kind() {
	case slog.KindString:
		text := v.String()
		k.WriteString(" " + a.Key + "=" + text[:min(len(text), maxKeyText)])
	case slog.KindBool:
		k.WriteString(" " + a.Key + "=" + v.String())
	case slog.KindGroup:
		for _, g := range v.Group() {
			writeKey(k, g)
		}
	}
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
	var k strings.Builder
	k.WriteString(h.scope)
	for _, a := range as {
		writeKey(&k, a)
	}
	k.WriteString(" ")
	return &handler{next: h.next.WithAttrs(as), root: h.root, lim: h.lim, scope: k.String()}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{next: h.next.WithGroup(name), root: h.root, lim: h.lim, scope: h.scope + name + ". "}
}

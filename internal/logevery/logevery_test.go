package logevery

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/wait"
)

// One line of a kind a second goes through; the next one says how many
// were left out; kinds are counted apart.
func TestLimiter(t *testing.T) {
	var l Limiter
	t0 := time.Unix(1000, 0)
	if ok, n := l.Allow("ledger commit", t0); !ok || n != 0 {
		t.Fatalf("first line = %v %d, want through", ok, n)
	}
	for i := range 5 {
		if ok, _ := l.Allow("ledger commit", t0.Add(time.Duration(i+1)*100*time.Millisecond)); ok {
			t.Fatalf("line %d within the second went through", i)
		}
	}
	if ok, _ := l.Allow("other", t0.Add(time.Millisecond)); !ok {
		t.Fatal("another kind's first line was held back")
	}
	if ok, n := l.Allow("ledger commit", t0.Add(time.Second)); !ok || n != 5 {
		t.Fatalf("a second later = %v %d, want through saying 5 were left out", ok, n)
	}
}

// Wrap lets a warning or an error of a message through once a second,
// the next one saying how many it stands for; info lines, lines that
// count themselves, and other loggers' scopes are not held back.
func TestWrap(t *testing.T) {
	var out bytes.Buffer
	var mu sync.Mutex
	l := Wrap(slog.New(slog.NewJSONHandler(lockedWriter{&out, &mu}, nil)))
	lines := func(pred func(map[string]any) bool) (n int, last map[string]any) {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var e map[string]any
			if json.Unmarshal([]byte(s), &e) == nil && pred(e) {
				n, last = n+1, e
			}
		}
		return n, last
	}
	msg := func(m string) func(map[string]any) bool { return func(e map[string]any) bool { return e["msg"] == m } }

	from := time.Now()
	for range 500 {
		l.Error("ledger down", "err", "refused")
		l.Info("progress")
		l.Warn("counted by its caller", "left_out", 0)
		l.With("primary", "b").Error("ledger down", "err", "refused")
	}
	most := 1 + int(time.Since(from)/time.Second)
	if n, _ := lines(msg("ledger down")); n < 2 || n > 2*most {
		t.Errorf("1,000 errors of two loggers wrote %d lines, want one each a second (2 to %d)", n, 2*most)
	}
	if n, _ := lines(msg("progress")); n != 500 {
		t.Errorf("500 info lines wrote %d", n)
	}
	if n, _ := lines(msg("counted by its caller")); n != 500 {
		t.Errorf("500 lines that count themselves wrote %d", n)
	}
	wait.For(t, 5*time.Second, "a line saying how many it stands for", func() bool {
		l.Error("ledger down", "err", "refused")
		_, last := lines(msg("ledger down"))
		n, _ := last["left_out"].(float64)
		return n > 0
	})
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// A kind names its item: lines about two SKUs, or a breaker's two
// transitions a moment apart, both go through; the request a line was
// logged in, its error and its numbers do not make it a kind of its own.
func TestWrapKindsNameTheirItem(t *testing.T) {
	var out bytes.Buffer
	var mu sync.Mutex
	l := Wrap(slog.New(slog.NewJSONHandler(lockedWriter{&out, &mu}, nil)))
	l.Warn("drift repair", "sku", "p/a", "err", errors.New("timeout"))
	l.Warn("drift repair", "sku", "p/b", "err", errors.New("timeout"))
	l.Warn("redis breaker", "node", "n1", "from", "open", "to", "half-open")
	l.Warn("redis breaker", "node", "n1", "from", "half-open", "to", "closed")
	for i := range 50 {
		l.Error("lookup request", "request_id", fmt.Sprint(i), "err", fmt.Errorf("refused %d", i), "waited", time.Duration(i))
	}
	mu.Lock()
	defer mu.Unlock()
	text := out.String()
	for _, want := range []string{`"sku":"p/a"`, `"sku":"p/b"`, `"to":"half-open"`, `"to":"closed"`} {
		if !strings.Contains(text, want) {
			t.Errorf("no line with %s:\n%s", want, text)
		}
	}
	if n := strings.Count(text, `"lookup request"`); n > 2 {
		t.Errorf("50 failures of one kind, each in its own request, wrote %d lines", n)
	}
}

// What a burst left out is told even when no line of its kind follows:
// once its second has passed, with the next warning of any kind. Kinds
// idle for a minute are forgotten.
func TestUnsaid(t *testing.T) {
	var l Limiter
	t0 := time.Unix(1000, 0)
	for i := range 10 {
		l.Allow("burst", t0.Add(time.Duration(i)*time.Millisecond))
	}
	l.Allow("quiet", t0)
	if got := l.Unsaid(t0.Add(500 * time.Millisecond)); len(got) != 0 {
		t.Errorf("within the burst's second: %v, want nothing yet", got)
	}
	if got := l.Unsaid(t0.Add(1200 * time.Millisecond)); len(got) != 0 {
		t.Errorf("a sweep 700 ms after the last: %v, want none (once a second)", got)
	}
	if got := l.Unsaid(t0.Add(1600 * time.Millisecond)); got["burst"] != 9 || len(got) != 1 {
		t.Errorf("after the burst's second = %v, want burst: 9", got)
	}
	if got := l.Unsaid(t0.Add(3 * time.Second)); len(got) != 0 {
		t.Errorf("told twice: %v", got)
	}
	l.Unsaid(t0.Add(2 * idleFor))
	if len(l.kinds) != 0 {
		t.Errorf("kinds idle for two minutes kept: %v", l.kinds)
	}

	var out bytes.Buffer
	var mu sync.Mutex
	w := Wrap(slog.New(slog.NewJSONHandler(lockedWriter{&out, &mu}, nil)))
	for range 20 {
		w.Warn("publish failed", "channel", "c1")
	}
	wait.For(t, 5*time.Second, `a "log lines left out" line for the burst`, func() bool {
		w.Warn("something else") // any later warning tells it
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(out.String(), `"msg":"log lines left out","kind":"WARN publish failed channel=c1","left_out":19`)
	})
}

// Kinds of one line each (a line naming a hold) do not grow the set past
// maxKinds: past it, new kinds share one, let through once a second.
func TestLimiterKeepsAtMostMaxKinds(t *testing.T) {
	var l Limiter
	now := time.Unix(1000, 0)
	for i := range maxKinds {
		if ok, _ := l.Allow(fmt.Sprintf("hold=%d", i), now); !ok {
			t.Fatalf("kind %d, new, left out", i)
		}
	}
	if ok, _ := l.AllowOr("hold=new", "hold", now); !ok {
		t.Fatal("the first kind past the most left out")
	}
	if ok, _ := l.AllowOr("hold=newer", "hold", now); ok {
		t.Error("a second kind of the same message past the most, in the same second, let through")
	}
	// Another message's line is not held back by the flood (a breaker's
	// change of state during a drift pass's lines about every SKU).
	if ok, _ := l.AllowOr("redis breaker node=a to=open", "redis breaker", now); !ok {
		t.Error("another message's line past the most left out")
	}
	if n := len(l.kinds); n > maxKinds+2 {
		t.Errorf("%d kinds kept, want at most %d", n, maxKinds+2)
	}
	if ok, left := l.AllowOr("hold=later", "hold", now.Add(time.Second)); !ok || left != 1 {
		t.Errorf("a kind past the most a second later = %v, %d left out; want through, 1", ok, left)
	}
}

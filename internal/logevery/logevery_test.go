package logevery

import (
	"bytes"
	"encoding/json"
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

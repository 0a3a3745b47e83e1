package observe_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
)

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// Successful requests log nothing; slow requests and 5xx are logged as JSON
// with the request's id, the same id the client got in X-Request-Id.
func TestLogs(t *testing.T) {
	var sink syncBuffer
	slow := 24 * time.Hour
	e := systest.Start(t, systest.Options{Driver: ledger.SQLite, Tune: func(o *app.Options) {
		o.Logger = slog.New(slog.NewJSONHandler(&sink, nil))
		o.HTTP.SlowRequest = slow
	}})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 100, 2, 4)
	before := len(sink.lines())
	for i := range 20 {
		if r := e.Buy(t, sku, fmt.Sprintf("quiet-%d", i), "b", 1); r.Status != http.StatusCreated {
			t.Fatalf("buy = %d", r.Status)
		}
	}
	if n := len(sink.lines()) - before; n != 0 {
		t.Errorf("20 successful purchases logged %d lines, want 0: %v", n, sink.lines()[before:])
	}

	// A 5xx: the ledger is closed under the server.
	e.Ledger.Close()
	r := e.Do(t, http.MethodGet, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String(), map[string]string{"X-Request-Id": "req-fail-1"}, "")
	if r.Status != http.StatusServiceUnavailable || r.Header.Get("X-Request-Id") != "req-fail-1" {
		t.Fatalf("admin get on a closed ledger = %d, id %q", r.Status, r.Header.Get("X-Request-Id"))
	}
	found := false
	for _, l := range sink.lines() {
		if l["request_id"] == "req-fail-1" && l["level"] == "ERROR" && l["status"] == float64(503) {
			found = true
		}
	}
	if !found {
		t.Errorf("no ERROR line with request_id req-fail-1 and status 503: %v", sink.lines())
	}

	// A ledger that fails every request logs a line a second for them,
	// with its cause and how many it stands for, not a line each.
	failed := func() (lines []map[string]any) {
		for _, l := range sink.lines() {
			if l["msg"] == "request failed" {
				lines = append(lines, l)
			}
		}
		return lines
	}
	from, sent := time.Now(), 0
	for range 200 {
		if r := e.Do(t, http.MethodGet, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String(), nil, ""); r.Status != http.StatusServiceUnavailable {
			t.Fatalf("admin get on a closed ledger = %d", r.Status)
		}
		sent++
	}
	// A line per second begun since the first failure, at most.
	if n, most := len(failed()), 2+int(time.Since(from)/time.Second); n > most {
		t.Errorf("%d failures logged %d lines in %v, want at most %d (one a second)", sent+1, n, time.Since(from), most)
	}
	var told map[string]any
	systest.WaitFor(t, 10*time.Second, "a failure line saying how many it stands for", func() bool {
		e.Do(t, http.MethodGet, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String(), nil, "")
		for _, l := range failed() {
			if n, _ := l["left_out"].(float64); n > 0 {
				told = l
				return true
			}
		}
		return false
	})
	if told["err"] == nil || told["problem"] != "unavailable" {
		t.Errorf("a failure line without its cause (err) and problem: %v", told)
	}

	// A slow request (the threshold at 1ns: every request is slow).
	var slowSink syncBuffer
	e2 := systest.Start(t, systest.Options{Driver: ledger.SQLite, Tune: func(o *app.Options) {
		o.Logger = slog.New(slog.NewJSONHandler(&slowSink, nil))
		o.HTTP.SlowRequest = time.Nanosecond
	}})
	e2.Do(t, http.MethodGet, "/livez", map[string]string{"X-Request-Id": "req-slow-1"}, "")
	found = false
	for _, l := range slowSink.lines() {
		if l["request_id"] == "req-slow-1" && l["msg"] == "slow request" && l["level"] == "WARN" {
			found = true
		}
	}
	if !found {
		t.Errorf("no slow-request line with request_id req-slow-1: %v", slowSink.lines())
	}
}

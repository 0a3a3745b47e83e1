package waitroom_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/e2e/systest"
)

// queueStream is a buyer's event stream of its place in line.
type queueStream struct {
	resp   *http.Response
	lines  *bufio.Scanner
	cancel context.CancelFunc
	// last is the previous event's data without its as_of: a stream
	// sends an event only when the standing changed.
	last string
}

func openQueueStream(t *testing.T, e *systest.Env, program, ticket string) *queueStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.URL+"/v1/programs/"+program+"/queue/"+ticket+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		cancel()
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("events = %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	s := &queueStream{resp: resp, lines: bufio.NewScanner(resp.Body), cancel: cancel}
	t.Cleanup(func() { cancel(); resp.Body.Close() })
	return s
}

// next reads the next status event; ok false once the stream ended.
func (s *queueStream) next(t *testing.T) (q queueReply, ok bool) {
	t.Helper()
	event := ""
	for s.lines.Scan() {
		line := s.lines.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && event == "status":
			data := []byte(strings.TrimPrefix(line, "data: "))
			var m map[string]any
			if err := json.Unmarshal(data, &q); err != nil || json.Unmarshal(data, &m) != nil {
				t.Fatalf("event data %q: %v", line, err)
			}
			if _, ok := m["as_of"].(string); !ok {
				t.Fatalf("event data %q: no as_of", line)
			}
			delete(m, "as_of")
			same, _ := json.Marshal(m)
			if string(same) == s.last {
				t.Fatalf("event %s: the standing did not change since the last event (only as_of moves)", line)
			}
			s.last = string(same)
			return q, true
		case strings.HasPrefix(line, "data: "):
			t.Fatalf("unexpected %s event: %s", event, line)
		}
	}
	return q, false
}

// A buyer follows its place as Server-Sent Events: waiting before the
// opening, then admitted with its token, and the stream ends; a buyer
// behind it sees waiting, then sold-out the moment the last ticket
// sells; a stream of a line's buyer ends when the server drains; a bad
// ticket gets its problem, not a stream.
func TestQueueEvents(t *testing.T) {
	t.Parallel() // its own env and programs: it overlaps the others' waits
	e := systest.Start(t, systest.Options{Driver: "sqlite", Pacer: true})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 1, 1, 1)
	program := sku.Program.String()
	now := time.Now().UTC()
	putQueue(t, e, sku.Program, fmt.Sprintf(`{"join_from":%q,"opens_at":%q,"rate_per_second":100,"window_seconds":60,"per_remaining":1}`,
		now.Format(time.RFC3339), now.Add(2*time.Second).Format(time.RFC3339Nano)))
	_, ann := queueJoin(t, e, sku.Program, "ann")
	s := openQueueStream(t, e, program, ann.Ticket)
	q, ok := s.next(t)
	if !ok || q.State != "waiting" {
		t.Fatalf("first event = %+v %v, want waiting", q, ok)
	}
	for ok && q.State == "waiting" {
		q, ok = s.next(t)
	}
	if !ok || q.State != "admitted" || q.Admission == "" || q.Position != 1 {
		t.Fatalf("after waiting: %+v %v, want admitted at 1", q, ok)
	}
	if _, ok := s.next(t); ok {
		t.Fatal("the stream went on after admission")
	}
	annToken := q.Admission

	// bob joined after the opening: behind ann, held back while ann may
	// still buy the one ticket.
	_, bob := queueJoin(t, e, sku.Program, "bob")
	b := openQueueStream(t, e, program, bob.Ticket)
	q, ok = b.next(t)
	if !ok || q.State != "waiting" || q.Position != 2 || q.Ahead == nil || *q.Ahead != 0 {
		t.Fatalf("bob's first event = %+v %v", q, ok)
	}
	if r := buyWith(t, e, sku, "ann-1", "ann", 1, annToken); r.Status != http.StatusCreated {
		t.Fatalf("ann buys = %d %s", r.Status, r.Body)
	}
	if q, ok = b.next(t); !ok || q.State != "sold-out" {
		t.Fatalf("bob after the last sale = %+v %v", q, ok)
	}
	// Bob's stream stays open (a refund would re-open the line for him:
	// TestQueueSoldOutToldAtOnceOnEveryStream); he may close it.
	b.cancel()

	// A bad ticket is a problem.
	r := e.Do(t, http.MethodGet, "/v1/programs/"+program+"/queue/forged.x/events", nil, "")
	if r.Status != http.StatusBadRequest || systest.ProblemKind(r) != "invalid-queue-ticket" {
		t.Fatalf("events of a forged ticket = %d %s", r.Status, r.Body)
	}

	// A stream ends when the server drains.
	other := systest.NewSKU(t)
	e.PutSKU(t, other, 5, 1, 1)
	putQueue(t, e, other.Program, fmt.Sprintf(`{"join_from":%q,"opens_in_seconds":3600,"rate_per_second":1,"window_seconds":60,"per_remaining":1}`,
		now.Format(time.RFC3339)))
	_, cy := queueJoin(t, e, other.Program, "cy")
	c := openQueueStream(t, e, other.Program.String(), cy.Ticket)
	if q, ok := c.next(t); !ok || q.State != "waiting" {
		t.Fatalf("cy's first event = %+v %v", q, ok)
	}
	e.Server.SetReady(false)
	if _, ok := c.next(t); ok {
		t.Fatal("a stream went on while the server drained")
	}
}

// heard is when a stream first said a state, read on its own goroutine.
type heard struct {
	state string
	at    time.Time
}

// follow reads s until it says one of want (or ends), reporting each state
// it hears with the time it heard it.
func follow(t *testing.T, s *queueStream, out chan<- heard, want ...string) {
	for {
		q, ok := s.next(t)
		if !ok {
			out <- heard{state: "ended", at: time.Now()}
			return
		}
		for _, w := range want {
			if q.State == w {
				out <- heard{state: q.State, at: time.Now()}
				return
			}
		}
	}
}

// Sold-out is told at once, on every replica: the streams of buyers
// waiting on one replica hear it within a second of the last sale's answer
// on another (a third one paces), and their streams stay open; a polling
// buyer is told when to look again. A refund then re-opens the line: the
// next buyer's stream hears admitted as promptly.
func TestQueueSoldOutToldAtOnceOnEveryStream(t *testing.T) {
	t.Parallel() // its own env and programs: it overlaps the others' waits
	dsn := systest.LedgerDSN(t, "sqlite")
	systest.Start(t, systest.Options{Driver: "sqlite", DSN: dsn, Pacer: true}) // paces; a and b do not
	a := systest.Start(t, systest.Options{Driver: "sqlite", DSN: dsn})
	b := systest.Start(t, systest.Options{Driver: "sqlite", DSN: dsn})
	sku := systest.NewSKU(t)
	const total, buyers = 2, 10
	a.PutSKU(t, sku, total, 1, 1)
	putQueue(t, a, sku.Program, `{"opens_in_seconds":0,"rate_per_second":1000,"window_seconds":60,"per_remaining":1}`)
	tickets := make([]string, buyers)
	for i := range buyers {
		r, q := queueJoin(t, a, sku.Program, fmt.Sprintf("s%d", i))
		if r.Status != http.StatusCreated {
			t.Fatalf("join %d = %d %s", i, r.Status, r.Body)
		}
		tickets[i] = q.Ticket
	}
	var admissions []queueReply
	for i := range total {
		admissions = append(admissions, admitted(t, a, sku.Program, fmt.Sprintf("s%d", i)))
	}
	// The waiting buyers follow their places on b.
	got := make(chan heard, buyers)
	streams := map[int]*queueStream{}
	for i := total; i < buyers; i++ {
		s := openQueueStream(t, b, sku.Program.String(), tickets[i])
		if q, ok := s.next(t); !ok || q.State != "waiting" {
			t.Fatalf("s%d's first event = %+v %v", i, q, ok)
		}
		streams[i] = s
	}
	for i := total; i < buyers; i++ {
		go follow(t, streams[i], got, "sold-out")
	}
	var last time.Time
	var orders []string
	for i, q := range admissions {
		r := buyWith(t, a, sku, fmt.Sprintf("sk%d", i), fmt.Sprintf("s%d", i), 1, q.Admission)
		if r.Status != http.StatusCreated {
			t.Fatalf("s%d buys = %d %s", i, r.Status, r.Body)
		}
		last = time.Now()
		orders = append(orders, systest.OrderID(r))
	}
	var slowest time.Duration
	for range buyers - total {
		h := <-got
		if h.state != "sold-out" {
			t.Fatalf("a stream %s before it heard sold-out", h.state)
		}
		slowest = max(slowest, h.at.Sub(last))
	}
	t.Logf("every stream on the other replica heard sold-out within %v of the last sale", slowest)
	if slowest > time.Second {
		t.Errorf("a stream heard sold-out %v after the last sale, want within 1s", slowest)
	}
	// A polling buyer is told sold-out, and when to look again.
	if r, q := queueCheck(t, b, sku.Program, tickets[total]); q.State != "sold-out" || r.Header.Get("Retry-After") == "" {
		t.Fatalf("a check after the sold-out = %d %s (Retry-After %q)", r.Status, r.Body, r.Header.Get("Retry-After"))
	}

	// s0's refund brings a ticket back: the next place, s2, hears
	// admitted on the stream it kept open.
	next := total
	go follow(t, streams[next], got, "admitted")
	if r := a.Do(t, http.MethodPost, "/v1/orders/"+orders[0]+"/refund", map[string]string{"Idempotency-Key": "s0-refund"},
		`{"buyer":"s0"}`); r.Status != http.StatusOK {
		t.Fatalf("refund = %d %s", r.Status, r.Body)
	}
	back := time.Now()
	h := <-got
	if h.state != "admitted" {
		t.Fatalf("s%d's stream: %s, want admitted after the refund", next, h.state)
	}
	t.Logf("the next buyer's stream heard admitted %v after the refund", h.at.Sub(back))
	if d := h.at.Sub(back); d > time.Second {
		t.Errorf("s%d heard admitted %v after the refund, want within 1s", next, d)
	}
}

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

	"github.com/stockgate/stockgate/internal/systest"
)

// queueStream is a buyer's event stream of its place in line.
type queueStream struct {
	resp   *http.Response
	lines  *bufio.Scanner
	cancel context.CancelFunc
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
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &q); err != nil {
				t.Fatalf("event data %q: %v", line, err)
			}
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
	if _, ok := b.next(t); ok {
		t.Fatal("the stream went on after sold-out")
	}

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

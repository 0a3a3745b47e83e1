package observe_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/client/webhook"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
	"github.com/stockgate/stockgate/tracing"
	"github.com/stockgate/stockgate/tracing/otelenv"
)

// otlpReceiver is a collector's OTLP/HTTP endpoint: it decodes what the
// exporter sends and keeps the spans.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/v1/traces" {
		http.NotFound(w, req)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		z, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = z
	}
	raw, _ := io.ReadAll(body)
	var ex coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &ex); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range ex.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			r.spans = append(r.spans, ss.Spans...)
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *otlpReceiver) named(name string) []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range r.spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// With the standard OTEL_* variables naming a collector, a purchase that
// arrives with a W3C traceparent continues that trace: its request span is
// the caller's child, the gate call and its commit (its wait for and part
// in a ledger batch) are the request's children, the ledger batch that
// commits it and that commit span link to each other, and the webhook delivery of
// its event is a span of the purchase's trace, a child of its request's
// span, whose traceparent goes out to the receiver; the batch's SQL
// statements and COMMIT are spans of the batch, and the gate call's Redis
// commands spans of the gate call (redisotel). A refund's delivery is
// likewise a span of the refund's trace, and a waiting room's join has
// its Redis commands as its spans.
func TestTracingFollowsAPurchase(t *testing.T) {
	recv := &otlpReceiver{}
	collector := httptest.NewServer(recv)
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20") // ms: the test waits for the spans
	shutdown, err := otelenv.Setup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = shutdown(context.Background()) }()
	if !tracing.Enabled() {
		t.Fatal("tracing is off with OTEL_EXPORTER_OTLP_ENDPOINT set")
	}

	var hookMu sync.Mutex
	var hookParents []string
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hookMu.Lock()
		hookParents = append(hookParents, r.Header.Get("Traceparent"))
		hookMu.Unlock()
	}))
	defer hook.Close()
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, Relay: true, Tune: func(o *app.Options) {
		o.Relay.WebhookURLs, o.Relay.WebhookSecret = []string{hook.URL}, webhook.NewSecret()
		o.Relay.Poll = 20 * time.Millisecond
	}})
	sku := stock.SKU{Program: keys.MustID("traced"), Ticket: keys.MustID("ga")}
	e.PutSKU(t, sku, 10, 2, 4)

	// Probes and scrapes first: untraced, so by the time the purchase's
	// spans are in (one exporter, in order) none of theirs is.
	for _, path := range []string{"/livez", "/readyz", "/metrics"} {
		if r := e.Do(t, http.MethodGet, path, nil, ""); r.Status != http.StatusOK {
			t.Fatalf("GET %s = %d %s", path, r.Status, r.Body)
		}
	}
	const caller, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	r := e.Do(t, http.MethodPost, "/v1/skus/traced/ga/purchases", map[string]string{
		"Idempotency-Key": "traced-1", "Traceparent": "00-" + caller + "-" + callerSpan + "-01",
	}, `{"buyer":"b1","quantity":1}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("purchase = %d %s", r.Status, r.Body)
	}

	var request, deduct, commit, batch, deliver *tracepb.Span
	systest.WaitFor(t, 20*time.Second, "the purchase's spans and its webhook delivery's", func() bool {
		request, deduct, batch, deliver = nil, nil, nil, nil
		for _, s := range recv.named("POST /v1/skus/:program/:ticket/purchases") {
			if hex.EncodeToString(s.TraceId) == caller {
				request = s
			}
		}
		if request == nil {
			return false
		}
		for _, s := range recv.named("gate.deduct") {
			if bytes.Equal(s.ParentSpanId, request.SpanId) {
				deduct = s
			}
		}
		commit = nil
		for _, s := range recv.named("ledger.commit takes") {
			if bytes.Equal(s.ParentSpanId, request.SpanId) && bytes.Equal(s.TraceId, request.TraceId) {
				commit = s
			}
		}
		if commit == nil {
			return false
		}
		for _, s := range recv.named("ledger.batch takes") {
			for _, l := range s.Links {
				if bytes.Equal(l.SpanId, commit.SpanId) && bytes.Equal(l.TraceId, commit.TraceId) {
					batch = s
				}
			}
		}
		hookMu.Lock()
		parents := append([]string(nil), hookParents...)
		hookMu.Unlock()
		for _, s := range recv.named("webhook.deliver") {
			for _, p := range parents {
				if strings.Contains(p, hex.EncodeToString(s.TraceId)+"-"+hex.EncodeToString(s.SpanId)) {
					deliver = s
				}
			}
		}
		return deduct != nil && batch != nil && deliver != nil && len(dbUnder(recv, batch, "postgresql")) > 0 &&
			len(dbUnder(recv, deduct, "redis")) > 0
	})
	// The delivery is the purchase's: one trace from the caller to the
	// receiver, though the relay posted it from the outbox later.
	if !bytes.Equal(deliver.TraceId, request.TraceId) || !bytes.Equal(deliver.ParentSpanId, request.SpanId) {
		t.Errorf("webhook.deliver is in trace %x under span %x, want the purchase's trace %s under its request span %x",
			deliver.TraceId, deliver.ParentSpanId, caller, request.SpanId)
	}
	// A refund (a batch of the refund lane, written with emit) is traced
	// the same way: its order.refunded delivery is in the refund's trace.
	const refundCaller = "5cf92f3577b34da6a3ce929d0e0e4737"
	if r := e.Do(t, http.MethodPost, "/v1/orders/"+systest.OrderID(r)+"/refund", map[string]string{
		"Idempotency-Key": "traced-rf", "Traceparent": "00-" + refundCaller + "-" + callerSpan + "-01",
	}, `{"buyer":"b1"}`); r.Status != http.StatusOK {
		t.Fatalf("refund = %d %s", r.Status, r.Body)
	}
	systest.WaitFor(t, 20*time.Second, "the refund's delivery in the refund's trace", func() bool {
		var refund *tracepb.Span
		for _, s := range recv.named("POST /v1/orders/:id/refund") {
			if hex.EncodeToString(s.TraceId) == refundCaller {
				refund = s
			}
		}
		if refund == nil {
			return false
		}
		for _, s := range recv.named("webhook.deliver") {
			for _, a := range s.Attributes {
				if a.Key == "stockgate.event.type" && a.Value.GetStringValue() == ledger.EventOrderRefunded &&
					bytes.Equal(s.TraceId, refund.TraceId) && bytes.Equal(s.ParentSpanId, refund.SpanId) {
					return true
				}
			}
		}
		return false
	})
	// A join of a waiting room: its request span, with the room's Redis
	// work (redisotel) as its children.
	if r := e.Do(t, http.MethodPut, "/v1/admin/programs/traced/queue", nil,
		`{"opens_in_seconds":0,"rate_per_second":100,"window_seconds":60,"per_remaining":1}`); r.Status != http.StatusOK {
		t.Fatalf("PUT queue = %d %s", r.Status, r.Body)
	}
	const joinCaller = "6df92f3577b34da6a3ce929d0e0e4738"
	if r := e.Do(t, http.MethodPost, "/v1/programs/traced/queue", map[string]string{
		"Traceparent": "00-" + joinCaller + "-" + callerSpan + "-01",
	}, `{"buyer":"b2"}`); r.Status != http.StatusCreated {
		t.Fatalf("join = %d %s", r.Status, r.Body)
	}
	// Admin work is traced the same way: the PUT's span, with the ledger's
	// statements under it.
	systest.WaitFor(t, 20*time.Second, "the admin PUT's span with its SQL", func() bool {
		for _, s := range recv.named("PUT /v1/admin/programs/:program/queue") {
			if len(dbUnder(recv, s, "postgresql")) > 0 {
				return true
			}
		}
		return false
	})
	systest.WaitFor(t, 20*time.Second, "the join's span with its Redis commands", func() bool {
		for _, s := range recv.named("POST /v1/programs/:program/queue") {
			if hex.EncodeToString(s.TraceId) == joinCaller && len(dbUnder(recv, s, "redis")) > 0 {
				return true
			}
		}
		return false
	})
	// The background loops (sweepers every 200 ms, the relay's polls every
	// 20 ms, on the ledger and Redis) ran all along: none of their
	// commands started a trace of its own.
	recv.mu.Lock()
	for _, s := range recv.spans {
		for _, a := range s.Attributes {
			if strings.HasPrefix(a.Key, "db.system") && len(s.ParentSpanId) == 0 {
				t.Errorf("%s span %q is a root: a background loop's command started a trace", a.Value.GetStringValue(), s.Name)
				break
			}
		}
	}
	recv.mu.Unlock()
	for _, name := range []string{"GET /livez", "GET /readyz", "GET /metrics"} {
		if got := recv.named(name); len(got) > 0 {
			t.Errorf("%d spans named %q: probes and scrapes are not traced", len(got), name)
		}
	}
	// The request's commit span links back to the batch that committed it.
	back := false
	for _, l := range commit.Links {
		back = back || bytes.Equal(l.SpanId, batch.SpanId) && bytes.Equal(l.TraceId, batch.TraceId)
	}
	if !back {
		t.Errorf("the request's ledger.commit span links to %v, not to its batch", commit.Links)
	}
	// The batch's SQL, each statement and its COMMIT a span of the batch
	// (otelpgx).
	var names []string
	sawCommit := false
	for _, s := range dbUnder(recv, batch, "postgresql") {
		names = append(names, s.Name)
		sawCommit = sawCommit || strings.Contains(strings.ToUpper(s.Name), "COMMIT")
	}
	if !sawCommit {
		t.Errorf("the ledger batch's SQL spans %v: no COMMIT among them", names)
	}
	t.Logf("the ledger batch's SQL spans: %v", names)
	if got := hex.EncodeToString(request.ParentSpanId); got != callerSpan {
		t.Errorf("request span's parent = %s, want the caller's %s", got, callerSpan)
	}
	if request.Kind != tracepb.Span_SPAN_KIND_SERVER || deduct.Kind != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("kinds: request %v, gate call %v", request.Kind, deduct.Kind)
	}
	attrs := map[string]string{}
	for _, a := range request.Attributes {
		attrs[a.Key] = a.Value.String()
	}
	if !strings.Contains(attrs["http.response.status_code"], "201") || !strings.Contains(attrs["http.route"], "/purchases") {
		t.Errorf("request span attributes %v", attrs)
	}
}

// dbUnder is the spans of statements or commands whose parent is span,
// sent to the database system named (a db.system attribute: otelpgx's
// "postgresql" spans, redisotel's "redis" ones).
func dbUnder(recv *otlpReceiver, span *tracepb.Span, system string) []*tracepb.Span {
	recv.mu.Lock()
	defer recv.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range recv.spans {
		if !bytes.Equal(s.ParentSpanId, span.SpanId) || !bytes.Equal(s.TraceId, span.TraceId) {
			continue
		}
		for _, a := range s.Attributes {
			if strings.HasPrefix(a.Key, "db.system") && a.Value.GetStringValue() == system {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

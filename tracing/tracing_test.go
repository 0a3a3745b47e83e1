package tracing_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/stockgate/stockgate/tracing"
)

// Off, the calls on the request path allocate nothing (and return the
// context they were given).
func TestOffAllocatesNothing(t *testing.T) {
	tracing.Use(nil)
	ctx := context.Background()
	h := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	allocs := testing.AllocsPerRun(1000, func() {
		c, span := tracing.StartClient(ctx, "gate.deduct")
		tracing.End(span, nil)
		c, span = tracing.StartServer(c, h, "POST /x")
		span.End()
		_ = tracing.Link(c)
		tracing.AddLink(span, tracing.Link(c))
		tracing.Inject(c, h)
		if tracing.Traceparent(c) != "" || tracing.WithParent(c, h.Get("Traceparent")) != ctx {
			panic("off, a traceparent was kept or read")
		}
		if c != ctx {
			panic("off, the context changed")
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per request with tracing off, want 0", allocs)
	}
}

// A batch's span is a root of its own, linked to every request it carries
// that had a span.
func TestBatchLinksItsRequests(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tracing.Use(tp)
	defer tracing.Use(nil)
	var links []trace.SpanContext
	for range 3 {
		ctx, span := tracing.StartServer(context.Background(), http.Header{}, "POST /x")
		links = append(links, tracing.Link(ctx))
		span.End()
	}
	links = append(links, trace.SpanContext{}) // a request without a span
	_, batch := tracing.StartLinked(trace.ContextWithSpanContext(context.Background(), links[0]), "ledger.batch takes", links)
	tracing.End(batch, errors.New("commit failed"))
	var got sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "ledger.batch takes" {
			got = s
		}
	}
	if got == nil {
		t.Fatal("no batch span")
	}
	if got.Parent().IsValid() {
		t.Errorf("batch span has parent %v, want a root", got.Parent())
	}
	if len(got.Links()) != 3 {
		t.Errorf("%d links, want the 3 requests with spans", len(got.Links()))
	}
	for i, l := range got.Links() {
		if l.SpanContext.SpanID() != links[i].SpanID() {
			t.Errorf("link %d = %v, want %v", i, l.SpanContext.SpanID(), links[i].SpanID())
		}
	}
	if got.Status().Description != "commit failed" {
		t.Errorf("status %+v, want the error", got.Status())
	}
}

// A span's traceparent, kept (in an event row) and read back later,
// makes the next span a child of it in the same trace; a malformed one
// starts a trace of its own.
func TestTraceparentRoundTrip(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tracing.Use(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	defer tracing.Use(nil)
	if got := tracing.Traceparent(context.Background()); got != "" {
		t.Errorf("Traceparent without a span = %q, want \"\"", got)
	}
	ctx, req := tracing.StartServer(context.Background(), http.Header{}, "POST /x")
	kept := tracing.Traceparent(ctx)
	req.End()
	if len(kept) != 55 {
		t.Fatalf("Traceparent = %q, want a W3C traceparent", kept)
	}
	_, deliver := tracing.StartClient(tracing.WithParent(context.Background(), kept), "webhook.deliver")
	deliver.End()
	_, lone := tracing.StartClient(tracing.WithParent(context.Background(), "00-zz-bad"), "webhook.deliver")
	lone.End()
	sc := trace.SpanContextFromContext(ctx)
	spans := rec.Ended()
	if got := spans[1]; got.Parent().SpanID() != sc.SpanID() || got.SpanContext().TraceID() != sc.TraceID() {
		t.Errorf("delivery span: parent %v in trace %v, want the request's span %v in %v",
			got.Parent().SpanID(), got.SpanContext().TraceID(), sc.SpanID(), sc.TraceID())
	}
	if got := spans[2]; got.Parent().IsValid() || got.SpanContext().TraceID() == sc.TraceID() {
		t.Errorf("a malformed traceparent gave parent %v in trace %v, want a root of its own", got.Parent(), got.SpanContext().TraceID())
	}
}

// BenchmarkOff is what the request path pays with tracing off: a gate
// call's span, a request's link, an outgoing request's headers.
func BenchmarkOff(b *testing.B) {
	tracing.Use(nil)
	requestPath(b)
}

// BenchmarkOn is the same with every span sampled and recorded, to no
// exporter (what is measured is the spans, not their export).
func BenchmarkOn(b *testing.B) {
	tracing.Use(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample())))
	defer tracing.Use(nil)
	requestPath(b)
}

func requestPath(b *testing.B) {
	ctx := context.Background()
	h := http.Header{}
	b.ReportAllocs()
	for b.Loop() {
		c, span := tracing.StartClient(ctx, "gate.deduct")
		tracing.End(span, nil)
		_ = tracing.Link(c)
		tracing.AddLink(span, tracing.Link(c))
		tracing.Inject(c, h)
	}
}

// A library's tracer wrapped by ChildrenOnly records a span under one
// already in the context, and none without: a background loop's Redis
// command or SQL statement starts no trace of its own.
func TestChildrenOnly(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	lib := tracing.ChildrenOnly(tp).Tracer("redisotel")
	ctx, orphan := lib.Start(context.Background(), "evalsha")
	if orphan.IsRecording() || trace.SpanContextFromContext(ctx).IsValid() {
		t.Errorf("a span with no parent was started: recording %v, in ctx %v", orphan.IsRecording(), trace.SpanContextFromContext(ctx))
	}
	orphan.End()
	parent, request := tp.Tracer("stockgate").Start(context.Background(), "POST /x")
	_, child := lib.Start(parent, "evalsha")
	child.End()
	request.End()
	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
		if s.Name() == "evalsha" && s.Parent().SpanID() != request.SpanContext().SpanID() {
			t.Errorf("the command's span is under %v, want the request's %v", s.Parent().SpanID(), request.SpanContext().SpanID())
		}
	}
	if len(names) != 2 || names[0] != "evalsha" {
		t.Errorf("spans ended %v, want the command's under the request's and nothing else", names)
	}
}

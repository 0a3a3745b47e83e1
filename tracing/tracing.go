// Package tracing is stockgate's OpenTelemetry tracing. It is off unless
// a provider is in Use (package otelenv sets one up when the standard
// OTEL_* variables ask for it); then each HTTP request
// has a span continuing the caller's W3C traceparent, with a child for each
// gate call to Redis, each ledger batch has a span linked to the requests it
// carries, and each webhook delivery is a span of the trace of the request
// whose change wrote its event (Traceparent, WithParent), whose traceparent
// goes out with the delivery.
//
// Off, every function here returns at once and allocates nothing: the hot
// path pays one atomic load per call site.
package tracing

import (
	"context"
	"net/http"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// scope names stockgate's spans' instrumentation scope.
const scope = "github.com/stockgate/stockgate"

var (
	tracer     atomic.Pointer[trace.Tracer] // nil: off
	propagator = Propagator()
	// none is the span handed out when tracing is off: a no-op, and a
	// value made once, so handing it out allocates nothing.
	none = trace.SpanFromContext(context.Background())
)

// Propagator is what a request carries its trace in: the W3C trace
// context and baggage.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Enabled reports whether spans are recorded.
func Enabled() bool { return tracer.Load() != nil }

// Use records spans with tp from now on; nil turns tracing off.
// otelenv.Setup calls it; tests call it with a provider of their own.
func Use(tp trace.TracerProvider) {
	if tp == nil {
		tracer.Store(nil)
		return
	}
	t := tp.Tracer(scope)
	tracer.Store(&t)
}

// Start starts a span named name as a child of ctx's span (kind internal
// unless given), or, off, returns ctx and a no-op span. End it.
func Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	t := tracer.Load()
	if t == nil {
		return ctx, none
	}
	return (*t).Start(ctx, name, opts...)
}

var client = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}

// StartClient starts a span of a call to another service (Redis, a
// webhook receiver) as a child of ctx's span, or, off, returns ctx and a
// no-op span. End it.
func StartClient(ctx context.Context, name string) (context.Context, trace.Span) {
	t := tracer.Load()
	if t == nil {
		return ctx, none
	}
	return (*t).Start(ctx, name, client...)
}

// StartServer starts the span of an HTTP request, continuing the trace its
// traceparent header names (W3C Trace Context).
func StartServer(ctx context.Context, h http.Header, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	t := tracer.Load()
	if t == nil {
		return ctx, none
	}
	ctx = propagator.Extract(ctx, propagation.HeaderCarrier(h))
	return (*t).Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
}

// Inject writes ctx's trace context into h (an outgoing request's headers).
func Inject(ctx context.Context, h http.Header) {
	if tracer.Load() == nil {
		return
	}
	propagator.Inject(ctx, propagation.HeaderCarrier(h))
}

// Traceparent is ctx's span as a W3C traceparent, for work that runs
// later in another process: an event row keeps it, so the webhook
// delivery of a purchase's event joins the purchase's trace. "" when off
// or when ctx has no span.
func Traceparent(ctx context.Context) string {
	if tracer.Load() == nil {
		return ""
	}
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c["traceparent"]
}

// WithParent is ctx with the span traceparent names (Traceparent's) as
// its remote parent, so the next span started from it joins that trace.
// A malformed or empty traceparent leaves ctx as it is.
func WithParent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" || tracer.Load() == nil {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
}

// Link is ctx's span, for a span that carries work of several requests (a
// ledger batch) to link to; zero when off or when ctx has none.
func Link(ctx context.Context) trace.SpanContext {
	if tracer.Load() == nil {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(ctx)
}

// StartLinked starts a root span linked to each valid span context of
// links: the span of a batch that commits many requests' work at once.
func StartLinked(ctx context.Context, name string, links []trace.SpanContext, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	t := tracer.Load()
	if t == nil {
		return ctx, none
	}
	ls := make([]trace.Link, 0, len(links))
	for _, sc := range links {
		if sc.IsValid() {
			ls = append(ls, trace.Link{SpanContext: sc})
		}
	}
	return (*t).Start(ctx, name, trace.WithNewRoot(), trace.WithLinks(ls...), trace.WithAttributes(attrs...))
}

// AddLink links span to sc (a batch's span, known only once the batch
// ran); nothing when either is off or zero.
func AddLink(span trace.Span, sc trace.SpanContext) {
	if sc.IsValid() && span.IsRecording() {
		span.AddLink(trace.Link{SpanContext: sc})
	}
}

// End ends span, marking it failed with err when err is not nil.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// ChildrenOnly wraps tp for the libraries' instrumentations (redisotel's
// span per Redis command, otelpgx's per SQL statement): their tracers
// start a span only under one already in ctx, so a command is part of
// the trace of the request, ledger batch or delivery that sends it, and
// the background loops' commands (the sweepers', the relay's polls and
// leases, several a second on every replica) start no traces of their
// own, which would bury the requests' traces in a collector.
func ChildrenOnly(tp trace.TracerProvider) trace.TracerProvider { return childrenOnly{tp: tp} }

type childrenOnly struct {
	embedded.TracerProvider
	tp trace.TracerProvider
}

func (c childrenOnly) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return childTracer{t: c.tp.Tracer(name, opts...)}
}

type childTracer struct {
	embedded.Tracer
	t trace.Tracer
}

func (c childTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, none
	}
	return c.t.Start(ctx, name, opts...)
}

// Package tracing is stockgate's OpenTelemetry tracing. It is off unless
// the standard OTEL_* variables ask for it (Setup); then each HTTP request
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
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// scope names stockgate's spans' instrumentation scope.
const scope = "github.com/stockgate/stockgate"

var (
	tracer     atomic.Pointer[trace.Tracer] // nil: off
	propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	// none is the span handed out when tracing is off: a no-op, and a
	// value made once, so handing it out allocates nothing.
	none = trace.SpanFromContext(context.Background())
)

// Enabled reports whether spans are recorded.
func Enabled() bool { return tracer.Load() != nil }

// Use records spans with tp from now on; nil turns tracing off. Setup calls
// it; tests call it with a provider of their own.
func Use(tp trace.TracerProvider) {
	if tp == nil {
		tracer.Store(nil)
		return
	}
	t := tp.Tracer(scope)
	tracer.Store(&t)
}

// ErrExporter is Setup with OTEL_* variables that name an exporter or a
// protocol this build does not ship.
var ErrExporter = errors.New("tracing: unsupported exporter")

// Setup turns tracing on when the environment asks for it, the way the
// OpenTelemetry specification names it: OTEL_TRACES_EXPORTER (otlp, or
// console: spans as JSON on stdout), or an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) with
// no exporter named. Unlike the specification's default, no variable means
// off: a gateway in front of a flash sale should not start exporting
// because a collector address exists somewhere. OTEL_SDK_DISABLED=true and
// OTEL_TRACES_EXPORTER=none turn it off.
//
// The exporter is OpenTelemetry's autoexport, so what platforms inject
// works as the specification says: OTLP over gRPC or HTTP/protobuf (the
// default) by OTEL_EXPORTER_OTLP_PROTOCOL or OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
// each reading its own OTEL_EXPORTER_OTLP_* settings (endpoint, headers,
// timeout, TLS files); the SDK reads OTEL_TRACES_SAMPLER(_ARG),
// OTEL_SERVICE_NAME (default "stockgate") and OTEL_RESOURCE_ATTRIBUTES,
// and OTEL_BSP_* for batching.
//
// shutdown flushes what is buffered and stops the exporter; off, it does
// nothing. Call it after the HTTP server has drained.
func Setup(ctx context.Context) (shutdown func(context.Context) error, err error) {
	off := func(context.Context) error { return nil }
	exporter := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") || (exporter == "" && !endpoint) || exporter == "none" {
		return off, nil
	}
	if err := checkSettings(); err != nil {
		return nil, err
	}
	// An empty OTEL_TRACES_EXPORTER (here: with an endpoint) is autoexport's
	// otlp.
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: OTEL_TRACES_EXPORTER=%q, protocol %q (this build exports otlp over grpc or http/protobuf, console, or none): %v",
			ErrExporter, exporter, protocol(), err)
	}
	if autoexport.IsNoneSpanExporter(exp) {
		return off, nil
	}
	res, err := resource.Merge(resource.NewSchemaless(semconv.ServiceName("stockgate")), resource.Default())
	if err != nil {
		// A conflict of schema URLs still leaves a usable resource.
		res = resource.Default()
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagator)
	Use(tp)
	return func(ctx context.Context) error {
		Use(nil)
		return tp.Shutdown(ctx)
	}, nil
}

// protocol is the OTLP protocol the environment names for traces, as
// autoexport reads it ("" when unset: http/protobuf).
func protocol() string {
	return cmp.Or(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))
}

// Protocol names what Setup exports with, for the start-up log line:
// "otlp/grpc", "otlp/http/protobuf", "console" (empty when off).
func Protocol() string {
	if !Enabled() {
		return ""
	}
	switch e := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); e {
	case "", "otlp":
		return "otlp/" + cmp.Or(protocol(), "http/protobuf")
	default:
		return e
	}
}

// ErrSetting is Setup with an OTEL_* variable the SDK would take and then
// fail on: it would export elsewhere than asked, spin, or panic.
var ErrSetting = errors.New("tracing: bad setting")

// checkSettings refuses what the SDK does not: an endpoint that is not an
// http(s) URL (the exporter logged it and sent to https://localhost:4318
// instead), and batching sizes or delays below 1 (a negative queue or
// batch size panicked at start, a schedule delay of 0 or less kept a core
// busy for ever).
func checkSettings() error {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		v := os.Getenv(k)
		if v == "" {
			continue
		}
		if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%w: %s=%q is not an http:// or https:// URL", ErrSetting, k, v)
		}
	}
	for _, k := range []string{"OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"} {
		v := os.Getenv(k)
		if v == "" {
			continue
		}
		if n, err := strconv.Atoi(v); err != nil || n < 1 {
			return fmt.Errorf("%w: %s=%q is not a whole number above 0", ErrSetting, k, v)
		}
	}
	return nil
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

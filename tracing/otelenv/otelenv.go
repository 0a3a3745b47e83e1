// Package otelenv turns stockgate's tracing on from the standard OTEL_*
// variables: the exporters (OTLP over gRPC or HTTP, the console) and the
// SDK live here, apart from package tracing, so that the packages whose
// spans it records (the sale, the ledger, the gateway) do not link them.
package otelenv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/stockgate/stockgate/tracing"
)

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
	otel.SetTextMapPropagator(tracing.Propagator())
	tracing.Use(tp)
	return func(ctx context.Context) error {
		tracing.Use(nil)
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
	if !tracing.Enabled() {
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

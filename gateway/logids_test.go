package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// A line logged with a context names its request and, when the context
// carries a span, its trace and span, so a log line leads to its trace;
// without a span it names none.
func TestLogLinesNameTheirTrace(t *testing.T) {
	var buf bytes.Buffer
	log := WithRequestIDs(slog.New(slog.NewJSONHandler(&buf, nil)))
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	log.InfoContext(ctx, "traced")
	log.InfoContext(context.Background(), "untraced")
	dec := json.NewDecoder(&buf)
	var traced, untraced map[string]any
	if err := dec.Decode(&traced); err != nil {
		t.Fatal(err)
	}
	if err := dec.Decode(&untraced); err != nil {
		t.Fatal(err)
	}
	if traced["trace_id"] != tid.String() || traced["span_id"] != sid.String() {
		t.Errorf("a line logged in a span: %v, want its trace_id and span_id", traced)
	}
	if _, ok := untraced["trace_id"]; ok {
		t.Errorf("a line logged outside any span: %v, want no trace_id", untraced)
	}
}

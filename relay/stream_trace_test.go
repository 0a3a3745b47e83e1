package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/relay"
	"github.com/stockgate/stockgate/stock"
	"github.com/stockgate/stockgate/tracing"
)

// A stream delivery is a span of the trace of the request whose change
// wrote the event (its traceparent, kept on the event row), and the
// entry carries the delivery span's traceparent, so a consumer's work
// joins the purchase's trace. Tracing off, the entry has no such field.
func TestStreamEntryJoinsTheRequestsTrace(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.SharedCluster(t).Client()
	sink, err := relay.NewStream(relay.StreamOptions{Redis: rdb, Prefix: testenv.ID(t, "ev") + ":"})
	if err != nil {
		t.Fatal(err)
	}
	const trace, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	event := func(i int) ledger.Event {
		return ledger.Event{ID: keys.MustID(fmt.Sprintf("ev%d", i)), Seq: int64(i), Type: ledger.EventOrderCreated, Partition: i,
			SKU: stock.SKU{Program: keys.MustID("p"), Ticket: keys.MustID("t")}, Quantity: 1, At: time.Now(),
			Trace: "00-" + trace + "-" + parent + "-01"}
	}
	entry := func(e ledger.Event) map[string]any {
		got, err := rdb.XRange(ctx, sink.Key(e.Partition), "-", "+").Result()
		if err != nil || len(got) != 1 {
			t.Fatalf("XRANGE %s = %v, %v, want one entry", sink.Key(e.Partition), got, err)
		}
		return got[0].Values
	}

	off := event(1)
	if err := sink.Deliver(ctx, off); err != nil {
		t.Fatal(err)
	}
	if v, ok := entry(off)["traceparent"]; ok {
		t.Errorf("tracing off: the entry has traceparent %v", v)
	}

	rec := tracetest.NewSpanRecorder()
	tracing.Use(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { tracing.Use(nil) })
	on := event(2)
	if err := sink.Deliver(ctx, on); err != nil {
		t.Fatal(err)
	}
	var span sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "stream.deliver" {
			span = s
		}
	}
	if span == nil {
		t.Fatalf("no stream.deliver span among %d", len(rec.Ended()))
	}
	if span.SpanContext().TraceID().String() != trace || span.Parent().SpanID().String() != parent {
		t.Errorf("stream.deliver is in trace %s under %s, want the request's %s under %s",
			span.SpanContext().TraceID(), span.Parent().SpanID(), trace, parent)
	}
	want := "00-" + trace + "-" + span.SpanContext().SpanID().String() + "-01"
	if got, _ := entry(on)["traceparent"].(string); got != want {
		t.Errorf("the entry's traceparent = %q, want the delivery span's %q", got, want)
	}
}

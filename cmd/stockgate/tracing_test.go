package main

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/stockgate/stockgate/internal/testenv"
)

// collector is an OTLP endpoint that keeps the spans it is sent: over
// HTTP/protobuf as an http.Handler, over gRPC as a TraceServiceServer.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (c *collector) add(ex *coltracepb.ExportTraceServiceRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range ex.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			c.spans = append(c.spans, ss.Spans...)
		}
	}
}

// Export is the OTLP/gRPC trace service.
func (c *collector) Export(_ context.Context, ex *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.add(ex)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// serverSpans is the names of the HTTP requests' spans received so far.
func (c *collector) serverSpans() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var names []string
	for _, s := range c.spans {
		if s.Kind == tracepb.Span_SPAN_KIND_SERVER {
			names = append(names, s.Name)
		}
	}
	return names
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		z, err := gzip.NewReader(r.Body)
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
	c.add(&ex)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// A request's method is the client's to choose, and Go accepts one as long
// as the header limit (1 MB). With tracing on, each request's span kept it
// twice (name and http.request.method) until exported: 300 requests of a
// 900 KB method grew a gateway whose collector hung from 50 MB to 860 MB,
// and the exporter's queue holds 2,048 spans. A method other than the
// standard ones is "_OTHER" (the semantic conventions' word).
func TestTracedMadeUpMethodIsBounded(t *testing.T) {
	c := testenv.SharedCluster(t)
	col := &collector{}
	cs := httptest.NewServer(col)
	defer cs.Close()
	srv := startServe(t, "STOCKGATE_REDIS_ADDRS="+strings.Join(c.Addrs(), ","), "STOCKGATE_LOG_LEVEL=warn",
		"OTEL_EXPORTER_OTLP_ENDPOINT="+cs.URL, "OTEL_BSP_SCHEDULE_DELAY=50")
	client := &http.Client{Timeout: 5 * time.Second}
	waitUntil(t, 20*time.Second, func() bool {
		r, err := client.Get(srv.base + "/readyz")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusOK
	})
	method := strings.Repeat("X", 100_000)
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	// A route that is traced (probes and scrapes are not).
	fmt.Fprintf(conn, "%s /v1/skus/p/t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", method)
	reply, _ := io.ReadAll(conn)
	conn.Close()
	if !bytes.HasPrefix(reply, []byte("HTTP/1.1 4")) {
		t.Fatalf("a made-up method was answered %q", reply[:min(len(reply), 40)])
	}
	var span *tracepb.Span
	waitUntil(t, 10*time.Second, func() bool {
		col.mu.Lock()
		defer col.mu.Unlock()
		for _, s := range col.spans {
			if s.Kind == tracepb.Span_SPAN_KIND_SERVER && !strings.HasPrefix(s.Name, "GET ") {
				span = s
			}
		}
		return span != nil
	})
	size := len(span.Name)
	for _, a := range span.Attributes {
		size += len(a.Key) + len(a.Value.GetStringValue())
	}
	if size > 1000 {
		t.Errorf("the span of a request with a %d-byte method holds %d bytes (name %.40q...)", len(method), size, span.Name)
	}
	if !strings.HasPrefix(span.Name, "_OTHER ") {
		t.Errorf("span name %.40q, want _OTHER and the route", span.Name)
	}
}

// OTEL_EXPORTER_OTLP_PROTOCOL is what platforms inject (the OpenTelemetry
// Operator, collectors' charts), grpc as often as http/protobuf. With grpc
// the gateway exited 1 at start ("unsupported exporter"), so every pod
// crash-looped. Each protocol, and none (http/protobuf, the default):
// the gateway starts, serves, and its spans reach a collector speaking
// that protocol.
func TestTracingOverEachOTLPProtocol(t *testing.T) {
	c := testenv.SharedCluster(t)
	for _, proto := range []string{"", "http/protobuf", "grpc"} {
		t.Run(cmp.Or(proto, "unset"), func(t *testing.T) {
			col := &collector{}
			var endpoint string
			if proto == "grpc" {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				gs := grpc.NewServer()
				coltracepb.RegisterTraceServiceServer(gs, col)
				go func() { _ = gs.Serve(l) }() // ends with Stop
				t.Cleanup(gs.Stop)
				endpoint = "http://" + l.Addr().String()
			} else {
				hs := httptest.NewServer(col)
				t.Cleanup(hs.Close)
				endpoint = hs.URL
			}
			env := []string{"STOCKGATE_REDIS_ADDRS=" + strings.Join(c.Addrs(), ","), "STOCKGATE_LOG_LEVEL=info",
				"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint, "OTEL_BSP_SCHEDULE_DELAY=50"}
			if proto != "" {
				env = append(env, "OTEL_EXPORTER_OTLP_PROTOCOL="+proto)
			}
			srv := startServe(t, env...)
			client := &http.Client{Timeout: 5 * time.Second}
			waitUntil(t, 20*time.Second, func() bool {
				select {
				case err := <-srv.exited:
					t.Fatalf("with OTEL_EXPORTER_OTLP_PROTOCOL=%q the gateway exited at start: %v\n%s", proto, err, srv.logs.String())
				default:
				}
				r, err := client.Get(srv.base + "/v1/skus/p1/t1/stock")
				if err != nil {
					return false
				}
				r.Body.Close()
				return true
			})
			waitUntil(t, 10*time.Second, func() bool {
				return slices.ContainsFunc(col.serverSpans(), func(n string) bool { return strings.HasPrefix(n, "GET /v1/skus/") })
			})
			if want := "otlp/" + cmp.Or(proto, "http/protobuf"); !strings.Contains(srv.logs.String(), want) {
				t.Errorf("the start's log does not say spans go out over %s:\n%s", want, srv.logs.String())
			}
		})
	}
}

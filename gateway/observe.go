package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/maypok86/otter/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/tracing"
)

type ctxKey struct{}

// RequestID is the id of the request ctx belongs to ("" outside one).
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(ctxKey{}).(string)
	return id
}

// WithRequestIDs is l with the request id of the context added to every
// record logged with one; main gives the sale package the same logger, so
// its log lines name the request too.
func WithRequestIDs(l *slog.Logger) *slog.Logger {
	if _, ok := l.Handler().(logHandler); ok {
		return l
	}
	return slog.New(logHandler{l.Handler()})
}

// logHandler adds the request id of the context to every record logged
// with one (s.log.ErrorContext(ctx, ...)), so a 5xx can be traced, and
// with tracing on the trace and span ids, so a log line leads to its
// trace (the ledger batch's own span inside a batch's work).
type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if id := RequestID(ctx); id != "" {
		r.AddAttrs(slog.String("request_id", id))
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(as)}
}
func (h logHandler) WithGroup(n string) slog.Handler { return logHandler{h.Handler.WithGroup(n)} }

// httpMetrics are the RED metrics, by route template (never by the ids in
// the path).
type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	limited  prometheus.Counter
	// localLimits counts rate decisions the replica's own limiter made
	// because the shared one (Redis) did not answer.
	localLimits prometheus.Counter
}

func newHTTPMetrics(reg prometheus.Registerer) (*httpMetrics, error) {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockgate_http_requests_total", Help: "HTTP requests by route template, method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "stockgate_http_request_duration_seconds", Help: "HTTP request latency by route template and method.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5},
		}, []string{"route", "method"}),
		limited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockgate_http_rate_limited_total", Help: "Requests refused with 429 because their client was over its rate.",
		}),
	}
	m.localLimits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "stockgate_http_rate_local_total",
		Help: "Rate-limit decisions this replica's own limiter made because the shared limit in Redis did not answer.",
	})
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.limited, m.localLimits} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// traced is the span of each request while tracing is on (routes adds it
// only then): it continues the caller's W3C traceparent, is named by the
// route template, and carries the request id and the status.
func traced(c *gin.Context) {
	// A probe or a scrape every few seconds from every kubelet and
	// Prometheus is no one's request: traced, it filled the collector
	// with spans nobody reads.
	if probe(c.Request.URL.Path) {
		return
	}
	route := c.FullPath()
	if route == "" {
		route = "unmatched"
	}
	// A client picks the method, and Go takes one up to the header limit
	// (1 MB): taken raw, each such request's span held it twice until
	// exported, and a slow collector's queue of 2,048 spans gigabytes.
	// Any other than the standard ones is "_OTHER", as the semantic
	// conventions say.
	method := methodLabel(c.Request.Method)
	if method == "other" {
		method = "_OTHER"
	}
	ctx, span := tracing.StartServer(c.Request.Context(), c.Request.Header, method+" "+route,
		semconv.HTTPRequestMethodKey.String(method), semconv.HTTPRoute(route))
	defer span.End()
	c.Request = c.Request.WithContext(ctx)
	c.Next()
	code := c.Writer.Status()
	span.SetAttributes(semconv.HTTPResponseStatusCode(code), attribute.String("stockgate.request_id", RequestID(c.Request.Context())))
	if code >= 500 {
		span.SetStatus(codes.Error, http.StatusText(code))
	}
}

// observe gives every request an id (a valid X-Request-Id from the client
// or a new one, echoed back), counts it, and logs it only when it failed
// with a 5xx or was slow: a successful request on the hot path logs nothing.
// Failures log one line a second per route, status and problem, with the
// cause and how many the line stands for (left_out): a ledger or Redis
// that fails every request, or a crowd shed at the door, would otherwise
// write a line per request when the replica has least CPU to spare. The
// line's request_id is the first of its second; the metrics count all.
func (s *Server) observe(c *gin.Context) {
	start := time.Now()
	id := c.GetHeader("X-Request-Id")
	// Most requests bring none: not checked, since CheckID's error for an
	// empty id (fmt.Errorf) cost 4 % of a waiting-room check's CPU.
	if id == "" || keys.CheckID(id) != nil {
		var b [8]byte
		_, _ = rand.Read(b[:])
		id = hex.EncodeToString(b[:])
	}
	c.Header("X-Request-Id", id)
	c.Request = c.Request.WithContext(context.WithValue(c.Request.Context(), ctxKey{}, id))
	c.Next()
	route := c.FullPath()
	if route == "" {
		route = "unmatched"
	}
	took := time.Since(start)
	status := c.Writer.Status()
	method := methodLabel(c.Request.Method)
	s.http.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
	s.http.duration.WithLabelValues(route, method).Observe(took.Seconds())
	switch {
	case status >= 500:
		code := c.GetString(problemKey)
		ok, left := s.logs.Allow("failed "+route+" "+strconv.Itoa(status)+" "+code, start)
		if !ok {
			return
		}
		args := []any{"route", route, "method", method, "status", status, "problem", code, "duration", took.String(), "left_out", left}
		if e := c.Errors.Last(); e != nil {
			args = append(args, "err", e.Err)
		}
		s.log.ErrorContext(c.Request.Context(), "request failed", args...)
	case took >= s.opts.SlowRequest && !strings.HasSuffix(route, "/events"): // a stream is long by design
		if ok, left := s.logs.Allow("slow "+route, start); ok {
			s.log.WarnContext(c.Request.Context(), "slow request", "route", route, "method", method,
				"status", status, "duration", took.String(), "left_out", left)
		}
	}
}

// methodLabel is the method as a metric label: the standard ones as they
// are, anything else "other". A client picks the method, so taken raw it
// could make one series per made-up method.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete,
		http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "other"
}

// limiter is the per-client rate limit: a token bucket per client address
// (as gin's ClientIP sees it, which trusts X-Forwarded-For only from the
// configured proxies), kept in a bounded cache that forgets idle clients.
type limiter struct {
	perSec  rate.Limit
	burst   int
	clients *otter.Cache[string, *rate.Limiter]
}

func newLimiter(perSec float64, burst int) (*limiter, error) {
	if perSec <= 0 {
		return nil, nil
	}
	c, err := otter.New(&otter.Options[string, *rate.Limiter]{
		MaximumSize:      100_000,
		ExpiryCalculator: otter.ExpiryAccessing[string, *rate.Limiter](time.Minute),
	})
	if err != nil {
		return nil, err
	}
	return &limiter{perSec: rate.Limit(perSec), burst: burst, clients: c}, nil
}

// client is the client's bucket of l.
func (l *limiter) client(ctx context.Context, addr string) *rate.Limiter {
	b, _ := l.clients.Get(ctx, addr, otter.LoaderFunc[string, *rate.Limiter](
		func(context.Context, string) (*rate.Limiter, error) { return rate.NewLimiter(l.perSec, l.burst), nil }))
	return b
}

// probe: a health check or a metrics scrape, neither traced nor limited.
func probe(path string) bool { return path == "/livez" || path == "/readyz" || path == "/metrics" }

// limit answers 429 with Retry-After to a client over its rate: the
// budget every replica shares (Options.SharedLimit) when it answers, this
// replica's own otherwise. Health checks and metrics scrapes are not
// limited.
func (s *Server) limit(c *gin.Context) {
	if s.limiter == nil {
		return
	}
	if probe(c.Request.URL.Path) {
		return
	}
	ctx, client := c.Request.Context(), c.ClientIP()
	var wait time.Duration
	if shared := s.opts.SharedLimit; shared != nil {
		ok, retry, err := shared.Allow(ctx, client, float64(s.limiter.perSec), s.limiter.burst)
		switch {
		case err != nil:
			s.http.localLimits.Inc()
			if s.local(ctx, client, &wait) {
				return
			}
		case ok:
			return
		default:
			wait = retry
		}
	} else if s.local(ctx, client, &wait) {
		return
	}
	s.http.limited.Inc()
	writeProblem(c, http.StatusTooManyRequests, "rate-limited", "too many requests from this client", retryAfter(wait))
	c.Abort()
}

// local asks this replica's own limiter for client: allowed, or the wait
// until its next token.
func (s *Server) local(ctx context.Context, client string, wait *time.Duration) bool {
	l := s.limiter.client(ctx, client)
	if l == nil || l.Allow() {
		return true
	}
	// The real wait: when the client's next token comes.
	r := l.Reserve()
	*wait = r.Delay()
	r.Cancel()
	return false
}

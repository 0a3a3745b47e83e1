// Package gateway is stockgate's HTTP face, and only that: routes, parsing
// into validated values at the edge, answers in JSON or RFC 9457
// problem+json (problem.go maps the sale package's errors), middleware.
// Every flow is package sale's; this package imports neither the ledger
// nor the Redis stores, and it is the only one that imports gin.
package gateway

import (
	"context"
	"crypto/subtle"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stockgate/stockgate/internal/logevery"
	"github.com/stockgate/stockgate/internal/opt"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
	"github.com/stockgate/stockgate/tracing"
	"github.com/stockgate/stockgate/waitroom"
)

// OpenAPI is the API's OpenAPI 3.1 document, served at /openapi.json.
//
//go:embed openapi.json
var OpenAPI []byte

// Routes lists the method and path template of every route the server
// registers, in gin's form (":id").
func (s *Server) Routes() []string {
	var out []string
	for _, e := range []*gin.Engine{s.engine, s.admin} {
		if e == nil {
			continue
		}
		for _, r := range e.Routes() {
			if !slices.Contains(out, r.Method+" "+r.Path) {
				out = append(out, r.Method+" "+r.Path)
			}
		}
	}
	return out
}

// Options configures a Server: the HTTP face of one sale.Service.
type Options struct {
	Sale *sale.Service // required
	// Rooms are the programs' waiting rooms (package waitroom). Optional:
	// without them no program has one.
	Rooms  *waitroom.Rooms
	Logger *slog.Logger // default slog.Default(); see WithRequestIDs
	// Registry receives the HTTP metrics and is served at /metrics.
	// Default: a new registry.
	Registry *prometheus.Registry
	// TrustedProxies are the addresses or CIDRs whose X-Forwarded-For is
	// believed when telling clients apart; empty trusts none, so the client
	// is the TCP peer and the header cannot be spoofed.
	TrustedProxies []string
	// RatePerClient and RateBurst limit each client (by address) to a token
	// bucket; beyond it, 429 with Retry-After. RatePerClient 0 turns
	// limiting off.
	RatePerClient float64
	RateBurst     int
	// SharedLimit keeps those budgets outside the replica (package
	// ratelimit's, in Redis), so a client gets one budget however many
	// replicas its requests reach; when it does not answer, the replica's
	// own bucket decides. Nil: each replica limits on its own.
	SharedLimit SharedLimit
	// CodeGuesses is how many wrong access codes one client (by address)
	// may present a minute, per replica, before its code requests get 429
	// with Retry-After. Default 20.
	CodeGuesses int
	// SlowRequest is the latency above which a request is logged.
	SlowRequest time.Duration
	// AdminToken, when set, is the bearer token admin routes require.
	// Empty leaves admin routes open, for local use only.
	AdminToken string
	// MaxBodyBytes caps a request body (a seat map may be larger: 1 MiB).
	MaxBodyBytes int64
	// BodyTimeout bounds the read of a request's body, from the handler's
	// first read (408 body-timeout past it). Default 10 s.
	BodyTimeout time.Duration
	// SeparateAdmin moves /metrics and the admin routes off Handler onto
	// AdminHandler, for a listener that only the cluster can reach.
	SeparateAdmin bool
	// Relay is the outbox relay the /v1/admin/relay routes show and
	// drive (package relay's). Optional: without it they answer as for a
	// relay with no sinks.
	Relay Relay
}

// SharedLimit is a per-client rate limit kept outside the replica.
type SharedLimit interface {
	// Allow spends one request of client's budget of perSec a second
	// with bursts of burst: ok, or when the next is allowed. An error
	// decides nothing.
	Allow(ctx context.Context, client string, perSec float64, burst int) (ok bool, retryAfter time.Duration, err error)
}

// DefaultOptions are the settings a zero Options takes; main takes its flag
// defaults from them.
func DefaultOptions() Options {
	return Options{RateBurst: 100, CodeGuesses: 20, SlowRequest: time.Second, MaxBodyBytes: 4 << 10, BodyTimeout: 10 * time.Second}
}

// MinAdminToken is the shortest admin token accepted.
const MinAdminToken = 16

// Validate reports the first field that cannot work (an *opt.Error). Zero
// settings are valid: they take their defaults.
func (o Options) Validate() error {
	switch {
	case o.MaxBodyBytes != 0 && o.MaxBodyBytes < 64:
		return opt.Bad("MaxBodyBytes", "must be at least 64")
	case o.SlowRequest < 0:
		return opt.Bad("SlowRequest", "must not be negative")
	case o.BodyTimeout < 0:
		return opt.Bad("BodyTimeout", "must not be negative")
	case o.RatePerClient < 0:
		return opt.Bad("RatePerClient", "must not be negative")
	case o.RateBurst < 0:
		return opt.Bad("RateBurst", "must be at least 1")
	case o.CodeGuesses < 0:
		return opt.Bad("CodeGuesses", "must be at least 1")
	case o.AdminToken != "" && len(o.AdminToken) < MinAdminToken:
		return opt.Bad("AdminToken", fmt.Sprintf("must be at least %d characters (or empty, for local use only)", MinAdminToken))
	}
	for _, p := range o.TrustedProxies {
		if _, _, err := net.ParseCIDR(p); err != nil && net.ParseIP(p) == nil {
			return opt.Bad("TrustedProxies", fmt.Sprintf("%q is not an address or CIDR", p))
		}
	}
	return nil
}

func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.RateBurst == 0 {
		o.RateBurst = d.RateBurst
	}
	if o.CodeGuesses == 0 {
		o.CodeGuesses = d.CodeGuesses
	}
	if o.SlowRequest == 0 {
		o.SlowRequest = d.SlowRequest
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = d.MaxBodyBytes
	}
	if o.BodyTimeout == 0 {
		o.BodyTimeout = d.BodyTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	return o
}

// Server serves the API.
type Server struct {
	sale    *sale.Service
	rooms   *waitroom.Rooms // nil: no waiting rooms
	http    *httpMetrics
	limiter *limiter
	guesses *limiter // wrong access codes, per client
	log     *slog.Logger
	logs    logevery.Limiter // request failures' and slow requests' lines, one a second per kind
	opts    Options
	ready   atomic.Bool
	// ledgerDown is why the ledger takes no writes ("" when it does):
	// /readyz fails with it (SetLedger).
	ledgerDown atomic.Pointer[string]
	// draining is closed when the server stops being ready after it was:
	// long-lived streams end, so the HTTP server can drain.
	draining  chan struct{}
	drainOnce sync.Once
	engine    *gin.Engine
	admin     *gin.Engine // with SeparateAdmin: /metrics and the admin routes
}

// New validates opts and returns a Server that is not ready yet: call
// SetReady once the process is warmed up.
func New(opts Options) (*Server, error) {
	if opts.Sale == nil {
		return nil, errors.New("gateway: Options.Sale is required")
	}
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	opts = opts.withDefaults()
	s := &Server{sale: opts.Sale, rooms: opts.Rooms, log: WithRequestIDs(opts.Logger), opts: opts, draining: make(chan struct{})}
	var err error
	if s.http, err = newHTTPMetrics(opts.Registry); err != nil {
		return nil, fmt.Errorf("gateway: metrics: %w", err)
	}
	if s.limiter, err = newLimiter(opts.RatePerClient, opts.RateBurst); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if s.guesses, err = newLimiter(float64(opts.CodeGuesses)/60, opts.CodeGuesses); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	public, admin := routeSet{public: true, admin: true}, routeSet{}
	if opts.SeparateAdmin {
		public.admin, admin.admin = false, true
	}
	if s.engine, err = s.routes(public); err != nil {
		return nil, err
	}
	if admin.admin {
		if s.admin, err = s.routes(admin); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// routeSet says which routes an engine serves besides the health checks.
type routeSet struct {
	public bool // the buyers' API and the OpenAPI document
	admin  bool // /metrics and /v1/admin
}

// Handler is the HTTP handler of the API: all of it, or without /metrics
// and the admin routes with SeparateAdmin.
func (s *Server) Handler() http.Handler { return headAsGet{s.engine} }

// AdminHandler serves /metrics, the admin routes and the health checks
// with SeparateAdmin; nil without it.
func (s *Server) AdminHandler() http.Handler {
	if s.admin == nil {
		return nil
	}
	return headAsGet{s.admin}
}

// headAsGet answers a HEAD as the GET of the same path, without its body
// (RFC 9110 9.3.2: a server must support HEAD wherever GET is): gin
// routes no HEAD by itself, and answered 405, which a load balancer's
// HEAD health check reads as down (helper-106). The GET is served on a
// copy of the request; net/http's writer, which still has the HEAD,
// drops what the handler writes as the body.
type headAsGet struct{ h http.Handler }

func (g headAsGet) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodHead {
		g.h.ServeHTTP(w, r)
		return
	}
	get := r.Clone(r.Context())
	get.Method = http.MethodGet
	g.h.ServeHTTP(w, get)
}

// SetReady flips /readyz: true once warmed up, false when draining.
func (s *Server) SetReady(ready bool) {
	if was := s.ready.Swap(ready); was && !ready {
		s.drainOnce.Do(func() { close(s.draining) })
	}
}

// SetLedger tells /readyz whether the ledger takes writes: with down
// set, /readyz answers 503 naming why, and the server serves on (a
// request that reaches it is answered as the ledger allows). "" is up.
func (s *Server) SetLedger(down string) {
	if down == "" {
		s.ledgerDown.Store(nil)
		return
	}
	s.ledgerDown.Store(&down)
}

func (s *Server) routes(set routeSet) (*gin.Engine, error) {
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	if err := e.SetTrustedProxies(s.opts.TrustedProxies); err != nil {
		return nil, fmt.Errorf("gateway: trusted proxies: %w", err)
	}
	e.Use(s.bodyDeadline)
	if tracing.Enabled() {
		e.Use(traced) // off, not even a hop through it
	}
	e.Use(s.observe, s.recoverer, s.limit, strictQuery)
	e.HandleMethodNotAllowed = true
	// A path with a trailing slash is no route (404 problem), not a
	// redirect: a 301/307 to another path is HTML or a Location a client
	// of this API never follows for a POST.
	e.RedirectTrailingSlash = false
	e.NoRoute(func(c *gin.Context) { writeProblem(c, http.StatusNotFound, "not-found", "no such route", 0) })
	e.NoMethod(func(c *gin.Context) {
		writeProblem(c, http.StatusMethodNotAllowed, "method-not-allowed", "method not allowed on this route", 0)
	})

	e.GET("/livez", func(c *gin.Context) { c.String(http.StatusOK, "ok\n") })
	e.GET("/readyz", func(c *gin.Context) {
		if !s.ready.Load() {
			writeProblem(c, http.StatusServiceUnavailable, "not-ready", "starting or draining", retryAfter(time.Second))
			return
		}
		if why := s.ledgerDown.Load(); why != nil {
			writeProblem(c, http.StatusServiceUnavailable, "not-ready", "the ledger takes no writes: "+*why, retryAfter(time.Second))
			return
		}
		c.String(http.StatusOK, "ok\n")
	})

	v1 := e.Group("/v1")
	if set.admin {
		e.GET("/metrics", gin.WrapH(promhttp.HandlerFor(s.opts.Registry, promhttp.HandlerOpts{})))
		admin := v1.Group("/admin", s.requireAdmin)
		admin.PUT("/skus/:program/:ticket", noPoolQuery, s.putSKU)
		admin.GET("/skus/:program/:ticket", s.getSKU)
		admin.POST("/skus/:program/:ticket/reconcile", s.noBody, s.reconcile)
		admin.POST("/skus/:program/:ticket/end", noPoolQuery, s.noBody, s.endSale)
		admin.POST("/skus/:program/:ticket/orders", noPoolQuery, s.postOrganizerOrder)
		admin.GET("/skus/:program/:ticket/pools", s.getPools)
		admin.PUT("/skus/:program/:ticket/pools/:pool", s.putPool)
		admin.POST("/skus/:program/:ticket/pools/:pool/close", s.noBody, s.closePool)
		admin.POST("/skus/:program/:ticket/pools/:pool/codes", s.postCodes)
		admin.PUT("/programs/:program", s.putProgram)
		admin.PUT("/programs/:program/queue", s.putQueue)
		admin.GET("/programs/:program/queue", s.getQueue)
		admin.GET("/programs/:program/report", s.getReport)
		admin.DELETE("/programs/:program/queue", s.noBody, s.deleteQueue)
		admin.PUT("/skus/:program/:ticket/seats", noPoolQuery, s.putSeats)
		admin.POST("/skus/:program/:ticket/seats/check", noPoolQuery, s.noBody, s.checkSeats)
		admin.GET("/events", s.getEvents)
		admin.POST("/events/missing", s.missingEvents)
		admin.GET("/relay", s.getRelay)
		admin.GET("/relay/dead", s.getDeadLetters)
		admin.POST("/relay/dead/:sink/:seq/redeliver", s.noBody, s.redeliver)
	}
	if !set.public {
		return e, nil
	}
	e.GET("/openapi.json", func(c *gin.Context) { c.Data(http.StatusOK, "application/json", OpenAPI) })
	e.GET("/queue/:program", s.queuePageHandler)
	e.GET("/queue-worker.js", s.powWorkerHandler)
	v1.GET("/skus/:program/:ticket/stock", s.getStock)
	v1.POST("/skus/:program/:ticket/purchases", s.purchase)
	v1.POST("/skus/:program/:ticket/holds", s.postHold)
	v1.GET("/holds/:id", s.getHold)
	v1.POST("/holds/:id/confirm", s.confirmHold)
	v1.POST("/holds/:id/cancel", s.cancelHold)
	v1.POST("/holds/:id/extend", s.extendHold)
	v1.GET("/orders/:id", s.getOrder)
	v1.POST("/skus/:program/:ticket/seat-holds", s.postSeatHold)
	v1.GET("/skus/:program/:ticket/seats", s.getSeats)
	v1.POST("/orders/:id/refund", s.refundOrder)
	v1.POST("/orders/:id/transfer", s.transferOrder)
	v1.POST("/orders/:id/resale", s.listForResale)
	v1.GET("/listings/:id", s.getListing)
	v1.POST("/listings/:id/withdraw", s.withdrawListing)
	v1.POST("/programs/:program/carts", s.postCart)
	v1.POST("/programs/:program/queue", s.joinQueue)
	v1.GET("/programs/:program/queue/:ticket", s.checkQueue)
	v1.GET("/programs/:program/queue/:ticket/events", s.queueEvents)
	v1.POST("/programs/:program/cart-holds", s.postCartHold)
	v1.GET("/carts/:id", s.getCart)
	v1.POST("/carts/:id/confirm", s.confirmCart)
	v1.POST("/carts/:id/cancel", s.cancelCart)
	v1.POST("/carts/:id/refund", s.refundCart)
	v1.PUT("/skus/:program/:ticket/waitlist/:buyer", s.joinWaitlist)
	v1.GET("/skus/:program/:ticket/waitlist/:buyer", s.getWaitlist)
	v1.DELETE("/skus/:program/:ticket/waitlist/:buyer", s.noBody, s.leaveWaitlist)
	return e, nil
}

// recoverer turns a panic into a 500 problem and a log line; a panic is a
// bug, but one buyer's bug must not take down the others' requests.
func (s *Server) recoverer(c *gin.Context) {
	defer func() {
		if r := recover(); r != nil {
			s.log.ErrorContext(c.Request.Context(), "panic in handler", "route", c.FullPath(), "panic", fmt.Sprint(r))
			_ = c.Error(fmt.Errorf("panic: %v", r)) // the cause, for observe's line
			writeProblem(c, http.StatusInternalServerError, "internal", "internal error", 0)
		}
	}()
	c.Next()
}

func (s *Server) requireAdmin(c *gin.Context) {
	if s.opts.AdminToken == "" {
		return
	}
	got, ok := strings.CutPrefix(c.GetHeader("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(s.opts.AdminToken)) != 1 {
		c.Header("WWW-Authenticate", `Bearer realm="stockgate-admin"`)
		writeProblem(c, http.StatusUnauthorized, "unauthorized", "admin routes need a valid bearer token", 0)
	}
}

// skuParam reads and validates the SKU in the path.
func skuParam(c *gin.Context) (stock.SKU, bool) {
	sku, err := stock.ParseSKU(c.Param("program"), c.Param("ticket"))
	if err != nil {
		writeProblem(c, http.StatusBadRequest, "invalid-id",
			"program and ticket ids must match [A-Za-z0-9_-]{1,64}", 0)
		return sku, false
	}
	return sku, true
}

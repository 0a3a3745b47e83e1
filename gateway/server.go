// Package gateway is stockgate's HTTP face: it validates requests, runs the
// purchase flow (Redis gate, then the ledger), and answers with JSON or RFC
// 9457 problem+json. It declares the small interfaces it needs and receives
// the Redis store, the ledger and the cache from main; it is the only
// package that imports gin.
package gateway

import (
	"context"
	"crypto/subtle"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/singleflight"

	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/cache"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// OpenAPI is the API's OpenAPI 3.1 document, served at /openapi.json.
//
//go:embed openapi.json
var OpenAPI []byte

// Routes lists the method and path template of every route the server
// registers, in gin's form (":id").
func (s *Server) Routes() []string {
	var out []string
	for _, r := range s.engine.Routes() {
		out = append(out, r.Method+" "+r.Path)
	}
	return out
}

// Gate is the Redis side of the stock (package shard).
type Gate interface {
	Deduct(ctx context.Context, r shard.Request) (shard.Deduction, error)
	Restore(ctx context.Context, sku stock.SKU, requestID string, parts []shard.Part) error
	Seed(ctx context.Context, sku stock.SKU, n int, remaining, epoch int64, overwrite bool) error
	Refill(ctx context.Context, sku stock.SKU, n int, returnID string, epoch, q int64) (int, error)
	Fence(ctx context.Context, sku stock.SKU, n int, closed bool) error
	TakeQuota(ctx context.Context, sku stock.SKU, buyer, requestID string, q, limit int64) (bool, error)
	ReleaseQuota(ctx context.Context, sku stock.SKU, buyer, requestID string) error
	Read(ctx context.Context, sku stock.SKU, n int) ([]shard.ShardStock, error)
	Remaining(ctx context.Context, sku stock.SKU, n int) (int64, bool, error)
}

// Ledger is the SQL truth (package ledger).
type Ledger interface {
	PutSKU(ctx context.Context, c ledger.SKUConfig) (ledger.SKUState, error)
	SKU(ctx context.Context, sku stock.SKU) (ledger.SKUState, error)
	Purchase(ctx context.Context, o ledger.Order) (ledger.Order, error)
	PurchaseBatch(ctx context.Context, orders []ledger.Order, direct bool) ([]ledger.BatchResult, error)
	PurchaseDirect(ctx context.Context, o ledger.Order, version int64) (ledger.Order, error)
	OrderByKey(ctx context.Context, key string) (ledger.Order, error)
	MarkGateSeeded(ctx context.Context, sku stock.SKU, seq int64) error
	Hold(ctx context.Context, h ledger.Hold, version int64) (ledger.Hold, error)
	HoldByID(ctx context.Context, id string) (ledger.Hold, error)
	HoldByKey(ctx context.Context, key string) (ledger.Hold, error)
	Confirm(ctx context.Context, holdID, buyer string, req ledger.Request) (ledger.Order, error)
	Cancel(ctx context.Context, holdID, buyer string, req ledger.Request) (ledger.Hold, bool, error)
	ExpireDue(ctx context.Context, limit int) ([]ledger.Hold, error)
	Refund(ctx context.Context, orderID, buyer string, req ledger.Request) (ledger.Order, bool, error)
	OrderByID(ctx context.Context, id string) (ledger.Order, error)
	RequestByKey(ctx context.Context, scope, key string) (ledger.Recorded, error)
	CommittedSince(ctx context.Context, sku stock.SKU, after int64) (ledger.Committed, error)
	AdvanceGate(ctx context.Context, sku stock.SKU) (ledger.SKUState, error)
	RestoreOwed(ctx context.Context, kind, id string) (ledger.Restore, bool, error)
	PendingRestores(ctx context.Context, olderThan time.Duration, limit int) ([]ledger.Restore, error)
	RestoreDone(ctx context.Context, kind, id string) error
	EndSale(ctx context.Context, sku stock.SKU) (ledger.SKUState, error)
	LoadSeats(ctx context.Context, sku stock.SKU, seats []ledger.Seat) (int64, error)
	Seats(ctx context.Context, sku stock.SKU, section string) ([]ledger.Seat, error)
	SeatFacts(ctx context.Context, sku stock.SKU) ([]ledger.SeatFact, error)
	PutProgram(ctx context.Context, program string, perBuyer int64) error
	ProgramCap(ctx context.Context, program string) (int64, error)
	SetShards(ctx context.Context, sku stock.SKU, n int) error
	SKUs(ctx context.Context, after stock.SKU, limit int) ([]ledger.SKUState, error)
}

// Options configures a Server.
type Options struct {
	Gate   Gate         // required
	Ledger Ledger       // required
	Cache  *cache.Cache // required; the same one the Gate skips empty shards with
	// Locker coordinates re-seeds across replicas; it must use the same
	// Redis Cluster as the Gate. Required.
	Locker *lock.Locker
	// Seats is the Redis side of reserved seating. Optional: without it
	// the seat routes answer 501.
	Seats *seats.Store
	// Notifier carries restock notices between replicas (the Redis
	// client; see RunNotices). Optional: without it a replica learns that
	// stock came back when its sold-out flag expires.
	Notifier Notifier
	Logger   *slog.Logger // default slog.Default()
	// Registry receives the metrics and is served at /metrics. Default: a
	// new registry.
	Registry *prometheus.Registry
	// Breaker configures the fuse around Redis; New fills in what counts as
	// an outcome, the metrics and the transition log.
	Breaker breaker.Options
	// RedisTimeout is the deadline of one gate call (a purchase probing
	// several shards is one call). Default 1s.
	RedisTimeout time.Duration
	// FallbackConcurrency caps purchases going straight to the ledger while
	// the breaker is open; beyond it they get 503 with Retry-After. Default 16.
	FallbackConcurrency int
	// FallbackAttempts bounds the optimistic attempts of one such purchase
	// (version conflicts retried with jittered exponential pauses starting
	// at FallbackBackoff). Defaults 5 and 2ms.
	FallbackAttempts int
	FallbackBackoff  time.Duration
	// ReseedWait is how long a purchase waits for the re-seed lock of its
	// SKU before going to the ledger instead. Default 1s.
	ReseedWait time.Duration
	// DriftEvery is the period of the drift check RunDrift runs. Default 30s.
	DriftEvery time.Duration
	// TrustedProxies are the addresses or CIDRs whose X-Forwarded-For is
	// believed when telling clients apart; empty trusts none, so the client
	// is the TCP peer and the header cannot be spoofed.
	TrustedProxies []string
	// RatePerClient and RateBurst limit each client (by address) to a token
	// bucket; beyond it, 429 with Retry-After. 0 turns limiting off.
	RatePerClient float64
	RateBurst     int
	// SlowRequest is the latency above which a request is logged. Default 1s.
	SlowRequest time.Duration
	// CacheMetrics receives the local caches' hit and miss counts; the same
	// one main gave the Cache. Default: new metrics on Registry.
	CacheMetrics *cache.Metrics
	// BatchMax is the most gate-admitted purchases committed in one ledger
	// transaction (group commit); 1 commits each alone. Default 256.
	BatchMax int
	// CollapseAt: when a SKU spread over several shards has this many units
	// left per shard or fewer, the drift check collapses it onto one shard
	// (a fenced resize), so the last units sit together. Default 1;
	// negative turns it off.
	CollapseAt int64
	// SweepEvery is the period of RunSweeper, which expires due holds: a
	// hold's stock is back at most about this long after its expiry.
	// Default 1s.
	SweepEvery time.Duration
	// RestoreGrace is how long a restore may stay half-done (ledger side
	// done, Redis side not) before any sweeper finishes it. Default 5s.
	RestoreGrace time.Duration
	// AdminToken, when set, is the bearer token admin routes require.
	// Empty leaves admin routes open, for local use only.
	AdminToken string
	// MaxBodyBytes caps a request body. Default 4 KiB.
	MaxBodyBytes int64
	// SettingsTTL is how long a SKU's settings are served from memory.
	// Default 1s.
	SettingsTTL time.Duration
	// StockTTL is how long a stock read is served from memory. Default 200ms.
	StockTTL time.Duration
	// WorkTimeout bounds one purchase's work. The work runs detached from the
	// client's connection: once stock is taken from Redis it must end in a
	// ledger commit or a restore, whether or not the client is still there.
	// Default 5s.
	WorkTimeout time.Duration
}

// Server serves the API.
type Server struct {
	gate    Gate
	ledger  Ledger
	cache   *cache.Cache
	locker  *lock.Locker
	breaker *breaker.Breaker
	metrics *metrics
	http    *httpMetrics
	limiter *limiter
	// committer group-commits gate-admitted purchases; direct, the ones
	// sold around the gate while the breaker is open.
	committer *committer
	direct    *committer
	fallback  chan struct{} // semaphore of ledger-direct purchases
	reseeds   singleflight.Group
	log       *slog.Logger
	opts      Options
	settings  *cache.Loading[ledger.SKUState]
	programs  *cache.Loading[int64] // per-buyer cap of a program, keyed by {program, ""}
	seatMaps  *cache.Loading[seatMap]
	// sectionViews serves seat status reads from memory for StockTTL.
	sectionViews *cache.Loading[sectionView]
	seatSeen     struct {
		mu sync.Mutex
		m  map[stock.SKU]map[string]string // seat → mismatch at the last periodic check
	}
	seats    *seats.Store
	stock    *cache.Loading[stockView]
	inflight inflight
	// replays answers retries of committed requests of SKUs that take no
	// more requests (sold out, ended) without a ledger call per request.
	replays *replays
	ready   atomic.Bool
	engine  *gin.Engine
}

// New validates opts and returns a Server that is not ready yet: call
// SetReady once the process is warmed up.
func New(opts Options) (*Server, error) {
	if opts.Gate == nil || opts.Ledger == nil || opts.Cache == nil {
		return nil, errors.New("gateway: Options.Gate, Ledger and Cache are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	opts.Logger = slog.New(logHandler{opts.Logger.Handler()})
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = 4 << 10
	}
	if opts.SettingsTTL == 0 {
		opts.SettingsTTL = time.Second
	}
	if opts.StockTTL == 0 {
		opts.StockTTL = 200 * time.Millisecond
	}
	if opts.WorkTimeout == 0 {
		opts.WorkTimeout = 5 * time.Second
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	setDefault(&opts.RedisTimeout, time.Second)
	setDefault(&opts.FallbackBackoff, 2*time.Millisecond)
	setDefault(&opts.ReseedWait, time.Second)
	setDefault(&opts.DriftEvery, 30*time.Second)
	setDefault(&opts.SweepEvery, time.Second)
	setDefault(&opts.SlowRequest, time.Second)
	setDefault(&opts.RestoreGrace, 5*time.Second)
	if opts.FallbackConcurrency == 0 {
		opts.FallbackConcurrency = 16
	}
	if opts.BatchMax == 0 {
		opts.BatchMax = 256
	}
	if opts.CollapseAt == 0 {
		opts.CollapseAt = 1
	}
	if opts.FallbackAttempts == 0 {
		opts.FallbackAttempts = 5
	}
	switch {
	case opts.Locker == nil:
		return nil, errors.New("gateway: Options.Locker is required")
	case opts.MaxBodyBytes < 64:
		return nil, fmt.Errorf("gateway: MaxBodyBytes %d below 64", opts.MaxBodyBytes)
	case opts.SettingsTTL < 0 || opts.StockTTL < 0 || opts.WorkTimeout < 0 || opts.RedisTimeout < 0 ||
		opts.FallbackBackoff < 0 || opts.ReseedWait < 0 || opts.DriftEvery < 0 ||
		opts.SweepEvery < 0 || opts.RestoreGrace < 0:
		return nil, errors.New("gateway: negative duration")
	case opts.RatePerClient < 0 || opts.RateBurst < 0 || (opts.RatePerClient > 0 && opts.RateBurst < 1):
		return nil, errors.New("gateway: RatePerClient and RateBurst must be positive together, or RatePerClient 0")
	case opts.BatchMax < 1:
		return nil, errors.New("gateway: BatchMax must be at least 1")
	case opts.FallbackConcurrency < 1 || opts.FallbackAttempts < 1:
		return nil, errors.New("gateway: FallbackConcurrency and FallbackAttempts must be at least 1")
	}
	s := &Server{gate: opts.Gate, ledger: opts.Ledger, cache: opts.Cache, locker: opts.Locker, log: opts.Logger, opts: opts,
		fallback: make(chan struct{}, opts.FallbackConcurrency)}
	var err error
	if s.metrics, err = newMetrics(opts.Registry); err != nil {
		return nil, fmt.Errorf("gateway: metrics: %w", err)
	}
	if s.http, err = newHTTPMetrics(opts.Registry); err != nil {
		return nil, fmt.Errorf("gateway: metrics: %w", err)
	}
	if opts.CacheMetrics == nil {
		if opts.CacheMetrics, err = cache.NewMetrics(opts.Registry); err != nil {
			return nil, fmt.Errorf("gateway: metrics: %w", err)
		}
	}
	if s.limiter, err = newLimiter(opts.RatePerClient, opts.RateBurst); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	bo := opts.Breaker
	bo.IsOutcome = isOutcome
	bo.Registerer = opts.Registry
	if s.breaker, err = breaker.New(bo); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	s.settings, err = cache.NewLoading(opts.SettingsTTL, 100_000, opts.CacheMetrics.Recorder("settings"), s.ledger.SKU)
	if err != nil {
		return nil, err
	}
	s.programs, err = cache.NewLoading(opts.SettingsTTL, 100_000, opts.CacheMetrics.Recorder("programs"), func(ctx context.Context, p stock.SKU) (int64, error) {
		return s.ledger.ProgramCap(ctx, p.Program)
	})
	if err != nil {
		return nil, err
	}
	if s.replays, err = newReplays(s.ledger, 10*time.Minute); err != nil {
		return nil, err
	}
	s.seats = opts.Seats
	s.seatMaps, err = cache.NewLoading(opts.SettingsTTL, 1_000, opts.CacheMetrics.Recorder("seatmaps"), s.loadSeatMap)
	if err != nil {
		return nil, err
	}
	s.sectionViews, err = cache.NewLoading(opts.StockTTL, 10_000, opts.CacheMetrics.Recorder("sections"), s.loadSectionView)
	if err != nil {
		return nil, err
	}
	s.stock, err = cache.NewLoading(opts.StockTTL, 100_000, opts.CacheMetrics.Recorder("stock"), s.loadStock)
	if err != nil {
		return nil, err
	}
	if s.engine, err = s.routes(); err != nil {
		return nil, err
	}
	s.committer = newCommitter(s, 8, opts.BatchMax, false)
	s.direct = newCommitter(s, 4, opts.BatchMax, true)
	return s, nil
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d == 0 {
		*d = v
	}
}

// Handler is the HTTP handler of the whole API.
func (s *Server) Handler() http.Handler { return s.engine }

// Close stops the group committer after it has answered what was queued.
// Call it after the HTTP server has drained.
func (s *Server) Close() {
	s.committer.close()
	s.direct.close()
}

// BreakerState is the Redis breaker's state now.
func (s *Server) BreakerState() breaker.State { return s.breaker.State() }

// SetReady flips /readyz: true once warmed up, false when draining.
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

func (s *Server) routes() (*gin.Engine, error) {
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	if err := e.SetTrustedProxies(s.opts.TrustedProxies); err != nil {
		return nil, fmt.Errorf("gateway: trusted proxies: %w", err)
	}
	e.Use(s.observe, s.recoverer, s.limit)
	e.HandleMethodNotAllowed = true
	e.NoRoute(func(c *gin.Context) { writeProblem(c, http.StatusNotFound, "not-found", "no such route", 0) })
	e.NoMethod(func(c *gin.Context) {
		writeProblem(c, http.StatusMethodNotAllowed, "method-not-allowed", "method not allowed on this route", 0)
	})

	e.GET("/livez", func(c *gin.Context) { c.String(http.StatusOK, "ok\n") })
	e.GET("/readyz", func(c *gin.Context) {
		if !s.ready.Load() {
			writeProblem(c, http.StatusServiceUnavailable, "not-ready", "starting or draining", 1)
			return
		}
		c.String(http.StatusOK, "ok\n")
	})

	e.GET("/metrics", gin.WrapH(promhttp.HandlerFor(s.opts.Registry, promhttp.HandlerOpts{})))
	e.GET("/openapi.json", func(c *gin.Context) { c.Data(http.StatusOK, "application/json", OpenAPI) })

	v1 := e.Group("/v1")
	v1.GET("/skus/:program/:ticket/stock", s.getStock)
	v1.POST("/skus/:program/:ticket/purchases", s.purchase)
	v1.POST("/skus/:program/:ticket/holds", s.postHold)
	v1.GET("/holds/:id", s.getHold)
	v1.POST("/holds/:id/confirm", s.confirmHold)
	v1.POST("/holds/:id/cancel", s.cancelHold)
	v1.GET("/orders/:id", s.getOrder)
	v1.POST("/skus/:program/:ticket/seat-holds", s.postSeatHold)
	v1.GET("/skus/:program/:ticket/seats", s.getSeats)
	v1.POST("/orders/:id/refund", s.refundOrder)

	admin := v1.Group("/admin", s.requireAdmin)
	admin.PUT("/skus/:program/:ticket", s.putSKU)
	admin.GET("/skus/:program/:ticket", s.getSKU)
	admin.POST("/skus/:program/:ticket/reconcile", s.reconcile)
	admin.POST("/skus/:program/:ticket/end", s.endSale)
	admin.PUT("/programs/:program", s.putProgram)
	admin.PUT("/skus/:program/:ticket/seats", s.putSeats)
	admin.POST("/skus/:program/:ticket/seats/check", s.checkSeats)
	return e, nil
}

// recoverer turns a panic into a 500 problem and a log line; a panic is a
// bug, but one buyer's bug must not take down the others' requests.
func (s *Server) recoverer(c *gin.Context) {
	defer func() {
		if r := recover(); r != nil {
			s.log.ErrorContext(c.Request.Context(), "panic in handler", "route", c.FullPath(), "panic", fmt.Sprint(r))
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
	sku := stock.SKU{Program: c.Param("program"), Ticket: c.Param("ticket")}
	if err := sku.Validate(); err != nil {
		writeProblem(c, http.StatusBadRequest, "invalid-id",
			"program and ticket ids must match [A-Za-z0-9_-]{1,64}", 0)
		return sku, false
	}
	return sku, true
}

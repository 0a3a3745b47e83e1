// Package gateway is stockgate's HTTP face: it validates requests, runs the
// purchase flow (Redis gate, then the ledger), and answers with JSON or RFC
// 9457 problem+json. It declares the small interfaces it needs and receives
// the Redis store, the ledger and the cache from main; it is the only
// package that imports gin.
package gateway

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/cache"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// Gate is the Redis side of the stock (package shard).
type Gate interface {
	Deduct(ctx context.Context, r shard.Request) (shard.Deduction, error)
	Restore(ctx context.Context, sku stock.SKU, requestID string, parts []shard.Part) error
	Seed(ctx context.Context, sku stock.SKU, n int, remaining int64, overwrite bool) error
	Remaining(ctx context.Context, sku stock.SKU, n int) (int64, bool, error)
}

// Ledger is the SQL truth (package ledger).
type Ledger interface {
	PutSKU(ctx context.Context, c ledger.SKUConfig) (ledger.SKUState, error)
	SKU(ctx context.Context, sku stock.SKU) (ledger.SKUState, error)
	Purchase(ctx context.Context, o ledger.Order) (ledger.Order, error)
	OrderByKey(ctx context.Context, key string) (ledger.Order, error)
}

// Options configures a Server.
type Options struct {
	Gate   Gate         // required
	Ledger Ledger       // required
	Cache  *cache.Cache // required; the same one the Gate skips empty shards with
	Logger *slog.Logger // default slog.Default()
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
	gate     Gate
	ledger   Ledger
	cache    *cache.Cache
	log      *slog.Logger
	opts     Options
	settings *cache.Loading[ledger.SKUState]
	stock    *cache.Loading[stockView]
	inflight inflight
	ready    atomic.Bool
	engine   *gin.Engine
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
	switch {
	case opts.MaxBodyBytes < 64:
		return nil, fmt.Errorf("gateway: MaxBodyBytes %d below 64", opts.MaxBodyBytes)
	case opts.SettingsTTL < 0 || opts.StockTTL < 0 || opts.WorkTimeout < 0:
		return nil, errors.New("gateway: negative duration")
	}
	s := &Server{gate: opts.Gate, ledger: opts.Ledger, cache: opts.Cache, log: opts.Logger, opts: opts}
	var err error
	s.settings, err = cache.NewLoading(opts.SettingsTTL, 100_000, nil, s.ledger.SKU)
	if err != nil {
		return nil, err
	}
	s.stock, err = cache.NewLoading(opts.StockTTL, 100_000, nil, s.loadStock)
	if err != nil {
		return nil, err
	}
	s.engine = s.routes()
	return s, nil
}

// Handler is the HTTP handler of the whole API.
func (s *Server) Handler() http.Handler { return s.engine }

// SetReady flips /readyz: true once warmed up, false when draining.
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

func (s *Server) routes() *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	e.Use(s.recoverer)
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

	v1 := e.Group("/v1")
	v1.GET("/skus/:program/:ticket/stock", s.getStock)
	v1.POST("/skus/:program/:ticket/purchases", s.purchase)

	admin := v1.Group("/admin", s.requireAdmin)
	admin.PUT("/skus/:program/:ticket", s.putSKU)
	admin.GET("/skus/:program/:ticket", s.getSKU)
	return e
}

// recoverer turns a panic into a 500 problem and a log line; a panic is a
// bug, but one buyer's bug must not take down the others' requests.
func (s *Server) recoverer(c *gin.Context) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("panic in handler", "route", c.FullPath(), "panic", fmt.Sprint(r))
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

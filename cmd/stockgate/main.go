// Command stockgate is the composition root: it reads the configuration,
// builds the Redis cluster client, the ledger, the cache and the HTTP
// server, serves until SIGTERM, then drains and exits once.
//
//	stockgate serve [flags]   every flag also reads STOCKGATE_<FLAG> from the environment
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/peterbourgon/ff/v3"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/cache"
	"github.com/stockgate/stockgate/cluster"
	"github.com/stockgate/stockgate/gateway"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// config is every setting, each a flag and an environment variable.
type config struct {
	Addr           string
	RedisAddrs     string
	RedisPassword  string
	DialTimeout    time.Duration
	ReadTimeout    time.Duration
	WriteTimeout   time.Duration
	PoolSize       int
	LedgerDriver   string
	LedgerDSN      string
	LedgerMaxConns int
	AdminToken     string
	RecordTTL      time.Duration
	SoldOutTTL     time.Duration
	EmptyShardTTL  time.Duration
	WorkTimeout    time.Duration
	ShutdownGrace  time.Duration
	LogLevel       string

	RedisTimeout        time.Duration
	StateReloadEvery    time.Duration
	BreakerFailures     uint
	BreakerRatio        float64
	BreakerMinRequests  uint
	BreakerWindow       time.Duration
	BreakerOpenFor      time.Duration
	BreakerProbes       uint
	FallbackConcurrency int
	FallbackAttempts    int
	FallbackBackoff     time.Duration
	LockTTL             time.Duration
	ReseedWait          time.Duration
	DriftEvery          time.Duration
	SweepEvery          time.Duration
	CollapseAt          int64
	TrustedProxies      string
	RatePerClient       float64
	RateBurst           int
	SlowRequest         time.Duration
	DrainDelay          time.Duration
	PprofAddr           string
	BatchMax            int
}

func flags(fs *flag.FlagSet, c *config) {
	fs.StringVar(&c.Addr, "addr", ":8080", "HTTP listen address")
	fs.StringVar(&c.RedisAddrs, "redis-addrs", "127.0.0.1:7000", "comma-separated Redis Cluster seed nodes")
	fs.StringVar(&c.RedisPassword, "redis-password", "", "Redis password (prefer the environment variable)")
	fs.DurationVar(&c.DialTimeout, "redis-dial-timeout", time.Second, "Redis dial timeout")
	fs.DurationVar(&c.ReadTimeout, "redis-read-timeout", 500*time.Millisecond, "Redis read timeout per command")
	fs.DurationVar(&c.WriteTimeout, "redis-write-timeout", 500*time.Millisecond, "Redis write timeout per command")
	fs.IntVar(&c.PoolSize, "redis-pool-size", 64, "Redis connections per node")
	fs.StringVar(&c.LedgerDriver, "ledger-driver", ledger.SQLite, "ledger database: sqlite or postgres")
	fs.StringVar(&c.LedgerDSN, "ledger-dsn", "stockgate.db", "SQLite file path, or PostgreSQL URL")
	fs.IntVar(&c.LedgerMaxConns, "ledger-max-conns", 32, "PostgreSQL connection cap")
	fs.StringVar(&c.AdminToken, "admin-token", "", "bearer token for /v1/admin routes (empty: open, local use only)")
	fs.DurationVar(&c.RecordTTL, "record-ttl", 24*time.Hour, "lifetime of a deduction record in Redis")
	fs.DurationVar(&c.SoldOutTTL, "sold-out-ttl", 500*time.Millisecond, "how long a sold-out SKU is answered from memory")
	fs.DurationVar(&c.EmptyShardTTL, "empty-shard-ttl", 250*time.Millisecond, "how long an empty shard is skipped")
	fs.DurationVar(&c.WorkTimeout, "work-timeout", 5*time.Second, "time limit of one purchase's work")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 20*time.Second, "time in-flight requests get to finish on SIGTERM")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")

	fs.DurationVar(&c.RedisTimeout, "redis-call-timeout", time.Second, "deadline of one gate call (a purchase probing several shards is one call)")
	fs.DurationVar(&c.StateReloadEvery, "redis-state-reload", time.Second, "how stale the cluster slot map may get before it is reloaded")
	fs.UintVar(&c.BreakerFailures, "breaker-failures", 5, "consecutive Redis failures that open the breaker")
	fs.Float64Var(&c.BreakerRatio, "breaker-failure-ratio", 0.5, "failure ratio within the window that opens the breaker")
	fs.UintVar(&c.BreakerMinRequests, "breaker-min-requests", 20, "calls in the window before the ratio counts")
	fs.DurationVar(&c.BreakerWindow, "breaker-window", 10*time.Second, "rolling window the failure ratio is counted over")
	fs.DurationVar(&c.BreakerOpenFor, "breaker-open-for", 2*time.Second, "time the breaker stays open before probing Redis")
	fs.UintVar(&c.BreakerProbes, "breaker-probes", 3, "successful half-open probes that close the breaker")
	fs.IntVar(&c.FallbackConcurrency, "fallback-concurrency", 16, "purchases sent straight to the ledger at once while Redis is out; beyond: 503")
	fs.IntVar(&c.FallbackAttempts, "fallback-attempts", 5, "optimistic attempts of one ledger-direct purchase")
	fs.DurationVar(&c.FallbackBackoff, "fallback-backoff", 2*time.Millisecond, "base of the jittered pause between those attempts")
	fs.DurationVar(&c.LockTTL, "lock-ttl", 10*time.Second, "lifetime of a coordination lock after its holder stops renewing it")
	fs.DurationVar(&c.ReseedWait, "reseed-wait", time.Second, "how long a purchase waits for another replica's re-seed of its SKU")
	fs.DurationVar(&c.DriftEvery, "drift-every", 30*time.Second, "period of the Redis-vs-ledger drift check")
	fs.StringVar(&c.TrustedProxies, "trusted-proxies", "", "comma-separated addresses or CIDRs whose X-Forwarded-For is believed (empty: none)")
	fs.Float64Var(&c.RatePerClient, "rate-per-client", 0, "requests per second one client address may send (0: no limit; behind a proxy set trusted-proxies first, or every client looks like the proxy)")
	fs.IntVar(&c.RateBurst, "rate-burst", 100, "burst above rate-per-client a client may send")
	fs.DurationVar(&c.SlowRequest, "slow-request", time.Second, "latency above which a request is logged")
	fs.DurationVar(&c.DrainDelay, "drain-delay", 0, "on SIGTERM, time /readyz fails while requests are still served, before connections close (Kubernetes' preStop sleep does this too)")
	fs.StringVar(&c.PprofAddr, "pprof-addr", "", "host:port of a separate listener for /debug/pprof (empty: off; keep it off the public network)")
	fs.IntVar(&c.BatchMax, "batch-max", 256, "most gate-admitted purchases committed in one ledger transaction (group commit; 1: each alone)")
	fs.Int64Var(&c.CollapseAt, "collapse-at", 1, "units left per shard at which a sharded SKU's tail collapses onto one shard (negative: never)")
	fs.DurationVar(&c.SweepEvery, "sweep-every", time.Second, "period of the hold-expiry sweeper (bounds how late an expired hold's stock comes back)")
}

// validate names the environment variable of the first bad setting.
func (c config) validate() error {
	bad := func(name, why string) error {
		return fmt.Errorf("STOCKGATE_%s (-%s): %s", strings.ToUpper(strings.ReplaceAll(name, "-", "_")), name, why)
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return bad("addr", "not host:port: "+err.Error())
	}
	for _, a := range strings.Split(c.RedisAddrs, ",") {
		if _, _, err := net.SplitHostPort(strings.TrimSpace(a)); err != nil {
			return bad("redis-addrs", fmt.Sprintf("%q is not host:port", a))
		}
	}
	for name, d := range map[string]time.Duration{
		"redis-dial-timeout": c.DialTimeout, "redis-read-timeout": c.ReadTimeout,
		"redis-write-timeout": c.WriteTimeout, "sold-out-ttl": c.SoldOutTTL, "empty-shard-ttl": c.EmptyShardTTL,
		"work-timeout": c.WorkTimeout, "shutdown-grace": c.ShutdownGrace,
		"redis-call-timeout": c.RedisTimeout, "redis-state-reload": c.StateReloadEvery,
		"breaker-window": c.BreakerWindow, "breaker-open-for": c.BreakerOpenFor,
		"fallback-backoff": c.FallbackBackoff, "lock-ttl": c.LockTTL, "reseed-wait": c.ReseedWait,
		"drift-every": c.DriftEvery, "sweep-every": c.SweepEvery,
	} {
		if d <= 0 {
			return bad(name, "must be a positive duration")
		}
	}
	switch {
	case c.RecordTTL < time.Minute:
		return bad("record-ttl", "must be at least 1m")
	case c.PoolSize < 1:
		return bad("redis-pool-size", "must be at least 1")
	case c.LedgerDriver != ledger.SQLite && c.LedgerDriver != ledger.Postgres:
		return bad("ledger-driver", "must be sqlite or postgres")
	case c.LedgerDSN == "":
		return bad("ledger-dsn", "must not be empty")
	case c.LedgerMaxConns < 1:
		return bad("ledger-max-conns", "must be at least 1")
	case c.BreakerFailures < 1:
		return bad("breaker-failures", "must be at least 1")
	case c.BreakerRatio <= 0 || c.BreakerRatio > 1:
		return bad("breaker-failure-ratio", "must be in (0, 1]")
	case c.BreakerMinRequests < 1:
		return bad("breaker-min-requests", "must be at least 1")
	case c.BreakerWindow < time.Second:
		return bad("breaker-window", "must be at least 1s")
	case c.BreakerProbes < 1:
		return bad("breaker-probes", "must be at least 1")
	case c.FallbackConcurrency < 1:
		return bad("fallback-concurrency", "must be at least 1")
	case c.FallbackAttempts < 1:
		return bad("fallback-attempts", "must be at least 1")
	case c.AdminToken != "" && len(c.AdminToken) < 16:
		return bad("admin-token", "must be at least 16 characters (or empty, for local use only)")
	case c.RatePerClient < 0:
		return bad("rate-per-client", "must be >= 0")
	case c.RateBurst < 1:
		return bad("rate-burst", "must be at least 1")
	case c.SlowRequest <= 0:
		return bad("slow-request", "must be a positive duration")
	case c.DrainDelay < 0 || c.DrainDelay >= c.ShutdownGrace:
		return bad("drain-delay", "must be >= 0 and below the shutdown grace")
	case c.PprofAddr != "" && !validHostPort(c.PprofAddr):
		return bad("pprof-addr", "not host:port")
	case c.BatchMax < 1:
		return bad("batch-max", "must be at least 1")
	case c.CollapseAt == 0:
		return bad("collapse-at", "must be at least 1, or negative to turn collapsing off")
	case c.LockTTL < time.Second:
		return bad("lock-ttl", "must be at least 1s")
	}
	for _, p := range splitList(c.TrustedProxies) {
		if _, _, err := net.ParseCIDR(p); err != nil && net.ParseIP(p) == nil {
			return bad("trusted-proxies", fmt.Sprintf("%q is not an address or CIDR", p))
		}
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return bad("log-level", "must be debug, info, warn or error")
	}
	return nil
}

func usage(w io.Writer, fs *flag.FlagSet) func() {
	return func() {
		fmt.Fprintf(w, "Usage: stockgate serve [flags]\n\nEvery flag can be set by the environment variable STOCKGATE_<FLAG>, e.g. STOCKGATE_REDIS_ADDRS.\n\n")
		fs.PrintDefaults()
	}
}

// run returns the exit code: 0 after a clean drain, 2 for bad usage or
// configuration, 1 for a failure to start or serve.
func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("stockgate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	flags(fs, &c)
	fs.Usage = usage(stderr, fs)
	if len(args) == 0 || args[0] != "serve" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fs.Usage()
			return 0
		}
		fs.Usage()
		return 2
	}
	if err := ff.Parse(fs, args[1:], ff.WithEnvVarPrefix("STOCKGATE")); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "stockgate: %v\n", err)
		return 2
	}
	if err := c.validate(); err != nil {
		fmt.Fprintf(stderr, "stockgate: bad configuration: %v\n", err)
		return 2
	}
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.LogLevel))
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, c, log); err != nil {
		log.Error("stockgate stopped", "err", err)
		return 1
	}
	return 0
}

// options is the configuration as the packages take it.
func (c config) options(log *slog.Logger) app.Options {
	return app.Options{
		Redis: cluster.Options{
			Addrs: splitList(c.RedisAddrs), Password: c.RedisPassword,
			DialTimeout: c.DialTimeout, ReadTimeout: c.ReadTimeout, WriteTimeout: c.WriteTimeout,
			PoolSize: c.PoolSize, StateReloadEvery: c.StateReloadEvery,
		},
		Ledger: ledger.Options{Driver: c.LedgerDriver, DSN: c.LedgerDSN, MaxConns: c.LedgerMaxConns},
		Cache:  cache.Options{SoldOutTTL: c.SoldOutTTL, EmptyShardTTL: c.EmptyShardTTL},
		Shard:  shard.Options{RecordTTL: c.RecordTTL},
		Lock:   lock.Options{TTL: c.LockTTL},
		Sale: sale.Options{
			WorkTimeout: c.WorkTimeout, RedisTimeout: c.RedisTimeout,
			Breaker: breaker.Options{
				ConsecutiveFailures: uint32(c.BreakerFailures), FailureRatio: c.BreakerRatio,
				MinRequests: uint32(c.BreakerMinRequests), Window: c.BreakerWindow,
				OpenFor: c.BreakerOpenFor, Probes: uint32(c.BreakerProbes),
			},
			FallbackConcurrency: c.FallbackConcurrency, FallbackAttempts: c.FallbackAttempts,
			FallbackBackoff: c.FallbackBackoff, ReseedWait: c.ReseedWait,
			DriftEvery: c.DriftEvery, SweepEvery: c.SweepEvery, CollapseAt: c.CollapseAt, BatchMax: c.BatchMax,
		},
		HTTP: gateway.Options{
			TrustedProxies: splitList(c.TrustedProxies), RatePerClient: c.RatePerClient, RateBurst: c.RateBurst,
			SlowRequest: c.SlowRequest, AdminToken: c.AdminToken,
		},
		Logger: log,
	}
}

func serve(ctx context.Context, c config, log *slog.Logger) error {
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	a, err := app.Open(openCtx, c.options(log))
	if err != nil {
		return err
	}
	// The drift check, the hold sweeper and the restock notices run until
	// serve returns; Close waits for them after the HTTP server drained.
	a.Start(app.AllLoops)
	defer a.Close()
	srv := a.Server

	if c.PprofAddr != "" {
		// Profiling on its own listener, never on the API's. Owned by serve;
		// it ends with the process.
		pl, err := net.Listen("tcp", c.PprofAddr)
		if err != nil {
			return fmt.Errorf("pprof listener: %w", err)
		}
		defer pl.Close()
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		go func() { _ = http.Serve(pl, mux) }()
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }() // owned here; ends with Shutdown
	srv.SetReady(true)
	log.Info("stockgate serving", "addr", ln.Addr().String(), "ledger", c.LedgerDriver)

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Drain: fail readiness first so load balancers stop sending, then let
	// in-flight requests finish within the grace period.
	// Readiness fails first and the server keeps serving for DrainDelay, so
	// load balancers stop sending before connections start to close.
	srv.SetReady(false)
	log.Info("draining", "delay", c.DrainDelay.String(), "grace", c.ShutdownGrace.String())
	time.Sleep(c.DrainDelay)
	sctx, scancel := context.WithTimeout(context.Background(), c.ShutdownGrace)
	defer scancel()
	if err := hs.Shutdown(sctx); err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	if err := a.Close(); err != nil {
		log.Warn("close", "err", err)
	}
	log.Info("stopped cleanly")
	return nil
}

// splitList splits a comma-separated setting, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func validHostPort(s string) bool {
	_, _, err := net.SplitHostPort(s)
	return err == nil
}

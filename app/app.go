// Package app assembles one stockgate process from its Options: the Redis
// Cluster client, the ledger, the local caches, the Redis stores, the sale
// domain and the HTTP server, and runs the loops every replica runs. main
// and the tests build through it, so what is tested is what is shipped.
package app

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/extra/redisprometheus/v9"
	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/buildinfo"
	"github.com/stockgate/stockgate/cache"
	"github.com/stockgate/stockgate/cluster"
	"github.com/stockgate/stockgate/gateway"
	"github.com/stockgate/stockgate/internal/opt"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/shard"
)

// Options is every setting of a process, by the package it configures.
// The dependencies inside Sale and HTTP (ledger, stores, logger, registry)
// are filled in by Open.
type Options struct {
	Redis  cluster.Options
	Ledger ledger.Options
	Cache  cache.Options
	Shard  shard.Options
	Lock   lock.Options
	Sale   sale.Options
	HTTP   gateway.Options
	Logger *slog.Logger // default slog.Default()
	// WrapLedger, when set, wraps the ledger the sale flows use: tests
	// inject faults and count calls with it.
	WrapLedger func(sale.Ledger) sale.Ledger
}

// DefaultOptions are every package's defaults; main takes its flag
// defaults from them.
func DefaultOptions() Options {
	return Options{
		Redis: cluster.DefaultOptions(), Ledger: ledger.DefaultOptions(), Cache: cache.DefaultOptions(),
		Shard: shard.DefaultOptions(), Lock: lock.DefaultOptions(), Sale: sale.DefaultOptions(),
		HTTP: gateway.DefaultOptions(),
	}
}

// Validate reports the first setting that cannot work, as an *opt.Error
// naming its field by path ("Shard.RecordTTL"). Each bound is the
// package's own.
func (o Options) Validate() error {
	for _, v := range []struct {
		name string
		err  error
	}{
		{"Redis", o.Redis.Validate()}, {"Ledger", o.Ledger.Validate()}, {"Cache", o.Cache.Validate()},
		{"Shard", o.Shard.Validate()}, {"Lock", o.Lock.Validate()}, {"Sale", o.Sale.Validate()},
		{"HTTP", o.HTTP.Validate()},
	} {
		if v.err != nil {
			return opt.In(v.name, v.err)
		}
	}
	return nil
}

// App is one assembled process.
type App struct {
	Redis    *redis.ClusterClient
	Ledger   *ledger.Ledger
	Cache    *cache.Cache
	Gate     *shard.Store
	Seats    *seats.Store
	Sale     *sale.Service
	Server   *gateway.Server
	Registry *prometheus.Registry

	stop  context.CancelFunc
	wg    sync.WaitGroup
	close sync.Once
}

// Open connects to Redis and the ledger (migrating its schema) and builds
// the rest. On error everything opened so far is closed.
func Open(ctx context.Context, o Options) (_ *App, err error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	log := gateway.WithRequestIDs(o.Logger)
	a := &App{Registry: prometheus.NewRegistry()}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	if a.Redis, err = cluster.New(o.Redis); err != nil {
		return nil, err
	}
	a.Registry.MustRegister(buildinfo.Collector(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		redisprometheus.NewCollector("stockgate", "redis", a.Redis))
	o.Ledger.Metrics = a.Registry
	if a.Ledger, err = ledger.Open(ctx, o.Ledger); err != nil {
		return nil, err
	}
	cacheMetrics, err := cache.NewMetrics(a.Registry)
	if err != nil {
		return nil, err
	}
	o.Cache.Stats = cacheMetrics.Recorder("flags")
	if a.Cache, err = cache.New(o.Cache); err != nil {
		return nil, err
	}
	o.Shard.Redis, o.Shard.Empty = a.Redis, a.Cache
	if a.Gate, err = shard.New(o.Shard); err != nil {
		return nil, err
	}
	o.Lock.Redis = a.Redis
	locker, err := lock.New(o.Lock)
	if err != nil {
		return nil, err
	}
	if a.Seats, err = seats.New(a.Redis); err != nil {
		return nil, err
	}
	var led sale.Ledger = a.Ledger
	if o.WrapLedger != nil {
		led = o.WrapLedger(led)
	}
	o.Sale.Gate, o.Sale.Ledger, o.Sale.Cache, o.Sale.Locker, o.Sale.Seats = a.Gate, led, a.Cache, locker, a.Seats
	o.Sale.Notifier, o.Sale.Logger, o.Sale.Registry, o.Sale.CacheMetrics = a.Redis, log, a.Registry, cacheMetrics
	if a.Sale, err = sale.New(o.Sale); err != nil {
		return nil, err
	}
	o.HTTP.Sale, o.HTTP.Logger, o.HTTP.Registry = a.Sale, log, a.Registry
	if a.Server, err = gateway.New(o.HTTP); err != nil {
		return nil, err
	}
	return a, nil
}

// Loops chooses the background loops Start runs. A replica runs all three;
// a test may leave the drift check or the sweeper out to watch a state
// they would repair.
type Loops struct {
	Drift, Sweep, Notices bool
}

// AllLoops is what a replica runs.
var AllLoops = Loops{Drift: true, Sweep: true, Notices: true}

// Start runs the chosen loops until Close. Call it once.
func (a *App) Start(l Loops) {
	ctx, stop := context.WithCancel(context.Background())
	a.stop = stop
	for _, run := range []struct {
		on bool
		f  func(context.Context)
	}{{l.Drift, a.Sale.RunDrift}, {l.Sweep, a.Sale.RunSweeper}, {l.Notices, a.Sale.RunNotices}} {
		if run.on {
			a.wg.Go(func() { run.f(ctx) }) // owned by a; ends with Close
		}
	}
}

// Close stops the loops, answers what the group committers hold, and
// closes the ledger and the Redis client. Call it after the HTTP server
// has drained; a second Close does nothing.
func (a *App) Close() error {
	var errs []error
	a.close.Do(func() {
		if a.stop != nil {
			a.stop()
			a.wg.Wait()
		}
		if a.Sale != nil {
			a.Sale.Close()
		}
		if a.Ledger != nil {
			errs = append(errs, a.Ledger.Close())
		}
		if a.Redis != nil {
			errs = append(errs, a.Redis.Close())
		}
	})
	return errors.Join(errs...)
}

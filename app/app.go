// Package app assembles one stockgate process from its Options: the Redis
// Cluster client, the ledger, the local caches, the Redis stores, the sale
// domain and the HTTP server, and runs the loops every replica runs. main
// and the tests build through it, so what is tested is what is shipped.
package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/extra/redisprometheus/v9"
	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/buildinfo"
	"github.com/stockgate/stockgate/cache"
	"github.com/stockgate/stockgate/cluster"
	"github.com/stockgate/stockgate/fleet"
	"github.com/stockgate/stockgate/gateway"
	"github.com/stockgate/stockgate/internal/logevery"
	"github.com/stockgate/stockgate/internal/opt"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/ratelimit"
	"github.com/stockgate/stockgate/relay"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/waitroom"
)

// Options is every setting of a process, by the package it configures.
// The dependencies inside Sale and HTTP (ledger, stores, logger, registry)
// are filled in by Open.
type Options struct {
	Redis  cluster.Options
	Ledger ledger.Options
	// Primaries are further PostgreSQL primaries beside Ledger (which is
	// named FirstPrimary and keeps the directory): each program's rows
	// live on one of them (package fleet). None: one ledger.
	Primaries []fleet.Primary
	// PlaceTTL is how long a replica trusts a program's place in the
	// directory (fleet.Options.PlaceTTL).
	PlaceTTL time.Duration
	// RateScope keeps the per-client rate budgets in Redis (the shared
	// limit HTTP.RatePerClient turns on) apart from another service's on
	// the same Redis: every replica of one service uses the same.
	RateScope string
	Cache     cache.Options
	Shard     shard.Options
	Lock      lock.Options
	Sale      sale.Options
	HTTP      gateway.Options
	Relay     RelayOptions
	Logger    *slog.Logger // default slog.Default()
	// WrapLedger, when set, wraps the ledger the sale flows use: tests
	// inject faults and count calls with it.
	WrapLedger func(sale.Ledger) sale.Ledger
}

// RelayOptions configure the outbox relay: its sinks (none: no relay)
// and its timing. Relay.Sinks, Metrics and Logger are filled by Open.
type RelayOptions struct {
	relay.Options
	// WebhookURLs get every event as a signed POST, each a sink of its
	// own, signed with WebhookSecret. An entry "name=URL" names its sink;
	// a bare URL's sink is "webhook-" and a hash of the URL. The name
	// keys the sink's cursors and dead letters in the ledger, so it must
	// not move from one receiver to another when the list changes.
	WebhookURLs   []string
	WebhookSecret string
	// StreamPrefix, when set, adds a Redis Streams sink ("stream") on
	// the service's Redis Cluster, its streams keyed StreamPrefix{NN},
	// trimmed to about StreamMaxLen entries (0: kept).
	StreamPrefix string
	StreamMaxLen int64
}

// on reports whether any sink is configured.
func (o RelayOptions) on() bool { return len(o.WebhookURLs) > 0 || o.StreamPrefix != "" }

// sinks builds the configured sinks.
func (o RelayOptions) sinks(rdb *redis.ClusterClient) ([]relay.Sink, error) {
	var out []relay.Sink
	for _, entry := range o.WebhookURLs {
		name, u := webhookSink(entry)
		w, err := relay.NewWebhook(relay.WebhookOptions{Name: name, URL: u, Secret: o.WebhookSecret})
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	if o.StreamPrefix != "" {
		s, err := relay.NewStream(relay.StreamOptions{Redis: rdb, Prefix: o.StreamPrefix, MaxLen: o.StreamMaxLen})
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// Validate reports the first setting that cannot work.
func (o RelayOptions) Validate() error {
	if !o.on() {
		return nil
	}
	names := map[string]bool{}
	for _, entry := range o.WebhookURLs {
		name, u := webhookSink(entry)
		if err := (relay.WebhookOptions{Name: name, URL: u, Secret: o.WebhookSecret}).Validate(); err != nil {
			return err
		}
		if names[name] {
			return opt.Bad("Relay.WebhookURLs", "names the sink "+name+" twice")
		}
		names[name] = true
	}
	if err := (relay.StreamOptions{Redis: &redis.ClusterClient{}, Prefix: o.StreamPrefix, MaxLen: o.StreamMaxLen}).Validate(); err != nil {
		return err
	}
	ro := o.Options
	ro.Sinks = []relay.Sink{placeholder{}} // the sinks were checked above
	return ro.Validate()
}

// placeholder stands for the configured sinks while their timing is
// validated.
type placeholder struct{}

func (placeholder) Name() string                                { return "sink" }
func (placeholder) Deliver(context.Context, ledger.Event) error { return nil }

// DefaultOptions are every package's defaults; main takes its flag
// defaults from them.
func DefaultOptions() Options {
	return Options{
		Redis: cluster.DefaultOptions(), Ledger: ledger.DefaultOptions(), Cache: cache.DefaultOptions(),
		Shard: shard.DefaultOptions(), Lock: lock.DefaultOptions(), Sale: sale.DefaultOptions(),
		HTTP: gateway.DefaultOptions(), Relay: RelayOptions{Options: relay.DefaultOptions()}, PlaceTTL: fleet.DefaultPlaceTTL,
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
		{"Redis", o.Redis.Validate()}, {"Ledger", o.Ledger.Validate()}, {"Fleet", o.fleet().Validate()}, {"Cache", o.Cache.Validate()},
		{"Shard", o.Shard.Validate()}, {"Lock", o.Lock.Validate()}, {"Sale", o.Sale.Validate()},
		{"HTTP", o.HTTP.Validate()}, {"Relay", o.Relay.Validate()},
	} {
		if v.err != nil {
			return opt.In(v.name, v.err)
		}
	}
	return nil
}

// FirstPrimary is the name of the ledger Options.Ledger opens.
const FirstPrimary = "main"

// fleet is the ledger's options as a fleet: Ledger first, then Primaries.
func (o Options) fleet() fleet.Options {
	ps := append([]fleet.Primary{{Name: FirstPrimary, Ledger: o.Ledger}}, o.Primaries...)
	return fleet.Options{Primaries: ps, PlaceTTL: o.PlaceTTL, Logger: o.Logger}
}

// App is one assembled process.
type App struct {
	Redis    *redis.ClusterClient
	Ledger   *fleet.Fleet
	Cache    *cache.Cache
	Gate     *shard.Store
	Seats    *seats.Store
	Sale     *sale.Service
	Rooms    *waitroom.Rooms
	Server   *gateway.Server
	Relay    relay.Group // one relay per primary; none with no sink configured
	Registry *prometheus.Registry

	log    *slog.Logger
	health *ledgerHealth
	stop   context.CancelFunc
	wg     sync.WaitGroup
	close  sync.Once
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
	// A failing dependency's warnings, a line a second each (logevery).
	o.Logger = logevery.Wrap(o.Logger)
	log := gateway.WithRequestIDs(o.Logger)
	a := &App{Registry: prometheus.NewRegistry(), log: log}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	if a.Redis, err = cluster.New(o.Redis); err != nil {
		return nil, err
	}
	// A breaker per Redis node, on every command the client sends: a
	// failing master costs only its own slots.
	bo := o.Sale.Breaker
	bo.IsOutcome, bo.Registerer, bo.Deadlines = cluster.NodeAnswered, a.Registry, true
	if o.Sale.Breakers, err = breaker.NewSet(bo); err != nil {
		return nil, err
	}
	cluster.Guard(a.Redis, o.Sale.Breakers)
	redisCalls := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "stockgate_redis_calls_total",
		Help: "Commands and scripts this replica sent to Redis (a pipeline counts each command; a script counts once).",
	})
	a.Redis.AddHook(countCalls{redisCalls})
	a.Registry.MustRegister(buildinfo.Collector(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		redisprometheus.NewCollector("stockgate", "redis", a.Redis), redisCalls)
	if a.health, err = newLedgerHealth(a.Registry); err != nil {
		return nil, err
	}
	fo := o.fleet()
	fo.Metrics, fo.Logger = a.Registry, log
	if a.Ledger, err = fleet.Open(ctx, fo); err != nil {
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
	if a.Rooms, err = waitroom.New(waitroom.Options{Ledger: a.Ledger, Store: waitroom.NewStore(a.Redis), Locker: locker,
		Logger: log, Registry: a.Registry}); err != nil {
		return nil, err
	}
	o.Sale.Door = door{a.Rooms}
	o.Sale.Notifier, o.Sale.Logger, o.Sale.Registry, o.Sale.CacheMetrics = a.Redis, log, a.Registry, cacheMetrics
	if a.Sale, err = sale.New(o.Sale); err != nil {
		return nil, err
	}
	if o.Relay.on() {
		ro := o.Relay.Options
		if ro.Sinks, err = o.Relay.sinks(a.Redis); err != nil {
			return nil, err
		}
		ro.Metrics, ro.Logger = a.Registry, log
		for _, name := range a.Ledger.Primaries() {
			if len(o.Primaries) > 0 {
				ro.Metrics = prometheus.WrapRegistererWith(prometheus.Labels{"primary": name}, a.Registry)
				ro.Logger = log.With("primary", name)
			}
			r, err := relay.New(a.Ledger.Primary(name), ro)
			if err != nil {
				return nil, err
			}
			a.Relay = append(a.Relay, r)
		}
		o.HTTP.Relay = a.Relay
	}
	o.HTTP.Sale, o.HTTP.Rooms, o.HTTP.Logger, o.HTTP.Registry = a.Sale, a.Rooms, log, a.Registry
	if o.HTTP.RatePerClient > 0 && o.HTTP.SharedLimit == nil {
		// One budget per client across the replicas, through the same
		// breakers as the gate: with Redis out, each replica's own.
		if o.HTTP.SharedLimit, err = ratelimit.New(ratelimit.Options{Redis: a.Redis, Scope: o.RateScope}); err != nil {
			return nil, err
		}
	}
	if a.Server, err = gateway.New(o.HTTP); err != nil {
		return nil, err
	}
	return a, nil
}

// Loops chooses the background loops Start runs. A replica runs all of
// them; a test may leave the drift check or the sweeper out to watch a
// state they would repair. Relay runs only with a sink configured.
// Health checks the ledger for /readyz and the ledger gauges.
type Loops struct {
	Drift, Sweep, Notices, Relay, Pacer, Health bool
}

// AllLoops is what a replica runs.
var AllLoops = Loops{Drift: true, Sweep: true, Notices: true, Relay: true, Pacer: true, Health: true}

// Start runs the chosen loops until Close. Call it once.
func (a *App) Start(l Loops) {
	ctx, stop := context.WithCancel(context.Background())
	a.stop = stop
	for _, run := range []struct {
		on bool
		f  func(context.Context)
	}{{l.Drift, a.Sale.RunDrift}, {l.Drift, a.Sale.RunSizer}, {l.Sweep, a.Sale.RunSweeper}, {l.Notices, a.Sale.RunNotices}, {l.Notices, a.Rooms.RunNotices}, {l.Pacer, a.Rooms.RunPacer},
		{l.Relay && a.Relay != nil, a.Relay.Run}, {l.Health, a.runHealth}} {
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

// countCalls counts what the Redis client sends: what an idle replica
// costs Redis shows in it.
type countCalls struct{ n prometheus.Counter }

func (c countCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c countCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Inc()
		return next(ctx, cmd)
	}
}

func (c countCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(float64(len(cmds)))
		return next(ctx, cmds)
	}
}

// webhookSink splits a WebhookURLs entry into its sink's name and URL:
// "name=URL", or a bare URL named "webhook-" and the first 8 hex digits of
// its SHA-256 (stable across restarts and list changes).
func webhookSink(entry string) (name, url string) {
	if i := strings.IndexByte(entry, '='); i > 0 && validName(entry[:i]) {
		return entry[:i], entry[i+1:]
	}
	sum := sha256.Sum256([]byte(entry))
	return "webhook-" + hex.EncodeToString(sum[:4]), entry
}

// validName says a sink name is an id ([A-Za-z0-9_-]{1,64}): the part
// of an entry before '=' that is not a URL's.
func validName(s string) bool {
	_, err := keys.ParseID(s)
	return err == nil
}

// door is the waiting rooms as sale's Door: sale and waitroom know nothing
// of each other, and their words meet here.
type door struct{ r *waitroom.Rooms }

func (d door) Admit(ctx context.Context, program, buyer keys.ID, token string, request, key keys.ID) (func(context.Context, sale.DoorOutcome), error) {
	settle, err := d.r.Admit(ctx, program, buyer, token, request, key)
	if err != nil {
		return nil, doorError(err)
	}
	if settle == nil {
		return nil, nil
	}
	return func(ctx context.Context, o sale.DoorOutcome) {
		how := waitroom.Unknown
		switch o {
		case sale.DoorCommitted:
			how = waitroom.Committed
		case sale.DoorRefused:
			how = waitroom.Refused
		case sale.DoorReplayed:
			how = waitroom.Replayed
		}
		settle(ctx, how)
	}, nil
}

func (d door) Queued(ctx context.Context, program keys.ID) (bool, error) {
	q, err := d.r.Queued(ctx, program)
	if err != nil {
		return false, doorError(err)
	}
	return q, nil
}

func (d door) Wake(program keys.ID) { d.r.Wake(program) }

// doorError is a refusal of the door in sale's words, its detail kept.
func doorError(err error) error {
	kind := sale.ErrUnavailable
	for _, k := range []struct {
		from *waitroom.Kind
		to   *sale.Err
	}{{waitroom.ErrAdmissionRequired, sale.ErrAdmissionRequired}, {waitroom.ErrAdmissionInvalid, sale.ErrAdmissionInvalid},
		{waitroom.ErrAdmissionUsed, sale.ErrAdmissionUsed}, {waitroom.ErrAdmissionExpired, sale.ErrAdmissionExpired}} {
		if errors.Is(err, k.from) {
			kind = k.to
		}
	}
	return fmt.Errorf("%w: %w", sale.Refuse(kind, waitroom.Detail(err)), err)
}

// The fleet is the ledger every consumer takes.
var (
	_ sale.Ledger     = (*fleet.Fleet)(nil)
	_ waitroom.Ledger = (*fleet.Fleet)(nil)
)

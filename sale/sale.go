// Package sale owns every flow of stock: purchase, hold, seat hold,
// confirm, cancel, expiry, refund, and the admin flows that change a SKU
// and rebuild its Redis gate (restock, end, resize, reconcile, drift
// repair). It keeps the request model (one key per buyer, bound to a
// fingerprint of what it asks; see request.go), orchestrates the Redis gate
// (package shard), the seat gate (seats), the ledger (ledger) and the
// cross-replica lock (lock), and answers with domain results and the
// errors in errors.go. Who may buy from a pool is package access's to
// say; a queued program's requests go through the waiting room's Door
// (package waitroom, wired by app; sale knows nothing of it). It knows
// nothing of HTTP: package gateway maps its results and errors onto the
// API.
package sale

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/cache"
	"github.com/stockgate/stockgate/internal/logevery"
	"github.com/stockgate/stockgate/internal/opt"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// Gate is the Redis side of the stock (package shard).
type Gate interface {
	Deduct(ctx context.Context, r shard.Request) (shard.Deduction, error)
	Restore(ctx context.Context, sku stock.SKU, requestID keys.ID, holder string, parts []shard.Part) (held bool, err error)
	Seed(ctx context.Context, sku stock.SKU, n int, remaining, epoch int64, overwrite bool) error
	Refill(ctx context.Context, sku stock.SKU, n int, returnID keys.ID, epoch, q int64) (int, error)
	Fence(ctx context.Context, sku stock.SKU, n int, closed bool) error
	TakeQuota(ctx context.Context, sku stock.SKU, buyer, requestID, keyID keys.ID, q, limit int64) (bool, error)
	ReleaseQuota(ctx context.Context, sku stock.SKU, buyer, requestID, keyID keys.ID) error
	TakeBudget(ctx context.Context, b shard.Budget, entry keys.ID, q, budget int64, expires time.Time, device string) (fresh bool, countedUnder string, err error)
	EndBudget(ctx context.Context, b shard.Budget, entry keys.ID) (string, error)
	ExtendBudget(ctx context.Context, b shard.Budget, entry keys.ID, expires time.Time) (string, error)
	Read(ctx context.Context, sku stock.SKU, n int) ([]shard.ShardStock, error)
	Remaining(ctx context.Context, sku stock.SKU, n int) (int64, bool, error)
}

// Ledger is the SQL truth (package ledger), as sale uses it: the
// capabilities below, each named for what it serves, so a wrapper (a test's
// slow ledger) or a later consumer takes only what it calls.
type Ledger interface {
	SKUs
	Takes
	Ends
	Restores
	Events
	Seating
	Pools
	Waitlists
	Resales
}

// SKUs are the SKUs' settings and their gates' bookkeeping.
type SKUs interface {
	ID() keys.ID
	PutSKU(ctx context.Context, c ledger.SKUConfig) (ledger.SKUState, error)
	SKU(ctx context.Context, sku stock.SKU) (ledger.SKUState, error)
	SKUs(ctx context.Context, after stock.SKU, limit int) ([]ledger.SKUState, error)
	EndSale(ctx context.Context, sku stock.SKU) (ledger.SKUState, error)
	SetShards(ctx context.Context, sku stock.SKU, n int) error
	SetProgram(ctx context.Context, p ledger.Program) error
	Program(ctx context.Context, program keys.ID) (ledger.Program, error)
	MarkGateSeeded(ctx context.Context, sku stock.SKU, seq int64) error
	AdvanceGate(ctx context.Context, sku stock.SKU) (ledger.SKUState, error)
	Report(ctx context.Context, program keys.ID) ([]ledger.StockReport, error)
}

// Takes commits takes of stock (group-committed) and answers what a
// request or a take already did.
type Takes interface {
	Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult
	OrderByKey(ctx context.Context, key keys.ID) (ledger.Order, error)
	OrderByID(ctx context.Context, id keys.ID) (ledger.Order, error)
	HoldByID(ctx context.Context, id keys.ID) (ledger.Hold, error)
	HoldByKey(ctx context.Context, key keys.ID) (ledger.Hold, error)
	CartByID(ctx context.Context, id keys.ID) (ledger.Cart, error)
	// RequestByKey reads a committed request by its key, on program's
	// primary (zero: on any).
	RequestByKey(ctx context.Context, program, scope, key keys.ID) (ledger.Recorded, error)
	// RequestDurable returns once a recorded request is on the synchronous
	// standby: asked before a replay is answered (see ledger's).
	RequestDurable(ctx context.Context, program, scope, key keys.ID) error
	// RequestSettled waits out any transaction writing a request's row:
	// nil once it is committed, ledger.ErrNotFound once nobody has it.
	RequestSettled(ctx context.Context, program, scope, key keys.ID) error
	CommittedSince(ctx context.Context, sku stock.SKU, after int64) (ledger.Committed, error)
}

// Ends ends what was taken: confirms, cancels, expiries and refunds, alone
// or in batches.
type Ends interface {
	Confirm(ctx context.Context, holdID, buyer keys.ID, req ledger.Request) (ledger.Order, error)
	ConfirmPart(ctx context.Context, holdID, buyer keys.ID, keep int64, req ledger.Request) (ledger.Order, error)
	AnswerWith(ctx context.Context, req ledger.Request, o ledger.Order) (ledger.Order, error)
	RefuseLate(ctx context.Context, r ledger.LateRefusal) (ledger.Recorded, error)
	ExpireHold(ctx context.Context, id keys.ID) (ledger.Hold, bool, error)
	Transfer(ctx context.Context, orderID, from, to keys.ID, q int64, req ledger.Request) (ledger.Order, error)
	ConfirmBatch(ctx context.Context, cs []ledger.HoldRequest) ([]ledger.BatchResult, error)
	Cancel(ctx context.Context, holdID, buyer keys.ID, req ledger.Request) (ledger.Hold, bool, error)
	Extend(ctx context.Context, holdID, buyer keys.ID, ttl time.Duration, req ledger.Request) (ledger.Hold, error)
	CancelBatch(ctx context.Context, cs []ledger.HoldRequest) ([]ledger.HoldResult, error)
	Refund(ctx context.Context, orderID, buyer keys.ID, req ledger.Request) (ledger.Order, bool, error)
	RefundBatch(ctx context.Context, rs []ledger.OrderRequest) ([]ledger.OrderResult, error)
	ExpireDue(ctx context.Context, limit int) ([]ledger.Hold, error)
	ConfirmCart(ctx context.Context, id, buyer keys.ID, req ledger.Request) (ledger.Cart, error)
	CancelCart(ctx context.Context, id, buyer keys.ID, req ledger.Request) (ledger.Cart, []keys.ID, error)
	RefundCart(ctx context.Context, id, buyer keys.ID, req ledger.Request) (ledger.Cart, []keys.ID, error)
}

// Restores are the returns of stock Redis is still owed.
type Restores interface {
	RestoreOwed(ctx context.Context, kind string, id keys.ID) (ledger.Restore, bool, error)
	PendingRestores(ctx context.Context, olderThan time.Duration, limit int) ([]ledger.Restore, error)
	RestoreDone(ctx context.Context, kind string, id keys.ID) error
	RestoreDurable(ctx context.Context, kind string, id keys.ID) error
}

// Events reads a program's event feed, and which events the ledger has.
type Events interface {
	Events(ctx context.Context, program keys.ID, after int64, limit int) ([]ledger.Event, error)
	KnownEvents(ctx context.Context, ids []keys.ID) ([]keys.ID, error)
}

// Seating is a SKU's seat map.
type Seating interface {
	LoadSeats(ctx context.Context, sku stock.SKU, seats []ledger.Seat) (int64, error)
	Seats(ctx context.Context, sku stock.SKU, section keys.ID) ([]ledger.Seat, error)
	SeatFacts(ctx context.Context, sku stock.SKU) ([]ledger.SeatFact, error)
}

// Pools are a ticket's allocations and their access codes.
type Pools interface {
	PutPool(ctx context.Context, c ledger.PoolConfig) (ledger.SKUState, error)
	ClosePool(ctx context.Context, pool stock.SKU, due bool) (int64, stock.SKU, error)
	Pools(ctx context.Context, ticket stock.SKU) ([]ledger.SKUState, error)
	PoolsDue(ctx context.Context, limit int) ([]stock.SKU, error)
	PutCodes(ctx context.Context, pool stock.SKU, codes []ledger.Code) (int, error)
	CodeOf(ctx context.Context, pool stock.SKU, hash string) (ledger.Code, error)
}

// Waitlists are the buyers waiting for a sold-out SKU's returns.
type Waitlists interface {
	JoinWaitlist(ctx context.Context, sku stock.SKU, buyer keys.ID, q int64, ttl time.Duration) (ledger.WaitEntry, bool, error)
	LeaveWaitlist(ctx context.Context, sku stock.SKU, buyer keys.ID) (ledger.WaitEntry, error)
	WaitEntryOf(ctx context.Context, sku stock.SKU, buyer keys.ID) (ledger.WaitEntry, error)
}

// settingsStale is how many SettingsTTLs a settings value may be served
// while its refreshes fail: a minute at the default, longer than a
// failover.
const settingsStale = 60

// Options configures a Service. The zero value of a setting takes its
// default (DefaultOptions); Validate refuses what cannot work.
type Options struct {
	Gate   Gate         // required
	Ledger Ledger       // required
	Cache  *cache.Cache // required; the same one the Gate skips empty shards with
	// Locker coordinates rebuilds across replicas; it must use the same
	// Redis Cluster as the Gate. Required.
	Locker *lock.Locker
	// Seats is the Redis side of reserved seating. Optional: without it
	// seat flows answer ErrNoSeating.
	Seats *seats.Store
	// Door is the waiting rooms' door (package waitroom). Optional:
	// without it no program has one.
	Door Door
	// Notifier carries restock notices between replicas (the Redis
	// client; see RunNotices). Optional: without it a replica learns that
	// stock came back when its sold-out flag expires.
	Notifier Notifier
	Logger   *slog.Logger // default slog.Default()
	// Registry receives the metrics. Default: a new registry.
	Registry prometheus.Registerer
	// CacheMetrics receives the local caches' hit and miss counts; the same
	// one the Cache was given. Default: new metrics on Registry.
	CacheMetrics *cache.Metrics
	// Breaker configures the fuse around each Redis master (see Breakers).
	Breaker breaker.Options
	// Breakers are the breakers every command to a Redis node runs through
	// (cluster.Guard installs them on the client), one per master: a
	// failing master refuses its own slots' calls at once, and the takes
	// of its SKUs go to other shards or around the gate while the others
	// keep their gate. The Service logs their transitions. Default: a Set
	// of its own from Breaker, which guards nothing.
	Breakers *breaker.Set

	// RedisTimeout is the deadline of one gate call (a purchase probing
	// several shards is one call).
	RedisTimeout time.Duration
	// FallbackConcurrency caps takes going straight to the ledger at once
	// while their master is out (or their outcome in Redis is unknown);
	// beyond it a take waits a moment (fallbackWait) for a place, then
	// gets ErrBusyShared. They are group-committed and shed by the
	// wait budget like the others, so the cap is a backstop. Default 256.
	FallbackConcurrency int
	// ReseedWait is how long a request waits for the rebuild lock of its
	// SKU before going to the ledger instead.
	ReseedWait time.Duration
	// DriftEvery is the period of the drift check RunDrift runs.
	DriftEvery time.Duration
	// BatchMax is the most gate-admitted purchases committed in one ledger
	// transaction (group commit); 1 commits each alone.
	BatchMax int
	// CommitLanes is the most ledger transactions of takes (and of
	// confirms, cancels, refunds) one replica runs at once. A lane opens
	// only while those before it can't keep up (a full batch waits behind
	// each one's flush), so under a crowd batches grow before lanes do.
	CommitLanes int
	// LedgerWaitBudget bounds how long a request waits for its ledger
	// batch: beyond it, it is refused at once with ErrBusy (503,
	// Retry-After) and what it took at the gate given back. Negative: no
	// bound.
	LedgerWaitBudget time.Duration
	// TakesInFlight is the fewest takes (purchases, holds, carts) one
	// replica lets in flight at once; the bound grows to what it finished
	// in the last second times LedgerWaitBudget, and a take beyond it is
	// refused at once with ErrBusy, before it costs anything. Negative: no
	// bound.
	TakesInFlight int64
	// CollapseAt: when a SKU spread over several shards has this many units
	// left per shard or fewer, the drift check collapses it onto one shard
	// (a fenced resize), so the last units sit together. Negative turns it
	// off; 0 takes the default.
	CollapseAt int64
	// AutoShards, when above 0, lets RunSizer size the shards of every SKU
	// this replica takes from between 1 and AutoShards, following its
	// takes (see sizer.go); a SKU's configured shards are where it starts.
	// 0 keeps every SKU at its configured shards.
	AutoShards int
	// AutoShardRate is the takes a second one shard is sized for, so one
	// master's share of a hot SKU stays small. Default 2,000.
	AutoShardRate float64
	// SweepEvery is the period of RunSweeper, which expires due holds: a
	// hold's stock is back at most about this long after its expiry.
	SweepEvery time.Duration
	// RestoreGrace is how long a restore may stay half-done (ledger side
	// done, Redis side not) before any sweeper finishes it.
	RestoreGrace time.Duration
	// SettingsTTL is how long a SKU's (a program's, a code's, a seat
	// map's) settings are served from memory before a read refreshes them
	// in the background; the old value is served until the refresh lands,
	// for at most settingsStale times as long (a ledger that does not
	// answer). The ledger checks again what it commits.
	SettingsTTL time.Duration
	// StockTTL is how long a stock read is served from memory.
	StockTTL time.Duration
	// WorkTimeout bounds one request's work. The work runs detached from the
	// caller's context: once stock is taken from Redis it must end in a
	// ledger commit or a give-back, whether or not the client is still there.
	WorkTimeout time.Duration
	// OfferTTL is how long a waitlist offer's hold lasts before it passes
	// to the next buyer in line.
	OfferTTL time.Duration
	// LatePayment is how long after a hold's expiry its confirm still buys
	// its units, taken again from stock if they are there (a buyer who
	// paid as the hold ran out); 0 turns late payments off (a confirm past
	// the expiry is ErrHoldExpired). At most MaxLatePayment.
	LatePayment time.Duration
	// Now is the clock holds expire by: a hold's expiry is set from it,
	// and a hold, a late payment's window and a hold budget are read
	// against it. nil is the machine's; a test moves it with the
	// ledger's (ledger.Options.Now).
	Now func() time.Time
}

// MaxLatePayment bounds Options.LatePayment.
const MaxLatePayment = 24 * time.Hour

// DefaultOptions are the settings a zero Options takes; main takes its flag
// defaults from them.
func DefaultOptions() Options {
	return Options{
		Breaker:             breaker.DefaultOptions(),
		RedisTimeout:        time.Second,
		FallbackConcurrency: 256,
		ReseedWait:          time.Second,
		DriftEvery:          30 * time.Second,
		BatchMax:            256,
		CommitLanes:         2,
		LedgerWaitBudget:    250 * time.Millisecond,
		TakesInFlight:       1024,
		CollapseAt:          1,
		AutoShardRate:       2000,
		SweepEvery:          time.Second,
		RestoreGrace:        5 * time.Second,
		SettingsTTL:         time.Second,
		StockTTL:            200 * time.Millisecond,
		WorkTimeout:         5 * time.Second,
		OfferTTL:            10 * time.Minute,
	}
}

// withDefaults fills every zero setting from DefaultOptions.
func (o Options) withDefaults() Options {
	d := DefaultOptions()
	def := func(v *time.Duration, dv time.Duration) {
		if *v == 0 {
			*v = dv
		}
	}
	for _, p := range []struct {
		v *time.Duration
		d time.Duration
	}{
		{&o.RedisTimeout, d.RedisTimeout}, {&o.ReseedWait, d.ReseedWait},
		{&o.DriftEvery, d.DriftEvery}, {&o.SweepEvery, d.SweepEvery}, {&o.RestoreGrace, d.RestoreGrace},
		{&o.SettingsTTL, d.SettingsTTL}, {&o.StockTTL, d.StockTTL}, {&o.WorkTimeout, d.WorkTimeout},
		{&o.OfferTTL, d.OfferTTL}, {&o.LedgerWaitBudget, d.LedgerWaitBudget},
	} {
		def(p.v, p.d)
	}
	if o.FallbackConcurrency == 0 {
		o.FallbackConcurrency = d.FallbackConcurrency
	}
	if o.BatchMax == 0 {
		o.BatchMax = d.BatchMax
	}
	if o.CommitLanes == 0 {
		o.CommitLanes = d.CommitLanes
	}
	if o.TakesInFlight == 0 {
		o.TakesInFlight = d.TakesInFlight
	}
	if o.CollapseAt == 0 {
		o.CollapseAt = d.CollapseAt
	}
	if o.AutoShardRate == 0 {
		o.AutoShardRate = d.AutoShardRate
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	return o
}

// Validate reports the first field that cannot work (an *opt.Error). Zero
// settings are valid: they take their defaults.
func (o Options) Validate() error {
	for name, d := range map[string]time.Duration{
		"RedisTimeout": o.RedisTimeout, "ReseedWait": o.ReseedWait,
		"DriftEvery": o.DriftEvery, "SweepEvery": o.SweepEvery, "RestoreGrace": o.RestoreGrace,
		"SettingsTTL": o.SettingsTTL, "StockTTL": o.StockTTL, "WorkTimeout": o.WorkTimeout, "LatePayment": o.LatePayment,
	} {
		if d < 0 {
			return opt.Bad(name, "must not be negative")
		}
	}
	if o.LatePayment > MaxLatePayment {
		return opt.Bad("LatePayment", "must be at most "+MaxLatePayment.String())
	}
	switch {
	case o.FallbackConcurrency < 0:
		return opt.Bad("FallbackConcurrency", "must be at least 1")
	case o.BatchMax < 0:
		return opt.Bad("BatchMax", "must be at least 1")
	case o.CommitLanes < 0:
		return opt.Bad("CommitLanes", "must be at least 1")
	case o.AutoShards < 0 || o.AutoShards > stock.MaxShards:
		return opt.Bad("AutoShards", "must be in 0..256")
	case o.AutoShardRate < 0 || o.AutoShardRate != o.AutoShardRate:
		return opt.Bad("AutoShardRate", "must be above 0")
	}
	return opt.In("Breaker", o.Breaker.Validate())
}

// Service runs the flows. It holds no state a restart would lose: what it
// keeps in memory (settings, sold-out flags, committed keys) is read again.
type Service struct {
	gate     Gate
	ledger   Ledger
	cache    *cache.Cache
	locker   *lock.Locker
	breakers *breaker.Set
	metrics  *metrics
	// committer group-commits gate-admitted purchases; direct, the ones
	// sold around the gate while the breaker is open.
	committer *committer
	direct    *committer
	// confirms, cancels and refunds group-commit what their names say.
	confirms *batcher[ledger.HoldRequest, confirmOut]
	cancels  *batcher[ledger.HoldRequest, cancelOut]
	refunds  *batcher[ledger.OrderRequest, refundOut]
	fallback chan struct{}    // semaphore of ledger-direct requests
	logs     logevery.Limiter // failing dependencies' lines, one a second
	reseeds  singleflight.Group
	log      *slog.Logger
	opts     Options
	settings *cache.Loading[stock.SKU, ledger.SKUState]
	codes    *cache.Loading[codeKey, ledger.Code]
	// codeMisses coalesces the ledger reads of a code the cache calls
	// unknown (codeFor): a crowd presenting one code not added yet makes
	// one read at a time, not one each.
	codeMisses singleflight.Group
	programs   *cache.Loading[keys.ID, ledger.Program] // a program's caps and hold budgets
	seatMaps   *cache.Loading[stock.SKU, seatMap]
	// sectionViews serves seat status reads from memory for StockTTL.
	sectionViews *cache.Loading[sectionKey, Section]
	seatSeen     struct {
		mu sync.Mutex
		m  map[stock.SKU]map[keys.ID]string // seat → mismatch at the last periodic check
	}
	seats   *seats.Store
	stock   *cache.Viewed[stock.SKU, Stock]
	changes changes // what the next change notice tells
	// restocksOwed are restock notices sent with the next change notices:
	// those whose publish failed, and SKUs sold around the gate (their gate
	// went stale, so every replica must read their settings again).
	restocksOwed changes
	quotaOwed    owed[quotaRelease]
	budgetOwed   owed[budgetCall]
	// inflight's mutex is taken twice a request from both cores: a cache
	// line of its own keeps the fields read beside it from bouncing
	// between the cores with it (false sharing).
	// Carts committed about 10 % slower (stockbench compare -runs carts,
	// 3 rounds: 0.90 with changes' new fields, 0.91 with 32 bytes of
	// padding alone) when the fields around it moved, and 0.98 once it
	// had its line.
	_        [64]byte
	inflight inflight
	_        [64]byte
	// replays answers retries of committed requests of SKUs that take no
	// more requests (sold out, ended) without a ledger call per request.
	replays *replays
	// flight bounds the takes in flight (see TakesInFlight).
	flight *flight
	// bypassed are the SKUs this replica sold around the gate since it
	// last read their rows (see gateFresh).
	bypassed sync.Map
	// redisTrouble: the breaker changed state since the drift check last
	// looked, so Redis may have lost writes: it reads every SKU again.
	redisTrouble atomic.Bool
	// rebuildsFailed: SKU → when a rebuild of its stale gate last failed
	// (see rebuildDue).
	rebuildsFailed sync.Map
	// rebuilds are the stale gates' rebuilds requests started and did
	// not wait for (see reseedSoon).
	rebuilds rebuildFlights
	// refillStale: SKU → when a return last waited out refillWaits for
	// its gate in vain.
	refillStale sync.Map
	// sizer counts takes for RunSizer (AutoShards).
	sizer sizer
	// backs publishes the back notices (see notifyBack).
	backs backNotices
}

// New validates opts and returns a Service; Close stops it.
func New(opts Options) (*Service, error) {
	if opts.Gate == nil || opts.Ledger == nil || opts.Cache == nil || opts.Locker == nil {
		return nil, errors.New("sale: Options.Gate, Ledger, Cache and Locker are required")
	}
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("sale: %w", err)
	}
	opts = opts.withDefaults()
	s := &Service{gate: opts.Gate, ledger: opts.Ledger, cache: opts.Cache, locker: opts.Locker, log: opts.Logger, opts: opts,
		seats: opts.Seats, fallback: make(chan struct{}, opts.FallbackConcurrency)}
	var err error
	if s.metrics, err = newMetrics(opts.Registry); err != nil {
		return nil, fmt.Errorf("sale: metrics: %w", err)
	}
	if opts.CacheMetrics == nil {
		if opts.CacheMetrics, err = cache.NewMetrics(opts.Registry); err != nil {
			return nil, fmt.Errorf("sale: metrics: %w", err)
		}
	}
	if s.breakers = opts.Breakers; s.breakers == nil {
		if s.breakers, err = breaker.NewSet(opts.Breaker); err != nil {
			return nil, fmt.Errorf("sale: %w", err)
		}
	}
	// Every transition is logged with the failure that opened the breaker
	// (not the error of whichever request happened to notice the change).
	s.breakers.Listen(func(node string, from, to breaker.State, cause error) {
		s.redisTrouble.Store(true)
		s.log.Warn("redis breaker", "node", node, "from", from.String(), "to", to.String(), "cause", cause)
	})
	cm := opts.CacheMetrics
	if s.settings, err = cache.NewRefreshing(opts.SettingsTTL, settingsStale*opts.SettingsTTL, 100_000, cm.Recorder("settings"), s.ledger.SKU); err != nil {
		return nil, err
	}
	if s.codes, err = cache.NewRefreshing(opts.SettingsTTL, settingsStale*opts.SettingsTTL, 1_000_000, cm.Recorder("codes"), s.loadCode); err != nil {
		return nil, err
	}
	if s.programs, err = cache.NewRefreshing(opts.SettingsTTL, settingsStale*opts.SettingsTTL, 100_000, cm.Recorder("programs"), s.ledger.Program); err != nil {
		return nil, err
	}
	if s.replays, err = newReplays(s.ledger, 10*time.Minute, 2*opts.WorkTimeout); err != nil {
		return nil, err
	}
	if s.seatMaps, err = cache.NewRefreshing(opts.SettingsTTL, settingsStale*opts.SettingsTTL, 1_000, cm.Recorder("seatmaps"), s.loadSeatMap); err != nil {
		return nil, err
	}
	if s.sectionViews, err = cache.NewLoading(opts.StockTTL, 10_000, cm.Recorder("sections"), s.loadSection); err != nil {
		return nil, err
	}
	if s.stock, err = cache.NewViewed(opts.Cache, opts.StockTTL, 100_000, cm.Recorder("stock"), s.loadStock); err != nil {
		return nil, err
	}
	s.flight = newFlight(opts.TakesInFlight, opts.LedgerWaitBudget, opts.WorkTimeout)
	s.committer = newCommitter(s, opts.CommitLanes, opts.BatchMax, false)
	s.direct = newCommitter(s, 4, opts.BatchMax, true)
	lanes, max, timeout, budget := opts.CommitLanes, opts.BatchMax, opts.WorkTimeout, opts.LedgerWaitBudget
	s.confirms = newBatcher(lanes, max, timeout, budget, s.metrics.batchMetrics("confirms"), s.flushConfirms)
	s.cancels = newBatcher(lanes, max, timeout, budget, s.metrics.batchMetrics("cancels"), s.flushCancels)
	s.refunds = newBatcher(lanes, max, timeout, budget, s.metrics.batchMetrics("refunds"), s.flushRefunds)
	return s, nil
}

// Close stops the group committers after they have answered what was
// queued. Call it once no flow is running (after the HTTP server drained).
func (s *Service) Close() {
	s.closeRebuilds()
	s.committer.close()
	s.direct.close()
	s.confirms.close()
	s.cancels.close()
	s.refunds.close()
	if s.opts.Notifier != nil {
		// What changed since the loops' last notice, those commits
		// included: a replica leaving (a rollout, a scale-in) would
		// otherwise leave the others' views standing their max age.
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.RedisTimeout)
		s.closeBacks(ctx)
		cancel()
		// Its own time: a publisher that waited on a silent node must not
		// leave it none (helper-89 #1).
		ctx, cancel = context.WithTimeout(context.Background(), s.opts.RedisTimeout)
		s.sendNotices(ctx)
		cancel()
	}
}

// Breakers are the Redis masters' breakers.
func (s *Service) Breakers() *breaker.Set { return s.breakers }

// BreakerState is the worst state of the Redis masters' breakers now:
// Open while any master's is open.
func (s *Service) BreakerState() breaker.State { return s.breakers.State() }

// now is the Service's clock (Options.Now).
func (s *Service) now() time.Time { return s.opts.Now() }

// detach gives work its own deadline, detached from the caller's: work
// once begun ends in a commit or a give-back, whether or not the client is
// still there.
func (s *Service) detach(ctx context.Context) (context.Context, context.CancelFunc) {
	// Its deadline is the request's: a Redis call it cuts short is the
	// request giving up, not the node failing.
	return context.WithTimeoutCause(context.WithoutCancel(ctx), s.opts.WorkTimeout, breaker.ErrCallerOutOfTime)
}

// runTake is run for a take: within the replica's bound of takes in
// flight, or refused at once (ErrBusy) before it moves anything.
func (s *Service) runTake(ctx context.Context, r request, f func(ctx context.Context) answer) (Result, error) {
	if !s.flight.enter() {
		s.metrics.ledgerShed.WithLabelValues("in_flight", shedDoor).Inc()
		return ansInFlightBusy.result(s.now)
	}
	defer s.flight.leave()
	return s.run(holdingPlace(ctx), r, f)
}

// run runs f once per request at a time on this replica, detached from the
// caller (see detach), and turns its answer into a Result. A concurrent
// request with the same key and another fingerprint runs after it, and
// the key's record decides it.
func (s *Service) run(ctx context.Context, r request, f func(ctx context.Context) answer) (Result, error) {
	a := s.inflight.do(r.joinKey(), r.fp, func() answer {
		ctx, cancel := s.detach(ctx)
		defer cancel()
		return s.durable(ctx, r, f(ctx))
	})
	return a.result(s.now)
}

// durable passes a on unless it replays a request row that a failover
// could still take back: PostgreSQL marks a COMMIT done on the primary
// before its synchronous standby has it, and a backend that ends in that
// wait (killed, its connection cut) leaves a row the next reader sees and
// a promoted standby lacks. A replay of a confirm, a cancel, a refund, a
// transfer, a listing or a cart action (ledger.ErrDuplicate) is answered
// once ledger.RequestDurable says the row is on the standby; unknown, it
// is 503 and the client's retry asks again. Purchases and holds check
// before their give-backs (recorded, take.commit).
func (s *Service) durable(ctx context.Context, r request, a answer) answer {
	if !a.replayed || a.durable || a.err != nil {
		return a
	}
	// An action by id names no program; its answer does. On several
	// primaries another program's row under the same key must not vouch
	// for this one (helper-50).
	if err := s.ledger.RequestDurable(ctx, r.on(a.program()).program, r.scope, r.key); err != nil && !errors.Is(err, ledger.ErrNotFound) {
		s.log.WarnContext(ctx, "replay not known to be on the standby", "err", err)
		return ansUnavailable
	}
	return a
}

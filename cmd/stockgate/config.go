package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v3"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/fleet"
	"github.com/stockgate/stockgate/internal/opt"
	"github.com/stockgate/stockgate/ledger"
)

// config is every setting: the packages' Options (app.Options, bound to
// flags below, with the packages' defaults) and the few that are main's own.
type config struct {
	app.Options
	Addr           string
	AdminAddr      string
	RedisAddrs     string // comma-separated, into Redis.Addrs
	WebhookURLs    string // comma-separated, into Relay.WebhookURLs
	TrustedProxies string // comma-separated, into HTTP.TrustedProxies
	ShutdownGrace  time.Duration
	DrainDelay     time.Duration
	LogLevel       string
	PprofAddr      string
	AllowOpenAdmin bool
	Migrate        bool
	DownTo         int64  // migrate only: undo the schema's steps above it
	Primaries      string // name=URL, comma-separated, into Options.Primaries
	MoveProgram    string // move only: the program
	MoveTo         string // move only: the primary it goes to
	SmokeURL       string // smoke only: the gateway's URL
	SmokeAdminURL  string // smoke only: its admin routes' URL, when they have a listener of their own

	// secrets are the flags that may also be read from the file
	// STOCKGATE_<FLAG>_FILE names (parse).
	secrets []string

	// flagOf names the flag that sets each Options field ("Shard.RecordTTL"),
	// so that a package's refusal names what the operator set.
	flagOf map[string]string
	// settings are the environment variables the flags read, with the
	// secrets' _FILE variants: what checkEnv knows (flags fills it).
	settings map[string]bool

	// nonZero are the flags whose zero would silently mean "the default":
	// main refuses zero and negative values there; every other bound is
	// the package's own (app.Options.Validate).
	nonZero map[string]func() bool
}

// binder declares one flag per setting, its default the current value.
type binder struct {
	fs *flag.FlagSet
	c  *config
}

func (b binder) field(name, field string, positive func() bool) {
	if field != "" {
		b.c.flagOf[field] = name
	}
	if positive != nil {
		b.c.nonZero[name] = positive
	}
}

func (b binder) dur(name string, p *time.Duration, field, usage string) {
	b.fs.DurationVar(p, name, *p, usage)
	b.field(name, field, func() bool { return *p > 0 })
}

func (b binder) int(name string, p *int, field, usage string) {
	b.fs.IntVar(p, name, *p, usage)
	b.field(name, field, func() bool { return *p > 0 })
}

func (b binder) u32(name string, p *uint32, field, usage string) {
	b.fs.Func(name, fmt.Sprintf("%s (default %d)", usage, *p), func(v string) error {
		n, err := strconv.ParseUint(v, 10, 32)
		*p = uint32(n)
		return err
	})
	b.field(name, field, func() bool { return *p > 0 })
}

func (b binder) str(name string, p *string, field, usage string) {
	b.fs.StringVar(p, name, *p, usage)
	b.field(name, field, nil)
}

// secret lets the flag be read from a file as well: STOCKGATE_<FLAG>_FILE
// names it, the convention of the postgres and mysql images, so a
// Kubernetes Secret mounted as files stays out of the environment (where
// kubectl describe, /proc/<pid>/environ and crash dumps show it). A flag
// that already names a file (-redis-tls-key-file) has no such variant: its
// variable STOCKGATE_..._FILE is the flag itself.
func (b binder) secret(name string) {
	f := b.fs.Lookup(name)
	if f == nil || strings.HasSuffix(name, "-file") || b.fs.Lookup(name+"-file") != nil {
		panic("secret flag " + name + ": undeclared, or its _FILE variable is a flag of its own")
	}
	f.Usage += " (or the file " + envVar(name) + "_FILE names)"
	b.c.secrets = append(b.c.secrets, name)
}

func flags(fs *flag.FlagSet, c *config) {
	c.Options = app.DefaultOptions()
	c.flagOf, c.nonZero = map[string]string{}, map[string]func() bool{}
	c.Ledger.DSN = "stockgate.db"
	b := binder{fs, c}
	o := &c.Options
	fs.StringVar(&c.Addr, "addr", ":8080", "HTTP listen address")
	fs.StringVar(&c.AdminAddr, "admin-addr", "", "separate listener for /metrics and the admin routes, which then leave -addr (empty: all on -addr)")
	fs.StringVar(&c.RedisAddrs, "redis-addrs", "127.0.0.1:7000", "comma-separated Redis Cluster seed nodes")
	c.flagOf["Redis.Addrs"] = "redis-addrs"
	b.str("redis-username", &o.Redis.Username, "", "Redis ACL user (empty: the default user)")
	b.str("redis-password", &o.Redis.Password, "", "Redis password (prefer the environment variable)")
	fs.BoolVar(&o.Redis.TLS.Enabled, "redis-tls", false, "speak TLS to Redis (managed services with encryption in transit)")
	b.field("redis-tls", "Redis.TLS.Enabled", nil)
	b.str("redis-tls-ca-file", &o.Redis.TLS.CAFile, "", "PEM CA bundle for the Redis nodes' certificates (empty: the system's)")
	b.str("redis-tls-cert-file", &o.Redis.TLS.CertFile, "", "client certificate, when Redis asks for one")
	b.str("redis-tls-key-file", &o.Redis.TLS.KeyFile, "Redis.TLS.KeyFile", "client certificate's key")
	b.str("redis-tls-server-name", &o.Redis.TLS.ServerName, "", "name the nodes' certificates are checked against (empty: each node's host)")
	b.dur("redis-dial-timeout", &o.Redis.DialTimeout, "Redis.DialTimeout", "Redis dial timeout")
	b.dur("redis-read-timeout", &o.Redis.ReadTimeout, "Redis.ReadTimeout", "Redis read timeout per command")
	b.dur("redis-write-timeout", &o.Redis.WriteTimeout, "Redis.WriteTimeout", "Redis write timeout per command")
	b.int("redis-pool-size", &o.Redis.PoolSize, "Redis.PoolSize", "Redis connections per node")
	b.dur("redis-state-reload", &o.Redis.StateReloadEvery, "Redis.StateReloadEvery", "how stale the cluster slot map may get before it is reloaded")
	b.str("ledger-driver", &o.Ledger.Driver, "Ledger.Driver", "ledger database: sqlite or postgres")
	b.str("ledger-dsn", &o.Ledger.DSN, "Ledger.DSN", "SQLite file path, or PostgreSQL URL")
	b.int("ledger-max-conns", &o.Ledger.MaxConns, "Ledger.MaxConns", "PostgreSQL connection cap")
	b.dur("ledger-idle-timeout", &o.Ledger.IdleTimeout, "Ledger.IdleTimeout", "how long a PostgreSQL connection may sit idle before it is closed")
	fs.StringVar(&c.Primaries, "ledger-primaries", "", "further PostgreSQL primaries beside -ledger-dsn (named main, which keeps the program directory), comma-separated name=URL: each program's rows live on one of them (docs/OPERATIONS.md, adding a primary)")
	c.flagOf["Primaries"] = "ledger-primaries"
	b.dur("place-ttl", &o.PlaceTTL, "PlaceTTL", "how long a replica trusts what it read of a program's primary before reading the directory again")
	fs.StringVar(&c.MoveProgram, "program", "", "move only: the program to move")
	fs.StringVar(&c.MoveTo, "to", "", "move only: the primary to move it to")
	fs.StringVar(&c.SmokeURL, "smoke-url", "", "smoke only: the gateway's URL (in a cluster, its Service's)")
	fs.StringVar(&c.SmokeAdminURL, "smoke-admin-url", "", "smoke only: the admin routes' URL when -admin-addr gives them a listener of their own (default: -smoke-url)")
	b.str("admin-token", &o.HTTP.AdminToken, "HTTP.AdminToken", "bearer token for /v1/admin routes (empty: open, local use only)")
	b.dur("record-ttl", &o.Shard.RecordTTL, "Shard.RecordTTL", "lifetime of a deduction record in Redis")
	b.dur("sold-out-ttl", &o.Cache.SoldOutTTL, "Cache.SoldOutTTL", "how long a sold-out SKU is answered from memory while restock notices may be missed")
	b.dur("notice-max-age", &o.Cache.NoticeMaxAge, "Cache.NoticeMaxAge", "how long a sold-out SKU is answered from memory while restock notices are heard and none came for it")
	b.dur("empty-shard-ttl", &o.Cache.EmptyShardTTL, "Cache.EmptyShardTTL", "how long an empty shard is skipped")
	b.dur("work-timeout", &o.Sale.WorkTimeout, "Sale.WorkTimeout", "time limit of one request's work")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 20*time.Second, "time in-flight requests get to finish on SIGTERM")
	c.nonZero["shutdown-grace"] = func() bool { return c.ShutdownGrace > 0 }
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.WebhookURLs, "webhook-urls", "", "comma-separated URLs the outbox relay POSTs every event to, signed; an entry name=URL names its sink, a bare URL's sink is webhook-<hash of the URL> (empty: no webhook sink)")
	c.flagOf["Relay.WebhookURLs"] = "webhook-urls"
	b.str("webhook-secret", &o.Relay.WebhookSecret, "Relay.WebhookSecret", "the webhooks' signing secret, whsec_ and base64 (prefer the environment variable)")
	b.str("stream-prefix", &o.Relay.StreamPrefix, "Relay.StreamPrefix", "key prefix of the Redis Streams the relay adds every event to, one per partition: <prefix>{NN} (empty: no stream sink)")
	fs.Int64Var(&o.Relay.StreamMaxLen, "stream-maxlen", 0, "trim each event stream to about this many entries (0: keep all)")
	b.field("stream-maxlen", "Relay.StreamMaxLen", nil)
	b.dur("relay-lease-ttl", &o.Relay.LeaseTTL, "Relay.LeaseTTL", "how long a relay partition lease lasts unrenewed (how soon a dead replica's partitions move)")
	b.int("relay-max-attempts", &o.Relay.MaxAttempts, "Relay.MaxAttempts", "failed delivery attempts before an event is dead-lettered")

	b.dur("redis-call-timeout", &o.Sale.RedisTimeout, "Sale.RedisTimeout", "deadline of one gate call (a purchase probing several shards is one call)")
	b.u32("breaker-failures", &o.Sale.Breaker.ConsecutiveFailures, "Sale.Breaker.ConsecutiveFailures", "consecutive Redis failures that open the breaker")
	fs.Float64Var(&o.Sale.Breaker.FailureRatio, "breaker-failure-ratio", o.Sale.Breaker.FailureRatio, "failure ratio within the window that opens the breaker")
	b.field("breaker-failure-ratio", "Sale.Breaker.FailureRatio", func() bool { return o.Sale.Breaker.FailureRatio > 0 })
	b.u32("breaker-min-requests", &o.Sale.Breaker.MinRequests, "Sale.Breaker.MinRequests", "calls in the window before the ratio counts")
	b.dur("breaker-window", &o.Sale.Breaker.Window, "Sale.Breaker.Window", "rolling window the failure ratio is counted over")
	b.dur("breaker-open-for", &o.Sale.Breaker.OpenFor, "Sale.Breaker.OpenFor", "time the breaker stays open before probing Redis")
	b.u32("breaker-probes", &o.Sale.Breaker.Probes, "Sale.Breaker.Probes", "successful half-open probes that close the breaker")
	b.int("fallback-concurrency", &o.Sale.FallbackConcurrency, "Sale.FallbackConcurrency", "requests sent straight to the ledger at once while Redis is out; beyond, after a 250 ms wait for a place: 503")
	b.dur("lock-ttl", &o.Lock.TTL, "Lock.TTL", "lifetime of a coordination lock after its holder stops renewing it")
	b.dur("reseed-wait", &o.Sale.ReseedWait, "Sale.ReseedWait", "how long a request waits for another replica's rebuild of its SKU")
	b.dur("drift-every", &o.Sale.DriftEvery, "Sale.DriftEvery", "period of the Redis-vs-ledger drift check")
	fs.StringVar(&c.TrustedProxies, "trusted-proxies", "", "comma-separated addresses or CIDRs whose X-Forwarded-For is believed (empty: none)")
	c.flagOf["HTTP.TrustedProxies"] = "trusted-proxies"
	fs.Float64Var(&o.HTTP.RatePerClient, "rate-per-client", 0, "requests per second one client address may send (0: no limit; behind a proxy set trusted-proxies first, or every client looks like the proxy)")
	b.field("rate-per-client", "HTTP.RatePerClient", nil)
	b.int("rate-burst", &o.HTTP.RateBurst, "HTTP.RateBurst", "burst above rate-per-client a client may send")
	b.int("code-guesses", &o.HTTP.CodeGuesses, "HTTP.CodeGuesses", "wrong access codes one client address may present a minute (per replica) before 429")
	b.dur("slow-request", &o.HTTP.SlowRequest, "HTTP.SlowRequest", "latency above which a request is logged")
	fs.DurationVar(&c.DrainDelay, "drain-delay", 0, "on SIGTERM, time /readyz fails while requests are still served, before connections close (Kubernetes' preStop sleep does this too)")
	fs.Int64Var(&c.DownTo, "schema-down-to", 0, "migrate only: undo the ledger schema's steps above this version, with the build that shipped them, before rolling back to a build a contract step shut out (docs/RUNBOOK.md); 0: migrate up")
	fs.BoolVar(&c.Migrate, "migrate", true, "serve applies the ledger schema at start; false refuses to start on a ledger not at this build's schema (run `stockgate migrate` first), so the serving role needs no DDL rights")
	fs.BoolVar(&c.AllowOpenAdmin, "allow-open-admin", false, "start with no admin token on a non-loopback address (admin routes open to the network)")
	fs.StringVar(&c.PprofAddr, "pprof-addr", "", "host:port of a separate listener for /debug/pprof (empty: off; keep it off the public network)")
	b.int("batch-max", &o.Sale.BatchMax, "Sale.BatchMax", "most gate-admitted purchases committed in one ledger transaction (group commit; 1: each alone)")
	b.int("commit-lanes", &o.Sale.CommitLanes, "Sale.CommitLanes", "the most ledger transactions of takes one replica runs at once; the next lane opens only while those before it have a full batch waiting")
	fs.DurationVar(&o.Sale.LedgerWaitBudget, "ledger-wait-budget", o.Sale.LedgerWaitBudget, "longest a request waits for its ledger batch before 503 overloaded (negative: no bound)")
	fs.Int64Var(&o.Sale.TakesInFlight, "takes-in-flight", o.Sale.TakesInFlight, "fewest takes a replica lets in flight before 503 overloaded; grows with its pace (negative: no bound)")
	fs.Int64Var(&o.Sale.CollapseAt, "collapse-at", o.Sale.CollapseAt, "units left per shard at which a sharded SKU's tail collapses onto one shard (negative: never)")
	b.field("collapse-at", "Sale.CollapseAt", func() bool { return o.Sale.CollapseAt != 0 })
	// 0 is valid here: shards as configured.
	fs.IntVar(&o.Sale.AutoShards, "auto-shards", o.Sale.AutoShards, "size every SKU's Redis shards between 1 and this, following its takes (0: each keeps its configured shards)")
	b.field("auto-shards", "Sale.AutoShards", nil)
	b.dur("sweep-every", &o.Sale.SweepEvery, "Sale.SweepEvery", "period of the hold-expiry sweeper (bounds how late an expired hold's stock comes back)")
	b.dur("offer-ttl", &o.Sale.OfferTTL, "Sale.OfferTTL", "how long a waitlist offer's hold lasts before it passes to the next buyer in line")
	// 0 is valid here: late payments off.
	fs.DurationVar(&o.Sale.LatePayment, "late-payment", o.Sale.LatePayment, "how long after a hold's expiry its confirm still buys its units if they are there (0: off; at most 24h)")
	b.field("late-payment", "Sale.LatePayment", nil)

	// The DSN carries the database password, a webhook URL often a token
	// (Slack's and most receivers' URLs are the credential).
	for _, name := range []string{"admin-token", "ledger-dsn", "ledger-primaries", "redis-username", "redis-password", "webhook-secret", "webhook-urls"} {
		b.secret(name)
	}
	c.settings = map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { c.settings[envVar(f.Name)] = true })
	for _, name := range c.secrets {
		c.settings[envVar(name)+"_FILE"] = true
	}
}

// notSettings are STOCKGATE_ variables that are no setting of the gateway
// (docs/TESTING.md): the test harness's (STOCKGATE_TEST_*) and the tests'
// own knobs, which a test run's environment hands to every process it
// starts. An entry ending in _ is a prefix.
var notSettings = []string{"STOCKGATE_TEST_", "STOCKGATE_MODEL_", "STOCKGATE_FULL_SCALE", "STOCKGATE_QUEUE_SHOTS"}

// serviceLink is a variable Kubernetes sets in every pod for each Service
// of the namespace (unless the pod says enableServiceLinks: false): a
// Service named stockgate or stockgate-admin gives STOCKGATE_SERVICE_HOST,
// STOCKGATE_ADMIN_PORT_9090_TCP_ADDR and the like. No flag ends so.
var serviceLink = regexp.MustCompile(`^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_[0-9]+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)?)$`)

// checkEnv refuses a STOCKGATE_ variable that is no setting, naming the
// nearest that is: ff reads only the variables of declared flags, so a
// misspelt one (STOCKGATE_REDIS_ADDRS without its S) was
// ignored without a word, and the gateway started on the default.
func (c *config) checkEnv(environ []string) error {
	var bad []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "STOCKGATE_") || c.settings[name] || serviceLink.MatchString(name) ||
			slices.ContainsFunc(notSettings, func(p string) bool { return name == p || strings.HasSuffix(p, "_") && strings.HasPrefix(name, p) }) {
			continue
		}
		bad = append(bad, fmt.Sprintf("%s (did you mean %s?)", name, nearest(name, slices.Collect(maps.Keys(c.settings)))))
	}
	if len(bad) == 0 {
		return nil
	}
	slices.Sort(bad)
	return fmt.Errorf("unknown environment variable %s: no such setting (stockgate -help lists them)", strings.Join(bad, ", "))
}

// checkFlags refuses a flag fs does not declare before ff.Parse does, so
// the refusal names the nearest flag, or the command whose flag it is.
// It walks args as package flag does: up to the first word that is not a
// flag, or "--"; a flag that is not boolean and has no =value takes the
// next word.
func checkFlags(fs, all *flag.FlagSet, args []string) error {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if len(a) < 2 || a[0] != '-' || a == "--" {
			return nil
		}
		name := strings.TrimPrefix(a[1:], "-")
		name, _, hasValue := strings.Cut(name, "=")
		if name == "" || name[0] == '-' || name == "h" || name == "help" {
			return nil // package flag's to refuse, or help
		}
		f := fs.Lookup(name)
		if f == nil {
			if all.Lookup(name) != nil {
				var of []string
				for _, cmd := range commands {
					if cmd.takes(name) {
						of = append(of, cmd.name)
					}
				}
				return fmt.Errorf("flag -%s is not one of %s: it is %s's (%s -help lists its flags)", name, fs.Name(),
					strings.Join(of, " and "), fs.Name())
			}
			var names []string
			fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
			return fmt.Errorf("unknown flag -%s (did you mean -%s?)", name, nearest(name, names))
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && b.IsBoolFlag()) {
			i++
		}
	}
	return nil
}

// nearest is the name of names nearest to s by edit distance, the first
// in sorted order among equals.
func nearest(s string, names []string) string {
	slices.Sort(names)
	best, bestD := "", -1
	for _, n := range names {
		if d := editDistance(s, n); bestD < 0 || d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b: the fewest
// insertions, deletions and substitutions of one byte that turn a into b.
func editDistance(a, b string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// envVar is the environment variable of a flag: STOCKGATE_<FLAG>, as
// ff.Parse reads it.
func envVar(flag string) string {
	return "STOCKGATE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// parse sets the flags from the command line, then from STOCKGATE_<FLAG>,
// then each secret from the file STOCKGATE_<FLAG>_FILE names, its trailing
// newline dropped. The command line wins over both variables, as over any;
// both variables set is a mistake, refused. Errors name the variable and
// the file, never what the file holds.
func parse(fs *flag.FlagSet, c *config, args []string) error {
	if err := c.checkEnv(os.Environ()); err != nil {
		return err
	}
	if err := ff.Parse(fs, args, ff.WithEnvVarPrefix("STOCKGATE")); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, name := range c.secrets {
		if fs.Lookup(name) == nil {
			continue // another command's
		}
		env := envVar(name)
		path := os.Getenv(env + "_FILE")
		switch {
		case path == "":
			continue
		case os.Getenv(env) != "":
			return fmt.Errorf("%s and %s_FILE are both set: set one", env, env)
		case given[name]: // on the command line
			continue
		}
		b, err := readSecret(path)
		if err != nil {
			return fmt.Errorf("%s_FILE: %w", env, err) // *PathError: op, path, cause
		}
		v := strings.TrimRight(string(b), "\r\n")
		if v == "" {
			return fmt.Errorf("%s_FILE: %s is empty", env, path)
		}
		if err := fs.Set(name, v); err != nil {
			return fmt.Errorf("%s_FILE: the value in %s is refused", env, path)
		}
	}
	return nil
}

// maxSecret bounds what a secret's file may hold: a token, a DSN, a list
// of webhook URLs.
const maxSecret = 64 << 10

// readSecret reads a secret's file, at most maxSecret bytes of it. Read
// whole, a path to /dev/zero or to a large file grew the process until it
// was killed for memory, saying nothing.
func readSecret(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecret+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSecret {
		return nil, fmt.Errorf("%s holds more than %d KiB: not a secret's file", path, maxSecret>>10)
	}
	return b, nil
}

// validate names the environment variable of the first bad setting. main
// checks only its own settings and that no flag is zero where zero would
// mean "the default"; every other bound is the package's (app.Options).
func (c *config) validate() error {
	bad := func(name, why string) error {
		return fmt.Errorf("%s (-%s): %s", envVar(name), name, why)
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return bad("addr", "not host:port: "+err.Error())
	}
	if c.DownTo < 0 {
		return bad("schema-down-to", "a schema version is 1 or more (0: migrate up)")
	}
	if c.AdminAddr != "" && !validHostPort(c.AdminAddr) {
		return bad("admin-addr", "not host:port")
	}
	c.HTTP.SeparateAdmin = c.AdminAddr != ""
	c.Redis.Addrs = splitList(c.RedisAddrs)
	c.Relay.WebhookURLs = splitList(c.WebhookURLs)
	c.HTTP.TrustedProxies = splitList(c.TrustedProxies)
	c.Options.Primaries = nil
	for _, entry := range splitList(c.Primaries) {
		name, dsn, ok := strings.Cut(entry, "=")
		if !ok || name == "" || dsn == "" {
			return bad("ledger-primaries", "each entry is name=postgres://...")
		}
		lo := c.Ledger
		lo.Driver, lo.DSN = ledger.Postgres, dsn
		c.Options.Primaries = append(c.Options.Primaries, fleet.Primary{Name: name, Ledger: lo})
	}
	if len(c.Options.Primaries) > 0 && c.Ledger.Driver != ledger.Postgres {
		return bad("ledger-primaries", "several primaries are PostgreSQL only: set -ledger-driver postgres")
	}
	names := make([]string, 0, len(c.nonZero))
	for name := range c.nonZero {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !c.nonZero[name]() {
			if name == "collapse-at" {
				return bad(name, "must be at least 1, or negative to turn collapsing off")
			}
			return bad(name, "must be above 0")
		}
	}
	switch {
	case c.DrainDelay < 0 || c.DrainDelay >= c.ShutdownGrace:
		return bad("drain-delay", "must be >= 0 and below the shutdown grace")
	case c.PprofAddr != "" && !validHostPort(c.PprofAddr):
		return bad("pprof-addr", "not host:port")
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return bad("log-level", "must be debug, info, warn or error")
	}
	if err := c.Options.Validate(); err != nil {
		var oe *opt.Error
		if errors.As(err, &oe) && c.flagOf[oe.Field] != "" {
			return bad(c.flagOf[oe.Field], oe.Why)
		}
		return err
	}
	return nil
}

// checkAdmin refuses to serve open admin routes on a network address.
// Without a token anyone who reaches the port may restock, end or rebuild
// a sale: fine on a laptop, never by accident on a network.
func (c *config) checkAdmin() error {
	addr := cmp.Or(c.AdminAddr, c.Addr)
	if c.HTTP.AdminToken == "" && !c.AllowOpenAdmin && !loopback(addr) {
		return fmt.Errorf("STOCKGATE_ADMIN_TOKEN (-admin-token): empty while the admin routes listen on %q, so they would be open "+
			"to the network: set it, listen on a loopback address, or set STOCKGATE_ALLOW_OPEN_ADMIN=true", addr)
	}
	return nil
}

// fleet is the configured ledger as a fleet (app.Options' own).
func (c *config) fleet() fleet.Options {
	return fleet.Options{Primaries: append([]fleet.Primary{{Name: app.FirstPrimary, Ledger: c.Ledger}}, c.Options.Primaries...),
		PlaceTTL: c.PlaceTTL}
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

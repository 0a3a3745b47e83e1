// Command stockgate is the composition root: it reads the configuration,
// builds the Redis cluster client, the ledger, the cache and the HTTP
// server, serves until SIGTERM, then drains and exits once.
//
//	stockgate serve|migrate|move|version [flags]
//
// Every flag also reads STOCKGATE_<FLAG> from the environment, and a secret
// STOCKGATE_<FLAG>_FILE (a file holding it); a STOCKGATE_ variable or a
// flag that is no setting stops the start, naming the nearest that is.
// `stockgate <command> -help` lists the flags the command takes.
package main

import (
	"cmp"
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
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/buildinfo"
	"github.com/stockgate/stockgate/fleet"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/tracing"
	"github.com/stockgate/stockgate/tracing/otelenv"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// stdout is where `stockgate version` prints (a test swaps it).
var stdout io.Writer = os.Stdout

// command is one of stockgate's subcommands and the flags it takes.
type command struct {
	name, about string
	takes       func(flag string) bool
}

// ledgerFlags are what a command that only opens the ledger takes.
var ledgerFlags = []string{"ledger-driver", "ledger-dsn", "ledger-max-conns", "ledger-primaries", "log-level"}

// oneShot are the flags of migrate and move alone; serve takes every
// other.
var oneShot = []string{"schema-down-to", "program", "to", "smoke-url", "smoke-admin-url"}

// commands are stockgate's subcommands, in the order usage lists them: the
// one table run dispatches on and usage prints, so neither can leave one
// out.
var commands = []command{
	{"serve", "run the gateway until SIGTERM, then drain", func(f string) bool { return !slices.Contains(oneShot, f) }},
	{"migrate", "apply the ledger schema and exit (run it before serve -migrate=false)", func(f string) bool {
		return slices.Contains(ledgerFlags, f) || f == "schema-down-to"
	}},
	{"move", "move a closed program's rows to another primary and exit (docs/OPERATIONS.md, \"Several primaries\")", func(f string) bool {
		return slices.Contains(ledgerFlags, f) || f == "place-ttl" || f == "program" || f == "to"
	}},
	{"smoke", "buy a ticket through a running gateway, refund it and exit (the chart's helm test)", func(f string) bool {
		return f == "smoke-url" || f == "smoke-admin-url" || f == "admin-token" || f == "log-level"
	}},
	{"version", "print the build and exit", func(string) bool { return false }},
}

func commandNamed(name string) (command, bool) {
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == name })
	if i < 0 {
		return command{}, false
	}
	return commands[i], true
}

// flagsOf is cmd's flag set: the flags of all (flags) it takes, the same
// values, so defaults and what parse sets land in the one config.
func flagsOf(all *flag.FlagSet, cmd command, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("stockgate "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	all.VisitAll(func(f *flag.Flag) {
		if cmd.takes(f.Name) {
			fs.Var(f.Value, f.Name, f.Usage)
		}
	})
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: stockgate %s", cmd.name)
		if n := countFlags(fs); n > 0 {
			fmt.Fprint(stderr, " [flags]")
		}
		fmt.Fprintf(stderr, "\n\n%s.\n\n", cmd.about)
		if countFlags(fs) > 0 {
			fmt.Fprint(stderr, envHelp)
			fs.PrintDefaults()
		}
	}
	return fs
}

func countFlags(fs *flag.FlagSet) int {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n
}

// migrate applies this build's ledger schema (what the chart's Job and an
// operator run before rolling out a build whose serving role has no DDL
// rights) and closes the ledger.
func migrate(ctx context.Context, c *config) (ledger.Schema, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	// Every primary, the directory's first.
	fo := c.fleet()
	for i := range fo.Primaries {
		fo.Primaries[i].Ledger.NoMigrate = c.DownTo > 0 // down: not up first
	}
	f, err := fleet.Open(ctx, fo)
	if err != nil {
		return ledger.Schema{}, err
	}
	defer f.Close()
	var s ledger.Schema
	err = f.Each(ctx, func(ctx context.Context, _ string, l *ledger.Ledger) error {
		if c.DownTo > 0 {
			if err := l.DownTo(ctx, c.DownTo); err != nil {
				return err
			}
		}
		s = l.Schema()
		return nil
	})
	return s, err
}

// move moves -program to the primary -to names (fleet.Fleet.Move) and
// reports what it copied.
func move(ctx context.Context, c *config, log *slog.Logger) error {
	program, err := keys.ParseID(c.MoveProgram)
	if err != nil {
		return fmt.Errorf("STOCKGATE_PROGRAM (-program): %w", err)
	}
	fo := c.fleet()
	fo.Logger = log
	for i := range fo.Primaries {
		fo.Primaries[i].Ledger.NoMigrate = true
	}
	f, err := fleet.Open(ctx, fo)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := f.Move(ctx, program, c.MoveTo)
	if err != nil {
		return err
	}
	for _, t := range r.Counts {
		log.Info("moved", "table", t.Table, "source_rows", t.Source, "target_rows", t.Target)
	}
	log.Info("program moved", "program", program.String(), "from", r.From, "to", r.To, "total", r.Sums[0], "sold", r.Sums[1],
		"held", r.Sums[2])
	return nil
}

// loopback reports whether addr (host:port) listens on loopback only; an
// empty host is every interface.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// envHelp says how the environment sets the flags.
const envHelp = "Every flag can be set by the environment variable STOCKGATE_<FLAG>, e.g. STOCKGATE_REDIS_ADDRS; a STOCKGATE_\n" +
	"variable that is no flag's stops the start, naming the nearest. A secret (its line below names\n" +
	"STOCKGATE_<FLAG>_FILE) can instead be read from the file that variable names, e.g. a Kubernetes Secret\n" +
	"mounted as files: STOCKGATE_ADMIN_TOKEN_FILE=/run/secrets/admin-token. Its trailing newline is dropped;\n" +
	"setting both STOCKGATE_<FLAG> and STOCKGATE_<FLAG>_FILE exits 2.\n\n"

// usage is stockgate's usage: every command, then every flag once (each
// command's -help lists its own).
func usage(w io.Writer, all *flag.FlagSet) {
	names := make([]string, len(commands))
	for i, cmd := range commands {
		names[i] = cmd.name
	}
	fmt.Fprintf(w, "Usage: stockgate %s [flags]\n\nCommands:\n", strings.Join(names, "|"))
	for _, cmd := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", cmd.name, cmd.about)
	}
	fmt.Fprintf(w, "\n`stockgate <command> -help` lists the flags the command takes.\n\n%sFlags of all commands:\n", envHelp)
	all.PrintDefaults()
}

// run returns the exit code: 0 after a clean drain, 2 for bad usage or
// configuration, 1 for a failure to start or serve.
func run(args []string, stderr io.Writer) int {
	c, code := setUp(args, stderr)
	if c == nil {
		return code
	}
	return execute(args[0], c, stderr)
}

// setUp reads the command line into a checked config, or says how to
// exit (c nil): help, the version, or a mistake in the arguments.
func setUp(args []string, stderr io.Writer) (_ *config, code int) {
	all := flag.NewFlagSet("stockgate", flag.ContinueOnError)
	all.SetOutput(stderr)
	var c config
	flags(all, &c)
	if len(args) == 0 {
		fmt.Fprintln(stderr, "stockgate: no command given")
		usage(stderr, all)
		return nil, 2
	}
	if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		usage(stderr, all)
		return nil, 0
	}
	cmd, ok := commandNamed(args[0])
	if !ok {
		names := make([]string, len(commands))
		for i, cmd := range commands {
			names[i] = cmd.name
		}
		fmt.Fprintf(stderr, "stockgate: unknown command %q (did you mean %s?)\n\n", args[0], nearest(args[0], names))
		usage(stderr, all)
		return nil, 2
	}
	fs := flagsOf(all, cmd, stderr)
	if cmd.name == "version" {
		switch {
		case len(args) == 2 && (args[1] == "-h" || args[1] == "-help" || args[1] == "--help"):
			fs.Usage()
			return nil, 0
		case len(args) > 1:
			fmt.Fprintf(stderr, "stockgate version: takes no arguments, got %q\n", args[1:])
			return nil, 2
		}
		fmt.Fprintln(stdout, buildinfo.Read().String())
		return nil, 0
	}
	if err := checkFlags(fs, all, args[1:]); err != nil {
		fmt.Fprintf(stderr, "stockgate %s: %v\n", cmd.name, err)
		return nil, 2
	}
	if err := parse(fs, &c, args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0
		}
		fmt.Fprintf(stderr, "stockgate %s: %v\n", cmd.name, err)
		return nil, 2
	}
	// Words after the flags are a mistake, never ignored: an image whose
	// entrypoint already says serve, given args [migrate], would otherwise
	// serve (for ever) where the operator asked for a migration.
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "stockgate %s: unexpected arguments %q (one command, then flags)\n", args[0], fs.Args())
		fs.Usage()
		return nil, 2
	}
	if err := c.validate(); err != nil {
		fmt.Fprintf(stderr, "stockgate: bad configuration: %v\n", err)
		return nil, 2
	}
	return &c, 0
}

// execute runs the command name (one of commands, but version) with c.
func execute(name string, c *config, stderr io.Writer) int {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.LogLevel))
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	// go-redis's own notices into the JSON log, not plain text beside it.
	redis.SetLogger(&app.RedisLog{Logger: log})
	if name == "smoke" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		if err := smoke(ctx, c.SmokeURL, cmp.Or(c.SmokeAdminURL, c.SmokeURL), c.HTTP.AdminToken, log); err != nil {
			log.Error("smoke test failed", "err", err)
			return 1
		}
		return 0
	}
	if name == "move" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		if err := move(ctx, c, log); err != nil {
			log.Error("move failed", "err", err)
			return 1
		}
		return 0
	}
	if name == "migrate" {
		s, err := migrate(context.Background(), c)
		if err != nil {
			log.Error("migrate failed", "err", err)
			return 1
		}
		log.Info("ledger schema migrated", "driver", cmp.Or(c.Ledger.Driver, ledger.SQLite), "version", s.Version,
			"oldest_build", s.OldestBuild, "build_newest", s.Latest, "build_minimum", s.Minimum)
		return 0
	}
	if err := c.checkAdmin(); err != nil {
		fmt.Fprintf(stderr, "stockgate: bad configuration: %v\n", err)
		return 2
	}

	if set := setMemoryLimit("/sys/fs/cgroup"); set > 0 {
		log.Info("memory limit from the container", "gomemlimit_bytes", set)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, c, log); err != nil {
		log.Error("stockgate stopped", "err", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, c *config, log *slog.Logger) error {
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Tracing, when the OTEL_* variables ask for it (otelenv.Setup), before
	// the server is built; its buffered spans are flushed after the drain
	// (defers run last-in first-out: after a.Close).
	stopTracing, err := otelenv.Setup(ctx)
	if err != nil {
		return err
	}
	defer func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := stopTracing(fctx); err != nil {
			log.Warn("tracing: flush at exit", "err", err)
		}
	}()
	if tracing.Enabled() {
		log.Info("tracing on", "exporter", otelenv.Protocol())
	}
	o := c.Options
	o.Logger = log
	o.Ledger.NoMigrate = !c.Migrate
	a, err := app.Open(openCtx, o)
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
		// Index serves the named profiles (heap, goroutine, allocs, block,
		// mutex, threadcreate) under its prefix; the rest are their own.
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		go func() { _ = http.Serve(pl, mux) }()
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 2)
	go func() { errc <- hs.Serve(ln) }() // owned here; ends with Shutdown
	servers := []*http.Server{hs}
	if c.AdminAddr != "" {
		al, err := net.Listen("tcp", c.AdminAddr)
		if err != nil {
			hs.Close()
			return fmt.Errorf("admin listener: %w", err)
		}
		as := &http.Server{Handler: srv.AdminHandler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { errc <- as.Serve(al) }() // owned here; ends with Shutdown
		servers = append(servers, as)
		log.Info("admin routes and /metrics on their own listener", "addr", al.Addr().String())
	}
	srv.SetReady(true)
	log.Info("stockgate serving", "addr", ln.Addr().String(), "ledger", cmp.Or(c.Ledger.Driver, ledger.SQLite),
		"version", buildinfo.Read().Version)
	if c.HTTP.AdminToken == "" {
		log.Warn("admin routes are open: no STOCKGATE_ADMIN_TOKEN is set", "addr", ln.Addr().String())
	}

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
	for _, srv := range servers {
		if err := srv.Shutdown(sctx); err != nil {
			return fmt.Errorf("drain: %w", err)
		}
	}
	for range servers {
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	if err := a.Close(); err != nil {
		log.Warn("close", "err", err)
	}
	log.Info("stopped cleanly")
	return nil
}

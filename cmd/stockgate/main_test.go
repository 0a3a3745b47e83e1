package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stockgate/stockgate/ledger"
)

func TestBadConfigExits2NamingTheVariable(t *testing.T) {
	tests := []struct{ env, value string }{
		{"STOCKGATE_ADDR", "no-port"},
		{"STOCKGATE_REDIS_ADDRS", "127.0.0.1:7000,nope"},
		{"STOCKGATE_REDIS_DIAL_TIMEOUT", "0s"},
		{"STOCKGATE_REDIS_READ_TIMEOUT", "-1s"},
		{"STOCKGATE_REDIS_WRITE_TIMEOUT", "0s"},
		{"STOCKGATE_REDIS_POOL_SIZE", "0"},
		{"STOCKGATE_LEDGER_DRIVER", "mysql"},
		{"STOCKGATE_LEDGER_MAX_CONNS", "0"},
		{"STOCKGATE_RECORD_TTL", "1s"},
		{"STOCKGATE_SOLD_OUT_TTL", "0s"},
		{"STOCKGATE_NOTICE_MAX_AGE", "0s"},
		{"STOCKGATE_EMPTY_SHARD_TTL", "0s"},
		{"STOCKGATE_WORK_TIMEOUT", "0s"},
		{"STOCKGATE_SHUTDOWN_GRACE", "0s"},
		{"STOCKGATE_LOG_LEVEL", "loud"},
		{"STOCKGATE_REDIS_CALL_TIMEOUT", "0s"},
		{"STOCKGATE_REDIS_STATE_RELOAD", "0s"},
		{"STOCKGATE_BREAKER_FAILURES", "0"},
		{"STOCKGATE_BREAKER_FAILURE_RATIO", "1.5"},
		{"STOCKGATE_BREAKER_MIN_REQUESTS", "0"},
		{"STOCKGATE_BREAKER_WINDOW", "500ms"},
		{"STOCKGATE_BREAKER_OPEN_FOR", "0s"},
		{"STOCKGATE_BREAKER_PROBES", "0"},
		{"STOCKGATE_FALLBACK_CONCURRENCY", "0"},
		{"STOCKGATE_LOCK_TTL", "50ms"},
		{"STOCKGATE_RESEED_WAIT", "-1s"},
		{"STOCKGATE_DRIFT_EVERY", "0s"},
		{"STOCKGATE_SWEEP_EVERY", "0s"},
		{"STOCKGATE_COLLAPSE_AT", "0"},
		{"STOCKGATE_TRUSTED_PROXIES", "10.0.0.0/8,nope"},
		{"STOCKGATE_RATE_PER_CLIENT", "-1"},
		{"STOCKGATE_RATE_BURST", "0"},
		{"STOCKGATE_SLOW_REQUEST", "0s"},
		{"STOCKGATE_DRAIN_DELAY", "1h"},
		{"STOCKGATE_ADMIN_TOKEN", "short"},
		{"STOCKGATE_PPROF_ADDR", "nope"},
		{"STOCKGATE_BATCH_MAX", "0"},
		{"STOCKGATE_REDIS_TLS_KEY_FILE", "/only/a/key.pem"},
		{"STOCKGATE_ADMIN_ADDR", "nope"},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			t.Setenv(tt.env, tt.value)
			code, out := runBounded(t, "serve")
			if code != 2 {
				t.Fatalf("run with %s=%q = %d, want 2 (%s)", tt.env, tt.value, code, out)
			}
			if !strings.Contains(out, tt.env) {
				t.Errorf("message %q does not name %s", out, tt.env)
			}
		})
	}
}

// An empty environment variable counts as unset, so an empty DSN can only
// come from a flag.
func TestEmptyDSNFlagExits2(t *testing.T) {
	if code, out := runBounded(t, "serve", "-ledger-dsn="); code != 2 || !strings.Contains(out, "STOCKGATE_LEDGER_DSN") {
		t.Fatalf("run = %d (%s), want 2 naming STOCKGATE_LEDGER_DSN", code, out)
	}
}

func TestNotANumberExits2(t *testing.T) {
	t.Setenv("STOCKGATE_REDIS_POOL_SIZE", "many")
	if code, out := runBounded(t, "serve"); code != 2 {
		t.Fatalf("run = %d (%s), want 2", code, out)
	}
}

func TestHelpListsEveryVariable(t *testing.T) {
	var stderr bytes.Buffer
	if code := run([]string{"--help"}, &stderr); code != 0 {
		t.Fatalf("--help = %d", code)
	}
	// Every flag there is, with its default.
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var c config
	flags(fs, &c)
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		if !strings.Contains(stderr.String(), "-"+f.Name) {
			t.Errorf("--help does not list -%s", f.Name)
		}
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "0s" && f.DefValue != "false" && !strings.Contains(stderr.String(), f.DefValue) {
			t.Errorf("--help does not show the default %q of -%s", f.DefValue, f.Name)
		}
	})
	if n < 39 {
		t.Errorf("only %d settings", n)
	}
	if !strings.Contains(stderr.String(), "STOCKGATE_") {
		t.Error("--help does not say how to set them from the environment")
	}
}

// runBounded runs the command line, and if it starts serving (the config
// was accepted) stops it with SIGINT after 5s rather than hanging the test.
func runBounded(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var stderr syncWriter
	done := make(chan int, 1)
	go func() { done <- run(args, &stderr) }()
	select {
	case code := <-done:
		return code, stderr.String()
	case <-time.After(5 * time.Second):
		t.Errorf("still running after 5s: the configuration was accepted and it is serving")
		syscall.Kill(os.Getpid(), syscall.SIGINT)
		return <-done, stderr.String()
	}
}

type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// With no admin token, the admin routes are open: refused on a network
// address unless allowed, accepted on loopback.
func TestOpenAdminOnTheNetworkExits2(t *testing.T) {
	for _, addr := range []string{":0", "0.0.0.0:0", "10.1.2.3:8080", "[::]:0"} {
		t.Run(addr, func(t *testing.T) {
			t.Setenv("STOCKGATE_ADDR", addr)
			code, out := runBounded(t, "serve")
			if code != 2 || !strings.Contains(out, "STOCKGATE_ADMIN_TOKEN") || !strings.Contains(out, "STOCKGATE_ALLOW_OPEN_ADMIN") {
				t.Fatalf("run on %s without a token = %d (%s), want 2 naming the token and the way to allow it", addr, code, out)
			}
		})
	}
	for addr, want := range map[string]bool{"127.0.0.1:8080": true, "localhost:0": true, "[::1]:0": true, ":8080": false,
		"192.168.1.4:80": false, "example.com:80": false} {
		if got := loopback(addr); got != want {
			t.Errorf("loopback(%q) = %v, want %v", addr, got, want)
		}
	}
	// Allowed explicitly: the same configuration validates.
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var c config
	flags(fs, &c)
	if err := fs.Parse([]string{"-addr", ":0", "-allow-open-admin"}); err != nil {
		t.Fatal(err)
	}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	if err := c.checkAdmin(); err != nil {
		t.Errorf("with -allow-open-admin: %v", err)
	}
	c.AllowOpenAdmin = false
	if err := c.checkAdmin(); err == nil {
		t.Error("without -allow-open-admin on :0: accepted")
	}
	// The buyers' API on the network, the admin routes on loopback only.
	c.AdminAddr = "127.0.0.1:9090"
	if err := c.checkAdmin(); err != nil {
		t.Errorf("admin routes on a loopback -admin-addr: %v", err)
	}
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	stdout = &out
	defer func() { stdout = os.Stdout }()
	if code := run([]string{"version"}, io.Discard); code != 0 || !strings.HasPrefix(out.String(), "stockgate ") ||
		!strings.Contains(out.String(), "go1.") {
		t.Fatalf("version = %d %q, want 0 and the build", code, out.String())
	}
}

// serve -migrate=false refuses a ledger not at this build's schema and says
// what to run; `stockgate migrate` applies it and exits 0.
func TestMigrateCommand(t *testing.T) {
	dsn := filepath.Join(t.TempDir(), "ledger.db")
	t.Setenv("STOCKGATE_LEDGER_DSN", dsn)
	t.Setenv("STOCKGATE_ADDR", "127.0.0.1:0")
	if code, out := runBounded(t, "serve", "-migrate=false"); code != 1 || !strings.Contains(out, "stockgate migrate") {
		t.Fatalf("serve -migrate=false on a new ledger = %d (%s), want 1 naming `stockgate migrate`", code, out)
	}
	code, migrated := runBounded(t, "migrate")
	l, err := ledger.Open(t.Context(), ledger.Options{Driver: ledger.SQLite, DSN: dsn, NoMigrate: true})
	if err != nil {
		t.Fatalf("after migrate, the ledger is not at this build's schema: %v", err)
	}
	newest := fmt.Sprintf(`"version":%d`, l.Schema().Latest)
	l.Close()
	if code != 0 || !strings.Contains(migrated, newest) {
		t.Fatalf("migrate = %d (%s), want 0 saying the schema's version (%s)", code, migrated, newest)
	}
	// Down to the baseline undoes the later steps; this build, which needs
	// the resale step, then refuses to serve it until migrated again; past
	// the baseline is refused.
	if code, out := runBounded(t, "migrate", "-schema-down-to", "1"); code != 0 || !strings.Contains(out, `"version":1`) {
		t.Fatalf("migrate -schema-down-to 1 = %d (%s), want 0 at version 1", code, out)
	}
	if l, err = ledger.Open(t.Context(), ledger.Options{Driver: ledger.SQLite, DSN: dsn, NoMigrate: true}); !errors.Is(err, ledger.ErrSchema) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("this build on the baseline = %v, want ErrSchema", err)
	}
	if code, out := runBounded(t, "migrate"); code != 0 || !strings.Contains(out, newest) {
		t.Fatalf("migrate again = %d (%s), want 0 at %s", code, out, newest)
	}
	if code, out := runBounded(t, "migrate", "-schema-down-to", "-1"); code != 2 || !strings.Contains(out, "STOCKGATE_SCHEMA_DOWN_TO") {
		t.Fatalf("migrate -schema-down-to -1 = %d (%s), want 2 naming the setting", code, out)
	}
}

// TLS files without TLS is a mistake an operator makes: named.
func TestTLSFilesWithoutTLSExits2(t *testing.T) {
	t.Setenv("STOCKGATE_REDIS_TLS_CA_FILE", "/etc/ssl/ca.pem")
	if code, out := runBounded(t, "serve"); code != 2 || !strings.Contains(out, "STOCKGATE_REDIS_TLS ") {
		t.Fatalf("run = %d (%s), want 2 naming STOCKGATE_REDIS_TLS", code, out)
	}
}

// A word after the command is refused with 2, never ignored: with the old
// image (ENTRYPOINT stockgate serve) the chart's migration Job ran
// `stockgate serve migrate`, which served for ever instead of migrating.
func TestExtraArgumentsExit2(t *testing.T) {
	t.Setenv("STOCKGATE_LEDGER_DSN", filepath.Join(t.TempDir(), "ledger.db"))
	t.Setenv("STOCKGATE_ADDR", "127.0.0.1:0")
	for _, args := range [][]string{
		{"serve", "migrate"},
		{"serve", "serve"},
		{"migrate", "now"},
		{"serve", "-log-level", "warn", "migrate"},
		{"version", "extra"},
		{"migrate", "--", "serve"},
	} {
		code, out := runBounded(t, args...)
		if code != 2 {
			t.Errorf("stockgate %q = %d (%s), want 2", args, code, out)
		} else if !strings.Contains(out, "argument") {
			t.Errorf("stockgate %q: message %q does not say an argument is wrong", args, out)
		}
	}
}

package main

import (
	"bytes"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A misspelt variable was ignored without a word: with STOCKGATE_REDIS_ADDR
// (no S) a pod connected to the default 127.0.0.1:7000, answered /readyz
// 200 and sold around the gate with the breaker open. Now a STOCKGATE_
// variable that is no setting, or an unknown flag, exits 2 naming the
// nearest setting, for every command that reads settings.
func TestUnknownSettingExits2NamingTheNearest(t *testing.T) {
	t.Setenv("STOCKGATE_LEDGER_DSN", filepath.Join(t.TempDir(), "ledger.db"))
	t.Setenv("STOCKGATE_ADDR", "127.0.0.1:0")
	for _, tc := range []struct {
		env   string // NAME=value, or ""
		args  []string
		wants []string
	}{
		{"STOCKGATE_REDIS_ADDR=10.0.0.1:6379", []string{"serve"}, []string{"STOCKGATE_REDIS_ADDR", "did you mean STOCKGATE_REDIS_ADDRS?"}},
		{"STOCKGATE_LEDGER_DNS=postgres://x", []string{"migrate"}, []string{"STOCKGATE_LEDGER_DNS", "did you mean STOCKGATE_LEDGER_DSN?"}},
		{"STOCKGATE_ADMIN_TOKEN_FIEL=/run/x", []string{"serve"}, []string{"did you mean STOCKGATE_ADMIN_TOKEN_FILE?"}},
		{"STOCKGATE_PLACETTL=1s", []string{"move", "-program", "p", "-to", "p1"}, []string{"did you mean STOCKGATE_PLACE_TTL?"}},
		{"", []string{"serve", "-redis-addr", "10.0.0.1:6379"}, []string{"-redis-addr", "did you mean -redis-addrs?"}},
		{"", []string{"serve", "--log-leve=warn"}, []string{"-log-leve", "did you mean -log-level?"}},
		{"", []string{"migrate", "-schema-down", "1"}, []string{"did you mean -schema-down-to?"}},
		// Another command's flag: said whose it is.
		{"", []string{"serve", "-program", "show-1"}, []string{"-program", "move"}},
		{"", []string{"migrate", "-redis-addrs", "x:1"}, []string{"-redis-addrs", "serve"}},
	} {
		t.Run(strings.Join(append([]string{tc.env}, tc.args...), " "), func(t *testing.T) {
			if name, value, ok := strings.Cut(tc.env, "="); ok {
				t.Setenv(name, value)
			}
			code, out := runBounded(t, tc.args...)
			if code != 2 {
				t.Fatalf("stockgate %q with %s = %d, want 2 (%s)", tc.args, tc.env, code, out)
			}
			for _, w := range tc.wants {
				if !strings.Contains(out, w) {
					t.Errorf("stockgate %q with %s says %q, want it to name %q", tc.args, tc.env, out, w)
				}
			}
		})
	}
}

// What is not a setting but legitimately in a gateway's environment is
// left alone: the test harness's variables (a test run hands them to every
// process it starts) and the variables Kubernetes makes of a Service
// named stockgate (the chart's own, unless enableServiceLinks is off).
func TestNotSettingsAccepted(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var c config
	flags(fs, &c)
	for _, name := range []string{"STOCKGATE_TEST_DATABASE_URL", "STOCKGATE_TEST_SERVE", "STOCKGATE_TEST_HELPER", "STOCKGATE_TEST_LOG",
		"STOCKGATE_MODEL_SEED", "STOCKGATE_MODEL_STEPS", "STOCKGATE_MODEL_TRACE", "STOCKGATE_FULL_SCALE", "STOCKGATE_QUEUE_SHOTS",
		"STOCKGATE_SERVICE_HOST", "STOCKGATE_SERVICE_PORT", "STOCKGATE_SERVICE_PORT_HTTP", "STOCKGATE_PORT", "STOCKGATE_PORT_80_TCP",
		"STOCKGATE_PORT_80_TCP_ADDR", "STOCKGATE_PORT_80_TCP_PORT", "STOCKGATE_PORT_80_TCP_PROTO", "STOCKGATE_ADMIN_SERVICE_HOST",
		"STOCKGATE_ADMIN_PORT_9090_TCP", "STOCKGATE_REDIS_ADDRS", "STOCKGATE_LEDGER_DSN_FILE", "STOCKBENCH_MAIN", "OTEL_SERVICE_NAME"} {
		if err := c.checkEnv([]string{name + "=x"}); err != nil {
			t.Errorf("checkEnv(%s) = %v, want nil", name, err)
		}
	}
	for _, name := range []string{"STOCKGATE_REDIS_ADDR", "STOCKGATE_TESTING", "STOCKGATE_ADMIN_PORT_X", "STOCKGATE_LOG_LEVEL_FILE"} {
		if err := c.checkEnv([]string{name + "=x"}); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("checkEnv(%s) = %v, want an error naming it", name, err)
		}
	}
}

// Every STOCKGATE_ name the repository uses (the Makefile, the scripts,
// the chart, every Go file: the tests' harness and knobs among them) is
// one the start accepts, so that no test run, script or chart stops the
// gateway with a name of its own. This file names wrong ones on purpose,
// as does a line that says "misspelt on purpose".
func TestEveryNameInTheRepositoryAccepted(t *testing.T) {
	fset := flag.NewFlagSet("x", flag.ContinueOnError)
	var c config
	flags(fset, &c)
	name := regexp.MustCompile(`STOCKGATE_[A-Z0-9_]+`)
	seen := map[string]bool{}
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		base := d.Name()
		if d.IsDir() {
			if path != "../.." && (strings.HasPrefix(base, ".") || base == "node_modules" || base == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if filepath.Base(path) == "env_test.go" && filepath.Base(filepath.Dir(path)) == "stockgate" {
			return nil
		}
		switch filepath.Ext(base) {
		case ".go", ".sh", ".yaml", ".yml", ".tpl", ".txt", ".json":
		default:
			if base != "Makefile" && base != "Dockerfile" {
				return nil
			}
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var text []byte
		for _, line := range bytes.Split(b, []byte("\n")) {
			if !bytes.Contains(line, []byte("misspelt on purpose")) {
				text = append(append(text, line...), '\n')
			}
		}
		for _, n := range name.FindAll(text, -1) {
			// A name ending in _ is a prefix or a placeholder's start
			// (STOCKGATE_<FLAG>, STOCKGATE_TEST_*).
			if s := string(n); !seen[s] && !strings.HasSuffix(s, "_") {
				seen[s] = true
				if err := c.checkEnv([]string{s + "=x"}); err != nil {
					t.Errorf("%s uses %s, which the start refuses: %v", path, s, err)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) < 60 || !seen["STOCKGATE_TEST_DATABASE_URL"] || !seen["STOCKGATE_TEST_SERVE"] {
		t.Errorf("found only %d names (%v): the walk missed the repository", len(seen), seen)
	}
}

// The usage line names every command (move was left out), each
// command's -help lists its own flags and no other command's, and an
// unknown command says so before the usage, exiting 2.
func TestCommandLine(t *testing.T) {
	var top bytes.Buffer
	if code := run([]string{"-help"}, &top); code != 0 {
		t.Fatalf("-help = %d", code)
	}
	first, _, _ := strings.Cut(top.String(), "\n")
	for _, cmd := range []string{"serve", "migrate", "move", "version"} {
		if !strings.Contains(first, cmd) {
			t.Errorf("usage line %q leaves out %s", first, cmd)
		}
	}
	own := map[string]struct{ has, hasNot []string }{
		"serve":   {[]string{"-redis-addrs", "-admin-token", "-ledger-dsn", "-migrate", "-place-ttl"}, []string{"-program", "-to ", "-schema-down-to"}},
		"migrate": {[]string{"-ledger-dsn", "-ledger-primaries", "-schema-down-to", "-log-level"}, []string{"-program", "-to ", "-redis-addrs", "-admin-token", "-addr"}},
		"move":    {[]string{"-ledger-dsn", "-ledger-primaries", "-program", "-to ", "-place-ttl"}, []string{"-schema-down-to", "-redis-addrs", "-admin-token"}},
		"version": {nil, []string{"-ledger-dsn", "-program"}},
	}
	for cmd, want := range own {
		for _, help := range []string{"-help", "--help", "-h"} {
			var out bytes.Buffer
			if code := run([]string{cmd, help}, &out); code != 0 {
				t.Errorf("stockgate %s %s = %d, want 0 (%s)", cmd, help, code, out.String())
				continue
			}
			if !strings.HasPrefix(out.String(), "Usage: stockgate "+cmd) {
				t.Errorf("stockgate %s %s begins %.60q, want its own usage", cmd, help, out.String())
			}
			for _, f := range want.has {
				if !strings.Contains(out.String(), "  "+f) {
					t.Errorf("stockgate %s %s does not list %s", cmd, help, f)
				}
			}
			for _, f := range want.hasNot {
				if strings.Contains(out.String(), "  "+f) {
					t.Errorf("stockgate %s %s lists %s, another command's flag", cmd, help, f)
				}
			}
		}
	}
	for _, args := range [][]string{{"sevre"}, {"migrat", "-ledger-dsn", "x"}, {"-redis-addrs", "x:1"}} {
		var out bytes.Buffer
		code := run(args, &out)
		if code != 2 {
			t.Errorf("stockgate %q = %d, want 2", args, code)
		}
		line, rest, _ := strings.Cut(out.String(), "\n")
		if !strings.Contains(line, "unknown command") || !strings.Contains(line, `"`+args[0]+`"`) {
			t.Errorf("stockgate %q: first line %q, want an error naming %q", args, line, args[0])
		}
		if !strings.Contains(rest, "Usage: stockgate") {
			t.Errorf("stockgate %q: no usage after the error", args)
		}
	}
	if !strings.Contains(mustRun(t, "sevre"), "did you mean serve?") {
		t.Error("stockgate sevre does not suggest serve")
	}
	var out bytes.Buffer
	if code := run(nil, &out); code != 2 || !strings.Contains(out.String(), "no command") {
		t.Errorf("stockgate = %d %q, want 2 saying no command was given", code, out.String())
	}
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	run(args, &out)
	return out.String()
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{{"", "", 0}, {"", "abc", 3}, {"kitten", "sitting", 3}, {"STOCKGATE_REDIS_ADDR", "STOCKGATE_REDIS_ADDRS", 1}, {"flaw", "lawn", 2}} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
	if got := nearest("redis-addr", []string{"redis-addrs", "addr", "admin-addr"}); got != "redis-addrs" {
		t.Errorf("nearest = %q", got)
	}
}

package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// writeSecret writes a file as a mounted Kubernetes Secret holds it.
func writeSecret(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte(content), 0o400); err != nil {
		t.Fatal(err)
	}
	return path
}

func parsed(t *testing.T, args ...string) (*flag.FlagSet, *config, error) {
	t.Helper()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var c config
	flags(fs, &c)
	return fs, &c, parse(fs, &c, args)
}

// Every flag that carries a secret reads STOCKGATE_<FLAG>_FILE, its
// trailing newline (as echo and most editors leave it) dropped.
func TestSecretFromFile(t *testing.T) {
	_, c, err := parsed(t)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"admin-token", "ledger-dsn", "ledger-primaries", "redis-username", "redis-password", "webhook-secret", "webhook-urls"}
	if diff := cmp.Diff(want, c.secrets); diff != "" {
		t.Errorf("secret flags (-want +got):\n%s", diff)
	}
	for _, name := range c.secrets {
		t.Run(name, func(t *testing.T) {
			value := "from-a-file:" + name
			t.Setenv(envVar(name)+"_FILE", writeSecret(t, value+"\r\n"))
			fs, _, err := parsed(t)
			if err != nil {
				t.Fatalf("parse with %s_FILE: %v", envVar(name), err)
			}
			if got := fs.Lookup(name).Value.String(); got != value {
				t.Errorf("-%s from %s_FILE = %q, want %q", name, envVar(name), got, value)
			}
			// The command line wins, as it does over STOCKGATE_<FLAG>.
			fs, _, err = parsed(t, "-"+name, "from-the-command-line")
			if err != nil {
				t.Fatal(err)
			}
			if got := fs.Lookup(name).Value.String(); got != "from-the-command-line" {
				t.Errorf("-%s on the command line and %s_FILE = %q, want the command line's", name, envVar(name), got)
			}
		})
	}
}

// A flag that names a file already has STOCKGATE_..._FILE as its own
// variable: it stays a path, never replaced by what the file holds.
func TestFileFlagsKeepTheirVariable(t *testing.T) {
	path := writeSecret(t, "-----BEGIN PRIVATE KEY-----\n")
	t.Setenv("STOCKGATE_REDIS_TLS_KEY_FILE", path)
	_, c, err := parsed(t)
	if err != nil {
		t.Fatal(err)
	}
	if c.Redis.TLS.KeyFile != path {
		t.Errorf("STOCKGATE_REDIS_TLS_KEY_FILE gave -redis-tls-key-file %q, want the path %q", c.Redis.TLS.KeyFile, path)
	}
}

// Mistakes exit 2 naming the variables and the file, never what it holds.
func TestSecretFileMistakesExit2(t *testing.T) {
	const secret = "do-not-print-this-value"
	dir := t.TempDir()
	tests := []struct {
		name string
		env  map[string]string
		want []string // in the message
	}{
		{"both set", map[string]string{"STOCKGATE_ADMIN_TOKEN": secret, "STOCKGATE_ADMIN_TOKEN_FILE": writeSecret(t, secret)},
			[]string{"STOCKGATE_ADMIN_TOKEN and STOCKGATE_ADMIN_TOKEN_FILE"}},
		{"no such file", map[string]string{"STOCKGATE_REDIS_PASSWORD_FILE": filepath.Join(dir, "missing")},
			[]string{"STOCKGATE_REDIS_PASSWORD_FILE", filepath.Join(dir, "missing"), "no such file"}},
		{"a directory", map[string]string{"STOCKGATE_LEDGER_DSN_FILE": dir}, []string{"STOCKGATE_LEDGER_DSN_FILE", dir}},
		{"empty", map[string]string{"STOCKGATE_WEBHOOK_SECRET_FILE": writeSecret(t, "\n")}, []string{"STOCKGATE_WEBHOOK_SECRET_FILE", "empty"}},
		// Read whole, a file as large as memory (or /dev/zero, endless) grew
		// the process until it was killed, saying nothing. (Not /dev/zero
		// here: a regression would take the test's memory.)
		{"large", map[string]string{"STOCKGATE_LEDGER_DSN_FILE": writeSecret(t, strings.Repeat(secret, 5000))},
			[]string{"STOCKGATE_LEDGER_DSN_FILE", "more than 64 KiB"}},
		// Read, then refused by the gateway's own check (too short).
		{"refused value", map[string]string{"STOCKGATE_ADMIN_TOKEN_FILE": writeSecret(t, "short-"+secret[:4])},
			[]string{"STOCKGATE_ADMIN_TOKEN", "at least"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			code, out := runBounded(t, "serve")
			if code != 2 {
				t.Fatalf("serve with %v = %d (%s), want 2", tt.env, code, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("message %q does not name %q", out, w)
				}
			}
			if strings.Contains(out, secret[:4]) {
				t.Errorf("message %q shows the secret", out)
			}
		})
	}
}

func TestHelpNamesSecretFiles(t *testing.T) {
	var stderr bytes.Buffer
	if code := run([]string{"serve", "-h"}, &stderr); code != 0 {
		t.Fatalf("serve -h = %d", code)
	}
	_, c, err := parsed(t)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range c.secrets {
		if !strings.Contains(stderr.String(), envVar(name)+"_FILE") {
			t.Errorf("serve -h does not name %s_FILE", envVar(name))
		}
	}
}

package clienttest_test

import (
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"

	"github.com/stockgate/stockgate/internal/testenv"
)

// The modules as a platform meets them: a module outside the repository
// depends on the client, its webhook verifier and the server's packages
// by version alone (no replace, no workspace, the module proxy off). The
// repository's two modules are served from a local file proxy, every
// other module from this machine's module cache; the server's go.mod must
// name the client by a version that proxy serves. A receiver that needs
// only the client gains no other module.
func TestModulesImportByVersion(t *testing.T) {
	testenv.SkipInUnit(t, "builds a scratch module against the module cache, 20-30 s")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := modfile.Parse("go.mod", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	const server, clientPath = "github.com/stockgate/stockgate", "github.com/stockgate/stockgate/client"
	embedded := []string{server + "/app", server + "/cmd/stockgate", server + "/ledger", server + "/sale"}
	clientVersion := ""
	for _, r := range gomod.Require {
		if r.Mod.Path == clientPath {
			clientVersion = r.Mod.Version
		}
	}
	for _, r := range gomod.Replace {
		t.Errorf("go.mod replaces %s: a module that depends on the server ignores it (develop through go.work)", r.Old.Path)
	}
	if clientVersion == "" {
		t.Fatalf("go.mod does not require %s", clientPath)
	}

	proxy := t.TempDir()
	serve(t, proxy, module.Version{Path: clientPath, Version: clientVersion}, filepath.Join(root, "client"))
	// A version no tag has: what is served is this checkout.
	const serverVersion = "v0.0.0-20261129000000-000000000000"
	serve(t, proxy, module.Version{Path: server, Version: serverVersion}, root)

	goenv := func(name string) string {
		out, err := exec.Command("go", "env", name).Output()
		if err != nil {
			t.Fatalf("go env %s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	// Offline below, every module of the graph is read from the machine's
	// cache: a new machine's holds only what its builds fetched, not the
	// .info of a module no package here imports (gin's optional encoders).
	for _, args := range [][]string{{"list", "-m", "all"}, append([]string{"list", "-deps"}, embedded...)} {
		fetch := exec.Command("go", args...)
		fetch.Dir = root
		if out, err := fetch.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	cache := t.TempDir() // its own: the served versions never land in the machine's cache
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod -modcacherw", "GOSUMDB=off", "GOTOOLCHAIN=local",
		"GOMODCACHE="+cache, "GOPROXY=file://"+proxy+",file://"+filepath.Join(goenv("GOMODCACHE"), "cache", "download"))
	run := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	scratch := func(require, src string) string {
		dir := t.TempDir()
		write(t, filepath.Join(dir, "go.mod"), "module example.com/receiver\n\ngo 1.26\n\nrequire (\n"+require+")\n")
		write(t, filepath.Join(dir, "main.go"), src)
		return dir
	}

	// A webhook receiver: the client and its verifier, nothing else.
	recv := scratch("\t"+clientPath+" "+clientVersion+"\n", `package main

import (
	"net/http"
	"time"

	"github.com/stockgate/stockgate/client"
	"github.com/stockgate/stockgate/client/webhook"
)

func main() {
	v, err := webhook.NewVerifier(webhook.NewSecret())
	if err != nil {
		panic(err)
	}
	_ = v.Verify(http.Header{}, nil, time.Now())
	_ = client.Event{}
}
`)
	run(recv, "build", "-o", os.DevNull, ".")
	if mods := strings.Fields(run(recv, "list", "-m", "all")); len(mods) != 3 { // the receiver, the client and its version
		t.Errorf("a receiver of the client alone has modules %v, want itself and the client", mods)
	}

	// A platform embedding the server: its packages by version. The
	// client's and a light server package build; every import of the
	// whole server (the gateway, the ledger, the command) resolves.
	embed := scratch("\t"+server+" "+serverVersion+"\n\t"+clientPath+" "+clientVersion+"\n", `package main

import (
	"github.com/stockgate/stockgate/client/webhook"
	"github.com/stockgate/stockgate/keys"
)

func main() {
	_, _ = keys.ParseID("a")
	_ = webhook.NewSecret()
}
`)
	run(embed, "build", "-o", os.DevNull, ".")
	run(embed, append([]string{"list", "-deps"}, embedded...)...)
	// The tests' and the load tool's tools are in modules of their own
	// (e2e/, deploy/, cmd/stockbench): none reaches a platform's graph.
	all := strings.Split(strings.TrimSpace(run(embed, "list", "-m", "all")), "\n")
	for _, m := range all {
		for _, tool := range []string{"helm.sh/", "k8s.io/", "github.com/chromedp/", "github.com/tsenart/vegeta",
			"github.com/Shopify/toxiproxy", "github.com/anishathalye/porcupine", "github.com/prometheus-operator/"} {
			if strings.HasPrefix(m, tool) {
				t.Errorf("a platform embedding the server gets the tests' tool %s", m)
			}
		}
	}
	t.Logf("modules a platform embedding the server gets: %d", len(all))
	if len(all) > embeddedModulesCeiling {
		t.Errorf("a platform embedding the server gets %d modules, more than the %d docs/OPERATIONS.md states: "+
			"a new dependency raises the ceiling on purpose, with its reason there", len(all), embeddedModulesCeiling)
	}
}

// embeddedModulesCeiling is the go list -m all count of a module that
// embeds the server, as docs/OPERATIONS.md ("Modules and tags") states
// it: the 60 is below the floor of the chosen libraries (84, the
// same docs), so the count is held where it is and may only go down
// unless a dependency is added on purpose.
const embeddedModulesCeiling = 102

// serve puts module m, made of dir's files, on the file proxy at proxy:
// its list, info, go.mod and zip, as a module proxy serves them.
func serve(t *testing.T, proxy string, m module.Version, dir string) {
	t.Helper()
	esc, err := module.EscapePath(m.Path)
	if err != nil {
		t.Fatal(err)
	}
	at := filepath.Join(proxy, esc, "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	info, _ := json.Marshal(map[string]any{"Version": m.Version, "Time": time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)})
	write(t, filepath.Join(at, "list"), m.Version+"\n")
	write(t, filepath.Join(at, m.Version+".info"), string(info))
	write(t, filepath.Join(at, m.Version+".mod"), string(mod))
	f, err := os.Create(filepath.Join(at, m.Version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := zip.Create(f, m, sources(t, dir)); err != nil {
		t.Fatalf("zip of %s: %v", m.Path, err)
	}
}

// sources are the files of the module rooted at dir, as a tag's zip
// holds them: no nested module, nothing hidden or left by a run (.run,
// built binaries, the linters' npm tree).
func sources(t *testing.T, dir string) []zip.File {
	t.Helper()
	var files []zip.File
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p == dir {
				return nil
			}
			if strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir // a module of its own
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() || strings.HasPrefix(name, ".") || fi.Size() > 4<<20 {
			return nil // a socket, a built binary
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		files = append(files, file{path: filepath.ToSlash(rel), abs: p, info: fi})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

type file struct {
	path, abs string
	info      fs.FileInfo
}

func (f file) Path() string                 { return f.path }
func (f file) Lstat() (fs.FileInfo, error)  { return f.info, nil }
func (f file) Open() (io.ReadCloser, error) { return os.Open(f.abs) }

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

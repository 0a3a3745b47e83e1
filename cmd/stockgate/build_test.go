package main

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A build with no VCS checkout (docker build without .git, a source
// tarball) says it is unstamped unless -X gives it a version and a
// revision, as deploy/Dockerfile does from its build arguments.
func TestVersionOfABuildOutsideGit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary twice")
	}
	src := copyWithoutVCS(t)
	unstamped := buildIn(t, src)
	if got := versionOf(t, unstamped); !strings.HasPrefix(got, "stockgate (devel, unstamped), unknown revision, go1.") {
		t.Errorf("version of an unstamped build outside git = %q, want it to say it is unstamped", got)
	}
	const pkg = "github.com/stockgate/stockgate/buildinfo"
	stamped := buildIn(t, src, "-ldflags", "-s -w -X "+pkg+".version=v9.8.7-test -X "+pkg+".revision=0123456789abcdef")
	if got := versionOf(t, stamped); !strings.HasPrefix(got, "stockgate v9.8.7-test, 0123456789abcdef, go1.") {
		t.Errorf("version of a build stamped with -X = %q, want v9.8.7-test and revision 0123456789abcdef", got)
	}
}

// copyWithoutVCS copies what the binary is built from (the module files
// and the sources and embedded files of its packages in this module) to a
// directory outside any checkout.
func copyWithoutVCS(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "-json=Dir,Module,GoFiles,EmbedFiles", "./cmd/stockgate")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	files := []string{"go.mod", "go.sum", "deploy/image.work", "deploy/image.work.sum", "client/go.mod"}
	for dec := json.NewDecoder(strings.NewReader(string(out))); dec.More(); {
		var p struct {
			Dir                 string
			Module              *struct{ Main bool }
			GoFiles, EmbedFiles []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.Module == nil || !strings.HasPrefix(p.Dir, root+string(filepath.Separator)) {
			continue // the standard library and the module cache (the client module, in the workspace, is here)
		}
		rel, err := filepath.Rel(root, p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range append(p.GoFiles, p.EmbedFiles...) {
			files = append(files, filepath.Join(rel, f))
		}
	}
	dst := t.TempDir()
	for _, f := range files {
		copyFile(t, filepath.Join(root, f), filepath.Join(dst, f))
	}
	return dst
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// buildIn builds the command as deploy/Dockerfile does, from the module at
// dir, into a temporary directory.
func buildIn(t *testing.T, dir string, flags ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "stockgate")
	args := append(append([]string{"build", "-trimpath"}, flags...), "-o", bin, "./cmd/stockgate")
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	// The image's workspace (the server and the client), as the
	// Dockerfile's ENV GOWORK names it.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly", "GOWORK="+filepath.Join(dir, "deploy", "image.work"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

func versionOf(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("%s version: %v", bin, err)
	}
	return strings.TrimSpace(string(out))
}

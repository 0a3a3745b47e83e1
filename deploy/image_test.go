package deploy

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// dockerignore is the repository's .dockerignore, read the way Docker
// reads it: one pattern a line, # comments, a leading ! re-includes, a
// leading / is dropped, * and ? stay within a path element, ** spans any
// number of them; the last pattern matching a path or one of its parent
// directories decides.
type dockerignore []struct {
	re      *regexp.Regexp
	include bool
}

func readDockerignore(t *testing.T) dockerignore {
	t.Helper()
	f, err := os.Open("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var d dockerignore
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		include := strings.HasPrefix(line, "!")
		line = path.Clean(strings.TrimPrefix(strings.TrimPrefix(line, "!"), "/"))
		if strings.ContainsAny(line, `[\`) {
			t.Fatalf(".dockerignore %q: character classes and escapes are beyond this test's reading", line)
		}
		var re strings.Builder
		re.WriteString("^")
		for i := 0; i < len(line); i++ {
			switch {
			case strings.HasPrefix(line[i:], "**/"):
				re.WriteString("(.*/)?")
				i += 2
			case strings.HasPrefix(line[i:], "**"):
				re.WriteString(".*")
				i++
			case line[i] == '*':
				re.WriteString("[^/]*")
			case line[i] == '?':
				re.WriteString("[^/]")
			default:
				re.WriteString(regexp.QuoteMeta(line[i : i+1]))
			}
		}
		re.WriteString("$")
		d = append(d, struct {
			re      *regexp.Regexp
			include bool
		}{regexp.MustCompile(re.String()), include})
	}
	return d
}

// excludes reports whether the build context leaves out the file or
// directory at rel (slash-separated, from the repository root).
func (d dockerignore) excludes(rel string) bool {
	excluded := false
	for _, p := range d {
		for q := rel; q != "."; q = path.Dir(q) {
			if p.re.MatchString(q) {
				excluded = !p.include
				break
			}
		}
	}
	return excluded
}

// The build context carries what deploy/Dockerfile builds from and none of
// the checkout's history, local runs, npm tree, test data or editor files.
func TestDockerignore(t *testing.T) {
	d := readDockerignore(t)
	for _, rel := range []string{
		".git", ".git/HEAD", ".run", ".run/bench.log", "deploy/lint/node_modules",
		"deploy/lint/node_modules/@redocly/cli/package.json", "ledger/testdata/ledger.json", "testdata/x",
		"stockgate.db", "ledger/stockgate.db-wal", "stockgate", "stockbench", "cover.out", "gateway/gateway.test",
		".vscode/settings.json", ".idea/workspace.xml", "gateway/.server.go.swp", "README.md~", "app/.DS_Store",
	} {
		if !d.excludes(rel) {
			t.Errorf("the build context carries %s", rel)
		}
	}
	need := []string{"go.mod", "go.sum", "deploy/image.work", "deploy/image.work.sum", "client/go.mod", "cmd/stockgate"}
	// Every package the binary imports from this module, with the files
	// the build reads there (sources and embedded files).
	cmd := exec.Command("go", "list", "-deps", "-json=Dir,Module,GoFiles,EmbedFiles", "../cmd/stockgate")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := 0
	for dec := json.NewDecoder(strings.NewReader(string(out))); dec.More(); {
		var p struct {
			Dir                 string
			Module              *struct{ Main bool }
			GoFiles, EmbedFiles []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.Module == nil || !p.Module.Main {
			continue
		}
		rel, err := filepath.Rel(root, p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		pkgs++
		need = append(need, filepath.ToSlash(rel))
		for _, f := range append(p.GoFiles, p.EmbedFiles...) {
			need = append(need, path.Join(filepath.ToSlash(rel), f))
		}
	}
	if pkgs < 10 {
		t.Fatalf("go list found %d packages of this module in the binary: not the build", pkgs)
	}
	for _, rel := range need {
		if d.excludes(rel) {
			t.Errorf("the build context lacks %s, which the build needs", rel)
		}
	}
}

// Both bases are pinned by digest as well as by tag, and the build stamps
// the version and revision given as build arguments (the context has no
// .git to read them from).
func TestDockerfilePinsAndStamps(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	docker := string(b)
	pinned := regexp.MustCompile(`^[a-z0-9./-]+:[\w.-]+@sha256:[0-9a-f]{64}$`)
	froms := regexp.MustCompile(`(?m)^FROM\s+(?:--platform=\S+\s+)?(\S+)`).FindAllStringSubmatch(docker, -1)
	if len(froms) != 2 {
		t.Fatalf("%d FROM lines, want the build stage and the runtime", len(froms))
	}
	for _, m := range froms {
		if !pinned.MatchString(m[1]) {
			t.Errorf("FROM %s: not pinned by tag and digest (image:tag@sha256:…)", m[1])
		}
	}
	build, _, _ := strings.Cut(docker[strings.Index(docker, "FROM"):][4:], "\nFROM")
	const pkg = "github.com/stockgate/stockgate/buildinfo"
	for _, want := range []string{"ARG VERSION", "ARG REVISION", "-X " + pkg + ".version=${VERSION}", "-X " + pkg + ".revision=${REVISION}"} {
		if !strings.Contains(build, want) {
			t.Errorf("the build stage lacks %q", want)
		}
	}
}

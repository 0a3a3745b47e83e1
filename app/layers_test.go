package app_test

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The layers of DESIGN.md's "Shape of the code", read from the import
// graph (go list): gateway is HTTP only and reaches the stores and the
// ledger only through sale, the waiting rooms and the relay; sale knows
// nothing of HTTP; sale and the waiting rooms know nothing of each other
// (app wires the door between them); the relay speaks its own words, not
// sale's; access rules are pure.
func TestLayers(t *testing.T) {
	const mod = "github.com/stockgate/stockgate/"
	for _, c := range []struct {
		pkg       string
		forbidden []string
	}{
		// gateway reaches no store but through the packages above: none
		// of ours, no Redis or SQL client.
		{"gateway", []string{mod + "shard", mod + "seats", mod + "ledger", mod + "lock", mod + "lua", mod + "cache", mod + "cluster",
			"github.com/redis/go-redis/v9", "database/sql", "github.com/jackc/pgx/v5"}},
		{"sale", []string{"github.com/gin-gonic/gin", "net/http", mod + "gateway", mod + "waitroom", mod + "relay"}},
		{"waitroom", []string{"github.com/gin-gonic/gin", "net/http", mod + "gateway", mod + "sale", mod + "shard", mod + "seats"}},
		{"relay", []string{"github.com/gin-gonic/gin", mod + "gateway", mod + "sale", mod + "waitroom"}},
		{"access", []string{"github.com/redis/go-redis/v9", "database/sql", "time/tzdata", mod + "ledger", mod + "shard", mod + "seats", mod + "cluster", mod + "sale"}},
	} {
		out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}\n{{join .Imports \"\\n\"}}", mod+c.pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", c.pkg, err)
		}
		imports := strings.Fields(string(out))
		if len(imports) < 2 || imports[0] != mod+c.pkg {
			t.Fatalf("go list %s gave %q, not the package and its imports", c.pkg, imports)
		}
		for _, f := range c.forbidden {
			if slices.Contains(imports[1:], f) {
				t.Errorf("%s imports %s", c.pkg, f)
			}
		}
	}
}

// Ids are checked once, at the edge (DESIGN.md, invariant 6): gateway
// parses what a client sends into keys.ID and stock.SKU, and every inner
// package takes those types. keys.CheckID, the text check itself, is
// called by keys (ParseID) and by gateway (the X-Request-Id header, which
// never goes into a key); a call anywhere else is a second check of an id
// that should have been a keys.ID.
func TestIDsCheckedOnceAtTheEdge(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var found int
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		found++
		rel, _ := filepath.Rel(root, path)
		pkg := filepath.Dir(rel)
		if pkg == "keys" || pkg == "gateway" {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(src), "keys.CheckID(") {
			t.Errorf("%s calls keys.CheckID: take a keys.ID (parsed at the edge) instead", rel)
		}
		return nil
	})
	if err != nil || found < 50 {
		t.Fatalf("walked %d Go files under %s (%v): not the module", found, root, err)
	}
}

// Tests wait for conditions, never for time (the house rule "no flaky tests";
// issue 42): a time.Sleep in a test file is allowed only where time itself
// is under test or paces a loop, and says so in a comment on its line
// ("time under test: …", "poll interval", a client's back-off). A bare
// sleep is a guess at how long something takes, which a busy 2-core
// machine gets wrong.
func TestSleepsInTestsSayWhy(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if !strings.Contains(line, "time.Sleep(") || strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue
			}
			n++
			if !strings.Contains(line, "//") {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s:%d: a time.Sleep with no comment saying why time itself is under test: %s", rel, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d sleeps in test files, each commented", n)
}

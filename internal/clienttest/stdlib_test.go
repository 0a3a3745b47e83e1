package clienttest_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The client is a module of its own that needs nothing beyond the
// standard library, tests included: a platform that imports it gains no
// line of the server's dependencies (gin, pgx, SQLite ...) in its go.sum.
func TestClientIsStandardLibraryOnly(t *testing.T) {
	mod, err := os.ReadFile("../../client/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(mod), "module github.com/stockgate/stockgate/client\n") || strings.Contains(string(mod), "require") {
		t.Errorf("client/go.mod is not a module of its own without requirements:\n%s", mod)
	}
	cmd := exec.Command("go", "list", "-deps", "-test", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./...")
	cmd.Dir = "../../client"
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list in client/: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		// The package, its external tests and its test binary: "p", "p_test [p.test]", "p.test".
		pkg := strings.TrimSuffix(strings.TrimSuffix(strings.Fields(line)[0], ".test"), "_test")
		if pkg != "github.com/stockgate/stockgate/client" && !strings.HasPrefix(pkg, "github.com/stockgate/stockgate/client/") {
			t.Errorf("the client's module depends on %s", line)
		}
	}
}

// The client asks for Go 1.22, not the server's toolchain: a platform a
// few releases behind can import it. go vet's stdversion check fails on
// any standard library symbol newer than the go line (strings.FieldsSeq,
// 1.24, was one), and the compiler on any newer language feature.
func TestClientBuildsAtGo122(t *testing.T) {
	mod, err := os.ReadFile("../../client/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mod), "\ngo 1.22\n") {
		t.Errorf("client/go.mod's go line is not 1.22:\n%s", mod)
	}
	cmd := exec.Command("go", "vet", "./...")
	cmd.Dir = "../../client"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("go vet in client/ at go 1.22: %v\n%s", err, out)
	}
}

package app_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The black-box tests under e2e/ see the service as its users and
// operators do: besides the harness (e2e/systest, internal/testenv for the
// servers it starts, the load drivers e2e/loadgen and internal/onsale,
// which speak HTTP as clients do, and e2e/powpage, which drives the waiting
// room's page in a browser as a buyer does) they import only the client,
// app and the module's public packages; never another internal package,
// nor another capability's tests. And the harness is for tests only: e2e/
// is a module of its own (its tools stay out of the server's go.mod), and
// no package of the service imports it; cmd/stockbench, the load tool and
// a module of its own too, is its one other user.
func TestE2EImports(t *testing.T) {
	const mod = "github.com/stockgate/stockgate/"
	kit := map[string]bool{mod + "e2e/systest": true, mod + "e2e/loadgen": true, mod + "e2e/powpage": true}
	allowed := map[string]bool{mod + "internal/testenv": true, mod + "internal/onsale": true}
	out, err := exec.Command("go", "list", "-f",
		`{{.ImportPath}}|{{join .Imports " "}}|{{join .TestImports " "}} {{join .XTestImports " "}}`, mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	e2e := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 3 {
			t.Fatalf("go list gave %q", line)
		}
		pkg, imports, testImports := f[0], strings.Fields(f[1]), strings.Fields(f[2])
		all := append(imports, testImports...)
		if !strings.HasPrefix(pkg, mod+"e2e/") {
			if pkg == mod+"cmd/stockbench" {
				continue
			}
			for _, imp := range all {
				if strings.HasPrefix(imp, mod+"e2e/") {
					t.Errorf("%s imports %s: the harness is for the tests under e2e/", pkg, imp)
				}
			}
			continue
		}
		if kit[pkg] {
			continue
		}
		e2e++
		for _, imp := range all {
			switch {
			case strings.HasPrefix(imp, mod+"internal/") && !allowed[imp]:
				t.Errorf("%s imports %s: e2e tests use the public packages and the harness", pkg, imp)
			case strings.HasPrefix(imp, mod+"e2e/") && imp != pkg && !kit[imp]:
				t.Errorf("%s imports %s: each capability's tests stand alone", pkg, imp)
			}
		}
	}
	if e2e < 10 {
		t.Fatalf("go list found %d packages under e2e/, not the tests by capability", e2e)
	}
}

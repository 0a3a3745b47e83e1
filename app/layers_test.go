package app_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The layers of DESIGN.md's "Shape of the code", read from the import
// graph (go list): gateway is HTTP only and reaches the stores and the
// ledger only through sale; sale knows nothing of HTTP.
func TestLayers(t *testing.T) {
	const mod = "github.com/stockgate/stockgate/"
	for _, c := range []struct {
		pkg       string
		forbidden []string
	}{
		{"gateway", []string{mod + "shard", mod + "seats", mod + "ledger", mod + "lock", mod + "lua", mod + "cache"}},
		{"sale", []string{"github.com/gin-gonic/gin", "net/http", mod + "gateway"}},
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

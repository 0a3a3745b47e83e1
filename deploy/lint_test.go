package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// redocly is the pinned Redocly CLI (deploy/lint/package.json), which
// `make test` installs with npm ci.
func redocly(t *testing.T) string {
	t.Helper()
	bin, err := filepath.Abs("lint/node_modules/.bin/redocly")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("Redocly CLI not installed (%v): `make test` installs it (make deps-lint: npm ci in deploy/lint)", err)
	}
	return bin
}

// lintOpenAPI runs Redocly's lint with the committed config on doc.
func lintOpenAPI(t *testing.T, doc string) (string, error) {
	t.Helper()
	cmd := exec.Command(redocly(t), "lint", "--config", "redocly.yaml", "--format", "stylish", doc)
	cmd.Dir = "lint"
	cmd.Env = append(os.Environ(), "REDOCLY_TELEMETRY=off", "REDOCLY_SUPPRESS_UPDATE_NOTICE=true", "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The API's OpenAPI document passes Redocly's lint (recommended rules, the
// decisions in deploy/lint/redocly.yaml). It did not: three request bodies
// gave `examples` as an array where OpenAPI 3.1 wants a map of Example
// objects. The lint is shown to catch that on a copy broken the old way.
func TestOpenAPILint(t *testing.T) {
	doc, err := filepath.Abs("../gateway/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := lintOpenAPI(t, doc); err != nil {
		t.Fatalf("redocly lint gateway/openapi.json: %v\n%s", err, out)
	}
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	op := d["paths"].(map[string]any)["/v1/programs/{program}/queue"].(map[string]any)["post"].(map[string]any)
	media := op["requestBody"].(map[string]any)["content"].(map[string]any)["application/json"].(map[string]any)
	media["examples"] = []any{map[string]any{"buyer": "alice"}}
	// And an admin route that forgot its security scheme.
	admin := d["paths"].(map[string]any)["/v1/admin/skus/{program}/{ticket}"].(map[string]any)["put"].(map[string]any)
	delete(admin, "security")
	broken := filepath.Join(t.TempDir(), "openapi.json")
	if b, err = json.Marshal(d); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(broken, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := lintOpenAPI(t, broken)
	if err == nil || !strings.Contains(out, "ExamplesMap") || !strings.Contains(out, "security-defined") {
		t.Errorf("redocly lint passes a document with examples as an array and an admin route without security (%v):\n%s", err, out)
	}
}

package gateway_test

import (
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stockgate/stockgate/ledger"
)

// The OpenAPI document served at /openapi.json lists exactly the routes the
// server registers: none missing, none extra.
func TestOpenAPIListsExactlyTheRoutes(t *testing.T) {
	e := newEnv(t, ledger.SQLite)
	r := e.do(t, http.MethodGet, "/openapi.json", nil, "")
	if r.status != http.StatusOK {
		t.Fatalf("/openapi.json = %d", r.status)
	}
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(r.body, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.1.0" {
		t.Errorf("openapi = %q, want 3.1.0", doc.OpenAPI)
	}
	param := regexp.MustCompile(`\{(\w+)\}`)
	var documented []string
	for path, ops := range doc.Paths {
		for method := range ops {
			documented = append(documented, strings.ToUpper(method)+" "+param.ReplaceAllString(path, ":$1"))
		}
	}
	registered := e.http.Routes()
	slices.Sort(documented)
	slices.Sort(registered)
	for _, r := range registered {
		if !slices.Contains(documented, r) {
			t.Errorf("route %s is not in the OpenAPI document", r)
		}
	}
	for _, d := range documented {
		if !slices.Contains(registered, d) {
			t.Errorf("the OpenAPI document lists %s, which the server does not serve", d)
		}
	}
	if len(registered) < 17 {
		t.Errorf("only %d routes registered: %v", len(registered), registered)
	}
}

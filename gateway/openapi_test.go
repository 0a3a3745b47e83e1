package gateway_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stockgate/stockgate/gateway"
	"github.com/stockgate/stockgate/sale"
)

// The OpenAPI document served at /openapi.json lists exactly the routes the
// server registers: none missing, none extra. Serving the document and
// listing the routes touch no sale, so the server runs on an empty one.
func TestOpenAPIListsExactlyTheRoutes(t *testing.T) {
	srv, err := gateway.New(gateway.Options{Sale: new(sale.Service)})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.json", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/openapi.json = %d", rec.Code)
	}
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
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
	registered := srv.Routes()
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

// The document says which headers come back: Retry-After on every 429 and
// 503, Idempotent-Replayed on the successes of keyed requests, X-Request-Id
// everywhere; and the bodies it names say which fields are always there.
func TestOpenAPIDeclaresHeadersAndRequiredFields(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []struct{ Name string } `json:"parameters"`
			Responses  map[string]struct {
				Headers map[string]json.RawMessage `json:"headers"`
			} `json:"responses"`
		} `json:"paths"`
		Components struct {
			Schemas map[string]struct {
				Required []string `json:"required"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(gateway.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			keyed := false
			for _, p := range op.Parameters {
				keyed = keyed || p.Name == "Idempotency-Key"
			}
			for code, r := range op.Responses {
				where := method + " " + path + " " + code
				if r.Headers["X-Request-Id"] == nil {
					t.Errorf("%s: no X-Request-Id header", where)
				}
				if (code == "429" || code == "503") && r.Headers["Retry-After"] == nil {
					t.Errorf("%s: no Retry-After header", where)
				}
				if keyed && (code == "200" || code == "201") && r.Headers["Idempotent-Replayed"] == nil {
					t.Errorf("%s: no Idempotent-Replayed header", where)
				}
			}
		}
	}
	for _, name := range []string{"Problem", "Order", "Hold", "Stock", "SKU", "Rebuild", "PurchaseRequest"} {
		if len(doc.Components.Schemas[name].Required) == 0 {
			t.Errorf("schema %s lists no required fields", name)
		}
	}
}

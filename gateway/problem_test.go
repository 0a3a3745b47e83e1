package gateway

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/waitroom"
)

// Every kind of sale error has a status: a kind missing from statusOf
// would reach clients as a 500.
func TestEveryErrorHasAStatus(t *testing.T) {
	for _, k := range sale.Kinds() {
		st, ok := statusOf[k]
		if !ok {
			t.Errorf("sale error %q has no status in statusOf", k.Code)
			continue
		}
		if st < 400 || st == http.StatusInternalServerError {
			t.Errorf("sale error %q maps to %d", k.Code, st)
		}
	}
	if len(statusOf) != len(sale.Kinds()) {
		t.Errorf("statusOf has %d entries for %d kinds", len(statusOf), len(sale.Kinds()))
	}
}

// Every problem the server can answer is in the OpenAPI document's enum of
// problem types and its x-problems list with the status it is sent with,
// and in docs/PROBLEMS.md: the sale errors by their status here, and the
// codes the gateway writes itself.
func TestEveryProblemIsDocumented(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas struct {
				Problem struct {
					Properties struct {
						Type struct {
							Enum []string `json:"enum"`
						} `json:"type"`
					} `json:"properties"`
				} `json:"Problem"`
			} `json:"schemas"`
			Problems map[string]struct {
				Status int `json:"status"`
			} `json:"x-problems"`
		} `json:"components"`
	}
	if err := json.Unmarshal(OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	docs, err := os.ReadFile("../docs/PROBLEMS.md")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{}
	for _, k := range sale.Kinds() {
		want[k.Code] = statusOf[k]
	}
	for _, k := range waitroom.Kinds() {
		want[k.Code] = roomStatus[k]
	}
	// The codes written here directly, with their statuses.
	src := ""
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") {
			b, _ := os.ReadFile(f)
			src += string(b)
		}
	}
	for _, m := range regexp.MustCompile(`writeProblem\(c, http\.Status(\w+), "([a-z-]+)"`).FindAllStringSubmatch(src, -1) {
		want[m[2]] = map[string]int{"BadRequest": 400, "Unauthorized": 401, "NotFound": 404, "MethodNotAllowed": 405, "RequestTimeout": 408,
			"RequestEntityTooLarge": 413, "UnsupportedMediaType": 415, "UnprocessableEntity": 422, "TooManyRequests": 429,
			"InternalServerError": 500, "BadGateway": 502, "ServiceUnavailable": 503}[m[1]]
	}
	if len(want) < 30 {
		t.Fatalf("found only %d problem codes: %v", len(want), want)
	}
	for code, status := range want {
		if !slices.Contains(doc.Components.Schemas.Problem.Properties.Type.Enum, problemBase+code) {
			t.Errorf("problem %q is not in the OpenAPI enum of problem types", code)
		}
		if got := doc.Components.Problems[code].Status; got != status {
			t.Errorf("problem %q: x-problems says status %d, the server sends %d", code, got, status)
		}
		if !strings.Contains(string(docs), "`"+code+"` | "+strconv.Itoa(status)+" |") {
			t.Errorf("docs/PROBLEMS.md does not list %q with status %d", code, status)
		}
	}
	if n := len(doc.Components.Problems); n != len(want) {
		t.Errorf("x-problems lists %d problems, the server sends %d", n, len(want))
	}
}

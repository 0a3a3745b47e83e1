package systest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/stockgate/stockgate/gateway"
)

// contract checks every answer the tests receive through Env.Do
// against the OpenAPI document the server serves: the route and method are
// documented, the status is one the operation lists, the content type is
// the documented one, and a JSON body validates against the documented
// schema (JSON Schema 2020-12, as OpenAPI 3.1 uses). So the document cannot
// drift from the code without a test failing.
type contract struct {
	doc struct {
		Paths map[string]map[string]struct {
			Responses map[string]struct {
				Content map[string]json.RawMessage `json:"content"`
			} `json:"responses"`
		} `json:"paths"`
	}
	routes   []route
	compiler *jsonschema.Compiler
	mu       sync.Mutex
	schemas  map[string]*jsonschema.Schema
}

type route struct {
	template string
	re       *regexp.Regexp
	literal  int // literal characters: the most specific template wins
}

var (
	contractOnce sync.Once
	theContract  *contract
	contractErr  error
)

func loadContract() (*contract, error) {
	contractOnce.Do(func() {
		c := &contract{schemas: map[string]*jsonschema.Schema{}}
		if contractErr = json.Unmarshal(gateway.OpenAPI, &c.doc); contractErr != nil {
			return
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(gateway.OpenAPI))
		if err != nil {
			contractErr = err
			return
		}
		c.compiler = jsonschema.NewCompiler()
		c.compiler.DefaultDraft(jsonschema.Draft2020)
		if contractErr = c.compiler.AddResource("openapi.json", doc); contractErr != nil {
			return
		}
		param := regexp.MustCompile(`\{[^}]+\}`)
		for tmpl := range c.doc.Paths {
			// QuoteMeta escapes the braces of "{id}": match them escaped.
			re := regexp.MustCompile("^" + regexp.MustCompile(`\\\{[^}]+\\\}`).ReplaceAllString(regexp.QuoteMeta(tmpl), `[^/]*`) + "$")
			c.routes = append(c.routes, route{tmpl, re, len(param.ReplaceAllString(tmpl, ""))})
		}
		sort.Slice(c.routes, func(i, j int) bool { return c.routes[i].literal > c.routes[j].literal })
		theContract = c
	})
	return theContract, contractErr
}

// pointer escapes a JSON pointer token.
func pointer(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1") }

func (c *contract) schema(loc string) (*jsonschema.Schema, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.schemas[loc]; ok {
		return s, nil
	}
	s, err := c.compiler.Compile(loc)
	if err != nil {
		return nil, err
	}
	c.schemas[loc] = s
	return s, nil
}

// check returns what is wrong with one answer, or "".
func (c *contract) check(method, path string, status int, header http.Header, body []byte) string {
	path, _, _ = strings.Cut(path, "?")
	var tmpl string
	for _, r := range c.routes {
		if r.re.MatchString(path) {
			tmpl = r.template
			break
		}
	}
	if tmpl == "" {
		if status == http.StatusNotFound {
			return "" // no such route: answered as such
		}
		return fmt.Sprintf("%s %s answered %d but is not in the OpenAPI document", method, path, status)
	}
	op, ok := c.doc.Paths[tmpl][strings.ToLower(method)]
	if !ok {
		if status == http.StatusMethodNotAllowed {
			return ""
		}
		return fmt.Sprintf("%s %s (%s) is not documented", method, path, tmpl)
	}
	code := strconv.Itoa(status)
	resp, ok := op.Responses[code]
	if !ok {
		if resp, ok = op.Responses["default"]; !ok {
			return fmt.Sprintf("%s %s answered %d, which the document does not list", method, tmpl, status)
		}
		code = "default"
	}
	if len(body) == 0 || len(resp.Content) == 0 {
		return ""
	}
	mt, _, _ := mime.ParseMediaType(header.Get("Content-Type"))
	if _, ok := resp.Content[mt]; !ok {
		return fmt.Sprintf("%s %s %d answered %s, the document says %v", method, tmpl, status, mt, keysOf(resp.Content))
	}
	if mt != "application/json" && mt != "application/problem+json" {
		return ""
	}
	loc := "openapi.json#/paths/" + pointer(tmpl) + "/" + strings.ToLower(method) + "/responses/" + code +
		"/content/" + pointer(mt) + "/schema"
	s, err := c.schema(loc)
	if err != nil {
		return fmt.Sprintf("schema of %s %s %d: %v", method, tmpl, status, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Sprintf("%s %s %d: body is not JSON: %v", method, tmpl, status, err)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Sprintf("%s %s %d: body %s does not match the document: %v", method, tmpl, status, body, err)
	}
	return ""
}

func keysOf[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// CheckContract fails the test if an answer to method and path is not
// what the OpenAPI document says it can be; Env.Do calls it on every
// answer.
func CheckContract(t *testing.T, method, path string, r Reply) {
	t.Helper()
	c, err := loadContract()
	if err != nil {
		t.Fatalf("the OpenAPI document does not load: %v", err)
	}
	if msg := c.check(method, path, r.Status, r.Header, r.Body); msg != "" {
		t.Errorf("contract: %s", msg)
	}
}

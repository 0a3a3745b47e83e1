package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The ecosystem's own checkers, pinned; `make test` installs each (make
// deps-helm, deps-kubeconform, deps-schemas) and a missing one fails the
// test, never skips it.
const (
	// The Kubernetes API the schemas describe: the kubernetes module of the
	// k8s.io/api this module builds with (its api/openapi-spec).
	kubernetesModule = "k8s.io/kubernetes@v1.34.1"
	// The Prometheus Operator's CRDs (example/prometheus-operator-crd), of
	// the monitoring API this module decodes with.
	prometheusOperatorModule = "github.com/prometheus-operator/prometheus-operator@v0.81.0"
	// KEDA's CRDs (config/crd/bases), for preScale's ScaledObject.
	kedaModule = "github.com/kedacore/keda/v2@v2.17.2"
)

// valueSets are the values the chart is checked with: the defaults with
// the two values they lack (TestDefaultsRefused: the chart refuses them
// bare), the production example, Redis over TLS with an ACL user, an HPA
// scaling on requests per second too, a platform team's additions
// (private CA, digest, node pool, IAM role, ...), and a ledger over three
// primaries.
var valueSets = map[string][]string{
	"minimal":     {minimalValues},
	"production":  {"helm/values-production.yaml"},
	"tls-acl":     {"helm/ci/tls-acl-values.yaml"},
	"autoscaling": {"helm/ci/autoscaling-values.yaml"},
	"extras":      {"helm/ci/extras-values.yaml"},
	"primaries":   {"helm/ci/primaries-values.yaml"},
}

// tool finds a command on PATH or in Go's install directory.
func tool(t *testing.T, name, install string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output()
	if err == nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		for _, dir := range []string{lines[0], filepath.Join(lines[len(lines)-1], "bin")} {
			if p := filepath.Join(dir, name); dir != "" && fileExists(p) {
				return p
			}
		}
	}
	t.Fatalf("%s not found: `make test` installs it (%s)", name, install)
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// moduleDir is where the Go module cache holds mod (path@version),
// downloaded if it is not there yet (make deps-schemas does it first).
func moduleDir(t *testing.T, mod string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", mod)
	cmd.Dir = t.TempDir() // outside this module: its go.mod is not touched
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	var m struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &m); err != nil || jerr != nil || m.Error != "" || m.Dir == "" {
		t.Fatalf("go mod download %s: %v %s (make deps-schemas downloads it)", mod, err, m.Error)
	}
	return m.Dir
}

// helmCmd runs the pinned helm binary.
func helmCmd(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(tool(t, "helm", "make deps-helm: go install helm.sh/helm/v3/cmd/helm@v3.19.0"), args...)
	// No repositories, plugins or caches of the machine's user.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out, nil
}

func valueArgs(files []string) []string {
	var args []string
	for _, f := range files {
		args = append(args, "-f", f)
	}
	return args
}

// `helm lint --strict` passes with every value set: no warning either.
func TestHelmLint(t *testing.T) {
	out, err := helmCmd(t, "version", "--short")
	if err != nil || !strings.HasPrefix(string(out), "v3.19") {
		t.Fatalf("helm version %q (%v), want v3.19 (make deps-helm)", out, err)
	}
	for name, files := range valueSets {
		if out, err := helmCmd(t, append([]string{"lint", "--strict", "helm/stockgate", "--kube-version", kubeVersion}, valueArgs(files)...)...); err != nil {
			t.Errorf("%s values: %v", name, err)
		} else if !strings.Contains(string(out), "0 chart(s) failed") {
			t.Errorf("%s values: helm lint says\n%s", name, out)
		}
	}
}

// kubeSchemas writes, into a new directory, kubeconform's strict JSON
// schemas (file names as its {{.ResourceKind}}{{.KindSuffix}} template
// wants) for kinds: from the Kubernetes OpenAPI document for built-in
// kinds, from the CRDs for the Prometheus Operator's and KEDA's. It does
// what kubeconform's openapi2jsonschema does: each kind refers to the
// definitions in one _definitions.json, additionalProperties false wherever properties are listed
// (except where the API keeps unknown fields), int-or-string as either.
func kubeSchemas(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	write := func(kind, apiVersion string, schema map[string]any) {
		group, version, found := strings.Cut(apiVersion, "/")
		suffix := "-" + strings.ToLower(strings.Split(group, ".")[0])
		if found {
			suffix += "-" + strings.ToLower(version)
		}
		b, err := json.Marshal(schema)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, strings.ToLower(kind)+suffix+".json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Built-in kinds: Kubernetes' swagger document.
	b, err := os.ReadFile(filepath.Join(moduleDir(t, kubernetesModule), "api/openapi-spec/swagger.json"))
	if err != nil {
		t.Fatal(err)
	}
	var swagger struct{ Definitions map[string]map[string]any }
	if err := json.Unmarshal(b, &swagger); err != nil {
		t.Fatal(err)
	}
	defs := map[string]any{}
	for name, d := range swagger.Definitions {
		switch name {
		case "io.k8s.apimachinery.pkg.util.intstr.IntOrString":
			defs[name] = map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}}
		case "io.k8s.apimachinery.pkg.api.resource.Quantity":
			defs[name] = map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}}
		default:
			defs[name] = strict(d)
		}
	}
	all, err := json.Marshal(map[string]any{"definitions": defs})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "_definitions.json"), all, 0o644); err != nil {
		t.Fatal(err)
	}
	builtin := 0
	for name, d := range swagger.Definitions {
		gvks, _ := d["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			gvk := g.(map[string]any)
			apiVersion := gvk["version"].(string)
			if grp := gvk["group"].(string); grp != "" {
				apiVersion = grp + "/" + apiVersion
			}
			write(gvk["kind"].(string), apiVersion, map[string]any{"$ref": "_definitions.json#/definitions/" + name})
			builtin++
		}
	}
	if builtin < 100 {
		t.Fatalf("only %d kinds in %s's OpenAPI document", builtin, kubernetesModule)
	}
	// Custom resources: their CRDs' openAPIV3Schema.
	crds := []string{
		filepath.Join(moduleDir(t, prometheusOperatorModule), "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"),
		filepath.Join(moduleDir(t, prometheusOperatorModule), "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"),
		filepath.Join(moduleDir(t, kedaModule), "config/crd/bases/keda.sh_scaledobjects.yaml"),
	}
	for _, f := range crds {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd struct {
			Spec struct {
				Group string
				Names struct{ Kind string }
				// Versions' schemas, as the API server validates with.
				Versions []struct {
					Name   string
					Schema struct {
						OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
					}
				}
			}
		}
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, v := range crd.Spec.Versions {
			write(crd.Spec.Names.Kind, crd.Spec.Group+"/"+v.Name, strict(v.Schema.OpenAPIV3Schema).(map[string]any))
		}
	}
	return dir
}

// strict returns an OpenAPI schema as a strict JSON schema (draft 4, as
// kubeconform reads them).
func strict(s any) any {
	switch v := s.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, x := range v {
			out[k] = strict(x)
		}
		if _, ok := v["properties"]; ok && v["additionalProperties"] == nil && v["x-kubernetes-preserve-unknown-fields"] != true {
			out["additionalProperties"] = false
		}
		if v["x-kubernetes-int-or-string"] == true {
			out = map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}}
		}
		if v["nullable"] == true {
			if typ, ok := v["type"].(string); ok {
				out["type"] = []any{typ, "null"}
			}
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = strict(x)
		}
		return out
	}
	return s
}

// kubeconform validates the manifests in files (YAML streams) strictly
// against the schemas in dir, every kind required to have one; it
// answers each resource's status.
func kubeconform(t *testing.T, dir string, files ...string) (map[string][]string, string) {
	t.Helper()
	args := append([]string{"-strict", "-output", "json", "-verbose",
		"-schema-location", filepath.Join(dir, "{{.ResourceKind}}{{.KindSuffix}}.json")}, files...)
	cmd := exec.Command(tool(t, "kubeconform", "make deps-kubeconform: go install github.com/yannh/kubeconform/cmd/kubeconform@v0.8.0"), args...)
	out, _ := cmd.Output() // exit 1 when any is invalid: the answer says which
	var res struct {
		Resources []struct{ Filename, Kind, Name, Status, Msg string }
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("kubeconform's answer: %v\n%s", err, out)
	}
	status := map[string][]string{}
	for _, r := range res.Resources {
		status[filepath.Base(r.Filename)] = append(status[filepath.Base(r.Filename)], fmt.Sprintf("%s/%s %s %s", r.Kind, r.Name, r.Status, r.Msg))
	}
	return status, string(out)
}

// `helm template` of every value set, on a cluster serving the Prometheus
// Operator's and KEDA's APIs (clusterArgs), validates with kubeconform
// against the Kubernetes and the Prometheus Operator (and KEDA) schemas. The
// schemas are shown to refuse a misspelt field of a built-in kind and of
// a custom resource, and a kind with no schema.
func TestKubeconform(t *testing.T) {
	dir := kubeSchemas(t)
	tmp := t.TempDir()
	var files []string
	for name, vals := range valueSets {
		args := append([]string{"template", "stockgate", "helm/stockgate", "--namespace", "stockgate"}, clusterArgs...)
		out, err := helmCmd(t, append(args, valueArgs(vals)...)...)
		if err != nil {
			t.Fatalf("%s values: %v", name, err)
		}
		files = append(files, filepath.Join(tmp, name+".yaml"))
		if err := os.WriteFile(files[len(files)-1], out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bad := map[string]string{
		"misspelt-deployment.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 1\n" +
			"  selector: {matchLabels: {a: b}}\n  template: {metadata: {labels: {a: b}}, spec: {containers: [{name: c, image: i}]}}\n",
		"misspelt-servicemonitor.yaml": "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\n" +
			"spec:\n  selector: {}\n  endpoints: [{prot: http}]\n",
		"unknown-kind.yaml": "apiVersion: example.com/v1\nkind: Nothing\nmetadata: {name: x}\n",
	}
	for name, text := range bad {
		files = append(files, filepath.Join(tmp, name))
		if err := os.WriteFile(files[len(files)-1], []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	status, out := kubeconform(t, dir, files...)
	for name := range valueSets {
		got := status[name+".yaml"]
		if len(got) < 9 {
			t.Errorf("%s values: kubeconform saw %d objects, want at least 9:\n%s", name, len(got), out)
		}
		for _, r := range got {
			if !strings.Contains(r, " statusValid") {
				t.Errorf("%s values: %s", name, r)
			}
		}
	}
	for name := range bad {
		if got := status[name]; len(got) != 1 || strings.Contains(got[0], " statusValid") {
			t.Errorf("kubeconform on %s: %v, want it refused", name, got)
		} else {
			t.Logf("%s: %s", name, got[0])
		}
	}
}

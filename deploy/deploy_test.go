// Package deploy holds the container image recipe, the Kubernetes
// manifests (kustomize), the reference Redis Cluster values, the Grafana
// dashboard and the alert rules. Its test checks them.
package deploy

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// decodeStrict decodes one manifest into its official API type, refusing
// any field the type does not have.
func decodeStrict(t *testing.T, doc []byte) (kind string, obj any) {
	t.Helper()
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		t.Fatal(err)
	}
	var meta struct{ APIVersion, Kind string }
	if err := json.Unmarshal(js, &meta); err != nil {
		t.Fatal(err)
	}
	switch meta.APIVersion + " " + meta.Kind {
	case "apps/v1 Deployment":
		obj = &appsv1.Deployment{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "v1 ConfigMap":
		obj = &corev1.ConfigMap{}
	case "v1 Secret":
		obj = &corev1.Secret{}
	case "v1 Namespace":
		obj = &corev1.Namespace{}
	case "autoscaling/v2 HorizontalPodAutoscaler":
		obj = &autoscalingv2.HorizontalPodAutoscaler{}
	case "policy/v1 PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "monitoring.coreos.com/v1 ServiceMonitor":
		obj = &monitoringv1.ServiceMonitor{}
	case "monitoring.coreos.com/v1 PrometheusRule":
		obj = &monitoringv1.PrometheusRule{}
	default:
		t.Fatalf("unexpected manifest kind %s %s", meta.APIVersion, meta.Kind)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		t.Fatalf("%s: %v", meta.Kind, err)
	}
	return meta.Kind, obj
}

// build runs kustomize on the base, as `kubectl kustomize deploy/k8s/base`.
func build(t *testing.T) map[string]any {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), "k8s/base")
	if err != nil {
		t.Fatal(err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]any{}
	for _, doc := range bytes.Split(out, []byte("\n---\n")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		kind, obj := decodeStrict(t, doc)
		objs[kind+"/"+nameOf(obj)] = obj
	}
	return objs
}

func nameOf(obj any) string {
	js, _ := json.Marshal(obj)
	var m struct {
		Metadata struct{ Name string } `json:"metadata"`
	}
	_ = json.Unmarshal(js, &m)
	return m.Metadata.Name
}

// Every manifest file, and everything kustomize builds from them, decodes
// strictly into the Kubernetes (and Prometheus Operator) API types, with
// what operators rely on in place.
func TestManifests(t *testing.T) {
	files, _ := filepath.Glob("k8s/base/*.yaml")
	for _, f := range files {
		if strings.HasSuffix(f, "kustomization.yaml") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		decodeStrict(t, b)
	}
	objs := build(t)
	want := []string{"Deployment/stockgate", "Service/stockgate", "HorizontalPodAutoscaler/stockgate",
		"PodDisruptionBudget/stockgate", "ConfigMap/stockgate", "Secret/stockgate", "ServiceMonitor/stockgate",
		"PrometheusRule/stockgate", "ConfigMap/stockgate-dashboard", "Namespace/stockgate"}
	for _, w := range want {
		if objs[w] == nil {
			t.Errorf("kustomize output lacks %s (has %v)", w, keys(objs))
		}
	}
	d, _ := objs["Deployment/stockgate"].(*appsv1.Deployment)
	if d == nil {
		t.Fatal("no Deployment")
	}
	if d.Namespace != "stockgate" || d.Labels["app.kubernetes.io/name"] != "stockgate" {
		t.Errorf("deployment namespace %q labels %v", d.Namespace, d.Labels)
	}
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	sc := c.SecurityContext
	switch {
	case c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz":
		t.Error("readiness probe is not /readyz")
	case c.ReadinessProbe.FailureThreshold < 3:
		t.Errorf("readiness fails the pod after %d slow answers, want at least 3", c.ReadinessProbe.FailureThreshold)
	case c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/livez":
		t.Error("liveness probe is not /livez")
	case c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil:
		t.Error("no preStop sleep")
	case c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero():
		t.Error("resources not set")
	case sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("root filesystem not read-only")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL":
		t.Error("container security context not restricted")
	case pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot ||
		pod.SecurityContext.SeccompProfile == nil || pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Error("pod security context not restricted (non-root, RuntimeDefault seccomp)")
	case int64(c.Lifecycle.PreStop.Sleep.Seconds) >= *pod.TerminationGracePeriodSeconds:
		t.Error("preStop sleep does not fit in the termination grace period")
	}
	hpa := objs["HorizontalPodAutoscaler/stockgate"].(*autoscalingv2.HorizontalPodAutoscaler)
	var cpu, rate bool
	for _, m := range hpa.Spec.Metrics {
		cpu = cpu || (m.Type == autoscalingv2.ResourceMetricSourceType && m.Resource.Name == corev1.ResourceCPU)
		rate = rate || (m.Type == autoscalingv2.PodsMetricSourceType && strings.Contains(m.Pods.Metric.Name, "requests"))
	}
	if !cpu || !rate {
		t.Errorf("HPA scales on cpu %v, request rate %v; want both", cpu, rate)
	}
	dash := objs["ConfigMap/stockgate-dashboard"].(*corev1.ConfigMap)
	var board struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct{ Name string }
		}
	}
	if err := json.Unmarshal([]byte(dash.Data["stockgate.json"]), &board); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	vars := map[string]bool{}
	for _, v := range board.Templating.List {
		vars[v.Name] = true
	}
	if !vars["namespace"] || !vars["pod"] {
		t.Errorf("dashboard variables %v: want namespace and pod", vars)
	}
	all := ""
	var rules []map[string]string
	for i, p := range board.Panels {
		for j, tg := range p.Targets {
			all += tg.Expr + "\n"
			// Every metric a panel reads is filtered by the variables.
			for _, m := range regexp.MustCompile(`stockgate_[a-z_]+(\{[^}]*\})?`).FindAllStringSubmatch(tg.Expr, -1) {
				if !strings.Contains(m[1], `namespace=~"$namespace"`) || !strings.Contains(m[1], `pod=~"$pod"`) {
					t.Errorf("panel %q reads %s without the namespace and pod variables", p.Title, m[0])
				}
			}
			rules = append(rules, map[string]string{"record": fmt.Sprintf("dashboard:panel%d:target%d", i, j), "expr": tg.Expr})
		}
	}
	// Every expression parses: promtool checks them as recording rules.
	groups, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(f, groups, 0o644); err != nil {
		t.Fatal(err)
	}
	if promtool, err := exec.LookPath("promtool"); err != nil {
		t.Error("promtool not found: `make test` installs it (apt-get install prometheus)")
	} else if out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput(); err != nil {
		t.Errorf("dashboard queries do not parse: %v\n%s", err, out)
	}
	for _, m := range []string{"stockgate_http_requests_total", "stockgate_http_request_duration_seconds_bucket",
		"stockgate_purchases_total", "stockgate_breaker_state", "stockgate_stock_remaining_units",
		"stockgate_cache_hits_total", "stockgate_redis_pool_timeout_total", "stockgate_ledger_write_duration_seconds_bucket",
		"stockgate_ledger_batch_size_bucket", "stockgate_http_rate_limited_total", "stockgate_build_info"} {
		if !strings.Contains(all, m) {
			t.Errorf("the dashboard does not chart %s", m)
		}
	}
}

// The alert rules pass promtool (Debian's prometheus package, which make
// test installs), extracted from the PrometheusRule.
func TestAlertRules(t *testing.T) {
	objs := build(t)
	rule := objs["PrometheusRule/stockgate"].(*monitoringv1.PrometheusRule)
	groups, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(f, groups, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: `make test` installs it (apt-get install prometheus)")
	}
	out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	// The unit tests, next to the extracted rules (they name rules.yaml).
	tests, err := os.ReadFile("k8s/alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tf := filepath.Join(filepath.Dir(f), "alerts_test.yaml")
	if err := os.WriteFile(tf, tests, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "test", "rules", tf).CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	runbook, err := os.ReadFile("../docs/RUNBOOK.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			// Each alert fires in some test and is silent in another, and
			// its runbook_url names a section of docs/RUNBOOK.md.
			fires := regexp.MustCompile(`alertname: ` + r.Alert + `\n\s+exp_alerts:\n\s+- exp_labels`)
			silent := regexp.MustCompile(`alertname: ` + r.Alert + `\n\s+exp_alerts: \[\]`)
			if !fires.Match(tests) || !silent.Match(tests) {
				t.Errorf("alert %s: want a promtool test where it fires and one where it is silent", r.Alert)
			}
			anchor := strings.ToLower(r.Alert)
			if r.Annotations["runbook_url"] != "https://github.com/stockgate/stockgate/blob/main/docs/RUNBOOK.md#"+anchor {
				t.Errorf("alert %s: runbook_url %q", r.Alert, r.Annotations["runbook_url"])
			}
			if !bytes.Contains(runbook, []byte("\n## "+r.Alert+"\n")) {
				t.Errorf("docs/RUNBOOK.md has no section ## %s", r.Alert)
			}
		}
	}
	var names []string
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
		}
	}
	for _, want := range []string{"StockgateOversellGuardRefusing", "StockgateBreakerOpen", "StockgateDrift", "StockgateErrorRatio",
		"StockgateTargetDown", "StockgatePurchaseLatencyHigh"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("no alert %s", want)
		}
	}
	t.Logf("promtool: %s", bytes.TrimSpace(out))
}

// The image's binary is static (no cgo, no dynamic loader), as the
// Dockerfile builds it, so it runs on distroless/static.
func TestStaticBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "stockgate")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "../cmd/stockgate")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("the binary has a %v segment: not static", p.Type)
		}
	}
	docker, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CGO_ENABLED=0", "distroless/static", "USER 65532"} {
		if !strings.Contains(string(docker), want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

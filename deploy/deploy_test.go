// Package deploy holds the container image recipe, the Helm chart (with the
// Grafana dashboard and the alert rules), and make run's local cluster
// script. Its tests render the chart with Helm's Go SDK and check every
// object, strictly typed.
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
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// scaledObject is the part of KEDA's ScaledObject the chart writes (KEDA's
// Go module is not a dependency for one type); decoded strictly like the
// others.
type scaledObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		ScaleTargetRef struct {
			Name string `json:"name"`
		} `json:"scaleTargetRef"`
		Advanced struct {
			HorizontalPodAutoscalerConfig struct {
				Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior"`
			} `json:"horizontalPodAutoscalerConfig"`
		} `json:"advanced"`
		MinReplicaCount int `json:"minReplicaCount"`
		MaxReplicaCount int `json:"maxReplicaCount"`
		Triggers        []struct {
			Type       string            `json:"type"`
			MetricType string            `json:"metricType,omitempty"`
			Metadata   map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

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
	case "v1 ServiceAccount":
		obj = &corev1.ServiceAccount{}
	case "v1 Pod":
		obj = &corev1.Pod{} // the helm test hook
	case "autoscaling/v2 HorizontalPodAutoscaler":
		obj = &autoscalingv2.HorizontalPodAutoscaler{}
	case "policy/v1 PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "monitoring.coreos.com/v1 ServiceMonitor":
		obj = &monitoringv1.ServiceMonitor{}
	case "monitoring.coreos.com/v1 PrometheusRule":
		obj = &monitoringv1.PrometheusRule{}
	case "batch/v1 Job":
		obj = &batchv1.Job{}
	case "networking.k8s.io/v1 NetworkPolicy":
		obj = &networkingv1.NetworkPolicy{}
	case "keda.sh/v1alpha1 ScaledObject":
		obj = &scaledObject{}
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

// minimalValues is the least an install sets (the admin token and the
// DSN): the chart refuses its bare defaults.
const minimalValues = "helm/ci/minimal-values.yaml"

// build renders the chart with the minimal values, as `helm template
// stockgate deploy/helm/stockgate --namespace stockgate -f
// deploy/helm/ci/minimal-values.yaml` does on a cluster with the
// Prometheus Operator and KEDA.
func build(t *testing.T) map[string]any { return render(t, minimalValues) }

// render renders the chart with Helm's Go SDK, with the values files given
// over the chart's defaults (checked against values.schema.json), and
// decodes every object strictly.
func render(t *testing.T, valueFiles ...string) map[string]any {
	t.Helper()
	return decodeAll(t, renderFiles(t, "stockgate", readValues(t, valueFiles...)))
}

// installable is vals over the minimal values.
func installable(t *testing.T, vals map[string]any) map[string]any {
	t.Helper()
	return chartutil.CoalesceTables(vals, readValues(t, minimalValues))
}

// readValues merges values files, later ones over earlier ones.
func readValues(t *testing.T, valueFiles ...string) map[string]any {
	t.Helper()
	vals := map[string]any{}
	for _, f := range valueFiles {
		v, err := chartutil.ReadValuesFile(f)
		if err != nil {
			t.Fatal(err)
		}
		vals = chartutil.CoalesceTables(v.AsMap(), vals)
	}
	return vals
}

// The cluster the chart's tests install on: the Kubernetes of the API
// the kubeconform schemas describe (kubernetesModule), serving the
// Prometheus Operator's and KEDA's APIs, as helm template is told with
// --kube-version and --api-versions (helm install asks the cluster).
const (
	kubeVersion = "v1.34.1"
	operatorAPI = "monitoring.coreos.com/v1"
	kedaAPI     = "keda.sh/v1alpha1"
)

// clusterArgs are helm template's flags for that cluster.
var clusterArgs = []string{"--kube-version", kubeVersion, "--api-versions", operatorAPI, "--api-versions", kedaAPI}

// capabilities is a cluster of kubeVersion serving the built-in APIs and
// apis.
func capabilities(apis ...string) *chartutil.Capabilities {
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: kubeVersion, Major: "1", Minor: "34"}
	caps.APIVersions = append(slices.Clone(chartutil.DefaultVersionSet), apis...)
	return caps
}

// renderFiles renders the chart for an install of release into namespace
// stockgate, on a cluster with the Prometheus Operator and KEDA: template
// path → text, as Helm hands them to its sorter.
func renderFiles(t *testing.T, release string, vals map[string]any) map[string]string {
	t.Helper()
	out, err := renderOn(t, release, "stockgate", vals, capabilities(operatorAPI, kedaAPI))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// renderOn renders the chart for an install of release into namespace on
// a cluster of caps; the error is the chart's refusal (fail, required,
// the values schema).
func renderOn(t *testing.T, release, namespace string, vals map[string]any, caps *chartutil.Capabilities) (map[string]string, error) {
	t.Helper()
	ch, err := loader.Load("helm/stockgate")
	if err != nil {
		t.Fatal(err)
	}
	// As helm install checks it.
	if v := ch.Metadata.KubeVersion; v != "" && !chartutil.IsCompatibleRange(v, caps.KubeVersion.Version) {
		return nil, fmt.Errorf("chart requires kubeVersion %s, the cluster is %s", v, caps.KubeVersion.Version)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: release, Namespace: namespace,
		Revision: 1, IsInstall: true}, caps)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	return out, nil
}

// decodeAll decodes every object of the rendered files strictly, by
// Kind/name.
func decodeAll(t *testing.T, files map[string]string) map[string]any {
	t.Helper()
	objs := map[string]any{}
	for name, text := range files {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		for _, doc := range strings.Split(text, "\n---") {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			kind, obj := decodeStrict(t, []byte(doc))
			objs[kind+"/"+nameOf(obj)] = obj
		}
	}
	return objs
}

// stripComments drops YAML comment lines (a template that renders nothing
// but its comments is no object).
func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func nameOf(obj any) string {
	js, _ := json.Marshal(obj)
	var m struct {
		Metadata struct{ Name string } `json:"metadata"`
	}
	_ = json.Unmarshal(js, &m)
	return m.Metadata.Name
}

// The chart renders, with its default values and with a production-like
// values file, into objects that decode strictly into the Kubernetes (and
// Prometheus Operator) API types, with what operators rely on in place.
func TestManifests(t *testing.T) {
	objs := build(t)
	want := []string{"Deployment/stockgate", "Service/stockgate", "HorizontalPodAutoscaler/stockgate",
		"PodDisruptionBudget/stockgate", "ConfigMap/stockgate", "ServiceMonitor/stockgate",
		"PrometheusRule/stockgate", "ConfigMap/stockgate-dashboard", "Job/stockgate-migrate", "ServiceAccount/stockgate"}
	for _, w := range want {
		if objs[w] == nil {
			t.Errorf("the chart's default render lacks %s (has %v)", w, keys(objs))
		}
	}
	d, _ := objs["Deployment/stockgate"].(*appsv1.Deployment)
	if d == nil {
		t.Fatal("no Deployment")
	}
	if d.Labels["app.kubernetes.io/name"] != "stockgate" {
		t.Errorf("deployment labels %v", d.Labels)
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
		"stockgate_ledger_batch_size_bucket", "stockgate_http_rate_limited_total", "stockgate_build_info",
		// The waiting room, the relay and the waitlist.
		"stockgate_queue_waiting", "stockgate_queue_admitted_unused", "stockgate_queue_abandoned", "stockgate_queue_stock_left",
		"stockgate_queue_joins_total", "stockgate_queue_pow_refused_total", "stockgate_queue_admitted_total", "stockgate_queue_wait_seconds_bucket",
		"stockgate_relay_lag_seconds", "stockgate_relay_backlog", "stockgate_relay_leases", "stockgate_relay_delivered_total",
		"stockgate_relay_failed_attempts_total", "stockgate_relay_dead_lettered_total", "stockgate_waitlist_joins_total"} {
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
	tests, err := os.ReadFile("helm/alerts_test.yaml")
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
		"StockgateTargetDown", "StockgateTargetsAbsent", "StockgatePurchaseLatencyHigh"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("no alert %s", want)
		}
	}
	t.Logf("promtool: %s", bytes.TrimSpace(out))
}

// The image's binary is static (no cgo, no dynamic loader), as the
// Dockerfile builds it, so it runs on distroless/static.
func TestStaticBinary(t *testing.T) {
	f, err := elf.Open(gatewayBinary(t))
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
	// `go mod download` before the sources are copied needs the image's
	// workspace (deploy/image.work: the server and the client alone, not
	// the tests' modules of go.work) and the go.mod of every module it
	// uses.
	work, err := os.ReadFile("image.work")
	if err != nil {
		t.Fatal(err)
	}
	download := strings.Index(string(docker), "RUN go mod download")
	for _, want := range []string{"COPY go.mod go.sum ./", "COPY deploy/image.work deploy/image.work.sum deploy/",
		"ENV GOWORK=/src/deploy/image.work"} {
		if i := strings.Index(string(docker), want); i < 0 || i > download {
			t.Errorf("the Dockerfile does not say %q before go mod download", want)
		}
	}
	uses := regexp.MustCompile(`(?m)^\s+(\.\.\S*)$`).FindAllStringSubmatch(string(work), -1)
	var mods []string
	for _, m := range uses {
		mods = append(mods, strings.TrimPrefix(strings.TrimPrefix(m[1], ".."), "/"))
	}
	if !slices.Equal(mods, []string{"", "client"}) {
		t.Fatalf("deploy/image.work uses %q, want the server (..) and the client (../client) alone", mods)
	}
	if i := strings.Index(string(docker), "COPY client/go.mod client/"); i < 0 || i > download {
		t.Errorf("the Dockerfile does not copy client/go.mod before go mod download (deploy/image.work uses it)")
	}
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// The production-like values: secrets from an existing Secret, metrics and
// admin on their own port (and Service, scraped there), KEDA pre-scaling
// instead of the HPA, a NetworkPolicy; and the migration Job as a hook.
func TestChartProductionValues(t *testing.T) {
	objs := render(t, "helm/values-production.yaml")
	if objs["HorizontalPodAutoscaler/stockgate"] != nil {
		t.Error("an HPA beside KEDA's ScaledObject: two owners of the replica count")
	}
	so, _ := objs["ScaledObject/stockgate"].(*scaledObject)
	if so == nil || len(so.Spec.Triggers) != 2 || so.Spec.Triggers[0].Type != "cron" ||
		so.Spec.Triggers[0].Metadata["desiredReplicas"] != "85" || so.Spec.Triggers[0].Metadata["timezone"] != "Europe/London" {
		t.Errorf("pre-scaling: %+v", so)
	}
	if objs["NetworkPolicy/stockgate"] == nil {
		t.Error("no NetworkPolicy")
	}
	d := objs["Deployment/stockgate"].(*appsv1.Deployment)
	c := d.Spec.Template.Spec.Containers[0]
	secret := false
	for _, e := range c.EnvFrom {
		secret = secret || (e.SecretRef != nil && e.SecretRef.Name == "stockgate-secrets")
	}
	if !secret || objs["Secret/stockgate"] != nil {
		t.Errorf("secrets: from stockgate-secrets %v, a chart-made Secret %v", secret, objs["Secret/stockgate"] != nil)
	}
	admin := false
	for _, p := range c.Ports {
		admin = admin || (p.Name == "admin" && p.ContainerPort == 9090)
	}
	as, _ := objs["Service/stockgate-admin"].(*corev1.Service)
	sm := objs["ServiceMonitor/stockgate"].(*monitoringv1.ServiceMonitor)
	if !admin || as == nil || sm.Spec.Endpoints[0].Port != "admin" || sm.Spec.Selector.MatchLabels["app.kubernetes.io/component"] != "admin" {
		t.Errorf("metrics on the admin port: container port %v, admin Service %v, scraped on %q", admin, as != nil, sm.Spec.Endpoints[0].Port)
	}
	if sm.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("ServiceMonitor labels %v: kube-prometheus-stack selects on release", sm.Labels)
	}
	job := objs["Job/stockgate-migrate"].(*batchv1.Job)
	if job.Annotations["helm.sh/hook"] != "pre-install,pre-upgrade" || job.Spec.Template.Spec.Containers[0].Args[0] != "migrate" {
		t.Errorf("migration job: hook %q args %v", job.Annotations["helm.sh/hook"], job.Spec.Template.Spec.Containers[0].Args)
	}
	if cm := objs["ConfigMap/stockgate"].(*corev1.ConfigMap); cm.Data["STOCKGATE_MIGRATE"] != "false" {
		t.Errorf("the serving pods migrate (STOCKGATE_MIGRATE %q) although the Job does", cm.Data["STOCKGATE_MIGRATE"])
	}
}

// values.schema.json refuses values that cannot work.
func TestChartValuesSchema(t *testing.T) {
	ch, err := loader.Load("helm/stockgate")
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []map[string]any{
		{"replicas": 0},
		{"env": map[string]any{"NOT_OURS": "x"}},
		{"autoscaling": map[string]any{"cpuUtilization": 150}},
		{"imagee": map[string]any{}},
		{"image": map[string]any{"digest": "latest"}},
		{"serviceAccount": map[string]any{"nmae": "x"}}, //nolint:misspell // a misspelt key, which the chart must refuse
		{"podDisruptionBudget": map[string]any{"maxUnavailable": 0}},
		{"podDisruptionBudget": map[string]any{"minAvailable": "0%"}},
		{"extraVolumeMounts": []any{map[string]any{"name": "ca"}}},
	} {
		if _, err := chartutil.ToRenderValues(ch, bad, chartutil.ReleaseOptions{Name: "stockgate", Namespace: "stockgate"},
			chartutil.DefaultCapabilities); err == nil {
			t.Errorf("values %v accepted", bad)
		}
	}
}

// The prometheus-adapter rule in the values serves the metric the HPA
// asks for, from a series the gateway exports, with a query that parses.
func TestAdapterRule(t *testing.T) {
	v, err := chartutil.ReadValuesFile("helm/stockgate/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rule, err := v.Table("adapterRule")
	if err != nil {
		t.Fatal(err)
	}
	name, _ := rule["name"].(map[string]any)
	adapter := map[string]any{"autoscaling": map[string]any{"prometheusAdapter": true}}
	hpa := decodeAll(t, renderFiles(t, "stockgate", installable(t, adapter)))["HorizontalPodAutoscaler/stockgate"].(*autoscalingv2.HorizontalPodAutoscaler)
	var asked string
	for _, m := range hpa.Spec.Metrics {
		if m.Pods != nil {
			asked = m.Pods.Metric.Name
		}
	}
	if asked == "" || name["as"] != asked {
		t.Errorf("the adapter serves %v, the HPA asks for %q", name["as"], asked)
	}
	series, _ := rule["seriesQuery"].(string)
	if !strings.HasPrefix(series, "stockgate_http_requests_total{") {
		t.Errorf("seriesQuery %q does not read stockgate_http_requests_total", series)
	}
	q, _ := rule["metricsQuery"].(string)
	q = strings.NewReplacer("<<.Series>>", "stockgate_http_requests_total", "<<.LabelMatchers>>", `namespace="stockgate",pod=~"stockgate-.*"`,
		"<<.GroupBy>>", "pod").Replace(q)
	groups, _ := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "adapter",
		"rules": []any{map[string]string{"record": "adapter:rule", "expr": q}}}}})
	f := filepath.Join(t.TempDir(), "adapter.yaml")
	if err := os.WriteFile(f, groups, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: `make test` installs it")
	}
	if out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput(); err != nil {
		t.Errorf("the adapter's query does not parse: %v\n%s", err, out)
	}
}

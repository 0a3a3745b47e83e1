package deploy

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// peer is a client pod: its namespace's labels and its own.
type peer struct {
	namespace map[string]string
	pod       map[string]string
}

func nsPeer(name string) peer {
	return peer{namespace: map[string]string{"kubernetes.io/metadata.name": name}, pod: map[string]string{"app": "client"}}
}

// admits reports whether the NetworkPolicies in objs let from reach port
// (a container port of the Deployment's pods), as Kubernetes decides: no
// policy selecting the pods admits all; otherwise some rule of one must
// match the port (named ports resolved on the pod) and the peer.
func admits(objs map[string]any, from peer, port int32) bool {
	d := objs["Deployment/stockgate"].(*appsv1.Deployment)
	podLabels := d.Spec.Template.Labels
	named := map[string]int32{}
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, p := range c.Ports {
			named[p.Name] = p.ContainerPort
		}
	}
	selected := false
	for _, obj := range objs {
		np, ok := obj.(*networkingv1.NetworkPolicy)
		if !ok || !selects(np.Spec.PodSelector.MatchLabels, podLabels) {
			continue
		}
		selected = true
		for _, rule := range np.Spec.Ingress {
			portOK := len(rule.Ports) == 0
			for _, p := range rule.Ports {
				switch {
				case p.Port == nil:
					portOK = true
				case p.Port.Type == intstr.Int && p.Port.IntVal == port:
					portOK = true
				case p.Port.Type == intstr.String && named[p.Port.StrVal] == port:
					portOK = true
				}
			}
			fromOK := len(rule.From) == 0
			for _, f := range rule.From {
				nsOK := f.NamespaceSelector == nil && from.namespace["kubernetes.io/metadata.name"] == "stockgate" ||
					f.NamespaceSelector != nil && selects(f.NamespaceSelector.MatchLabels, from.namespace)
				podOK := f.PodSelector == nil || selects(f.PodSelector.MatchLabels, from.pod)
				fromOK = fromOK || (nsOK && podOK && f.IPBlock == nil)
			}
			if portOK && fromOK {
				return true
			}
		}
	}
	return !selected
}

// scrapeTarget is what Prometheus (through the Operator) scrapes for the
// chart's ServiceMonitor: the container port behind the Service port it
// names, and the job label the Operator gives it (the Service label named
// by jobLabel, else the Service's name).
func scrapeTarget(t *testing.T, objs map[string]any) (port int32, job string) {
	t.Helper()
	d := objs["Deployment/stockgate"].(*appsv1.Deployment)
	mon := objs["ServiceMonitor/"+d.Name].(*monitoringv1.ServiceMonitor)
	for _, obj := range objs {
		svc, ok := obj.(*corev1.Service)
		if !ok || !selects(mon.Spec.Selector.MatchLabels, svc.Labels) {
			continue
		}
		job = svc.Name
		if v := svc.Labels[mon.Spec.JobLabel]; mon.Spec.JobLabel != "" && v != "" {
			job = v
		}
		for _, sp := range svc.Spec.Ports {
			if sp.Name != mon.Spec.Endpoints[0].Port {
				continue
			}
			for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
				if p.Name == sp.TargetPort.StrVal || p.ContainerPort == sp.TargetPort.IntVal {
					return p.ContainerPort, job
				}
			}
		}
	}
	t.Fatalf("the ServiceMonitor %s selects no Service port named %q", mon.Name, mon.Spec.Endpoints[0].Port)
	return 0, ""
}

// With the NetworkPolicy on (the production values), Prometheus in the
// monitoring namespace reaches /metrics, the ingress controller reaches the
// API and other namespaces reach neither; and StockgateTargetDown fires for
// the job the Operator really names (a promtool test of the real rules
// with that job), whatever the release is called.
func TestMetricsReachable(t *testing.T) {
	for _, tc := range []struct {
		release string
		files   []string
	}{
		{"stockgate", []string{minimalValues}},
		{"stockgate", []string{"helm/values-production.yaml"}},
		{"prod", []string{"helm/values-production.yaml"}},
		{"prod", []string{minimalValues}},
	} {
		t.Run(fmt.Sprintf("%s %v", tc.release, tc.files), func(t *testing.T) {
			vals := readValues(t, tc.files...)
			objs := decodeAll(t, renderFiles(t, tc.release, vals))
			// The Deployment's key is Deployment/<fullname>: alias it.
			for k, o := range objs {
				if strings.HasPrefix(k, "Deployment/") {
					objs["Deployment/stockgate"] = o
				}
			}
			port, job := scrapeTarget(t, objs)
			if !admits(objs, nsPeer("monitoring"), port) {
				t.Errorf("Prometheus in namespace monitoring cannot reach /metrics on port %d", port)
			}
			if !admits(objs, nsPeer("ingress-nginx"), 8080) {
				t.Error("the ingress controller cannot reach port 8080")
			}
			if tc.files[0] != minimalValues && admits(objs, nsPeer("default"), port) {
				t.Errorf("with a NetworkPolicy, namespace default reaches port %d", port)
			}
			rule := objs["PrometheusRule/"+nameOf(objs["Deployment/stockgate"])].(*monitoringv1.PrometheusRule)
			targetDownFires(t, rule, job)
		})
	}
}

// targetDownFires runs promtool's unit test of the rules with one target
// of job down for 10 minutes: StockgateTargetDown must fire.
func targetDownFires(t *testing.T, rule *monitoringv1.PrometheusRule, job string) {
	t.Helper()
	labels := map[string]string{"job": job, "namespace": "stockgate", "pod": "stockgate-0", "instance": "10.0.0.1:9090"}
	series := fmt.Sprintf(`up{job=%q, namespace="stockgate", pod="stockgate-0", instance="10.0.0.1:9090"}`, job)
	labels["severity"] = "critical"
	if err := promtoolAlert(t, rule, "StockgateTargetDown", series, "0x10", "5m", []map[string]string{labels}); err != nil {
		t.Errorf("StockgateTargetDown does not fire for a target of job %q that is down: %v", job, err)
	}
}

// promtoolAlert runs promtool's unit test of the rules on one series (its
// values every minute): at evalTime the alert must be firing with exactly
// the label sets want (none: silent), its annotations templated from
// them.
func promtoolAlert(t *testing.T, rule *monitoringv1.PrometheusRule, alert, series, values, evalTime string, want []map[string]string) error {
	t.Helper()
	dir := t.TempDir()
	groups, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), groups, 0o644); err != nil {
		t.Fatal(err)
	}
	var templates map[string]string
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == alert {
				templates = r.Annotations
			}
		}
	}
	if templates == nil {
		return fmt.Errorf("no alert %s", alert)
	}
	exp := []any{}
	for _, labels := range want {
		annotations := map[string]string{}
		for k, v := range templates {
			for l, lv := range labels {
				v = strings.ReplaceAll(v, "{{ $labels."+l+" }}", lv)
			}
			annotations[k] = v
		}
		exp = append(exp, map[string]any{"exp_labels": labels, "exp_annotations": annotations})
	}
	test := map[string]any{"rule_files": []string{"rules.yaml"}, "evaluation_interval": "1m", "tests": []any{map[string]any{
		"interval":        "1m",
		"input_series":    []any{map[string]any{"series": series, "values": values}},
		"alert_rule_test": []any{map[string]any{"eval_time": evalTime, "alertname": alert, "exp_alerts": exp}},
	}}}
	b, err := yaml.Marshal(test)
	if err != nil {
		t.Fatal(err)
	}
	tf := filepath.Join(dir, "alert_test.yaml")
	if err := os.WriteFile(tf, b, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: `make test` installs it (apt-get install prometheus)")
	}
	if out, err := exec.Command(promtool, "test", "rules", tf).CombinedOutput(); err != nil {
		return fmt.Errorf("%v\n%s", err, out)
	}
	return nil
}

// Without prometheus-adapter (the default) the HPA scales on CPU alone:
// a Pods metric nobody serves would stop it from ever scaling down. Said
// to be installed, it scales on requests per second too; and
// docs/OPERATIONS.md says so.
func TestHPAWithoutAdapter(t *testing.T) {
	metrics := func(vals map[string]any) (cpu, rate bool) {
		objs := decodeAll(t, renderFiles(t, "stockgate", installable(t, vals)))
		hpa := objs["HorizontalPodAutoscaler/stockgate"].(*autoscalingv2.HorizontalPodAutoscaler)
		for _, m := range hpa.Spec.Metrics {
			cpu = cpu || (m.Type == autoscalingv2.ResourceMetricSourceType && m.Resource.Name == corev1.ResourceCPU)
			rate = rate || m.Type == autoscalingv2.PodsMetricSourceType
		}
		return cpu, rate
	}
	if cpu, rate := metrics(map[string]any{}); !cpu || rate {
		t.Errorf("default HPA scales on cpu %v, a Pods metric %v; want cpu alone", cpu, rate)
	}
	adapter := map[string]any{"autoscaling": map[string]any{"prometheusAdapter": true}}
	if cpu, rate := metrics(adapter); !cpu || !rate {
		t.Errorf("HPA with prometheusAdapter scales on cpu %v, requests per second %v; want both", cpu, rate)
	}
	readme, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "autoscaling.prometheusAdapter=true") {
		t.Error("docs/OPERATIONS.md does not say how to turn the requests-per-second metric on (autoscaling.prometheusAdapter=true)")
	}
}

// definedMetrics are the metric names stockgate exports, read from the
// code that defines them (tests and deploy/ aside): the Name of each
// prometheus *Opts literal, the names passed to the relay's counter and
// gauge helpers, a histogram's _bucket, _sum and _count series, and the
// go-redis collector's names under the namespace and subsystem the app
// gives it (read from that module's source).
func definedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	defined := map[string]bool{}
	add := func(name, kind string) {
		defined[name] = true
		if kind == "HistogramOpts" {
			defined[name+"_bucket"], defined[name+"_sum"], defined[name+"_count"] = true, true, true
		}
	}
	str := func(e ast.Expr) string {
		if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			s, _ := strconv.Unquote(lit.Value)
			return s
		}
		return ""
	}
	var redisNS, redisSub string
	err := filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (p == "../deploy" || strings.HasPrefix(d.Name(), ".") && p != "..") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		// A file being edited may not parse: what it does parse counts.
		f, _ := parser.ParseFile(token.NewFileSet(), p, nil, 0)
		if f == nil {
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				if sel, ok := n.Type.(*ast.SelectorExpr); ok && strings.HasSuffix(sel.Sel.Name, "Opts") {
					for _, e := range n.Elts {
						if kv, ok := e.(*ast.KeyValueExpr); ok && fmt.Sprint(kv.Key) == "Name" && strings.HasPrefix(str(kv.Value), "stockgate_") {
							add(str(kv.Value), sel.Sel.Name)
						}
					}
				}
			case *ast.CallExpr:
				if id, ok := n.Fun.(*ast.Ident); ok && (id.Name == "counter" || id.Name == "gauge") && len(n.Args) > 0 &&
					strings.HasPrefix(str(n.Args[0]), "stockgate_") {
					add(str(n.Args[0]), id.Name)
				}
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && fmt.Sprint(sel.X) == "redisprometheus" && sel.Sel.Name == "NewCollector" && len(n.Args) > 1 {
					redisNS, redisSub = str(n.Args[0]), str(n.Args[1])
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if redisNS != "" {
		cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/redis/go-redis/extra/redisprometheus/v9")
		cmd.Dir = ".."
		dir, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list redisprometheus: %v", err)
		}
		src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(dir)), "collector.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`BuildFQName\(namespace, subsystem, "([a-z_]+)"\)`).FindAllStringSubmatch(string(src), -1) {
			defined[redisNS+"_"+redisSub+"_"+m[1]] = true
		}
	}
	return defined
}

// unknownMetrics are the stockgate_ names an expression reads that
// stockgate does not export.
func unknownMetrics(expr string, defined map[string]bool) []string {
	var out []string
	for _, m := range regexp.MustCompile(`\bstockgate_[a-z0-9_]+`).FindAllString(expr, -1) {
		if !defined[m] {
			out = append(out, m)
		}
	}
	return out
}

// Every metric the dashboard (its panels and its variables) and the alert
// rules read is one stockgate exports: a renamed metric would leave a
// panel empty and an alert silent, and nothing would say so.
func TestDashboardMetricsExist(t *testing.T) {
	defined := definedMetrics(t)
	// The scan finds what it must, and the check refuses a misspelt name.
	for _, m := range []string{"stockgate_http_requests_total", "stockgate_http_request_duration_seconds_bucket",
		"stockgate_queue_waiting", "stockgate_relay_lag_seconds", "stockgate_breaker_state", "stockgate_redis_pool_timeout_total"} {
		if !defined[m] {
			t.Errorf("the scan of the code does not find %s", m)
		}
	}
	if got := unknownMetrics(`sum(stockgate_queue_waitng{pod=~"$pod"})`, defined); !slices.Equal(got, []string{"stockgate_queue_waitng"}) {
		t.Errorf("unknownMetrics of a misspelt name: %v", got)
	}
	b, err := os.ReadFile("helm/stockgate/files/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var board struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name  string
				Query any
			}
		}
	}
	if err := json.Unmarshal(b, &board); err != nil {
		t.Fatal(err)
	}
	exprs := 0
	for _, p := range board.Panels {
		for _, tg := range p.Targets {
			exprs++
			if bad := unknownMetrics(tg.Expr, defined); len(bad) > 0 {
				t.Errorf("panel %q reads %v, which stockgate does not export", p.Title, bad)
			}
		}
	}
	for _, v := range board.Templating.List {
		if bad := unknownMetrics(fmt.Sprint(v.Query), defined); len(bad) > 0 {
			t.Errorf("variable %s reads %v, which stockgate does not export", v.Name, bad)
		}
	}
	rule := build(t)["PrometheusRule/stockgate"].(*monitoringv1.PrometheusRule)
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			exprs++
			if bad := unknownMetrics(r.Expr.String(), defined); len(bad) > 0 {
				t.Errorf("alert %s reads %v, which stockgate does not export", r.Alert, bad)
			}
		}
	}
	t.Logf("%d expressions checked against %d metric names in the code", exprs, len(defined))
}

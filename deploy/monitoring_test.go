package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
		{"stockgate", nil},
		{"stockgate", []string{"helm/values-production.yaml"}},
		{"prod", []string{"helm/values-production.yaml"}},
		{"prod", nil},
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
			if len(tc.files) > 0 && admits(objs, nsPeer("default"), port) {
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
	dir := t.TempDir()
	groups, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), groups, 0o644); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"job": job, "namespace": "stockgate", "pod": "stockgate-0", "instance": "10.0.0.1:9090"}
	annotations := map[string]string{}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert != "StockgateTargetDown" {
				continue
			}
			for k, v := range r.Annotations {
				for l, lv := range labels {
					v = strings.ReplaceAll(v, "{{ $labels."+l+" }}", lv)
				}
				annotations[k] = v
			}
		}
	}
	series := fmt.Sprintf(`up{job=%q, namespace="stockgate", pod="stockgate-0", instance="10.0.0.1:9090"}`, job)
	test := map[string]any{"rule_files": []string{"rules.yaml"}, "evaluation_interval": "1m", "tests": []any{map[string]any{
		"interval":     "1m",
		"input_series": []any{map[string]any{"series": series, "values": "0x10"}},
		"alert_rule_test": []any{map[string]any{"eval_time": "5m", "alertname": "StockgateTargetDown", "exp_alerts": []any{
			map[string]any{"exp_labels": map[string]string{"severity": "critical", "job": job, "namespace": "stockgate",
				"pod": "stockgate-0", "instance": "10.0.0.1:9090"}, "exp_annotations": annotations},
		}}},
	}}}
	b, err := yaml.Marshal(test)
	if err != nil {
		t.Fatal(err)
	}
	tf := filepath.Join(dir, "targetdown_test.yaml")
	if err := os.WriteFile(tf, b, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: `make test` installs it (apt-get install prometheus)")
	}
	if out, err := exec.Command(promtool, "test", "rules", tf).CombinedOutput(); err != nil {
		t.Errorf("StockgateTargetDown does not fire for a target of job %q that is down: %v\n%s", job, err, out)
	}
}

// Without prometheus-adapter (the default) the HPA scales on CPU alone:
// a Pods metric nobody serves would stop it from ever scaling down. Said
// to be installed, it scales on requests per second too; and the README
// says so.
func TestHPAWithoutAdapter(t *testing.T) {
	metrics := func(vals map[string]any) (cpu, rate bool) {
		objs := decodeAll(t, renderFiles(t, "stockgate", vals))
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
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "autoscaling.prometheusAdapter=true") {
		t.Error("the README does not say how to turn the requests-per-second metric on (autoscaling.prometheusAdapter=true)")
	}
}

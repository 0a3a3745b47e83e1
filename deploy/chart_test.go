package deploy

import (
	"fmt"
	"math"
	"os"
	"path"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// What a platform team sets around the gateway (helm/ci/extras-values.yaml)
// reaches the pods, the Deployment's and the migration Job's alike: the
// values schema, which refuses unknown keys, once refused every one of
// them.
func TestChartPodSettings(t *testing.T) {
	objs := render(t, "helm/ci/extras-values.yaml")
	d := objs["Deployment/stockgate"].(*appsv1.Deployment)
	j := objs["Job/stockgate-migrate"].(*batchv1.Job)
	const image = "registry.example/stockgate/stockgate@sha256:4f3c2b1a09e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a29180f7e6d5c4b3a29180"
	for _, pod := range []struct {
		name string
		spec corev1.PodSpec
		meta map[string]string
	}{{"Deployment", d.Spec.Template.Spec, d.Spec.Template.Annotations}, {"Job", j.Spec.Template.Spec, j.Spec.Template.Annotations}} {
		s, c := pod.spec, pod.spec.Containers[0]
		if c.Image != image {
			t.Errorf("%s image %q, want %q (image.digest)", pod.name, c.Image, image)
		}
		if len(s.ImagePullSecrets) != 1 || s.ImagePullSecrets[0].Name != "registry-example" {
			t.Errorf("%s imagePullSecrets %v", pod.name, s.ImagePullSecrets)
		}
		if s.NodeSelector["node-pool"] != "on-sale" || len(s.Tolerations) != 1 || s.Tolerations[0].Value != "on-sale" {
			t.Errorf("%s nodeSelector %v, tolerations %v", pod.name, s.NodeSelector, s.Tolerations)
		}
		if s.Affinity == nil || s.Affinity.NodeAffinity == nil {
			t.Errorf("%s has no node affinity", pod.name)
		}
		if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
			t.Errorf("%s mounts a service account token", pod.name)
		}
		if pod.meta["sidecar.istio.io/inject"] != "false" {
			t.Errorf("%s pod annotations %v", pod.name, pod.meta)
		}
		env := map[string]corev1.EnvVar{}
		for _, e := range c.Env {
			env[e.Name] = e
		}
		if e := env["STOCKGATE_WEBHOOK_SECRET"]; e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "platform-webhook" {
			t.Errorf("%s: extraEnv STOCKGATE_WEBHOOK_SECRET is %+v", pod.name, e)
		}
	}
	if ann := d.Spec.Template.Annotations; ann["checksum/config"] == "" {
		t.Errorf("podAnnotations replaced the config checksum: %v", ann)
	}
	// podLabels join the chart's labels and never change them.
	labels := d.Spec.Template.Labels
	if labels["cost-centre"] != "ticketing" || labels["app.kubernetes.io/name"] != "stockgate" || !selects(d.Spec.Selector.MatchLabels, labels) {
		t.Errorf("pod labels %v", labels)
	}
	if l := j.Spec.Template.Labels; l["cost-centre"] != "ticketing" || l["app.kubernetes.io/name"] != "stockgate-migrate" {
		t.Errorf("the Job's pod labels %v", l)
	}
	// Spreading over zones and nodes, each constraint selecting this
	// release's pods.
	var keys []string
	for _, c := range d.Spec.Template.Spec.TopologySpreadConstraints {
		keys = append(keys, c.TopologyKey)
		if c.LabelSelector == nil || !selects(c.LabelSelector.MatchLabels, labels) || len(c.LabelSelector.MatchLabels) != 2 {
			t.Errorf("spread over %s counts the pods of %v", c.TopologyKey, c.LabelSelector)
		}
	}
	if !slices.Equal(keys, []string{"topology.kubernetes.io/zone", "kubernetes.io/hostname"}) {
		t.Errorf("spread over %v", keys)
	}
	// The ServiceAccount: the pods', made by the chart with the IAM role;
	// the Job's, a hook of its own with the same role (the release's does
	// not exist yet when a pre-install hook runs).
	sa, _ := objs["ServiceAccount/stockgate"].(*corev1.ServiceAccount)
	jsa, _ := objs["ServiceAccount/stockgate-migrate"].(*corev1.ServiceAccount)
	const role = "arn:aws:iam::123456789012:role/stockgate"
	switch {
	case sa == nil || jsa == nil:
		t.Fatalf("ServiceAccounts: the pods' %v, the Job's %v", sa != nil, jsa != nil)
	case d.Spec.Template.Spec.ServiceAccountName != sa.Name || j.Spec.Template.Spec.ServiceAccountName != jsa.Name:
		t.Errorf("service accounts: the pods use %q, the Job %q", d.Spec.Template.Spec.ServiceAccountName, j.Spec.Template.Spec.ServiceAccountName)
	case sa.Annotations["eks.amazonaws.com/role-arn"] != role || jsa.Annotations["eks.amazonaws.com/role-arn"] != role:
		t.Errorf("service account annotations %v, %v", sa.Annotations, jsa.Annotations)
	case sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken:
		t.Error("the ServiceAccount automounts its token")
	case jsa.Annotations["helm.sh/hook"] != j.Annotations["helm.sh/hook"] || jsa.Annotations["helm.sh/hook-weight"] >= j.Annotations["helm.sh/hook-weight"]:
		t.Errorf("the Job's ServiceAccount is not a hook made before the Job: %v", jsa.Annotations)
	}
	// Not created: the pods and the Job run as the one named.
	objs = decodeAll(t, renderFiles(t, "stockgate", installable(t, map[string]any{
		"serviceAccount": map[string]any{"create": false, "name": "platform-sa"}})))
	d, j = objs["Deployment/stockgate"].(*appsv1.Deployment), objs["Job/stockgate-migrate"].(*batchv1.Job)
	if objs["ServiceAccount/stockgate"] != nil || objs["ServiceAccount/stockgate-migrate"] != nil ||
		d.Spec.Template.Spec.ServiceAccountName != "platform-sa" || j.Spec.Template.Spec.ServiceAccountName != "platform-sa" {
		t.Errorf("serviceAccount.create=false: pods run as %q, the Job as %q", d.Spec.Template.Spec.ServiceAccountName, j.Spec.Template.Spec.ServiceAccountName)
	}
}

// A managed Redis whose TLS certificate a private CA signed: the CA, in a
// Secret the operator made, is mounted with extraVolumes and
// extraVolumeMounts, and STOCKGATE_REDIS_TLS_CA_FILE names the file in
// the mount. Helm's install order on a namespace holding the Secrets
// starts every pod; without the CA's Secret the pods would not start.
func TestRedisPrivateCA(t *testing.T) {
	flags, err := os.ReadFile("../cmd/stockgate/config.go") // the flags' definitions
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(flags), `"redis-tls-ca-file"`) {
		t.Fatal("stockgate has no -redis-tls-ca-file (STOCKGATE_REDIS_TLS_CA_FILE) setting any more")
	}
	vals := readValues(t, "helm/ci/extras-values.yaml")
	files := renderFiles(t, "stockgate", vals)
	objs := decodeAll(t, files)
	cm := objs["ConfigMap/stockgate"].(*corev1.ConfigMap)
	caFile := cm.Data["STOCKGATE_REDIS_TLS_CA_FILE"]
	for _, key := range []string{"Deployment/stockgate", "Job/stockgate-migrate"} {
		spec := podSpec(objs[key])
		if key == "Job/stockgate-migrate" {
			// The Job has the pods' settings inline.
			for _, e := range spec.Containers[0].Env {
				if e.Name == "STOCKGATE_REDIS_TLS_CA_FILE" && e.Value != caFile {
					t.Errorf("the Job's CA file %q, the pods' %q", e.Value, caFile)
				}
			}
		}
		if from := caSecret(spec, spec.Containers[0], caFile); from != "redis-ca" {
			t.Errorf("%s: %s is in no mount of the Secret redis-ca (from %q; volumes %v, mounts %v)",
				key, caFile, from, spec.Volumes, spec.Containers[0].VolumeMounts)
		}
	}
	made := namespace{"Secret/stockgate-secrets": secret("stockgate-secrets", nil),
		"Secret/platform-webhook": secret("platform-webhook", nil)}
	if _, err := helmRun(t, made, files, false); err == nil || !strings.Contains(err.Error(), "Secret/redis-ca") {
		t.Errorf("helm install without the CA's Secret: %v, want the pods waiting for Secret/redis-ca", err)
	}
	made = namespace{"Secret/stockgate-secrets": secret("stockgate-secrets", nil),
		"Secret/platform-webhook": secret("platform-webhook", nil), "Secret/redis-ca": secret("redis-ca", map[string]string{"ca.crt": "PEM"})}
	if steps, err := helmRun(t, made, files, false); err != nil {
		t.Errorf("helm install: %v\nsteps:\n%s", err, strings.Join(steps, "\n"))
	}
}

// caSecret is the Secret whose volume c mounts at a directory holding
// file, or "".
func caSecret(spec *corev1.PodSpec, c corev1.Container, file string) string {
	for _, m := range c.VolumeMounts {
		if path.Dir(file) != path.Clean(m.MountPath) {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return v.Secret.SecretName
			}
		}
	}
	return ""
}

// helm install prints NOTES.txt: how to watch the rollout, reach the
// Service, read the admin token, and what the migration Job is; and
// what it left out because the cluster lacks an operator's API.
func TestNotes(t *testing.T) {
	notes := func(t *testing.T, vals map[string]any, caps *chartutil.Capabilities) string {
		t.Helper()
		out, err := renderOn(t, "prod", "shop", vals, caps)
		if err != nil {
			t.Fatal(err)
		}
		n, ok := out["stockgate/templates/NOTES.txt"]
		if !ok {
			t.Fatal("no templates/NOTES.txt")
		}
		return n
	}
	full := capabilities(operatorAPI, kedaAPI)
	n := notes(t, installable(t, nil), full)
	for _, want := range []string{
		"kubectl -n shop rollout status deployment/prod-stockgate",
		"kubectl -n shop port-forward service/prod-stockgate 8080:80",
		"http://prod-stockgate.shop.svc.cluster.local:80",
		"kubectl -n shop get secret prod-stockgate -o jsonpath='{.data.STOCKGATE_ADMIN_TOKEN}' | base64 -d",
		"kubectl -n shop logs job/prod-stockgate-migrate",
		"HorizontalPodAutoscaler prod-stockgate",
	} {
		if !strings.Contains(n, want) {
			t.Errorf("NOTES.txt lacks %q:\n%s", want, n)
		}
	}
	if strings.Contains(n, "Not installed") {
		t.Errorf("NOTES.txt says something was left out on a cluster with every API:\n%s", n)
	}
	prod := readValues(t, "helm/values-production.yaml")
	n = notes(t, prod, full)
	for _, want := range []string{
		"kubectl -n shop get secret stockgate-secrets -o jsonpath='{.data.STOCKGATE_ADMIN_TOKEN}'",
		"kubectl -n shop port-forward service/prod-stockgate-admin 9090:9090",
		"KEDA's ScaledObject prod-stockgate",
	} {
		if !strings.Contains(n, want) {
			t.Errorf("NOTES.txt (production values) lacks %q:\n%s", want, n)
		}
	}
	n = notes(t, prod, capabilities())
	for _, want := range []string{"monitoring.coreos.com/v1", "keda.sh/v1alpha1"} {
		if !strings.Contains(n, "Not installed") || !strings.Contains(n, want) {
			t.Errorf("NOTES.txt on a cluster without %s does not say what it left out:\n%s", want, n)
		}
	}
}

// The bare defaults cannot start (no admin token, no ledger): helm install
// and helm template refuse them, naming the values to set, instead of
// installing pods that exit 2. What is enough renders. (helm lint, by
// design, only logs a template's fail.)
func TestDefaultsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string // in the error; none: it renders
	}{
		{"defaults", nil, []string{"secretEnv.STOCKGATE_ADMIN_TOKEN", "existingSecret", "exit 2"}},
		{"token only", []string{"--set", "secretEnv.STOCKGATE_ADMIN_TOKEN=t"}, []string{"secretEnv.STOCKGATE_LEDGER_DSN", "existingSecret"}},
		{"token and DSN", []string{"--set", "secretEnv.STOCKGATE_ADMIN_TOKEN=t,secretEnv.STOCKGATE_LEDGER_DSN=postgres://db/x"}, nil},
		{"existingSecret", []string{"--set", "existingSecret=stockgate-secrets"}, nil},
		{"extraEnv", []string{"--set", "extraEnv[0].name=STOCKGATE_ADMIN_TOKEN,extraEnv[0].valueFrom.secretKeyRef.name=s,extraEnv[0].valueFrom.secretKeyRef.key=t",
			"--set", "extraEnv[1].name=STOCKGATE_LEDGER_DSN,extraEnv[1].valueFrom.secretKeyRef.name=s,extraEnv[1].valueFrom.secretKeyRef.key=d"}, nil},
		// The secrets as files of a Secret mounted with extraVolumes
		// (STOCKGATE_<FLAG>_FILE).
		{"files", []string{"--set", "env.STOCKGATE_ADMIN_TOKEN_FILE=/etc/stockgate/secrets/token,env.STOCKGATE_LEDGER_DSN_FILE=/etc/stockgate/secrets/dsn",
			"--set", "extraVolumes[0].name=secrets,extraVolumes[0].secret.secretName=stockgate-files",
			"--set", "extraVolumeMounts[0].name=secrets,extraVolumeMounts[0].mountPath=/etc/stockgate/secrets"}, nil},
		{"open admin, said so", []string{"--set-string", "env.STOCKGATE_ALLOW_OPEN_ADMIN=true,secretEnv.STOCKGATE_LEDGER_DSN=postgres://db/x"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", "stockgate", "helm/stockgate", "-n", "stockgate", "--kube-version", kubeVersion}, tc.args...)
			out, err := helmCmd(t, args...)
			switch {
			case tc.want == nil && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want == nil && !strings.Contains(string(out), "kind: Deployment"):
				t.Errorf("no Deployment rendered:\n%s", out)
			case tc.want != nil && err == nil:
				t.Errorf("rendered; want helm to refuse, naming %v", tc.want)
			case tc.want != nil:
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("helm's refusal does not name %s:\n%v", w, err)
					}
				}
			}
		})
	}
}

// autoscalers are the objects that set the Deployment's replica count.
func autoscalers(objs map[string]any) []string {
	var out []string
	for k, o := range objs {
		switch o.(type) {
		case *autoscalingv2.HorizontalPodAutoscaler, *scaledObject:
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// An autoscaled Deployment has no replicas in the chart (each upgrade
// would set it back under the autoscaler), and one autoscaler at most:
// KEDA's when preScale is on and the cluster serves KEDA's API (it makes
// the HPA itself), else the chart's HPA; never the two, which fight over
// the count.
func TestOneAutoscaler(t *testing.T) {
	for _, hpa := range []bool{false, true} {
		for _, pre := range []bool{false, true} {
			for _, keda := range []bool{false, true} {
				name := fmt.Sprintf("autoscaling=%v preScale=%v KEDA=%v", hpa, pre, keda)
				caps := capabilities(operatorAPI)
				if keda {
					caps = capabilities(operatorAPI, kedaAPI)
				}
				files, err := renderOn(t, "stockgate", "stockgate", installable(t, map[string]any{
					"autoscaling": map[string]any{"enabled": hpa}, "preScale": map[string]any{"enabled": pre}}), caps)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				objs := decodeAll(t, files)
				got := autoscalers(objs)
				want := []string{}
				switch {
				case pre && keda:
					want = []string{"ScaledObject/stockgate"}
				case hpa || pre:
					want = []string{"HorizontalPodAutoscaler/stockgate"}
				}
				if !slices.Equal(got, want) && len(got)+len(want) > 0 {
					t.Errorf("%s: autoscalers %v, want %v", name, got, want)
				}
				d := objs["Deployment/stockgate"].(*appsv1.Deployment)
				if len(want) > 0 && d.Spec.Replicas != nil {
					t.Errorf("%s: autoscaled by %v, yet the Deployment sets replicas %d", name, got, *d.Spec.Replicas)
				}
				if len(want) == 0 && (d.Spec.Replicas == nil || *d.Spec.Replicas != 3) {
					t.Errorf("%s: not autoscaled, replicas %v, want 3", name, d.Spec.Replicas)
				}
			}
		}
	}
	// The production values: KEDA, no HPA, no replicas.
	objs := render(t, "helm/values-production.yaml")
	if got := autoscalers(objs); !slices.Equal(got, []string{"ScaledObject/stockgate"}) || objs["Deployment/stockgate"].(*appsv1.Deployment).Spec.Replicas != nil {
		t.Errorf("production values: autoscalers %v, replicas %v", got, objs["Deployment/stockgate"].(*appsv1.Deployment).Spec.Replicas)
	}
	// Requests per second is a metric of the chart's HPA, which KEDA's
	// replaces: asking for both is refused, not silently half done.
	_, err := renderOn(t, "stockgate", "stockgate", installable(t, map[string]any{
		"autoscaling": map[string]any{"prometheusAdapter": true}, "preScale": map[string]any{"enabled": true}}), capabilities(kedaAPI))
	if err == nil || !strings.Contains(err.Error(), "autoscaling.prometheusAdapter") || !strings.Contains(err.Error(), "preScale.enabled") {
		t.Errorf("prometheusAdapter with KEDA: %v, want a refusal naming both values", err)
	}
}

// The Prometheus Operator's and KEDA's objects are rendered only where
// the cluster serves their APIs (helm template learns it from
// --api-versions; helm install asks the cluster): elsewhere the install
// would fail on kinds nobody serves.
func TestMonitoringNeedsCRDs(t *testing.T) {
	kinds := func(args ...string) []string {
		t.Helper()
		args = append([]string{"template", "stockgate", "helm/stockgate", "-n", "stockgate", "--kube-version", kubeVersion,
			"-f", "helm/values-production.yaml"}, args...)
		out, err := helmCmd(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, k := range []string{"ServiceMonitor", "PrometheusRule", "ScaledObject", "HorizontalPodAutoscaler"} {
			if strings.Contains(string(out), "\nkind: "+k+"\n") {
				got = append(got, k)
			}
		}
		return got
	}
	if got := kinds(); !slices.Equal(got, []string{"HorizontalPodAutoscaler"}) {
		t.Errorf("on a bare cluster: %v, want the HPA alone", got)
	}
	if got := kinds("--api-versions", operatorAPI); !slices.Equal(got, []string{"ServiceMonitor", "PrometheusRule", "HorizontalPodAutoscaler"}) {
		t.Errorf("with the Prometheus Operator: %v", got)
	}
	if got := kinds("--api-versions", operatorAPI, "--api-versions", kedaAPI); !slices.Equal(got, []string{"ServiceMonitor", "PrometheusRule", "ScaledObject"}) {
		t.Errorf("with the Prometheus Operator and KEDA: %v", got)
	}
}

// The chart says which Kubernetes it needs: the preStop sleep action is
// served from 1.30. Managed clusters' versions carry a suffix.
func TestKubeVersion(t *testing.T) {
	ch, err := loader.Load("helm/stockgate")
	if err != nil {
		t.Fatal(err)
	}
	for v, want := range map[string]bool{"v1.29.9": false, "v1.30.0": true, "v1.30.2-eks-a737599": true, "v1.34.1": true} {
		if ok := chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, v); ok != want {
			t.Errorf("kubeVersion %q admits %s: %v, want %v", ch.Metadata.KubeVersion, v, ok, want)
		}
	}
	if _, err := helmCmd(t, "template", "stockgate", "helm/stockgate", "--kube-version", "1.29.9", "-f", minimalValues); err == nil ||
		!strings.Contains(err.Error(), "kubeVersion") {
		t.Errorf("helm template on Kubernetes 1.29: %v, want a refusal naming kubeVersion", err)
	}
	d := build(t)["Deployment/stockgate"].(*appsv1.Deployment)
	if d.Spec.Template.Spec.Containers[0].Lifecycle.PreStop.Sleep == nil {
		t.Error("no preStop sleep: then the chart needs no 1.30")
	}
}

// disruptionsAllowed is how many pods the PDB lets an eviction take when n
// pods run, all healthy, as the disruption controller computes it
// (percentages of n rounded up).
func disruptionsAllowed(pdb *policyv1.PodDisruptionBudget, n int) int {
	scaled := func(v *intstr.IntOrString) int {
		if v.Type == intstr.Int {
			return v.IntValue()
		}
		var p float64
		_, _ = fmt.Sscanf(v.StrVal, "%f%%", &p) // a malformed percentage counts 0, and the checks below fail
		return int(math.Ceil(p * float64(n) / 100))
	}
	if pdb.Spec.MaxUnavailable != nil {
		return max(0, n-(n-scaled(pdb.Spec.MaxUnavailable)))
	}
	return max(0, n-scaled(pdb.Spec.MinAvailable))
}

// The PDB never blocks a node drain: at the fewest pods the Deployment
// runs (autoscaling.minReplicas, or replicas) it lets at least one go.
// By default it allows one at a time (maxUnavailable 1); at one pod there
// is none (any budget could block); a minAvailable that would keep every
// pod is refused, naming the value.
func TestPDBNeverBlocksDrains(t *testing.T) {
	for _, tc := range []struct {
		name   string
		vals   map[string]any
		floor  int
		want   string // "" no PDB; else maxUnavailable or minAvailable as rendered
		refuse bool
	}{
		{"defaults", nil, 3, "maxUnavailable 1", false},
		{"minReplicas 1", map[string]any{"autoscaling": map[string]any{"minReplicas": 1}}, 1, "", false},
		{"replicas 1", map[string]any{"autoscaling": map[string]any{"enabled": false}, "replicas": 1}, 1, "", false},
		{"replicas 2", map[string]any{"autoscaling": map[string]any{"enabled": false}, "replicas": 2}, 2, "maxUnavailable 1", false},
		{"minAvailable 2 of 2", map[string]any{"autoscaling": map[string]any{"minReplicas": 2}, "podDisruptionBudget": map[string]any{"minAvailable": 2}}, 2, "", true},
		{"minAvailable 2 of 3", map[string]any{"podDisruptionBudget": map[string]any{"minAvailable": 2}}, 3, "minAvailable 2", false},
		{"minAvailable 60% of 2", map[string]any{"autoscaling": map[string]any{"minReplicas": 2}, "podDisruptionBudget": map[string]any{"minAvailable": "60%"}}, 2, "", true},
		{"minAvailable 50% of 2", map[string]any{"autoscaling": map[string]any{"minReplicas": 2}, "podDisruptionBudget": map[string]any{"minAvailable": "50%"}}, 2, "minAvailable 50%", false},
		{"maxUnavailable 25%", map[string]any{"podDisruptionBudget": map[string]any{"maxUnavailable": "25%"}}, 3, "maxUnavailable 25%", false},
		{"disabled", map[string]any{"podDisruptionBudget": map[string]any{"enabled": false}}, 3, "", false},
		{"production", readValues(t, "helm/values-production.yaml"), 10, "minAvailable 80%", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files, err := renderOn(t, "stockgate", "stockgate", installable(t, tc.vals), capabilities(operatorAPI, kedaAPI))
			if tc.refuse {
				if err == nil || !strings.Contains(err.Error(), "podDisruptionBudget.minAvailable") {
					t.Errorf("rendered (%v); want a refusal naming podDisruptionBudget.minAvailable", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			pdb, _ := decodeAll(t, files)["PodDisruptionBudget/stockgate"].(*policyv1.PodDisruptionBudget)
			got := ""
			switch {
			case pdb != nil && pdb.Spec.MaxUnavailable != nil:
				got = "maxUnavailable " + pdb.Spec.MaxUnavailable.String()
			case pdb != nil && pdb.Spec.MinAvailable != nil:
				got = "minAvailable " + pdb.Spec.MinAvailable.String()
			}
			if got != tc.want {
				t.Errorf("PDB %q, want %q", got, tc.want)
			}
			if pdb == nil {
				return
			}
			if n := disruptionsAllowed(pdb, tc.floor); n < 1 {
				t.Errorf("at %d pods the PDB allows %d evictions: drains block", tc.floor, n)
			}
			if p := pdb.Spec.UnhealthyPodEvictionPolicy; p == nil || *p != policyv1.AlwaysAllow {
				t.Errorf("unhealthyPodEvictionPolicy %v: a pod that is not ready would hold up drains", p)
			}
		})
	}
}

// The migration Job's pods are never the Service's endpoints nor counted
// by the PDB: their labels match neither selector, whatever podLabels
// says (helm/ci/extras-values.yaml tries app.kubernetes.io/name).
func TestMigrationJobNotSelected(t *testing.T) {
	for name, files := range valueSets {
		objs := render(t, files...)
		j := objs["Job/stockgate-migrate"].(*batchv1.Job)
		labels := j.Spec.Template.Labels
		for _, key := range selecting(objs, labels) {
			t.Errorf("%s values: %s selects the migration Job's pods (%v)", name, key, labels)
		}
		d := objs["Deployment/stockgate"].(*appsv1.Deployment)
		if svc := objs["Service/stockgate"].(*corev1.Service); !selects(svc.Spec.Selector, d.Spec.Template.Labels) {
			t.Errorf("%s values: the Service does not select the gateway's pods", name)
		}
	}
}

// StockgateTargetsAbsent fires when no target of the chart's scrape job is
// left in the release's namespace, whatever the release and namespace
// are called, and is silent while one is scraped; the chart leaves it out
// when it makes no ServiceMonitor (the job is then someone else's).
func TestTargetsAbsent(t *testing.T) {
	for _, tc := range []struct{ release, namespace string }{{"stockgate", "stockgate"}, {"prod", "shop"}} {
		files, err := renderOn(t, tc.release, tc.namespace, installable(t, nil), capabilities(operatorAPI))
		if err != nil {
			t.Fatal(err)
		}
		objs := decodeAll(t, files)
		for k, o := range objs {
			if strings.HasPrefix(k, "Deployment/") {
				objs["Deployment/stockgate"] = o
			}
		}
		_, job := scrapeTarget(t, objs)
		rule := objs["PrometheusRule/"+nameOf(objs["Deployment/stockgate"])].(*monitoringv1.PrometheusRule)
		gone := fmt.Sprintf(`up{job=%q, namespace="elsewhere", pod="gw-1"}`, job)
		here := fmt.Sprintf(`up{job=%q, namespace=%q, pod="gw-1"}`, job, tc.namespace)
		alerts := []map[string]string{{"severity": "critical", "job": job, "namespace": tc.namespace}}
		if err := promtoolAlert(t, rule, "StockgateTargetsAbsent", gone, "1x20", "10m", alerts); err != nil {
			t.Errorf("release %s in %s: no target of job %q in the namespace: %v", tc.release, tc.namespace, job, err)
		}
		if err := promtoolAlert(t, rule, "StockgateTargetsAbsent", here, "1x40", "10m", nil); err != nil {
			t.Errorf("release %s in %s: a target of job %q is scraped: %v", tc.release, tc.namespace, job, err)
		}
	}
	objs := decodeAll(t, renderFiles(t, "stockgate", installable(t, map[string]any{"monitoring": map[string]any{"serviceMonitor": false}})))
	for _, g := range objs["PrometheusRule/stockgate"].(*monitoringv1.PrometheusRule).Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "StockgateTargetsAbsent" {
				t.Error("no ServiceMonitor of the chart's, yet StockgateTargetsAbsent waits for its job")
			}
		}
	}
}

// The gateway listens where STOCKGATE_ADDR says, and the pod's port named
// http (the probes', the Service's and the NetworkPolicy's) is that one:
// it was 8080 whatever STOCKGATE_ADDR said, so with env.STOCKGATE_ADDR
// ":9000" the probes knocked on a closed port and no pod ever started.
func TestPortFollowsAddr(t *testing.T) {
	for addr, want := range map[string]int32{":9000": 9000, "0.0.0.0:8081": 8081, "[::]:9443": 9443} {
		objs := decodeAll(t, renderFiles(t, "stockgate", installable(t, map[string]any{
			"env": map[string]any{"STOCKGATE_ADDR": addr}})))
		d := objs["Deployment/stockgate"].(*appsv1.Deployment)
		var got int32
		for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
			if p.Name == "http" {
				got = p.ContainerPort
			}
		}
		if got != want {
			t.Errorf("STOCKGATE_ADDR %q: the http port is %d, want %d", addr, got, want)
		}
	}
}

// The chart refuses what would cut a drain short or hide the pods from
// their probes: a terminationGracePeriodSeconds shorter than the preStop
// sleep, the drain and the span flush (it was fixed at 30, exactly their
// default sum), and a loopback STOCKGATE_ADDR.
func TestDrainFitsAndPortReachable(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string // in the error; "": it renders
	}{
		{"defaults", nil, ""},
		{"a longer drain", []string{"--set-string", "env.STOCKGATE_SHUTDOWN_GRACE=40s"}, "terminationGracePeriodSeconds 35 is shorter"},
		{"a longer drain, a longer grace", []string{"--set-string", "env.STOCKGATE_SHUTDOWN_GRACE=40s", "--set", "terminationGracePeriodSeconds=60"}, ""},
		{"a longer preStop", []string{"--set", "preStopSeconds=20"}, "preStopSeconds (20)"},
		{"loopback", []string{"--set-string", "env.STOCKGATE_ADDR=127.0.0.1:8080"}, "loopback"},
		{"localhost", []string{"--set-string", "env.STOCKGATE_ADDR=localhost:8080"}, "loopback"},
		{"every interface", []string{"--set-string", "env.STOCKGATE_ADDR=:9000"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", "stockgate", "helm/stockgate", "-n", "stockgate", "--kube-version", kubeVersion,
				"-f", "helm/ci/minimal-values.yaml"}, tc.args...)
			out, err := helmCmd(t, args...)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v\n%s", err, out)
			case tc.want == "" && !strings.Contains(string(out), "terminationGracePeriodSeconds:"):
				t.Errorf("no grace rendered:\n%s", out)
			case tc.want != "" && (err == nil || !strings.Contains(string(out)+err.Error(), tc.want)):
				t.Errorf("= %v\n%s\nwant refused naming %q", err, out, tc.want)
			}
		})
	}
}

// A ledger over several primaries (helm/ci/primaries-values.yaml): their
// URLs, each to its own PgBouncer, reach the pods and the migration Job
// (which migrates every primary) from the Secret each reads.
func TestPrimariesReachEveryPod(t *testing.T) {
	objs := render(t, "helm/ci/primaries-values.yaml")
	d := objs["Deployment/stockgate"].(*appsv1.Deployment)
	j := objs["Job/stockgate-migrate"].(*batchv1.Job)
	for what, spec := range map[string]corev1.PodSpec{"Deployment": d.Spec.Template.Spec, "migration Job": j.Spec.Template.Spec} {
		found := false
		for _, c := range spec.Containers {
			for _, from := range c.EnvFrom {
				if from.SecretRef == nil {
					continue
				}
				s, ok := objs["Secret/"+from.SecretRef.Name].(*corev1.Secret)
				if ok && strings.Contains(s.StringData["STOCKGATE_LEDGER_PRIMARIES"], "p1=postgres://stockgate:secret@pgbouncer-p1.db:6432/") {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("the %s's container reads no Secret with STOCKGATE_LEDGER_PRIMARIES", what)
		}
	}
}

// `helm test` runs one Pod: the release's own image running `stockgate
// smoke` (cmd/stockgate's TestSmokeCommand runs that against a gateway)
// at the buyers' Service, and at the admin Service when the admin routes
// have a port of their own, with the release's Secret for the admin
// token; no Service or PodDisruptionBudget selects it.
func TestSmokeHook(t *testing.T) {
	for name, files := range valueSets {
		objs := render(t, files...)
		p, ok := objs["Pod/stockgate-smoke"].(*corev1.Pod)
		if !ok {
			t.Fatalf("%s values: no Pod/stockgate-smoke", name)
		}
		if p.Annotations["helm.sh/hook"] != "test" || p.Spec.RestartPolicy != corev1.RestartPolicyNever || len(p.Spec.Containers) != 1 {
			t.Errorf("%s values: the smoke pod is no helm test run once: %v, %s, %d containers", name, p.Annotations, p.Spec.RestartPolicy, len(p.Spec.Containers))
			continue
		}
		c := p.Spec.Containers[0]
		d := objs["Deployment/stockgate"].(*appsv1.Deployment)
		if c.Image != d.Spec.Template.Spec.Containers[0].Image || strings.Join(c.Args, " ") != "smoke" {
			t.Errorf("%s values: the smoke pod runs %s %v, want the gateway's image %s with [smoke]", name, c.Image, c.Args, d.Spec.Template.Spec.Containers[0].Image)
		}
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
		svc := objs["Service/stockgate"].(*corev1.Service)
		if want := fmt.Sprintf("http://stockgate:%d", svc.Spec.Ports[0].Port); env["STOCKGATE_SMOKE_URL"] != want {
			t.Errorf("%s values: STOCKGATE_SMOKE_URL = %q, want the Service's %q", name, env["STOCKGATE_SMOKE_URL"], want)
		}
		want := ""
		if admin, ok := objs["Service/stockgate-admin"].(*corev1.Service); ok {
			want = fmt.Sprintf("http://stockgate-admin:%d", admin.Spec.Ports[0].Port)
		}
		if env["STOCKGATE_SMOKE_ADMIN_URL"] != want {
			t.Errorf("%s values: STOCKGATE_SMOKE_ADMIN_URL = %q, want %q", name, env["STOCKGATE_SMOKE_ADMIN_URL"], want)
		}
		if len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef == nil {
			t.Errorf("%s values: the smoke pod's envFrom %+v, want the release's Secret (the admin token)", name, c.EnvFrom)
		}
		for _, key := range selecting(objs, p.Labels) {
			t.Errorf("%s values: %s selects the smoke pod (%v)", name, key, p.Labels)
		}
		// Under a NetworkPolicy (production's admits only the ingress
		// controller, Prometheus and a back office), helm test reaches
		// the gateway only if the policy admits the smoke pod itself.
		// (admits: no policy admits all.)
		ports := map[string]int32{}
		for _, cp := range d.Spec.Template.Spec.Containers[0].Ports {
			ports[cp.Name] = cp.ContainerPort
		}
		called := []string{"http"}
		if want != "" {
			called = append(called, "admin")
		}
		smoke := peer{namespace: map[string]string{"kubernetes.io/metadata.name": "stockgate"}, pod: p.Labels}
		for _, port := range called {
			if !admits(objs, smoke, ports[port]) {
				t.Errorf("%s values: the NetworkPolicy does not admit the smoke pod (%v) on port %s (%d)", name, p.Labels, port, ports[port])
			}
		}
	}
}

// selecting names the Services and PodDisruptionBudgets among objs that
// select pods with labels.
func selecting(objs map[string]any, labels map[string]string) []string {
	var out []string
	for key, obj := range objs {
		var sel map[string]string
		switch o := obj.(type) {
		case *corev1.Service:
			sel = o.Spec.Selector
		case *policyv1.PodDisruptionBudget:
			sel = o.Spec.Selector.MatchLabels
		default:
			continue
		}
		if selects(sel, labels) {
			out = append(out, key)
		}
	}
	return out
}

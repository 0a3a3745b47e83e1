package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// gatewaySettings is what the gateway built from this tree accepts, as its
// -help says: every flag's STOCKGATE_<FLAG>, and STOCKGATE_<FLAG>_FILE for
// each secret (secrets: their STOCKGATE_<FLAG>).
func gatewaySettings(t *testing.T) (settings, secrets []string) {
	t.Helper()
	bin := gatewayBinary(t)
	out, _ := exec.Command(bin, "-help").CombinedOutput()
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		settings = append(settings, "STOCKGATE_"+strings.ToUpper(strings.ReplaceAll(m[1], "-", "_")))
	}
	for _, m := range regexp.MustCompile(`the file (STOCKGATE_[A-Z0-9_]+)_FILE names`).FindAllStringSubmatch(string(out), -1) {
		settings = append(settings, m[1]+"_FILE")
		secrets = append(secrets, m[1])
	}
	if len(settings) < 60 || len(secrets) < 5 {
		t.Fatalf("stockgate -help names %d settings and %d secrets:\n%s", len(settings), len(secrets), out)
	}
	slices.Sort(settings)
	slices.Sort(secrets)
	return settings, secrets
}

// oneShot are the settings of `stockgate move` and `migrate
// -schema-down-to`, run by hand, and of `stockgate smoke`, which only the
// chart's helm test pod sets: never values' (the ConfigMap, the Secret).
var oneShot = []string{"STOCKGATE_PROGRAM", "STOCKGATE_SCHEMA_DOWN_TO", "STOCKGATE_SMOKE_ADMIN_URL", "STOCKGATE_SMOKE_URL", "STOCKGATE_TO"}

// notSecret is a flag the gateway lets come from a file that is no
// credential: the ACL user's name (production values set it under env).
const notSecret = "STOCKGATE_REDIS_USERNAME"

func chartSchema(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile("helm/stockgate/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func dig(m any, path ...string) any {
	for _, p := range path {
		mm, _ := m.(map[string]any)
		m = mm[p]
	}
	return m
}

// The gateway stops at start on a STOCKGATE_ variable that is no setting
// (a misspelt one was ignored, and a pod with REDIS_ADDR for ADDRS went
// ready on the default Redis address). The chart holds the same line:
// its values schema names exactly the gateway's settings (less the
// one-shot commands'), and everything it renders (every values file of
// make test) sets only those, in the ConfigMap, the Secrets and every
// container's env.
func TestChartSetsOnlyKnownSettings(t *testing.T) {
	settings, _ := gatewaySettings(t)
	var want []string
	for _, s := range settings {
		if !slices.Contains(oneShot, s) {
			want = append(want, s)
		}
	}
	var got []string
	for _, v := range dig(chartSchema(t), "definitions", "setting", "enum").([]any) {
		got = append(got, v.(string))
	}
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("values.schema.json's definitions.setting is not the gateway's settings (-gateway +schema):\n%s", diff)
	}
	known := func(name string) bool { return !strings.HasPrefix(name, "STOCKGATE_") || slices.Contains(want, name) }
	for set, files := range valueSets {
		objs := render(t, files...)
		for key, obj := range objs {
			var names []string
			switch o := obj.(type) {
			case *corev1.ConfigMap:
				if key != "ConfigMap/stockgate" {
					continue // the dashboard
				}
				for k := range o.Data {
					names = append(names, k)
				}
			case *corev1.Secret:
				for k := range o.StringData {
					names = append(names, k)
				}
			case *appsv1.Deployment, *batchv1.Job:
				for _, c := range podSpec(o).Containers {
					for _, e := range c.Env {
						names = append(names, e.Name)
					}
				}
			}
			for _, n := range names {
				if !known(n) {
					t.Errorf("%s values: %s sets %s, which the gateway refuses at start", set, key, n)
				}
			}
		}
	}
}

// Secrets under env land in the ConfigMap and in the migration Job's
// inline environment, where kubectl describe shows them. The schema
// refuses each of the gateway's secrets (the flags that read a _FILE)
// under env, saying where it goes; `helm lint` and `helm template` fail.
// The same value under secretEnv renders; a name that is no setting is
// refused under env, secretEnv and as a STOCKGATE_ name of extraEnv.
func TestSecretsRefusedUnderEnv(t *testing.T) {
	_, secrets := gatewaySettings(t)
	props, _ := dig(chartSchema(t), "properties", "env", "properties").(map[string]any)
	var refused []string
	for name := range props {
		refused = append(refused, name)
	}
	slices.Sort(refused)
	want := slices.DeleteFunc(slices.Clone(secrets), func(s string) bool { return s == notSecret })
	if diff := cmp.Diff(want, refused); diff != "" {
		t.Errorf("the secrets the schema refuses under env are not the gateway's (-gateway +schema):\n%s", diff)
	}
	value := map[string]string{"STOCKGATE_LEDGER_DSN": "postgres://u:hunter2@db:5432/stockgate",
		"STOCKGATE_LEDGER_PRIMARIES": "p1=postgres://u:hunter2@db1:5432/stockgate"}
	base := []string{"stockgate", "helm/stockgate", "-n", "stockgate", "--kube-version", kubeVersion, "-f", minimalValues}
	for _, name := range want {
		v := value[name]
		if v == "" {
			v = "hunter2hunter2hunter2hunter2hunter2"
		}
		for _, verb := range []string{"template", "lint"} {
			args := append([]string{verb}, base...)
			if verb == "lint" {
				args = append([]string{"lint", "--strict"}, base[1:]...)
			}
			out, err := helmCmd(t, append(args, "--set", "env."+name+"="+v)...)
			if err == nil {
				t.Errorf("helm %s with env.%s: accepted", verb, name)
			} else if !strings.Contains(err.Error(), name+" is a secret: set it under secretEnv") {
				t.Errorf("helm %s with env.%s: the refusal does not say where it goes:\n%v", verb, name, err)
			}
			if strings.Contains(string(out), "hunter2") {
				t.Errorf("helm %s with env.%s rendered the secret", verb, name)
			}
		}
		if _, err := helmCmd(t, append([]string{"template"}, append(base, "--set", "secretEnv."+name+"="+v)...)...); err != nil {
			t.Errorf("helm template with secretEnv.%s: %v", name, err)
		}
	}
	// A file's path is no secret.
	if _, err := helmCmd(t, append([]string{"template"}, append(base, "--set", "env.STOCKGATE_LEDGER_DSN_FILE=/run/secrets/dsn")...)...); err != nil {
		t.Errorf("env.STOCKGATE_LEDGER_DSN_FILE: %v", err)
	}
	for _, set := range []string{"env.STOCKGATE_REDIS_ADDR=redis:6379", "secretEnv.STOCKGATE_REDIS_PASWORD=x", // misspelt on purpose
		"extraEnv[0].name=STOCKGATE_LEDGER_DNS", "migration.secretEnv.STOCKGATE_LEDGER_DNS=x"} { // misspelt on purpose
		name := regexp.MustCompile(`STOCKGATE_[A-Z_]+`).FindString(set)
		if _, err := helmCmd(t, append([]string{"template"}, append(base, "--set", set)...)...); err == nil {
			t.Errorf("helm template --set %s: accepted", set)
		} else if !strings.Contains(err.Error(), name) {
			t.Errorf("helm template --set %s: the refusal does not name %s: %v", set, name, err)
		}
	}
	// Any other variable passes through extraEnv (OTEL_*, ...).
	if _, err := helmCmd(t, append([]string{"template"}, append(base, "--set", "extraEnv[0].name=OTEL_EXPORTER_OTLP_PROTOCOL",
		"--set", "extraEnv[0].value=grpc")...)...); err != nil {
		t.Errorf("extraEnv OTEL_EXPORTER_OTLP_PROTOCOL: %v", err)
	}
}

// jobAndPods renders vals over the minimal values: the migration Job, its
// hook Secret (nil when none), the Deployment and the pods' Secret.
func jobAndPods(t *testing.T, vals map[string]any) (*batchv1.Job, *corev1.Secret, *appsv1.Deployment, *corev1.Secret) {
	t.Helper()
	objs := decodeAll(t, renderFiles(t, "stockgate", installable(t, vals)))
	j, _ := objs["Job/stockgate-migrate"].(*batchv1.Job)
	js, _ := objs["Secret/stockgate-migrate"].(*corev1.Secret)
	d, _ := objs["Deployment/stockgate"].(*appsv1.Deployment)
	ps, _ := objs["Secret/stockgate"].(*corev1.Secret)
	if j == nil || d == nil {
		t.Fatalf("no Job or Deployment in %v", keys(objs))
	}
	return j, js, d, ps
}

func secretRefs(c corev1.Container) []string {
	var refs []string
	for _, e := range c.EnvFrom {
		if e.SecretRef != nil {
			refs = append(refs, e.SecretRef.Name)
		}
	}
	return refs
}

func envNames(c corev1.Container) []string {
	var names []string
	for _, e := range c.Env {
		names = append(names, e.Name)
	}
	return names
}

// The migration Job can log in as a role of its own (the serving role then
// needs no DDL rights): migration.secretEnv or migration.existingSecret
// replace the pods' secrets for the Job alone, migration.extraEnv and
// migration.resources their extraEnv and resources; unset, the Job has
// the pods'. It has a deadline and a retry count of its own.
func TestMigrationOwnLogin(t *testing.T) {
	const servingDSN = "postgres://stockgate:secret@pgbouncer.db:6432/stockgate" // minimal-values.yaml
	// Unset: the pods' login, extraEnv and resources; no deadline.
	j, js, d, _ := jobAndPods(t, map[string]any{"extraEnv": []any{map[string]any{"name": "OTEL_SERVICE_NAME", "value": "pods"}}})
	jc, dc := j.Spec.Template.Spec.Containers[0], d.Spec.Template.Spec.Containers[0]
	if js == nil || js.StringData["STOCKGATE_LEDGER_DSN"] != servingDSN || !slices.Equal(secretRefs(jc), []string{"stockgate-migrate"}) {
		t.Errorf("by default the Job's login: hook Secret %v, envFrom %v; want the pods' secretEnv", js, secretRefs(jc))
	}
	if !cmp.Equal(jc.Resources, dc.Resources) || !slices.Contains(envNames(jc), "OTEL_SERVICE_NAME") {
		t.Errorf("by default the Job's resources %v and env %v, want the pods' %v", jc.Resources, envNames(jc), dc.Resources)
	}
	if j.Spec.ActiveDeadlineSeconds != nil || j.Spec.BackoffLimit == nil || *j.Spec.BackoffLimit != 3 {
		t.Errorf("by default deadline %v backoffLimit %v, want none and 3", j.Spec.ActiveDeadlineSeconds, j.Spec.BackoffLimit)
	}

	// A login of its own, inline.
	const ddlDSN = "postgres://stockgate_migrate:other@db:5432/stockgate"
	j, js, d, ps := jobAndPods(t, map[string]any{"migration": map[string]any{
		"secretEnv":             map[string]any{"STOCKGATE_LEDGER_DSN": ddlDSN},
		"extraEnv":              []any{map[string]any{"name": "OTEL_SERVICE_NAME", "value": "migrate"}},
		"resources":             map[string]any{"requests": map[string]any{"cpu": "100m"}},
		"activeDeadlineSeconds": 600, "backoffLimit": 0,
	}, "extraEnv": []any{map[string]any{"name": "PODS_ONLY", "value": "x"}}})
	jc, dc = j.Spec.Template.Spec.Containers[0], d.Spec.Template.Spec.Containers[0]
	if js == nil || !cmp.Equal(js.StringData, map[string]string{"STOCKGATE_LEDGER_DSN": ddlDSN}) || !slices.Equal(secretRefs(jc), []string{"stockgate-migrate"}) {
		t.Errorf("migration.secretEnv: the Job's Secret %v, envFrom %v; want migration.secretEnv alone", js, secretRefs(jc))
	}
	if ps == nil || ps.StringData["STOCKGATE_LEDGER_DSN"] != servingDSN || !slices.Equal(secretRefs(dc), []string{"stockgate"}) {
		t.Errorf("migration.secretEnv changed the pods' login: %v %v", ps, secretRefs(dc))
	}
	if got := envNames(jc); slices.Contains(got, "PODS_ONLY") || !slices.Contains(got, "OTEL_SERVICE_NAME") {
		t.Errorf("migration.extraEnv: the Job's env %v, want it instead of the pods'", got)
	}
	if !jc.Resources.Requests.Cpu().Equal(resource.MustParse("100m")) || dc.Resources.Requests.Cpu().Equal(resource.MustParse("100m")) {
		t.Errorf("migration.resources: Job %v, pods %v", jc.Resources, dc.Resources)
	}
	if j.Spec.ActiveDeadlineSeconds == nil || *j.Spec.ActiveDeadlineSeconds != 600 || *j.Spec.BackoffLimit != 0 {
		t.Errorf("deadline %v backoffLimit %v, want 600 and 0", j.Spec.ActiveDeadlineSeconds, *j.Spec.BackoffLimit)
	}

	// A login of its own in a Secret made beforehand.
	j, js, _, _ = jobAndPods(t, map[string]any{"migration": map[string]any{"existingSecret": "stockgate-migrate-login"}})
	if js != nil || !slices.Equal(secretRefs(j.Spec.Template.Spec.Containers[0]), []string{"stockgate-migrate-login"}) {
		t.Errorf("migration.existingSecret: hook Secret %v, envFrom %v; want that Secret alone", js, secretRefs(j.Spec.Template.Spec.Containers[0]))
	}

	// Production values: a deadline and resources of the Job's own.
	objs := render(t, "helm/values-production.yaml")
	pj := objs["Job/stockgate-migrate"].(*batchv1.Job)
	if pj.Spec.ActiveDeadlineSeconds == nil || pj.Spec.Template.Spec.Containers[0].Resources.Limits.Memory().IsZero() {
		t.Errorf("production values: the Job's deadline %v, resources %v", pj.Spec.ActiveDeadlineSeconds, pj.Spec.Template.Spec.Containers[0].Resources)
	}

	// A login of its own without a DSN cannot migrate: refused, named.
	_, err := renderOn(t, "stockgate", "stockgate", installable(t, map[string]any{"migration": map[string]any{
		"secretEnv": map[string]any{"STOCKGATE_LEDGER_PRIMARIES": "p1=postgres://x"}}}), capabilities())
	if err == nil || !strings.Contains(err.Error(), "migration.secretEnv.STOCKGATE_LEDGER_DSN") {
		t.Errorf("migration.secretEnv without a DSN: %v, want a refusal naming it", err)
	}
}

// A rollout of many pods is not serial (maxSurge was fixed at 1); the
// pods roll when their Secret or ConfigMap changes (they read both only at
// start); Kubernetes' service-link variables (STOCKGATE_SERVICE_HOST of a
// Service named stockgate) stay out of the pods; production values spread
// over zones and name a PriorityClass.
func TestRolloutAndPlacement(t *testing.T) {
	_, _, d, _ := jobAndPods(t, nil)
	ru := d.Spec.Strategy.RollingUpdate
	if ru == nil || *ru.MaxSurge != intstr.FromString("25%") || *ru.MaxUnavailable != intstr.FromInt32(0) {
		t.Errorf("default rollout %+v, want maxSurge 25%%, maxUnavailable 0", ru)
	}
	_, _, d, _ = jobAndPods(t, map[string]any{"rollout": map[string]any{"maxSurge": 10, "maxUnavailable": "10%"}})
	if ru := d.Spec.Strategy.RollingUpdate; *ru.MaxSurge != intstr.FromInt32(10) || *ru.MaxUnavailable != intstr.FromString("10%") {
		t.Errorf("rollout values not applied: %+v", ru)
	}
	if _, err := renderOn(t, "stockgate", "stockgate", installable(t, map[string]any{"rollout": map[string]any{"maxSurge": 0}}),
		capabilities()); err == nil {
		t.Error("maxSurge 0 with maxUnavailable 0 (a rollout that cannot move) rendered")
	}
	if d.Spec.Template.Spec.EnableServiceLinks == nil || *d.Spec.Template.Spec.EnableServiceLinks {
		t.Error("the pods get Kubernetes' service-link variables (STOCKGATE_SERVICE_HOST, ...)")
	}

	annotations := func(vals map[string]any) map[string]string {
		_, _, d, _ := jobAndPods(t, vals)
		return d.Spec.Template.Annotations
	}
	base := annotations(nil)
	for _, change := range []map[string]any{
		{"secretEnv": map[string]any{"STOCKGATE_ADMIN_TOKEN": strings.Repeat("r", 32)}}, // a rotated token
		{"env": map[string]any{"STOCKGATE_LOG_LEVEL": "debug"}},
		{"existingSecret": "stockgate-secrets-v2"},
	} {
		if got := annotations(change); cmp.Equal(got, base) {
			t.Errorf("with %v the pod template is unchanged: the pods would not roll", change)
		}
	}
	if !cmp.Equal(annotations(map[string]any{"replicas": 7}), base) {
		t.Error("a change that is no setting changed the pod template")
	}

	prod := render(t, "helm/values-production.yaml")["Deployment/stockgate"].(*appsv1.Deployment).Spec.Template.Spec
	zones := slices.ContainsFunc(prod.TopologySpreadConstraints, func(c corev1.TopologySpreadConstraint) bool {
		return c.TopologyKey == "topology.kubernetes.io/zone" && c.WhenUnsatisfiable == corev1.DoNotSchedule
	})
	if !zones || prod.PriorityClassName == "" {
		t.Errorf("production values: zone spread %v, priorityClassName %q", zones, prod.PriorityClassName)
	}
}

// helm 3.19, which make deps-helm installs, assumes Kubernetes 1.20 when
// helm template or helm lint is not told, and the chart needs 1.30: the
// documented `helm template --api-versions ...` failed unless one added
// --kube-version. Every helm template and helm lint command in
// docs/OPERATIONS.md's shell blocks names the Kubernetes version, and
// runs, as written, from the repository's root, exiting 0.
func TestDocumentedHelmCommands(t *testing.T) {
	doc, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	helm := tool(t, "helm", "make deps-helm")
	n := 0
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllSubmatch(doc, -1) {
		for _, line := range strings.Split(strings.ReplaceAll(string(block[1]), "\\\n", " "), "\n") {
			words := shellWords(strings.TrimSpace(line))
			if len(words) < 2 || words[0] != "helm" || (words[1] != "template" && words[1] != "lint") {
				continue
			}
			n++
			if !slices.Contains(words, "--kube-version") {
				t.Errorf("documented %q names no --kube-version: helm assumes Kubernetes 1.20, which the chart refuses", line)
			}
			cmd := exec.Command(helm, words[1:]...)
			cmd.Dir = ".."
			home := t.TempDir()
			cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("documented %q: %v\n%s", line, err, out)
			}
		}
	}
	if n < 2 {
		t.Errorf("docs/OPERATIONS.md shows %d helm template or lint commands, want the render and the lint of \"Rendering without a cluster\"", n)
	}
}

// The production NetworkPolicy lets a back office's namespace reach the
// admin port (only monitoring could), and no other namespace; it limits
// egress to DNS and the rules given. KEDA's ScaledObject makes its HPA
// with the chart's HPA's scale behaviour (it had Kubernetes' default).
func TestAdminReachAndScaleBehaviour(t *testing.T) {
	objs := render(t, "helm/values-production.yaml")
	const adminPort = 9090
	for ns, want := range map[string]bool{"backoffice": true, "monitoring": true, "ingress-nginx": false, "default": false} {
		if got := admits(objs, nsPeer(ns), adminPort); got != want {
			t.Errorf("namespace %s reaches the admin port: %v, want %v", ns, got, want)
		}
	}
	np := objs["NetworkPolicy/stockgate"].(*networkingv1.NetworkPolicy)
	dns := false
	for _, r := range np.Spec.Egress {
		for _, p := range r.Ports {
			dns = dns || (p.Port.IntVal == 53 && len(r.To) == 0)
		}
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || !dns || len(np.Spec.Egress) < 2 {
		t.Errorf("production egress: policy types %v, DNS %v, %d rules", np.Spec.PolicyTypes, dns, len(np.Spec.Egress))
	}
	// Without egress rules, egress is left alone (no Egress policy type,
	// which with no rules would cut the pods off).
	if np := render(t, minimalValues, "helm/ci/extras-values.yaml"); np["NetworkPolicy/stockgate"] != nil {
		t.Error("a NetworkPolicy without networkPolicy.enabled")
	}
	np = decodeAll(t, renderFiles(t, "stockgate", installable(t, map[string]any{"networkPolicy": map[string]any{"enabled": true}})))["NetworkPolicy/stockgate"].(*networkingv1.NetworkPolicy)
	if slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
		t.Errorf("no egress rules given, yet egress is restricted: %v", np.Spec.PolicyTypes)
	}

	so := objs["ScaledObject/stockgate"].(*scaledObject)
	hpa := render(t, "helm/ci/autoscaling-values.yaml")["HorizontalPodAutoscaler/stockgate"].(*autoscalingv2.HorizontalPodAutoscaler)
	if got := so.Spec.Advanced.HorizontalPodAutoscalerConfig.Behavior; got == nil || !cmp.Equal(got, hpa.Spec.Behavior) {
		t.Errorf("KEDA's HPA behaviour %+v, want the chart HPA's %+v", got, hpa.Spec.Behavior)
	}
}

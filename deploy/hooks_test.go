package deploy

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// namespace is what a Kubernetes namespace holds while Helm works on it:
// Kind/name → the object (decoded strictly).
type namespace map[string]any

// helmRun plays `helm install` (upgrade false) or `helm upgrade` of the
// rendered files on ns the way Helm 3 does it (helm.sh/helm/v3
// pkg/action/hooks.go and install.go): the event's pre hooks sorted by
// weight, then name (releaseutil has sorted them by kind first), each
// created in turn and waited for (a Job until it completes); then the
// hooks with hook-succeeded deleted, last first; then the release's
// objects; then the post hooks. A pod that names a ConfigMap, Secret or
// ServiceAccount that is not there when its owner is created never starts
// (CreateContainerConfigError): a hook Job's pod so blocks the install.
// It returns the steps it took, or the first pod that would wait.
func helmRun(t *testing.T, ns namespace, files map[string]string, upgrade bool) ([]string, error) {
	t.Helper()
	// Helm takes NOTES.txt out before it sorts (pkg/action renderResources).
	files = maps.Clone(files)
	maps.DeleteFunc(files, func(name, _ string) bool { return strings.HasSuffix(name, "NOTES.txt") })
	hooks, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		t.Fatalf("helm's sorter: %v", err)
	}
	pre, post := release.HookPreInstall, release.HookPostInstall
	if upgrade {
		pre, post = release.HookPreUpgrade, release.HookPostUpgrade
	}
	var steps []string
	runHooks := func(event release.HookEvent) error {
		var run []*release.Hook
		for _, h := range hooks {
			if slices.Contains(h.Events, event) {
				run = append(run, h)
			}
		}
		slices.SortStableFunc(run, func(a, b *release.Hook) int {
			return cmp.Or(cmp.Compare(a.Weight, b.Weight), cmp.Compare(a.Name, b.Name))
		})
		for _, h := range run {
			policies := h.DeletePolicies
			if len(policies) == 0 {
				policies = []release.HookDeletePolicy{release.HookBeforeHookCreation}
			}
			key := h.Kind + "/" + h.Name
			if slices.Contains(policies, release.HookBeforeHookCreation) {
				delete(ns, key)
			}
			kind, obj := decodeStrict(t, []byte(h.Manifest))
			if err := ns.startable(kind, obj); err != nil {
				return fmt.Errorf("%s hook %s: %w", event, key, err)
			}
			ns[key] = obj
			steps = append(steps, fmt.Sprintf("%s hook %s (weight %d)", event, key, h.Weight))
		}
		for i := len(run) - 1; i >= 0; i-- {
			if slices.Contains(run[i].DeletePolicies, release.HookSucceeded) {
				delete(ns, run[i].Kind+"/"+run[i].Name)
				steps = append(steps, fmt.Sprintf("%s hook %s/%s deleted", event, run[i].Kind, run[i].Name))
			}
		}
		return nil
	}
	if err := runHooks(pre); err != nil {
		return steps, err
	}
	var created []string
	for _, m := range manifests {
		if strings.TrimSpace(stripComments(m.Content)) == "" {
			continue
		}
		kind, obj := decodeStrict(t, []byte(m.Content))
		key := kind + "/" + nameOf(obj)
		ns[key] = obj
		created = append(created, key)
	}
	steps = append(steps, "release objects "+strings.Join(created, ", "))
	// Created together: a Deployment's pods may name any of them.
	for _, key := range created {
		if err := ns.startable(strings.SplitN(key, "/", 2)[0], ns[key]); err != nil {
			return steps, fmt.Errorf("%s: %w", key, err)
		}
	}
	return steps, runHooks(post)
}

// podSpec is the pod template of a workload, or nil.
func podSpec(obj any) *corev1.PodSpec {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		return &o.Spec.Template.Spec
	case *batchv1.Job:
		return &o.Spec.Template.Spec
	}
	return nil
}

// startable reports the first object a workload's pods need that ns lacks.
func (ns namespace) startable(kind string, obj any) error {
	spec := podSpec(obj)
	if spec == nil {
		return nil
	}
	need := func(kind, name string, optional *bool) error {
		if optional != nil && *optional {
			return nil
		}
		if ns[kind+"/"+name] == nil {
			return fmt.Errorf("its pods need %s/%s, which is not in the namespace yet (have %v)", kind, name, ns.keys())
		}
		return nil
	}
	var errs []error
	if spec.ServiceAccountName != "" && spec.ServiceAccountName != "default" {
		errs = append(errs, need("ServiceAccount", spec.ServiceAccountName, nil))
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		for _, e := range c.EnvFrom {
			if e.ConfigMapRef != nil {
				errs = append(errs, need("ConfigMap", e.ConfigMapRef.Name, e.ConfigMapRef.Optional))
			}
			if e.SecretRef != nil {
				errs = append(errs, need("Secret", e.SecretRef.Name, e.SecretRef.Optional))
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
				errs = append(errs, need("ConfigMap", e.ValueFrom.ConfigMapKeyRef.Name, e.ValueFrom.ConfigMapKeyRef.Optional))
			}
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				errs = append(errs, need("Secret", e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Optional))
			}
		}
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil {
			errs = append(errs, need("ConfigMap", v.ConfigMap.Name, v.ConfigMap.Optional))
		}
		if v.Secret != nil {
			errs = append(errs, need("Secret", v.Secret.SecretName, v.Secret.Optional))
		}
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (ns namespace) keys() []string {
	var out []string
	for k := range ns {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// env is what a workload's first container sees in its environment, from
// its env, ConfigMaps and Secrets in ns (Secrets' stringData as the API
// server stores it, in data).
func (ns namespace) env(t *testing.T, obj any) map[string]string {
	t.Helper()
	c := podSpec(obj).Containers[0]
	out := map[string]string{}
	for _, e := range c.EnvFrom {
		switch {
		case e.ConfigMapRef != nil:
			if cm, ok := ns["ConfigMap/"+e.ConfigMapRef.Name].(*corev1.ConfigMap); ok {
				for k, v := range cm.Data {
					out[k] = v
				}
			}
		case e.SecretRef != nil:
			if s, ok := ns["Secret/"+e.SecretRef.Name].(*corev1.Secret); ok {
				for k, v := range s.StringData {
					out[k] = v
				}
				for k, v := range s.Data {
					out[k] = string(v)
				}
			}
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			out[e.Name] = e.Value
		}
	}
	return out
}

// secret is a Secret made before the install (`kubectl create secret
// generic name --from-literal=...`).
func secret(name string, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{Data: map[string][]byte{}}
	s.Name = name
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

// imageCommand is the final stage's ENTRYPOINT and CMD of the Dockerfile
// (exec form).
func imageCommand(t *testing.T) (entrypoint, command []string) {
	t.Helper()
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages := regexp.MustCompile(`(?m)^FROM `).Split(string(b), -1)
	for _, line := range strings.Split(stages[len(stages)-1], "\n") {
		word, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
		var into *[]string
		switch word {
		case "ENTRYPOINT":
			into = &entrypoint
		case "CMD":
			into = &command
		default:
			continue
		}
		if err := json.Unmarshal([]byte(rest), into); err != nil {
			t.Fatalf("Dockerfile %s %s: not the exec form: %v", word, rest, err)
		}
	}
	return entrypoint, command
}

// argv is what a container runs, as Kubernetes combines its command and
// args with the image's ENTRYPOINT and CMD: command replaces the
// entrypoint (and drops CMD), args replace CMD.
func argv(t *testing.T, c corev1.Container) []string {
	t.Helper()
	entrypoint, cmd := imageCommand(t)
	return argvOn(entrypoint, cmd, c)
}

// argvOn is what c runs on an image with that ENTRYPOINT and CMD.
func argvOn(entrypoint, cmd []string, c corev1.Container) []string {
	if len(c.Command) > 0 {
		entrypoint, cmd = c.Command, nil
	}
	if len(c.Args) > 0 {
		cmd = c.Args
	}
	return append(slices.Clone(entrypoint), cmd...)
}

// The pods run what they are for: the Deployment `/stockgate serve`, the
// migration Job `/stockgate migrate` (the image's ENTRYPOINT once said
// serve too, so the Job ran `stockgate serve migrate`: it served for ever,
// or failed on a fresh ledger, and never migrated).
func TestPodCommands(t *testing.T) {
	for _, files := range [][]string{{minimalValues}, {"helm/values-production.yaml"}, {"helm/ci/extras-values.yaml"}} {
		objs := render(t, files...)
		d := objs["Deployment/stockgate"].(*appsv1.Deployment)
		if got := argv(t, d.Spec.Template.Spec.Containers[0]); !slices.Equal(got, []string{"/stockgate", "serve"}) {
			t.Errorf("values %v: the Deployment runs %q, want /stockgate serve", files, got)
		}
		j := objs["Job/stockgate-migrate"].(*batchv1.Job)
		if got := argv(t, j.Spec.Template.Spec.Containers[0]); !slices.Equal(got, []string{"/stockgate", "migrate"}) {
			t.Errorf("values %v: the migration Job runs %q, want /stockgate migrate", files, got)
		}
		// The same on an image of before, whose ENTRYPOINT said serve.
		old := []string{"/stockgate", "serve"}
		if got := argvOn(old, nil, j.Spec.Template.Spec.Containers[0]); !slices.Equal(got, []string{"/stockgate", "migrate"}) {
			t.Errorf("values %v: on the former image the migration Job runs %q", files, got)
		}
		if got := argvOn(old, nil, d.Spec.Template.Spec.Containers[0]); !slices.Equal(got, []string{"/stockgate", "serve"}) {
			t.Errorf("values %v: on the former image the Deployment runs %q", files, got)
		}
		// A running migration is not an endpoint of the Service, nor
		// counted by the PDB.
		svc := objs["Service/stockgate"].(*corev1.Service)
		if selects(svc.Spec.Selector, j.Spec.Template.Labels) {
			t.Errorf("values %v: the Service selects the migration Job's pods (%v)", files, j.Spec.Template.Labels)
		}
	}
	// With no arguments the image serves (docker run).
	if entry, cmd := imageCommand(t); !slices.Equal(append(entry, cmd...), []string{"/stockgate", "serve"}) {
		t.Errorf("the image runs %q by default, want /stockgate serve", append(entry, cmd...))
	}
}

func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// helm install on an empty namespace (but for the Secret the operator made
// first, when the values name one), then helm upgrade, in Helm's order:
// the migration Job, a pre-install hook, runs before Helm creates the
// release's ConfigMap and Secret, so it may read neither; it sees the
// settings the serving pods see.
func TestHookOrder(t *testing.T) {
	made := secret("stockgate-secrets", map[string]string{"STOCKGATE_ADMIN_TOKEN": strings.Repeat("t", 32),
		"STOCKGATE_LEDGER_DSN": "postgres://u:p@pgbouncer:6432/stockgate", "STOCKGATE_REDIS_PASSWORD": "r"})
	inline := map[string]any{"secretEnv": map[string]any{"STOCKGATE_ADMIN_TOKEN": strings.Repeat("a", 32),
		"STOCKGATE_LEDGER_DSN": "postgres://u:p@db:5432/stockgate"}}
	var extra []any
	for _, k := range []string{"STOCKGATE_ADMIN_TOKEN", "STOCKGATE_LEDGER_DSN"} {
		extra = append(extra, map[string]any{"name": k, "valueFrom": map[string]any{
			"secretKeyRef": map[string]any{"name": "stockgate-secrets", "key": k}}})
	}
	fromSecret := map[string]any{"extraEnv": extra}
	for _, tc := range []struct {
		name    string
		vals    map[string]any
		upgrade map[string]any // the values of a later helm upgrade
	}{
		{"secretEnv", inline, chartutil.CoalesceTables(map[string]any{"env": map[string]any{"STOCKGATE_LOG_LEVEL": "debug"}}, inline)},
		{"existingSecret", map[string]any{"existingSecret": "stockgate-secrets"}, map[string]any{"secretEnv": map[string]any{
			"STOCKGATE_LEDGER_DSN": "postgres://u:p@other:5432/stockgate", "STOCKGATE_ADMIN_TOKEN": strings.Repeat("b", 32)}}},
		{"production", readValues(t, "helm/values-production.yaml"), readValues(t, "helm/values-production.yaml")},
		// No Secret of the chart's: each secret from the operator's, by
		// extraEnv.
		{"extraEnv", fromSecret, chartutil.CoalesceTables(map[string]any{"migration": map[string]any{"enabled": false}}, fromSecret)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace{"Secret/stockgate-secrets": made}
			for i, vals := range []map[string]any{tc.vals, tc.upgrade} {
				files := renderFiles(t, "stockgate", vals)
				steps, err := helmRun(t, ns, files, i > 0)
				if err != nil {
					t.Fatalf("helm %s: %v\nsteps:\n%s", []string{"install", "upgrade"}[i], err, strings.Join(steps, "\n"))
				}
				// The Job ran in its hook with what was there then; the
				// Deployment sees the namespace after the install.
				objs := decodeAll(t, files)
				j, _ := objs["Job/stockgate-migrate"].(*batchv1.Job)
				if j == nil {
					continue
				}
				hookNS := namespace{"Secret/stockgate-secrets": made}
				for key, obj := range objs {
					if strings.HasSuffix(key, "-migrate") {
						hookNS[key] = obj
					}
				}
				jobEnv := hookNS.env(t, j)
				podEnv := ns.env(t, ns["Deployment/stockgate"])
				delete(podEnv, "STOCKGATE_MIGRATE")
				delete(jobEnv, "STOCKGATE_MIGRATE")
				if diff := cmpEnv(jobEnv, podEnv); diff != "" {
					t.Errorf("helm %s: the Job's settings differ from the pods': %s", []string{"install", "upgrade"}[i], diff)
				}
				if ns["Secret/stockgate-migrate"] != nil || ns["ServiceAccount/stockgate-migrate"] != nil {
					t.Error("the Job's Secret or ServiceAccount is left behind after it succeeded")
				}
			}
		})
	}
}

func cmpEnv(a, b map[string]string) string {
	var diffs []string
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			diffs = append(diffs, fmt.Sprintf("%s: Job %q, pods %q", k, v, b[k]))
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: Job unset, pods %q", k, v))
		}
	}
	slices.Sort(diffs)
	return strings.Join(diffs, "; ")
}

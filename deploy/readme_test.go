package deploy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/stockgate/stockgate/internal/testenv"
)

func TestMain(m *testing.M) {
	code := testenv.Main(m)
	removeBuilt()
	os.Exit(code)
}

// shellWords splits one shell command line (continuations joined) into
// words: quotes removed, nothing expanded.
func shellWords(line string) []string {
	var words []string
	var w strings.Builder
	in, started := rune(0), false
	for _, r := range line {
		switch {
		case in != 0 && r == in:
			in = 0
		case in != 0:
			w.WriteRune(r)
		case r == '\'' || r == '"':
			in, started = r, true
		case r == ' ' || r == '\t':
			if started {
				words = append(words, w.String())
				w.Reset()
				started = false
			}
		default:
			w.WriteRune(r)
			started = true
		}
	}
	if started {
		words = append(words, w.String())
	}
	return words
}

// installSection is docs/OPERATIONS.md's "Installing on Kubernetes" section.
func installSection(t *testing.T) []byte {
	t.Helper()
	readme, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	section := regexp.MustCompile("(?s)\n## Installing on Kubernetes\n.*?\n## ").Find(readme)
	if section == nil {
		t.Fatal("docs/OPERATIONS.md has no section ## Installing on Kubernetes")
	}
	return section
}

// readmeInstall is docs/OPERATIONS.md's "Installing on Kubernetes" walk: its
// commands, continuations joined, comments dropped.
func readmeInstall(t *testing.T) [][]string {
	t.Helper()
	section := regexp.MustCompile("(?s)```sh\n(.*?)```").FindSubmatch(installSection(t))
	if section == nil {
		t.Fatal("docs/OPERATIONS.md has no ```sh block under ## Installing on Kubernetes")
	}
	var cmds [][]string
	for _, line := range strings.Split(strings.ReplaceAll(string(section[1]), "\\\n", " "), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			cmds = append(cmds, shellWords(line))
		}
	}
	return cmds
}

// The install of docs/OPERATIONS.md, walked from an empty namespace: its commands
// parsed as written; the Secret it makes; its `helm install` rendered by
// helm itself (as `helm template` with the same arguments) and validated
// by kubeconform; Helm's install order played on the namespace (the
// migration hook finds all it needs); the Job's and the Deployment's
// commands as the image runs them; then both run for real, built from
// this tree, with their rendered settings and the Secret's: the Job
// against PostgreSQL through PgBouncer (the documented DSN is a PgBouncer),
// twice (install, then upgrade), each exiting 0; then serve, which with
// the chart's STOCKGATE_MIGRATE=false starts only on a migrated ledger,
// becomes ready and drains on SIGTERM.
func TestReadmeInstall(t *testing.T) {
	var nsName, release string
	var made *corev1.Secret
	var helmArgs []string
	for _, c := range readmeInstall(t) {
		switch {
		case len(c) == 4 && slices.Equal(c[:3], []string{"kubectl", "create", "namespace"}):
			nsName = c[3]
		case len(c) > 5 && c[0] == "kubectl" && slices.Equal(c[3:6], []string{"create", "secret", "generic"}):
			if c[1] != "-n" || c[2] != nsName {
				t.Fatalf("the Secret is made in %v, not in the namespace %q", c[1:3], nsName)
			}
			data := map[string]string{}
			for _, arg := range c[7:] {
				kv, ok := strings.CutPrefix(arg, "--from-literal=")
				k, v, _ := strings.Cut(kv, "=")
				if !ok {
					t.Fatalf("secret argument %q", arg)
				}
				data[k] = v
			}
			made = secret(c[6], data)
		case len(c) > 3 && c[0] == "helm" && c[1] == "install":
			release = c[2]
			// helm install asks the cluster what helm template is told:
			// Kubernetes 1.34, serving the Prometheus Operator's API (the
			// install section names it) and KEDA's.
			helmArgs = append(append([]string{"template"}, c[2:]...), clusterArgs...)
		}
	}
	if nsName == "" || made == nil || release == "" {
		t.Fatalf("the documented install: namespace %q, secret %v, release %q", nsName, made != nil, release)
	}
	if !slices.Contains(helmArgs, "-n") && !slices.Contains(helmArgs, "--namespace") {
		t.Errorf("the documented helm install names no namespace: %v", helmArgs)
	}
	// helm as the user runs it, from the repository's root.
	cmd := exec.Command(tool(t, "helm", "make deps-helm"), helmArgs...)
	cmd.Dir = ".."
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	rendered, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %v: %v", helmArgs, err)
	}
	manifests := filepath.Join(t.TempDir(), "install.yaml")
	if err := os.WriteFile(manifests, rendered, 0o644); err != nil {
		t.Fatal(err)
	}
	status, out := kubeconform(t, kubeSchemas(t), manifests)
	for _, r := range status["install.yaml"] {
		if !strings.Contains(r, " statusValid") {
			t.Errorf("kubeconform: %s", r)
		}
	}
	if len(status["install.yaml"]) < 9 {
		t.Errorf("kubeconform saw %d objects:\n%s", len(status["install.yaml"]), out)
	}

	// A custom resource needs its operator's CRDs in the cluster: the
	// install section names each group it renders.
	section := string(installSection(t))
	for _, obj := range strings.Split(string(rendered), "\n---") {
		m := regexp.MustCompile(`(?m)^apiVersion: ([^/\s]+)/`).FindStringSubmatch(obj)
		if m != nil && strings.Contains(m[1], ".") && !strings.HasSuffix(m[1], ".k8s.io") && !strings.Contains(section, "`"+m[1]+"`") {
			t.Errorf("the install renders a %s resource but docs/OPERATIONS.md does not name its CRDs as a prerequisite", m[1])
		}
	}

	// Helm's order on the namespace that holds only the Secret.
	files := map[string]string{}
	for _, doc := range regexp.MustCompile(`(?m)^---\n# Source: `).Split("\n"+string(rendered), -1)[1:] {
		path, body, _ := strings.Cut(doc, "\n")
		files[path] += "\n---\n" + body
	}
	ns := namespace{"Secret/" + made.Name: made}
	steps, err := helmRun(t, ns, files, false)
	if err != nil {
		t.Fatalf("helm install: %v\nsteps:\n%s", err, strings.Join(steps, "\n"))
	}
	t.Logf("helm install:\n%s", strings.Join(steps, "\n"))
	objs := decodeAll(t, files)
	job, _ := objs["Job/"+release+"-migrate"].(*batchv1.Job)
	dep, _ := objs["Deployment/"+release].(*appsv1.Deployment)
	if job == nil || dep == nil {
		t.Fatalf("no Job %s-migrate or Deployment %s in %v", release, release, ns.keys())
	}
	jobArgv, depArgv := argv(t, job.Spec.Template.Spec.Containers[0]), argv(t, dep.Spec.Template.Spec.Containers[0])
	if !slices.Equal(jobArgv, []string{"/stockgate", "migrate"}) || !slices.Equal(depArgv, []string{"/stockgate", "serve"}) {
		t.Fatalf("the Job runs %q and the pods %q, want /stockgate migrate and /stockgate serve", jobArgv, depArgv)
	}
	hookNS := namespace{"Secret/" + made.Name: made}
	jobEnv, podEnv := hookNS.env(t, job), ns.env(t, dep)

	// Now for real: this tree's binary, real servers in place of the
	// documented placeholders (the DSN, the Redis address, the admin token
	// its shell would have made, the listen address of a pod).
	bin := gatewayBinary(t)
	dsn, _ := testenv.PgBouncerURL(t, testenv.PgBouncerOptions{})
	token := make([]byte, 24)
	rand.Read(token)
	redisAddrs := strings.Join(testenv.SharedCluster(t).Addrs(), ",")
	for _, env := range []map[string]string{jobEnv, podEnv} {
		for k, placeholder := range map[string]string{"STOCKGATE_LEDGER_DSN": "…@pgbouncer", "STOCKGATE_ADMIN_TOKEN": "$(openssl rand",
			"STOCKGATE_REDIS_ADDRS": "redis.example:"} {
			if !strings.Contains(env[k], placeholder) {
				t.Fatalf("%s = %q: not the documented placeholder %q", k, env[k], placeholder)
			}
		}
		env["STOCKGATE_LEDGER_DSN"], env["STOCKGATE_ADMIN_TOKEN"] = dsn, hex.EncodeToString(token)
		env["STOCKGATE_REDIS_ADDRS"], env["STOCKGATE_REDIS_PASSWORD"] = redisAddrs, ""
	}
	process := func(ctx context.Context, argv []string, env map[string]string) *exec.Cmd {
		c := exec.CommandContext(ctx, bin, argv[1:]...)
		c.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
		for k, v := range env {
			c.Env = append(c.Env, k+"="+v)
		}
		return c
	}
	for _, event := range []string{"install", "upgrade"} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		out, err := process(ctx, jobArgv, jobEnv).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("the migration Job (helm %s) exited %v:\n%s", event, err, out)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	if podEnv["STOCKGATE_MIGRATE"] != "false" {
		t.Errorf("the pods migrate (STOCKGATE_MIGRATE %q): the Job's run proves nothing", podEnv["STOCKGATE_MIGRATE"])
	}
	podEnv["STOCKGATE_ADDR"] = addr
	srv := process(t.Context(), depArgv, podEnv)
	var logs strings.Builder
	srv.Stdout, srv.Stderr = &logs, &logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() { srv.Process.Kill() }) // if it is still running
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("serve exited before it was ready: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve not ready within 30s:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	srv.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("serve exited %v on SIGTERM:\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("serve still running 30s after SIGTERM")
	}
}

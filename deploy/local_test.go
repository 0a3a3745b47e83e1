package deploy

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// make run's local cluster starts again after a stop, any number of times,
// even over files a previous cluster left (a replica writes the RDB of its
// first sync to disk; a node that loads it claims the old slots and the new
// cluster cannot be created).
func TestLocalClusterRestarts(t *testing.T) {
	base := freePorts(t, 6)
	runDir := t.TempDir()
	dir := filepath.Join(runDir, "redis")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(cmd string) (string, error) {
		c := exec.Command("bash", "local/cluster.sh", cmd)
		c.Env = append(os.Environ(), "RUN_DIR="+runDir, fmt.Sprintf("REDIS_PORT_BASE=%d", base))
		out, err := c.CombinedOutput()
		return string(out), err
	}
	script := func(cmd string) string {
		out, err := run(cmd)
		if err != nil {
			t.Fatalf("cluster.sh %s: %v\n%s", cmd, err, out)
		}
		return out
	}
	t.Cleanup(func() { _, _ = run("stop") }) // stops only the pids the script wrote
	cli := func(port int, args ...string) string {
		out, _ := exec.Command("redis-cli", append([]string{"-p", fmt.Sprint(port)}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out))
	}
	// Two minutes: a failover is the node timeout (5 s), a vote of the
	// masters and, when two replicas' elections collide, another try
	// twice the node timeout later; with both cores busy (make test, 3
	// packages at a time) one run saw no replica take over within 60 s.
	// What the nodes logged and thought is printed when it fails.
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for !ok() {
			if time.Now().After(deadline) {
				for p := base; p < base+6; p++ {
					log, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%d.log", p)))
					lines := strings.Split(strings.TrimSpace(string(log)), "\n")
					t.Logf(":%d role %q\n%s\nlog tail:\n%s", p, cli(p, "role"), cli(p, "cluster", "nodes"),
						strings.Join(lines[max(len(lines)-15, 0):], "\n"))
				}
				t.Fatalf("%s: not within 2m", what)
			}
			time.Sleep(100 * time.Millisecond) // poll interval
		}
	}
	// A failover between runs: kill a master (by the pid the script wrote),
	// let its replica take over, then `start` again brings the node back
	// into the same cluster as a replica; `make stop && make run` after
	// that is a fresh cluster again.
	if out := script("start"); !strings.Contains(out, "redis cluster ready") {
		t.Fatalf("start said %q", out)
	}
	victim := 0
	for p := base; p < base+6; p++ {
		if strings.HasPrefix(cli(p, "role"), "master") {
			victim = p
			break
		}
	}
	pid, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%d.pid", victim)))
	if err != nil || victim == 0 {
		t.Fatalf("no master to kill (%d): %v", victim, err)
	}
	if out, err := exec.Command("kill", "-9", strings.TrimSpace(string(pid))).CombinedOutput(); err != nil {
		t.Fatalf("kill master %d: %v %s", victim, err, out)
	}
	other := base
	if other == victim {
		other++
	}
	waitFor("a replica takes over the killed master's slots", func() bool {
		masters := 0
		for p := base; p < base+6; p++ {
			if p != victim && strings.HasPrefix(cli(p, "role"), "master") {
				masters++
			}
		}
		return masters == 3 && strings.Contains(cli(other, "cluster", "info"), "cluster_state:ok")
	})
	if out := script("start"); !strings.Contains(out, "redis cluster ready") {
		t.Fatalf("start after a failover said %q", out)
	}
	waitFor("the returned node follows the new master", func() bool { return strings.HasPrefix(cli(victim, "role"), "slave") })
	script("stop")
	waitFree(t, base, 6)
	for round := range 3 {
		// What an earlier cluster may leave: RDB files (garbage here, so a
		// node that loads one fails to start).
		for _, name := range []string{"dump.rdb", fmt.Sprintf("dump-%d.rdb", base), fmt.Sprintf("dump-%d.rdb", base+3)} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte("not an rdb"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if out := script("start"); !strings.Contains(out, "redis cluster ready") {
			t.Fatalf("round %d: start said %q", round, out)
		}
		script("stop")
		waitFree(t, base, 6)
	}
}

// freePorts finds n consecutive free loopback ports.
func freePorts(t *testing.T, n int) int {
	for start := 21000; start < 40000; start += 97 {
		if portsFree(start, n) {
			return start
		}
	}
	t.Fatal("no free port range")
	return 0
}

func portsFree(base, n int) bool {
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return false
		}
		l.Close()
		// The cluster bus port (p+10000) must be free too.
		b, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+10000))
		if err != nil {
			return false
		}
		b.Close()
	}
	return true
}

// waitFree waits until the stopped nodes have let go of their ports.
func waitFree(t *testing.T, base, n int) {
	deadline := time.Now().Add(30 * time.Second)
	for !portsFree(base, n) {
		if time.Now().After(deadline) {
			t.Fatalf("ports %d.. still taken 30s after stop", base)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/internal/wait"
)

func TestMain(m *testing.M) {
	if os.Getenv("STOCKGATE_TEST_SERVE") == "1" {
		// The server process of TestSIGTERMDrainsUnderLoad: this binary,
		// run as `stockgate serve` configured by the environment.
		os.Exit(run([]string{"serve"}, os.Stderr))
	}
	os.Exit(testenv.Main(m))
}

// TestSIGTERMDrainsUnderLoad runs stockgate as a real process under load
// and sends it SIGTERM: /readyz turns 503 at once, the clients (like a load
// balancer) stop sending when it does, every request already sent gets its
// answer, and the process exits 0 within the grace period.
func TestSIGTERMDrainsUnderLoad(t *testing.T) {
	c := testenv.SharedCluster(t)
	const grace = 10 * time.Second
	srv := startServe(t, "STOCKGATE_REDIS_ADDRS="+strings.Join(c.Addrs(), ","),
		"STOCKGATE_DRAIN_DELAY=1s", "STOCKGATE_SHUTDOWN_GRACE="+grace.String(), "STOCKGATE_LOG_LEVEL=warn",
		// A drain, not a shedding test: on a loaded machine the SQLite
		// ledger's commits outlast production's 250 ms wait budget.
		"STOCKGATE_LEDGER_WAIT_BUDGET=5s")
	cmd, exited, logs, base := srv.cmd, srv.exited, &srv.logs, srv.base
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(path string) int {
		resp, err := client.Get(base + path)
		if err != nil {
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	waitUntil(t, 20*time.Second, func() bool { return get("/readyz") == http.StatusOK })
	sku := testenv.ID(t, "p")
	req, _ := http.NewRequest(http.MethodPut, base+"/v1/admin/skus/"+sku+"/ga", strings.NewReader(`{"total":100000,"shards":4}`))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := client.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT sku: %v %v", resp, err)
	}

	var notReady atomic.Bool
	var sent, answered, failed atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for n := 0; !notReady.Load(); n++ {
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/skus/"+sku+"/ga/purchases",
					strings.NewReader(`{"buyer":"b","quantity":1}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", fmt.Sprintf("drain-%d-%d", w, n))
				sent.Add(1)
				resp, err := client.Do(req)
				if err != nil || resp.StatusCode != http.StatusCreated {
					failed.Add(1)
					t.Errorf("request in flight at shutdown: %v %v", err, resp)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answered.Add(1)
			}
		})
	}
	// Under load at the signal: answers are coming back, more in flight.
	waitUntil(t, 20*time.Second, func() bool { return answered.Load() >= 16 })
	sentAtSignal := sent.Load()
	signalled := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The "load balancer": stop sending once readiness fails.
	waitUntil(t, 5*time.Second, func() bool { return get("/readyz") == http.StatusServiceUnavailable })
	notReadyAfter := time.Since(signalled)
	notReady.Store(true)
	wg.Wait()
	select {
	case err := <-exited:
		took := time.Since(signalled)
		if err != nil {
			t.Errorf("exit: %v (%s)", err, logs.String())
		}
		if took > grace {
			t.Errorf("exited %v after SIGTERM, beyond the %v grace", took, grace)
		}
		// No admin token, on loopback: allowed, and said.
		if !strings.Contains(logs.String(), "admin routes are open") {
			t.Errorf("no warning about open admin routes in the log:\n%s", logs.String())
		}
		t.Logf("%d requests before SIGTERM, %d in all, %d answered, %d failed; /readyz 503 %v after SIGTERM; exit 0 after %v",
			sentAtSignal, sent.Load(), answered.Load(), failed.Load(), notReadyAfter.Round(time.Millisecond), took.Round(time.Millisecond))
	case <-time.After(grace + 5*time.Second):
		t.Fatalf("still running %v after SIGTERM", grace+5*time.Second)
	}
}

// served is this test binary running as `stockgate serve` (see TestMain).
type served struct {
	cmd    *exec.Cmd
	exited chan error // its exit, once
	logs   syncWriter
	base   string // http://127.0.0.1:port
}

// startServe runs `stockgate serve` as a process of its own on a free
// loopback port with a SQLite ledger of its own, configured by env over
// the test's environment; it is killed when the test ends if it is still
// running.
func startServe(t *testing.T, env ...string) *served {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s := &served{cmd: exec.Command(os.Args[0], "-test.run=^$"), exited: make(chan error, 1), base: "http://" + addr}
	s.cmd.Env = append(append(os.Environ(), "STOCKGATE_TEST_SERVE=1", "STOCKGATE_ADDR="+addr,
		"STOCKGATE_LEDGER_DSN="+filepath.Join(t.TempDir(), "ledger.db")), env...)
	s.cmd.Stderr = &s.logs
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.exited <- s.cmd.Wait() }()
	t.Cleanup(func() {
		if s.cmd.ProcessState == nil {
			s.cmd.Process.Kill()
		}
	})
	return s
}

func waitUntil(t *testing.T, within time.Duration, ok func() bool) {
	t.Helper()
	wait.For(t, within, "condition", ok)
}

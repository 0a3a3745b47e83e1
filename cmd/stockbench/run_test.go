package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/stockgate/stockgate/keys"
)

// TestMain lets a test run the command itself (exit statuses).
func TestMain(m *testing.M) {
	if os.Getenv("STOCKBENCH_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// seen is one request the recorder got.
type seen struct {
	method, path, key, buyer string
	header                   http.Header
	body                     []byte
}

// recorder answers what stockbench run asks of a gateway and remembers
// every request: the load tool's request shaping is what these tests are
// about (the gateway itself is tested against real servers elsewhere).
// Purchases and holds alternate 201 and 409.
type recorder struct {
	mu    sync.Mutex
	reqs  []seen
	n     int
	codes map[string]uint64 // what it answered the load, by status
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var body struct{ Buyer string }
	b, _ := io.ReadAll(req.Body)
	_ = json.Unmarshal(b, &body)
	r.mu.Lock()
	r.reqs = append(r.reqs, seen{req.Method, req.URL.Path, req.Header.Get("Idempotency-Key"), body.Buyer, req.Header.Clone(), b})
	r.n++
	odd := r.n%2 == 1
	code := http.StatusOK
	switch {
	case strings.HasPrefix(req.URL.Path, "/v1/admin/"):
		r.mu.Unlock()
		fmt.Fprint(w, `{"total":100,"sold":3,"held":0}`)
		return
	case req.Method == http.MethodPost && odd:
		code = http.StatusCreated
	case req.Method == http.MethodPost:
		code = http.StatusConflict
	}
	if r.codes == nil {
		r.codes = map[string]uint64{}
	}
	r.codes[fmt.Sprint(code)]++
	r.mu.Unlock()
	w.WriteHeader(code)
	switch code {
	case http.StatusCreated:
		fmt.Fprint(w, `{"hold_id":"h1","buyer":"b"}`)
	case http.StatusOK:
		fmt.Fprint(w, `{"remaining":1}`)
	}
}

func (r *recorder) answered() map[string]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.codes)
}

func (r *recorder) requests() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reqs)
}

// run runs `stockbench run` against the recorder and returns its stdout.
func run(t *testing.T, rec *recorder, args ...string) string {
	t.Helper()
	srv := httptest.NewServer(rec)
	defer srv.Close()
	var out bytes.Buffer
	if err := runCmd(append([]string{"-url", srv.URL, "-workers", "4"}, args...), &out, io.Discard); err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return out.String()
}

func keysOf(reqs []seen) (ks, buyers []string) {
	for _, r := range reqs {
		if r.method == http.MethodPost {
			ks, buyers = append(ks, r.key), append(buyers, r.buyer)
		}
	}
	slices.Sort(ks)
	slices.Sort(buyers)
	return ks, buyers
}

// A second run against the same gateway used to send the first run's keys
// (fixed prefixes), and every request was refused as a reused key.
func TestRunKeysAreTheRunsOwn(t *testing.T) {
	var ks, buyers [4][]string
	for i := range 4 {
		rec := &recorder{}
		args := []string{"-scenario", "flash", "-n", "20"}
		if i >= 2 {
			args = append(args, "-run-id", "fixed1")
		}
		run(t, rec, args...)
		ks[i], buyers[i] = keysOf(rec.requests())
		if len(ks[i]) != 20 || slices.Contains(ks[i], "") || slices.Contains(buyers[i], "") {
			t.Fatalf("run %d sent keys %v buyers %v; want 20 of each", i, ks[i], buyers[i])
		}
	}
	for _, k := range ks[0] {
		if slices.Contains(ks[1], k) {
			t.Errorf("two runs with default run ids share key %q", k)
		}
	}
	for _, b := range buyers[0] {
		if slices.Contains(buyers[1], b) {
			t.Errorf("two runs with default run ids share buyer %q", b)
		}
	}
	if !slices.Equal(ks[2], ks[3]) || !slices.Equal(buyers[2], buyers[3]) {
		t.Errorf("the same -run-id gave different keys: %v vs %v", ks[2], ks[3])
	}
}

// -sku drives an existing SKU with no admin call; -H headers go on every
// request.
func TestRunExistingSKUWithHeaders(t *testing.T) {
	rec := &recorder{}
	out := run(t, rec, "-sku", "show-9/ga", "-n", "12", "-H", "X-Edge-Auth: secret 1", "-H", "X-Tenant:acme", "-json",
		"-admin-token", "")
	reqs := rec.requests()
	if len(reqs) != 12 {
		t.Fatalf("%d requests, want 12", len(reqs))
	}
	for _, r := range reqs {
		if strings.HasPrefix(r.path, "/v1/admin/") {
			t.Errorf("-sku run made an admin call: %s %s", r.method, r.path)
		}
		if r.path != "/v1/skus/show-9/ga/purchases" {
			t.Errorf("request to %s, want the given SKU", r.path)
		}
		if r.header.Get("X-Edge-Auth") != "secret 1" || r.header.Get("X-Tenant") != "acme" || r.header.Get("Idempotency-Key") == "" {
			t.Errorf("request headers %v: want X-Edge-Auth, X-Tenant and the key", r.header)
		}
	}
	var got runSummary
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("-json output %q: %v", out, err)
	}
	if got.Audit != nil || got.AuditSkipped == "" {
		t.Errorf("-sku summary audit %+v skipped %q: want skipped, saying why", got.Audit, got.AuditSkipped)
	}
}

// -json counts what the gateway answered, and audits the run's own SKU.
func TestRunJSONSummary(t *testing.T) {
	rec := &recorder{}
	out := run(t, rec, "-scenario", "holds", "-n", "30", "-json", "-run-id", "r42")
	var got runSummary
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("-json output %q: %v", out, err)
	}
	carried := 0
	for _, r := range rec.requests() {
		if r.method == http.MethodPost && strings.HasPrefix(r.key, "holds-r42-") {
			carried++
		}
	}
	if carried != 30 {
		t.Fatalf("%d holds carried the run id, want 30", carried)
	}
	answered := rec.answered()
	if diff := cmp.Diff(answered, got.Result.Codes); diff != "" || answered["201"] == 0 || answered["409"] == 0 {
		t.Errorf("summary codes differ from the recorder's answers %v (-answered +summary):\n%s", answered, diff)
	}
	if got.Result.Requests != 30 || got.RunID != "r42" || got.Scenario != "holds" || got.Result.ElapsedSeconds <= 0 ||
		got.Result.RequestsPerSecond <= 0 {
		t.Errorf("summary %+v: want 30 requests, run r42, scenario holds, an elapsed time and a rate", got)
	}
	if got.Audit == nil || got.Audit.Total != 100 || got.Audit.SoldHeld != 3 || got.Audit.Created != got.Result.Codes["201"] {
		t.Errorf("audit %+v: want the recorder's SKU (100 total, 3 sold) and the 201 count", got.Audit)
	}
	for _, q := range []string{"p50", "p90", "p99", "max"} {
		if v, ok := got.Result.LatencyMS[q]; !ok || v < 0 {
			t.Errorf("latencies %v: want %s", got.Result.LatencyMS, q)
		}
	}
}

// -n 0 with -duration runs until the duration is up, not forever, open
// loop and closed.
func TestRunStopsAtDuration(t *testing.T) {
	for _, args := range [][]string{
		{"-scenario", "reads", "-n", "0", "-duration", "300ms", "-rate", "50"},
		{"-scenario", "reads", "-duration", "300ms"},
	} {
		rec := &recorder{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			srv := httptest.NewServer(rec)
			defer srv.Close()
			_ = runCmd(append([]string{"-url", srv.URL, "-workers", "4"}, args...), io.Discard, io.Discard)
		}()
		// Not a timing assertion: a run that ignores -duration never ends,
		// and this says so instead of hanging until go test's timeout.
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatalf("run %q still going after a minute", args)
		}
		if got := rec.answered()["200"]; got == 0 {
			t.Errorf("run %q sent no reads", args)
		}
	}
}

// The longest run id parseRun takes, the longest scenario name and the
// largest request number still make keys and buyers the gateway takes: one
// it refuses is a 400 for every request of the run.
func TestRunKeysAreIDs(t *testing.T) {
	longest := ""
	for n := 1; n <= keys.MaxIDLen; n++ {
		if _, err := parseRun([]string{"-run-id", strings.Repeat("r", n)}, io.Discard); err == nil {
			longest = strings.Repeat("r", n)
		}
	}
	for _, scenario := range []string{"flash", "steady", "soldout", "holds", "carts"} {
		c, err := parseRun([]string{"-scenario", scenario, "-run-id", longest, "-n", "0", "-duration", "1s"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		_, names := c.plan()
		req, ok := c.load(names)(math.MaxUint64)
		var body struct{ Buyer string }
		if err := json.Unmarshal([]byte(req.Body), &body); !ok || err != nil {
			t.Fatalf("%s request %d: %q, %v, %v", scenario, uint64(math.MaxUint64), req.Body, ok, err)
		}
		for _, id := range []string{req.Header.Get("Idempotency-Key"), body.Buyer} {
			if _, err := keys.ParseID(id); err != nil {
				t.Errorf("%s with -run-id %q: keys.ParseID(%q) = %v", scenario, longest, id, err)
			}
		}
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-scenario", "nope"},
		{"-ramp", "10:"},
		{"-ramp", "0:100", "-duration", "1s"},
		{"-ramp", "10:100"},                                  // no duration
		{"-ramp", "10:100", "-rate", "5", "-duration", "1s"}, // both
		{"-n", "0"},                                          // unbounded
		{"-H", "no colon"},
		{"-H", ": empty name"},
		{"-H", "X(bad): v"},
		{"-H", "Na me: v"},
		{"-H", "X-Bell: a\x07b"},
		{"-run-id", "has space"},
		{"-run-id", strings.Repeat("x", 25)},
		{"-sku", "no-slash"},
		{"-sku", "a/b/c"},
		{"-scenario", "carts", "-sku", "show-9/ga"}, // a cart spans SKUs the run creates
		{"-workers", "0"},
		{"-rate", "-1"},
		{"-bogus"},
		{"extra"},
	} {
		_, err := parseRun(args, io.Discard)
		var u usageError
		if !errors.As(err, &u) {
			t.Errorf("parseRun(%q) = %v, want a usage error", args, err)
		}
	}
	if _, err := parseRun([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h = %v, want flag.ErrHelp", err)
	}
	c, err := parseRun([]string{"-ramp", "10:200", "-duration", "20s", "-H", "A: 1", "-H", "A: 2", "-H", "X-Tab: a\tb"}, io.Discard)
	if err != nil || c.rate != 10 || c.rateEnd != 200 || len(c.header.Values("A")) != 2 || c.header.Get("X-Tab") != "a\tb" {
		t.Errorf("good flags = %+v, %v", c, err)
	}
}

// The command exits 2 on a bad flag, 0 on -h.
func TestRunExitStatus(t *testing.T) {
	for args, want := range map[string]int{"-scenario nope": 2, "-H bad": 2, "-H X(bad):v": 2, "-h": 0} {
		cmd := exec.Command(os.Args[0], append([]string{"run"}, strings.Fields(args)...)...)
		cmd.Env = append(os.Environ(), "STOCKBENCH_MAIN=1")
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != want {
			t.Errorf("stockbench run %s exited %d (%s), want %d", args, code, out, want)
		}
		if lines := strings.Count(strings.TrimSpace(string(out)), "\n") + 1; want == 2 && lines != 1 {
			t.Errorf("stockbench run %s printed %d lines (%s), want one", args, lines, out)
		}
		if want == 0 && !strings.Contains(string(out), "-run-id") {
			t.Errorf("stockbench run -h printed %q, want the flags", out)
		}
	}
}

// -duration alone bounds a run in time only, and a flash sale's stock is a
// tenth of what the run will send, however it is bounded.
func TestRunPlanFollowsItsBounds(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		n     uint64
		units int64
	}{
		{nil, 50_000, 5_000},
		{[]string{"-n", "50"}, 50, 5},
		{[]string{"-duration", "1m"}, 0, unknownRequests / 10},
		{[]string{"-duration", "1m", "-n", "500"}, 500, 50},
		{[]string{"-n", "0", "-duration", "10s", "-rate", "100"}, 0, 100},
		{[]string{"-n", "300", "-duration", "10s", "-rate", "100"}, 300, 30},
		{[]string{"-duration", "10s", "-ramp", "100:300"}, 0, 200},
		{[]string{"-scenario", "holds", "-duration", "10s", "-rate", "200000"}, 0, 2_000_000},
		{[]string{"-scenario", "carts", "-n", "3000000"}, 3_000_000, 3_000_000}, // each SKU: one per cart
	} {
		c, err := parseRun(tc.args, io.Discard)
		if err != nil {
			t.Fatalf("parseRun(%q) = %v", tc.args, err)
		}
		if units, _ := c.plan(); c.n != tc.n || units != tc.units {
			t.Errorf("parseRun(%q): -n %d, stock %d; want %d, %d", tc.args, c.n, units, tc.n, tc.units)
		}
	}
}

// A cart run creates its program's 3 SKUs with stock for every cart, then
// sends carts to the program's route, each one ticket of each SKU, each
// under its own key and buyer; its audit counts a granted cart's tickets.
func TestRunCarts(t *testing.T) {
	rec := &recorder{}
	out := run(t, rec, "-scenario", "carts", "-n", "10", "-run-id", "c7", "-program", "show7", "-json")
	created := map[string]bool{}
	var carts []seen
	for _, r := range rec.requests() {
		switch {
		case r.method == http.MethodPut && strings.HasPrefix(r.path, "/v1/admin/skus/show7/"):
			var cfg struct{ Total int64 }
			if err := json.Unmarshal(r.body, &cfg); err != nil || cfg.Total < 10 {
				t.Errorf("PUT %s %s: want stock for every cart (10)", r.path, r.body)
			}
			created[strings.TrimPrefix(r.path, "/v1/admin/skus/show7/")] = true
		case r.method == http.MethodPost:
			carts = append(carts, r)
		}
	}
	if len(created) != 3 || len(carts) != 10 {
		t.Fatalf("created SKUs %v and sent %d carts; want 3 and 10", created, len(carts))
	}
	ks, buyers := keysOf(carts)
	if len(slices.Compact(ks)) != 10 || len(slices.Compact(buyers)) != 10 {
		t.Errorf("keys %v, buyers %v: want 10 of each, all different", ks, buyers)
	}
	for _, r := range carts {
		if r.path != "/v1/programs/show7/carts" || !strings.HasPrefix(r.key, "carts-c7-") {
			t.Errorf("cart to %s under key %q, want /v1/programs/show7/carts and the run's key", r.path, r.key)
		}
		var body struct {
			Buyer string
			Lines []struct {
				Ticket   string
				Quantity int64
			}
		}
		if err := json.Unmarshal(r.body, &body); err != nil || len(body.Lines) != 3 {
			t.Fatalf("cart body %s (%v): want 3 lines", r.body, err)
		}
		tickets := map[string]bool{}
		for _, l := range body.Lines {
			if !created[l.Ticket] || l.Quantity != 1 {
				t.Errorf("cart line %+v: want quantity 1 of a SKU the run created (%v)", l, created)
			}
			tickets[l.Ticket] = true
		}
		if len(tickets) != 3 {
			t.Errorf("cart %s: want 3 different tickets", r.body)
		}
	}
	var got runSummary
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("-json output %q: %v", out, err)
	}
	// The recorder's 3 SKUs have sold 3 each; 4 or more granted carts are
	// more tickets than that.
	a := got.Audit
	if a == nil || a.SoldHeld != 9 || a.Created < 4 || a.EveryCreatedInLedger {
		t.Errorf("audit %+v: want sold 9 of the 3 SKUs, and %d granted carts' tickets not all in it", a, got.Result.Codes["201"])
	}
}

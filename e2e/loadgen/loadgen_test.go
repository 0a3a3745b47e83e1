package loadgen

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

func TestAttackCountsEveryAnswer(t *testing.T) {
	var seen atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen.Add(1)%4 == 0 {
			w.WriteHeader(http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	res, err := Attack(Run{Name: "closed", BaseURL: srv.URL, Scenario: Purchases([]string{"p/t"}, "k", 400), Workers: 8})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 400 || res.Count(201) != 300 || res.Count(409) != 100 || seen.Load() != 400 {
		t.Errorf("requests %d, answers %s, server saw %d; want 400 = 300×201 + 100×409", res.Requests, res.CodesString(), seen.Load())
	}
	if res.Quantile(50) <= 0 || res.Quantile(99.9) < res.Quantile(50) {
		t.Errorf("quantiles p50 %v p99.9 %v", res.Quantile(50), res.Quantile(99.9))
	}
	if tab := Table([]Result{res}); !strings.Contains(tab, "| closed | 400 |") {
		t.Errorf("table:\n%s", tab)
	}
}

// Latencies per status: a 201 that waited 200 ms and a 503 answered at
// once are told apart (the fault bench's shed answers against its sales).
func TestQuantileOfAStatus(t *testing.T) {
	var seen atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen.Add(1)%2 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		time.Sleep(200 * time.Millisecond) // the slow answer the test tells apart
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	res, err := Attack(Run{Name: "mixed", BaseURL: srv.URL, Scenario: Purchases([]string{"p/t"}, "k", 40), Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	if res.Count(201) != 20 || res.Count(503) != 20 {
		t.Fatalf("answers %s, want 20 of each", res.CodesString())
	}
	if got := res.QuantileOf(201, 0); got < 200*time.Millisecond {
		t.Errorf("the fastest 201 took %v, less than the 200 ms each waited", got)
	}
	if slow, fast := res.QuantileOf(201, 50), res.QuantileOf(503, 50); fast >= slow {
		t.Errorf("median 503 %v not faster than the median 201 %v", fast, slow)
	}
	if got := res.QuantileOf(409, 99); got != 0 {
		t.Errorf("p99 of no 409s = %v, want 0", got)
	}
}

// An open-loop run is paced at its rate (checked on the pacer, not on the
// clock of a busy machine), and a duration bounds it.
func TestOpenLoopKeepsItsRate(t *testing.T) {
	p, ok := (Run{Rate: 200}).pacer().(vegeta.ConstantPacer)
	if !ok || p.Freq != 200 || p.Per != time.Second {
		t.Fatalf("pacer %+v, want 200 per second", p)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	res, err := Attack(Run{Name: "open", BaseURL: srv.URL, Scenario: Reads("p/t", 0), Rate: 200, Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests == 0 || res.Count(200) != res.Requests {
		t.Errorf("a 200 ms run at 200/s sent %d requests (%s)", res.Requests, res.CodesString())
	}
}

// An open loop keeps the connections it opened: with more requests in
// flight than Workers, the ones past Workers were closed after their
// answer and dialled again, and after a crowd run the loopback ports ran
// out into TIME_WAIT (the tool then spent its CPU in connect()). At most
// the requests in flight are ever dialled.
func TestOpenLoopReusesItsConnections(t *testing.T) {
	var dialled atomic.Int64
	start := time.Now()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Answers go out in bursts, at each 100 ms since the start (a
		// server pausing, as a ledger's commits do): the requests of a
		// window are in flight together and their connections come back
		// at once.
		next := 100*time.Millisecond - time.Since(start)%(100*time.Millisecond)
		time.Sleep(next) // the server's pause is what the test is about
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialled.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	const workers = 2
	res, err := Attack(Run{Name: "open", BaseURL: srv.URL, Scenario: Reads("p/t", 0), Rate: 200, Workers: workers, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests < 100 || res.Count(200) != res.Requests {
		t.Fatalf("sent %d requests (%s), want about 200 answered 200", res.Requests, res.CodesString())
	}
	if n := dialled.Load(); n > workers*16 {
		t.Errorf("%d connections dialled for %d requests, at most %d in flight: connections closed and dialled again", n, res.Requests, workers*16)
	}
}

// A ramp goes from its start rate to its end rate over the run's duration.
func TestRampPacer(t *testing.T) {
	r := Run{Rate: 10, RateEnd: 110, Duration: 10 * time.Second}
	p, ok := r.pacer().(vegeta.LinearPacer)
	if !ok {
		t.Fatalf("pacer %T, want a linear one", r.pacer())
	}
	for at, want := range map[time.Duration]float64{0: 10, 5 * time.Second: 60, 10 * time.Second: 110} {
		if got := p.Rate(at); got < want-0.01 || got > want+0.01 {
			t.Errorf("rate at %v = %.2f, want %.0f", at, got, want)
		}
	}
	if _, ok := (Run{Rate: 10}).pacer().(vegeta.ConstantPacer); !ok {
		t.Error("no ramp: want a constant pacer")
	}
	if _, err := Attack(Run{Rate: 10, RateEnd: 20, Scenario: Reads("p/t", 1)}); err == nil {
		t.Error("a ramp without a duration ran")
	}
}

// Run.Header goes on every request beside the scenario's own headers.
func TestRunHeaderOnEveryRequest(t *testing.T) {
	var bad atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Edge") != "e1" || r.Header.Get("Idempotency-Key") == "" {
			bad.Add(1)
		}
	}))
	defer srv.Close()
	res, err := Attack(Run{BaseURL: srv.URL, Scenario: Purchases([]string{"p/t"}, "k", 50), Workers: 4,
		Header: http.Header{"X-Edge": {"e1"}}})
	if err != nil || res.Requests != 50 || bad.Load() != 0 {
		t.Errorf("%d requests (%v), %d without the header or the key", res.Requests, err, bad.Load())
	}
}

// Every cart names the program's route and one ticket of each of the
// tickets given, under a key and a buyer no other request of the run has.
func TestCartsScenario(t *testing.T) {
	const n = 200
	tickets := []string{"adult", "child", "parking"}
	sc := Carts("show-1", tickets, "carts-r1-", n)
	keys, buyers := map[string]bool{}, map[string]bool{}
	for i := range uint64(n) {
		req, ok := sc(i)
		if !ok {
			t.Fatalf("request %d: scenario ended early", i)
		}
		if req.Method != http.MethodPost || req.Path != "/v1/programs/show-1/carts" {
			t.Fatalf("request %d: %s %s, want POST /v1/programs/show-1/carts", i, req.Method, req.Path)
		}
		var body struct {
			Buyer string
			Lines []struct {
				Ticket   string
				Quantity int64
			}
		}
		dec := json.NewDecoder(strings.NewReader(req.Body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil {
			t.Fatalf("request %d: body %s: %v", i, req.Body, err)
		}
		var got []string
		for _, l := range body.Lines {
			if l.Quantity != 1 {
				t.Errorf("request %d: line %+v, want quantity 1", i, l)
			}
			got = append(got, l.Ticket)
		}
		if !slices.Equal(got, tickets) {
			t.Errorf("request %d: tickets %v, want %v", i, got, tickets)
		}
		key := req.Header.Get("Idempotency-Key")
		if key == "" || keys[key] || body.Buyer == "" || buyers[body.Buyer] || !strings.HasPrefix(key, "carts-r1-") {
			t.Errorf("request %d: key %q buyer %q: want both new and the key under the run's prefix", i, key, body.Buyer)
		}
		keys[key], buyers[body.Buyer] = true, true
		if req.Header.Get("Content-Type") != "application/json" {
			t.Errorf("request %d: Content-Type %q", i, req.Header.Get("Content-Type"))
		}
	}
	if _, ok := sc(n); ok {
		t.Errorf("request %d of %d made", n, n)
	}
}

// An open-loop run whose server holds every request makes the tool run
// out of workers: the requests it sends late are counted, their latency
// counts from when they were due, and the result says the tool, not the
// server, set the pace.
func TestOpenLoopSaysWhenTheToolLimited(t *testing.T) {
	release := make(chan struct{})
	var arrived atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		<-release
	}))
	defer srv.Close()
	const workers, rate = 1, 1000 // at most 16 in flight
	start := time.Now()
	done := make(chan Result, 1)
	go func() {
		res, err := Attack(Run{Name: "held", BaseURL: srv.URL, Scenario: Reads("p/t", 200), Rate: rate, Workers: workers})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	// Every worker waits on the server, and the schedule has moved on past
	// the 100th request: from the 17th on, requests go out late.
	for arrived.Load() < 16 || time.Since(start) < 100*time.Millisecond {
		time.Sleep(time.Millisecond) // time under test: the schedule 100 ms on (polled with the arrivals)
	}
	close(release)
	res := <-done
	if !res.ToolLimited() || res.Late < 50 || res.MaxLag < lateAfter {
		t.Fatalf("late %d of %d, max lag %v: want the run marked tool-limited", res.Late, res.Requests, res.MaxLag)
	}
	if res.Quantile(99) < res.MaxLag/2 {
		t.Errorf("p99 %v, max lag %v: the lag is not in the latencies", res.Quantile(99), res.MaxLag)
	}
	if n := res.Note(); !strings.Contains(n, "load tool limited") || !strings.Contains(Table([]Result{res}), "(tool-limited)") {
		t.Errorf("note %q, table %q", n, Table([]Result{res}))
	}
	if s := res.Summary(); !s.ToolLimited || s.LateSends != res.Late {
		t.Errorf("summary %+v", s)
	}
}

// Each request of an open-loop run is due when its pacer sends it: the
// n-th of a constant rate at n/rate, of a ramp where the ramp's count of
// hits reaches n.
func TestDueTime(t *testing.T) {
	start := time.Unix(1000, 0)
	if got := (Run{Rate: 200}).dueTime(start)(100); !got.Equal(start.Add(500 * time.Millisecond)) {
		t.Errorf("constant: request 100 due %v after start, want 500ms", got.Sub(start))
	}
	ramp := Run{Rate: 10, RateEnd: 110, Duration: 10 * time.Second}.dueTime(start)
	// hits(t) = 10 t + 5 t²: 600 at 10 s, 15 at 1 s.
	for n, want := range map[uint64]time.Duration{0: 0, 15: time.Second, 600: 10 * time.Second} {
		if got := ramp(n).Sub(start); got < want-time.Millisecond || got > want+time.Millisecond {
			t.Errorf("ramp: request %d due %v after start, want %v", n, got, want)
		}
	}
	if (Run{}).dueTime(start) != nil {
		t.Error("a closed-loop run has due times")
	}
}

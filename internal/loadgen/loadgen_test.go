package loadgen

import (
	"encoding/json"
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

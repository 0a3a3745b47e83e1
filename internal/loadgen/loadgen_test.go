package loadgen

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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

func TestOpenLoopKeepsItsRate(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	res, err := Attack(Run{Name: "open", BaseURL: srv.URL, Scenario: Reads("p/t", 0), Rate: 200, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests < 190 || res.Requests > 210 || res.Count(200) != res.Requests {
		t.Errorf("1s at 200/s sent %d requests (%s)", res.Requests, res.CodesString())
	}
}

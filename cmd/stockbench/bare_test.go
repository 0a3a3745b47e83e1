package main

import (
	"net/http"
	"strings"
	"testing"
)

// The bare ceilings run as a child process that answers like the in-process
// handlers did and is gone once stopped.
func TestBareRunsApart(t *testing.T) {
	t.Setenv("STOCKBENCH_MAIN", "1") // the child is this test binary running main
	for kind, req := range map[string]struct{ method, path, body string }{
		"purchases": {http.MethodPost, "/v1/skus/p/ga/purchases", `{"buyer":"b","quantity":1}`},
		"polls":     {http.MethodGet, "/v1/programs/p/queue/t1", ""},
	} {
		base, stop, err := serveBare(kind)
		if err != nil {
			t.Fatal(err)
		}
		r, err := http.NewRequest(req.method, base+req.path, strings.NewReader(req.body))
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "k1")
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Errorf("bare %s: %s %s = %d", kind, req.method, req.path, resp.StatusCode)
		}
		stop()
		http.DefaultClient.CloseIdleConnections()
		if resp, err := http.Get(base + req.path); err == nil {
			resp.Body.Close()
			t.Errorf("bare %s still answers after stop: %d", kind, resp.StatusCode)
		}
	}
	if _, _, err := serveBare("nothing"); err == nil {
		t.Error("bare nothing started")
	}
}

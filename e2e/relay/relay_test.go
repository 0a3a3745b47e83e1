package relay_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/client/webhook"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
)

// The relay's admin routes: a sink's figures, its dead letters, a
// redelivery the receiver refuses (502, kept) and one it takes (200,
// forgotten), and bad queries refused.
func TestRelayAPI(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	var delivered atomic.Int64
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if refuse.Load() {
			http.Error(w, "no", http.StatusServiceUnavailable)
			return
		}
		delivered.Add(1)
	}))
	t.Cleanup(rcv.Close)
	e := systest.Start(t, systest.Options{Driver: ledger.SQLite, Relay: true, Tune: func(o *app.Options) {
		o.Relay.WebhookURLs, o.Relay.WebhookSecret = []string{"webhook=" + rcv.URL}, webhook.NewSecret()
		o.Relay.Poll, o.Relay.BackoffBase, o.Relay.BackoffMax, o.Relay.MaxAttempts = 20*time.Millisecond, time.Millisecond, 5*time.Millisecond, 2
		o.Relay.StatsEvery = 50 * time.Millisecond
	}})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 3, 1, 4)
	e.MustBuy(t, sku, "k1", "ann", 1)
	type deadReply struct {
		DeadLetters []struct {
			Sink  string        `json:"sink"`
			Event webhook.Event `json:"event"`
		} `json:"dead_letters"`
		Next int64 `json:"next"`
	}
	var dead deadReply
	systest.WaitFor(t, 20*time.Second, "dead letter", func() bool {
		r := e.Do(t, http.MethodGet, "/v1/admin/relay/dead?sink=webhook", nil, "")
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &dead) != nil {
			t.Fatalf("GET dead = %d %s", r.Status, r.Body)
		}
		return len(dead.DeadLetters) > 0
	})
	seq := dead.DeadLetters[0].Event.Seq
	r := e.Do(t, http.MethodGet, "/v1/admin/relay", nil, "")
	var sinks struct {
		Sinks []struct {
			Name   string `json:"name"`
			Dead   int64  `json:"dead_letters"`
			Leased int    `json:"partitions_leased"`
		} `json:"sinks"`
	}
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &sinks) != nil || len(sinks.Sinks) != 1 || sinks.Sinks[0].Dead < 1 || sinks.Sinks[0].Leased != ledger.Partitions {
		t.Fatalf("GET relay = %d %s, want one sink with a dead letter and every partition leased", r.Status, r.Body)
	}
	redeliver := fmt.Sprintf("/v1/admin/relay/dead/webhook/%d/redeliver", seq)
	if r := e.Do(t, http.MethodPost, redeliver, nil, ""); r.Status != http.StatusBadGateway {
		t.Fatalf("redeliver (refused) = %d %s, want 502", r.Status, r.Body)
	}
	refuse.Store(false)
	if r := e.Do(t, http.MethodPost, redeliver, nil, ""); r.Status != http.StatusOK || delivered.Load() == 0 {
		t.Fatalf("redeliver = %d %s, want 200 and a delivery", r.Status, r.Body)
	}
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{http.MethodPost, redeliver, http.StatusNotFound}, // forgotten
		{http.MethodPost, "/v1/admin/relay/dead/nope/1/redeliver", http.StatusNotFound},
		{http.MethodPost, "/v1/admin/relay/dead/webhook/x/redeliver", http.StatusUnprocessableEntity},
		{http.MethodGet, "/v1/admin/relay/dead", http.StatusUnprocessableEntity},
		{http.MethodGet, "/v1/admin/relay/dead?sink=webhook&limit=0", http.StatusUnprocessableEntity},
		{http.MethodGet, "/v1/admin/relay/dead?sink=webhook&after=-1", http.StatusUnprocessableEntity},
		{http.MethodGet, "/v1/admin/relay/dead?sink=nope", http.StatusNotFound},
	} {
		if r := e.Do(t, c.method, c.path, nil, ""); r.Status != c.status {
			t.Errorf("%s %s = %d %s, want %d", c.method, c.path, r.Status, r.Body, c.status)
		}
	}
}

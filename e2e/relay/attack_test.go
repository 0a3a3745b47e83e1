package relay_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/client/webhook"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
)

// idReceiver records the webhook-id of every delivery it accepts; down,
// it answers 503.
type idReceiver struct {
	down atomic.Bool
	mu   sync.Mutex
	ids  map[string]bool
}

func (r *idReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	_, _ = io.Copy(io.Discard, req.Body)
	if r.down.Load() {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	r.mu.Lock()
	r.ids[req.Header.Get(webhook.HeaderID)] = true
	r.mu.Unlock()
}

func (r *idReceiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

// The webhook sinks are named by their place in --webhook-urls
// ("webhook", "webhook-2", ...), and a sink's cursors and dead letters are
// kept under its name. Take the first URL out of the list (a platform
// leaves) and the second receiver, which was down and behind, restarts as
// "webhook" with the first receiver's cursors: it never gets the events it
// missed. Every receiver should get every event at least once, whatever
// the list's order.
func TestAttackWebhookSinkInheritsAnotherReceiversCursor(t *testing.T) {
	systest.FullTier(t)
	a := &idReceiver{ids: map[string]bool{}}
	b := &idReceiver{ids: map[string]bool{}}
	b.down.Store(true)
	sa, sb := httptest.NewServer(a), httptest.NewServer(b)
	t.Cleanup(sa.Close)
	t.Cleanup(sb.Close)
	secret := webhook.NewSecret()
	dsn := systest.LedgerDSN(t, ledger.SQLite)
	tune := func(urls ...string) func(o *app.Options) {
		return func(o *app.Options) {
			o.Relay.WebhookURLs, o.Relay.WebhookSecret = urls, secret
			o.Relay.Poll, o.Relay.BackoffBase, o.Relay.BackoffMax, o.Relay.MaxAttempts = 20*time.Millisecond, time.Millisecond, 20*time.Millisecond, 100000
		}
	}
	e1 := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Relay: true, Tune: tune(sa.URL, sb.URL)})
	sku := systest.NewSKU(t)
	e1.PutSKU(t, sku, 10, 1, 4)
	e1.MustBuy(t, sku, "k1", "ann", 1)
	e1.MustBuy(t, sku, "k2", "bob", 1)
	events, err := e1.Ledger.Events(t.Context(), sku.Program, 0, 100)
	if err != nil || len(events) != 2 {
		t.Fatalf("events = %d, %v, want 2", len(events), err)
	}
	systest.WaitFor(t, 20*time.Second, "every event at receiver a", func() bool { return a.count() >= len(events) })
	e1.Kill()
	// a is decommissioned; b is back up.
	b.down.Store(false)
	systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Relay: true, Tune: tune(sb.URL)})
	systest.WaitUntil(5*time.Second, func() bool { return b.count() >= len(events) })
	if b.count() < len(events) {
		t.Fatalf("receiver b got %d of the %d events once the list changed, want every one", b.count(), len(events))
	}
}

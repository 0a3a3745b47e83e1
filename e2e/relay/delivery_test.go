package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/client/webhook"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// hookReceiver is a platform's webhook endpoint: it verifies each
// delivery's signature, fails a share of them with 500, and keeps the
// ones it took, noting any partition delivered twice at once.
type hookReceiver struct {
	verifier  *webhook.Verifier
	failShare float64

	mu        sync.Mutex
	partition map[string]int // ticket → relay partition
	inFlight  map[int]int
	overlaps  int
	bad       int
	got       []webhook.Event
	ids       map[string]bool
}

func (r *hookReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	var e webhook.Event
	if r.verifier.Verify(req.Header, body, time.Now()) != nil || json.Unmarshal(body, &e) != nil || req.Header.Get(webhook.HeaderID) != e.ID {
		r.mu.Lock()
		r.bad++
		r.mu.Unlock()
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	r.mu.Lock()
	p, known := r.partition[e.Ticket]
	if known {
		r.inFlight[p]++
		if r.inFlight[p] > 1 {
			r.overlaps++
		}
	}
	fail := rand.Float64() < r.failShare
	if !fail {
		r.got = append(r.got, e)
		r.ids[e.ID] = true
	}
	if known {
		r.inFlight[p]--
	}
	r.mu.Unlock()
	if fail {
		http.Error(w, "try later", http.StatusInternalServerError)
	}
}

func (r *hookReceiver) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

// A sale of 2,000 purchases over 3 replicas, with 400 holds (confirmed,
// cancelled, left to expire) and 100 refunds: every state change reaches
// a platform's webhook exactly once after de-duplication by id, each
// ticket's in the order the ledger committed them, while the receiver
// fails 20 % of deliveries and one replica is killed midway with its
// relay's leases held. PostgreSQL only: it is the ledger several replicas
// share in production, and the one whose sequence can be seen out of
// commit order (the relay package's tests run both ledgers).
func TestEveryChangeReachesTheWebhook(t *testing.T) {
	t.Parallel() // its own replicas, ledger, receiver and program: it overlaps the other long tests
	const tickets, purchases, holds, refunds = 20, 2_000, 400, 100
	secret := webhook.NewSecret()
	verifier, err := webhook.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	rcv := &hookReceiver{verifier: verifier, failShare: 0.2, partition: map[string]int{}, inFlight: map[int]int{}, ids: map[string]bool{}}
	hook := httptest.NewServer(rcv)
	t.Cleanup(hook.Close)
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	var envs []*systest.Env
	for i := range 3 {
		envs = append(envs, systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Sweep: true, Relay: true, Tune: func(o *app.Options) {
			o.Sale.SweepEvery = 100 * time.Millisecond
			o.Relay.WebhookURLs, o.Relay.WebhookSecret = []string{hook.URL}, secret
			o.Relay.Owner = fmt.Sprintf("replica-%d", i)
			o.Relay.LeaseTTL, o.Relay.Poll = time.Second, 20*time.Millisecond
			o.Relay.BackoffBase, o.Relay.BackoffMax, o.Relay.MaxAttempts = 2*time.Millisecond, 20*time.Millisecond, 1000
			o.Relay.KeepLeases = i == 0
		}}))
	}
	program := keys.MustID(fmt.Sprintf("hook%d", time.Now().UnixNano()))
	var skus []stock.SKU
	for i := range tickets {
		s := stock.SKU{Program: program, Ticket: keys.MustID(fmt.Sprintf("t%d", i))}
		envs[0].PutSKU(t, s, 1_000, 2, 4)
		skus = append(skus, s)
	}
	ctx := context.Background()
	rcv.mu.Lock()
	for _, e := range allProgramEvents(t, envs[0].Ledger, program) {
		rcv.partition[e.SKU.Base().Ticket.String()] = e.Partition
	}
	rcv.mu.Unlock()

	live := func(i int) *systest.Env { return envs[1+i%2] } // the replicas that stay
	// Every request is sent as a platform's worker sends it: a 503 (a
	// replica or the ledger at its capacity on a loaded machine) again
	// with the same key after its Retry-After. The test counts changes,
	// not first answers.
	buy := func(i int, e *systest.Env) systest.Reply {
		r, _ := e.Retried(t, http.MethodPost, systest.SKUPath(skus[i%tickets])+"/purchases", fmt.Sprintf("p-%d", i),
			fmt.Sprintf(`{"buyer":"b%d","quantity":1}`, i%997))
		return r
	}
	act := func(e *systest.Env, path, key, buyer string) systest.Reply {
		r, _ := e.Retried(t, http.MethodPost, path, key, fmt.Sprintf(`{"buyer":%q}`, buyer))
		return r
	}
	first := systest.BuyAll(purchases/3, 32, func(i int) systest.Reply { return buy(i, envs[i%3]) })
	// Midway: replica 0 dies with its relay's leases held; the others
	// take its partitions over when they lapse.
	systest.WaitFor(t, 30*time.Second, "the first deliveries", func() bool { return rcv.distinct() > 100 })
	envs[0].Kill()
	counts := systest.BuyAll(purchases-purchases/3, 32, func(i int) systest.Reply { return buy(purchases/3+i, live(i)) })
	if first[http.StatusCreated]+counts[http.StatusCreated] != purchases {
		t.Fatalf("purchases: %v then %v", first, counts)
	}
	type held struct{ id, buyer string }
	var hs []held
	var mu sync.Mutex
	counts = systest.BuyAll(holds, 32, func(i int) systest.Reply {
		ttl := 900
		if i%4 == 3 {
			ttl = 1 // a quarter expire
		}
		buyer := fmt.Sprintf("h%d", i)
		r, _ := live(i).Retried(t, http.MethodPost, systest.SKUPath(skus[i%tickets])+"/holds", fmt.Sprintf("h-%d", i),
			fmt.Sprintf(`{"buyer":%q,"quantity":1,"ttl_seconds":%d}`, buyer, ttl))
		var h systest.HoldReply
		_ = json.Unmarshal(r.Body, &h)
		if r.Status == http.StatusCreated && ttl > 1 {
			mu.Lock()
			hs = append(hs, held{h.HoldID, buyer})
			mu.Unlock()
		}
		return r
	})
	if counts[http.StatusCreated] != holds {
		t.Fatalf("holds: %v", counts)
	}
	// Two thirds of the long holds confirmed, a third cancelled.
	counts = systest.BuyAll(len(hs), 32, func(i int) systest.Reply {
		action, want := "confirm", http.StatusCreated
		if i%3 == 2 {
			action, want = "cancel", http.StatusOK
		}
		r := act(live(i), "/v1/holds/"+hs[i].id+"/"+action, "a-"+hs[i].id, hs[i].buyer)
		if r.Status != want {
			return systest.Reply{Status: 599}
		}
		return r
	})
	if counts[599] != 0 {
		t.Fatalf("confirms and cancels: %v", counts)
	}
	counts = systest.BuyAll(refunds, 32, func(i int) systest.Reply {
		j := i * (purchases / refunds)
		o, err := systest.OrderOf(ctx, envs[1].Ledger, fmt.Sprintf("b%d", j%997), fmt.Sprintf("p-%d", j))
		if err != nil {
			t.Error(err)
			return systest.Reply{Status: 599}
		}
		return act(live(i), "/v1/orders/"+o.ID.String()+"/refund", "r-"+o.ID.String(), o.Buyer.String())
	})
	if counts[http.StatusOK] != refunds {
		t.Fatalf("refunds: %v", counts)
	}
	systest.WaitFor(t, 30*time.Second, "every short hold expired", func() bool {
		for _, s := range skus {
			if st, err := envs[1].Ledger.SKU(ctx, s); err != nil || st.Held != 0 {
				return false
			}
		}
		return true
	})

	events := allProgramEvents(t, envs[1].Ledger, program)
	byType := map[string]int{}
	for _, e := range events {
		byType[e.Type]++
	}
	long := len(hs)
	want := map[string]int{ledger.EventOrderCreated: purchases, ledger.EventHoldCreated: holds,
		ledger.EventHoldConfirmed: long - long/3, ledger.EventHoldCancelled: long / 3, ledger.EventHoldExpired: holds - long,
		ledger.EventOrderRefunded: refunds}
	for typ, n := range want {
		if byType[typ] != n {
			t.Errorf("%d %s events in the outbox, want one per change: %d", byType[typ], typ, n)
		}
	}
	systest.WaitFor(t, 120*time.Second, "every event at the webhook", func() bool { return rcv.distinct() >= len(events) })
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	inLedger := map[string]ledger.Event{}
	for _, e := range events {
		inLedger[e.ID.String()] = e
	}
	seen := map[string]bool{}
	last := map[string]int64{}
	dups := 0
	for _, g := range rcv.got {
		if seen[g.ID] {
			dups++
			continue
		}
		seen[g.ID] = true
		e, ok := inLedger[g.ID]
		if !ok || g.Type != e.Type || g.Seq != e.Seq {
			t.Errorf("delivered %+v: the ledger has %+v (%v)", g, e, ok)
			continue
		}
		if e.Seq <= last[e.SKU.String()] {
			t.Errorf("%s: event %d arrived after %d", e.SKU, e.Seq, last[e.SKU.String()])
		}
		last[e.SKU.String()] = e.Seq
	}
	if len(seen) != len(events) || rcv.bad > 0 || rcv.overlaps > 0 {
		t.Errorf("%d distinct events delivered of %d, %d bad signatures, %d overlapping deliveries of a partition",
			len(seen), len(events), rcv.bad, rcv.overlaps)
	}
	t.Logf("%d events delivered through a receiver failing 20%% and a killed replica; %d repeats (dropped by id)", len(events), dups)
}

// allProgramEvents reads a program's whole event log.
func allProgramEvents(t *testing.T, l interface {
	Events(ctx context.Context, program keys.ID, after int64, limit int) ([]ledger.Event, error)
}, program keys.ID) []ledger.Event {
	t.Helper()
	var out []ledger.Event
	for after := int64(0); ; {
		page, err := l.Events(context.Background(), program, after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			return out
		}
		out = append(out, page...)
		after = page[len(page)-1].Seq
	}
}

package relay_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/relay"
	"github.com/stockgate/stockgate/webhook"
)

// lossyStream is a Redis Streams sink whose attempts can fail before the
// XADD (the event is refused: it ends a dead letter) or after it (Redis
// added the entry but its answer never came back in time: the attempt
// timed out, or the relay died before advancing its cursor).
type lossyStream struct {
	*relay.Stream
	refuse    func(ledger.Event) bool
	lostReply func(ledger.Event) bool
}

func (s *lossyStream) Deliver(ctx context.Context, e ledger.Event) error {
	if s.refuse(e) {
		return errors.New("refused before the XADD")
	}
	if err := s.Stream.Deliver(ctx, e); err != nil {
		return err
	}
	if s.lostReply(e) {
		return errors.New("XADD done, its answer lost")
	}
	return nil
}

// Once a dead letter of a partition has been redelivered to the Redis
// Streams sink, it sits in the stream under an ID Redis picked (a
// millisecond time, far above any "<seq>-1"), so every later event of the
// partition is refused as "not above the top item", looked for under
// "<seq>-1" (where it never is) and added under "*" again. An event whose
// XADD reached Redis but whose answer did not (an attempt timed out, a
// relay died before advancing) is then retried and added a second time:
// the sink promises to never add an event twice.
func TestAttackStreamAddsAnEventTwiceAfterARedelivery(t *testing.T) {
	ctx := context.Background()
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.SQLite, DSN: testenv.SQLitePath(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	rdb := testenv.SharedCluster(t).Client()
	program := keys.MustID("show-stream-twice")
	skus := makeSKUs(t, l, program.String(), 1)
	buy(t, l, skus[0])
	buy(t, l, skus[0])
	first := allEvents(t, l, program)
	if len(first) != 2 {
		t.Fatalf("%d events, want 2", len(first))
	}
	inner, err := relay.NewStream(relay.StreamOptions{Redis: rdb, Prefix: testenv.ID(t, "ev") + ":"})
	if err != nil {
		t.Fatal(err)
	}
	var refuse atomic.Bool
	refuse.Store(true)
	var mu sync.Mutex
	lost := map[keys.ID]bool{} // events whose answer was lost once
	var third keys.ID
	sink := &lossyStream{Stream: inner,
		refuse: func(e ledger.Event) bool { return e.ID == first[0].ID && refuse.Load() },
		lostReply: func(e ledger.Event) bool {
			mu.Lock()
			defer mu.Unlock()
			if e.ID != third || lost[e.ID] {
				return false
			}
			lost[e.ID] = true
			return true
		}}
	o := fastOptions(sink)
	o.MaxAttempts = 2
	r, err := relay.New(l, o)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(rctx) })
	t.Cleanup(func() { stop(); wg.Wait() })

	key := inner.Key(first[0].Partition)
	entriesOf := func(id keys.ID) int {
		got, err := rdb.XRange(ctx, key, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range got {
			if m.Values["id"] == id.String() {
				n++
			}
		}
		return n
	}
	// The first event is dead-lettered, the second is in the stream.
	waitFor(t, 20*time.Second, "the second event in the stream", func() bool { return entriesOf(first[1].ID) == 1 })
	refuse.Store(false)
	if _, err := r.Redeliver(ctx, sink.Name(), first[0].Seq); err != nil {
		t.Fatalf("Redeliver = %v", err)
	}
	// A third event: its first XADD lands but its answer is lost.
	mu.Lock()
	buy(t, l, skus[0])
	all := allEvents(t, l, program)
	third = all[2].ID
	mu.Unlock()
	waitFor(t, 20*time.Second, "the third event delivered", func() bool {
		st, err := l.PartitionState(ctx, sink.Name(), first[0].Partition)
		return err == nil && st.Delivered == all[2].Seq
	})
	if n := entriesOf(third); n != 1 {
		got, _ := rdb.XRange(ctx, key, "-", "+").Result()
		t.Fatalf("the third event is in the stream %d times, want once; stream: %v", n, got)
	}
}

// One sink's receiver that hangs (never answers until the attempt times
// out) holds the relay's delivery slots (Options.Parallel, shared by every
// sink) for the whole attempt timeout, again and again on every one of its
// partitions, so a second, healthy sink of the same relay is starved: its
// events wait seconds each behind the hanging receiver's attempts. A
// receiver that hangs should stall only its own sink.
func TestAttackHangingReceiverStallsTheOtherSinks(t *testing.T) {
	ctx := context.Background()
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.SQLite, DSN: testenv.SQLitePath(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	program := keys.MustID("show-hang")
	skus := makeSKUs(t, l, program.String(), 200)
	for _, s := range skus {
		buy(t, l, s)
	}
	events := allEvents(t, l, program)
	secret := webhook.NewSecret()
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}))
	t.Cleanup(hang.Close)
	rcv, good := newReceiver(t, secret, partitions(t, l, program), 0)
	hangSink, err := relay.NewWebhook(relay.WebhookOptions{Name: "hanging", URL: hang.URL, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	goodSink, err := relay.NewWebhook(relay.WebhookOptions{Name: "healthy", URL: good.URL, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	// Default lease, attempt timeout and parallelism; quick polls and
	// retries.
	o := relay.Options{Sinks: []relay.Sink{hangSink, goodSink}, Poll: 20 * time.Millisecond, BackoffBase: 5 * time.Millisecond,
		BackoffMax: 40 * time.Millisecond, MaxAttempts: 1000, StatsEvery: 50 * time.Millisecond}
	r, err := relay.New(l, o)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(rctx) })
	t.Cleanup(func() { stop(); wg.Wait() })
	start := time.Now()
	deadline := start.Add(8 * time.Second)
	for rcv.distinct() < len(events) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := rcv.distinct(); got < len(events) {
		t.Fatalf("the healthy sink got %d of %d events in %v while the other sink's receiver hangs; want all within a second or two",
			got, len(events), time.Since(start).Round(time.Millisecond))
	}
}

package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/client/webhook"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/internal/wait"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/relay"
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
	fullTier(t)
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
	fullTier(t)
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
		_, _ = io.Copy(io.Discard, r.Body)
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
	wait.Until(8*time.Second, func() bool { return rcv.distinct() >= len(events) })
	if got := rcv.distinct(); got < len(events) {
		t.Fatalf("the healthy sink got %d of %d events in %v while the other sink's receiver hangs; want all within a second or two",
			got, len(events), time.Since(start).Round(time.Millisecond))
	}
}

// overlapReceiver answers slowly and counts deliveries of one partition
// that overlap (two relays delivering it at once).
type overlapReceiver struct {
	partition map[string]int
	mu        sync.Mutex
	spans     map[int][]span // per partition, the deliveries a relay waited for
	ids       map[string]bool
}

// span is one delivery's time in the receiver's handler.
type span struct{ from, to time.Time }

// ServeHTTP counts a delivery only if its relay was still waiting for the
// answer when it ended: one the relay gave up on (its attempt's deadline,
// within its lease) can still be in a starved handler when the next
// lease holder delivers, and that is at-least-once, not two relays at
// once.
func (o *overlapReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	from := time.Now()
	body, _ := io.ReadAll(req.Body)
	id := req.Header.Get(webhook.HeaderID)
	var e struct{ Ticket string }
	_ = json.Unmarshal(body, &e)
	p := o.partition[e.Ticket]
	time.Sleep(60 * time.Millisecond) // time under test: a 60 ms receiver, so deliveries can overlap
	o.mu.Lock()
	defer o.mu.Unlock()
	if req.Context().Err() == nil {
		o.spans[p] = append(o.spans[p], span{from, time.Now()})
	}
	o.ids[id] = true
}

// overlaps is how many waited-for deliveries of a partition began while
// another was in the handler.
func (o *overlapReceiver) overlaps() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return countOverlaps(o.spans)
}

func (o *overlapReceiver) distinct() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.ids)
}

// Two replicas run the relay on one PostgreSQL ledger; the second's clock
// is ahead by a little more than the lease TTL. Leases are written and
// judged by each replica's own clock (lease_until = its now + TTL), so the
// second sees the first's live, freshly renewed leases as lapsed, takes
// every partition at its first claim (and drops the first from the live
// relays), and delivers them while the first is still delivering the same
// partitions under leases it holds by its own clock: one partition
// delivered by two relays at once. The database's clock would be one
// clock for every replica.
func TestAttackClockSkewTwoRelaysDeliverAPartitionAtOnce(t *testing.T) {
	fullTier(t)
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	la, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { la.Close() })
	const ttl = 1500 * time.Millisecond
	lb, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: dsn,
		Now: func() time.Time { return time.Now().Add(ttl + 500*time.Millisecond) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lb.Close() })
	program := keys.MustID("show-skew")
	skus := makeSKUs(t, la, program.String(), 8)
	for i := range 160 {
		buy(t, la, skus[i%len(skus)])
	}
	events := allEvents(t, la, program)
	rcv := &overlapReceiver{partition: partitions(t, la, program), spans: map[int][]span{}, ids: map[string]bool{}}
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)
	secret := webhook.NewSecret()
	var wg sync.WaitGroup
	var stops []context.CancelFunc
	t.Cleanup(func() {
		for _, s := range stops {
			s()
		}
		wg.Wait()
	})
	start := func(l *ledger.Ledger, owner string) {
		hook, err := relay.NewWebhook(relay.WebhookOptions{URL: srv.URL, Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		o := fastOptions(hook)
		o.Owner, o.LeaseTTL = owner, ttl
		r, err := relay.New(l, o)
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		stops = append(stops, stop)
		wg.Go(func() { r.Run(rctx) })
	}
	start(la, "relay-a")
	waitFor(t, 20*time.Second, "relay-a delivering", func() bool { return rcv.distinct() >= 10 })
	start(lb, "relay-b")
	waitFor(t, 60*time.Second, "every event delivered", func() bool { return rcv.distinct() == len(events) })
	if n := rcv.overlaps(); n > 0 {
		t.Fatalf("%d deliveries of a partition overlapped another relay's (replica clocks %v apart, lease TTL %v); want none",
			n, ttl+500*time.Millisecond, ttl)
	}
}

// The Redis Streams sink counts an event delivered as soon as the master
// answers its XADD, and the relay moves the partition's cursor past it;
// Redis replicates to the replica later. When the master dies before the
// replica has the entries and the replica is promoted, they are gone from
// the stream for good while the ledger says delivered: the stream never
// gets them (at least once to every sink, through a Redis failover).
// Fixed: the sink counts an add delivered once a replica has it (WAIT);
// then the relay adds, after the failover, what the promoted replica
// lacks, and the event markers keep each event to one entry.
func TestAttackStreamLosesEventsInAFailover(t *testing.T) {
	fullTier(t)
	ctx := context.Background()
	c := testenv.NewCluster(t, testenv.ClusterOptions{ReplicasPerMaster: 1})
	rdb := c.Client()
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.SQLite, DSN: testenv.SQLitePath(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	program := keys.MustID("show-stream-failover")
	skus := makeSKUs(t, l, program.String(), 1)
	buy(t, l, skus[0])
	sink, err := relay.NewStream(relay.StreamOptions{Redis: rdb, Prefix: testenv.ID(t, "ev") + ":"})
	if err != nil {
		t.Fatal(err)
	}
	// Retried for as long as the failover takes (tens of seconds here:
	// the replica was stopped), never dead-lettered on the way.
	o := fastOptions(sink)
	o.MaxAttempts = 1 << 30
	r, err := relay.New(l, o)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(rctx) })
	t.Cleanup(func() { stop(); wg.Wait() })
	first := allEvents(t, l, program)[0]
	key := sink.Key(first.Partition)
	delivered := func(seq int64) func() bool {
		return func() bool {
			st, err := l.PartitionState(ctx, sink.Name(), first.Partition)
			return err == nil && st.Delivered == seq
		}
	}
	waitFor(t, 20*time.Second, "the first event delivered", delivered(first.Seq))
	slot := int(rdb.ClusterKeySlot(ctx, key).Val())
	master, err := c.MasterOf(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	var replica *testenv.Node
	for _, n := range c.Nodes {
		role, err := n.Client().Do(ctx, "ROLE").Slice()
		if err == nil && len(role) >= 3 && role[0] == "slave" && fmt.Sprint(role[2]) == fmt.Sprint(master.Port) {
			replica = n
		}
	}
	if replica == nil {
		t.Fatal("no replica of the stream's master")
	}
	// The replica falls behind (its link drops), the relay delivers three
	// more events, then the master dies and the replica takes over.
	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	// The link drops (what was already sent stays in the replica's socket
	// buffer and reaches it when it resumes; nothing after).
	mc := master.Client()
	if err := mc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	mc.Close()
	for range 3 {
		buy(t, l, skus[0])
	}
	events := allEvents(t, l, program)
	// The master takes the next add, the replica does not ack it: the
	// relay must not count it delivered (and waits on it, in order).
	waitFor(t, 20*time.Second, "the next add on the master, failed for want of a replica", func() bool {
		n, err := master.Client().XLen(ctx, key).Result()
		st, serr := l.PartitionState(ctx, sink.Name(), first.Partition)
		return err == nil && serr == nil && n == 2 && st.Attempts >= 1
	})
	if st, err := l.PartitionState(ctx, sink.Name(), first.Partition); err != nil || st.Delivered != first.Seq {
		t.Fatalf("partition %+v (%v): counted delivered while no replica had the entries", st, err)
	}
	master.Kill()
	if err := replica.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitFailover(ctx, slot, master, 60*time.Second); err != nil {
		t.Fatalf("no failover: %v", err)
	}
	// After the failover the relay adds what the promoted replica lacks,
	// each event once.
	waitFor(t, 60*time.Second, "every event delivered", delivered(events[len(events)-1].Seq))
	fresh := c.Client() // slots as they are now
	msgs, err := fresh.XRange(ctx, key, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int{}
	for _, m := range msgs {
		ids[fmt.Sprint(m.Values["id"])]++
	}
	for _, e := range events {
		if ids[e.ID.String()] != 1 {
			t.Errorf("event %d is in the stream %d times after the failover, want once", e.Seq, ids[e.ID.String()])
		}
	}
	if len(msgs) != len(events) {
		t.Errorf("after the failover the stream has %d entries for the %d events", len(msgs), len(events))
	}
}

// claimCut is a relay's ledger whose lease renewals fail once cut (the
// replica lost its way to the database, not to the receivers).
type claimCut struct {
	*ledger.Ledger
	cut atomic.Bool
}

func (c *claimCut) ClaimPartitions(ctx context.Context, sink, owner string, ttl time.Duration) (ledger.Claim, error) {
	if c.cut.Load() {
		return ledger.Claim{}, errors.New("cut off from the ledger")
	}
	return c.Ledger.ClaimPartitions(ctx, sink, owner, ttl)
}

// "An attempt never outlasts the lease it started under": the lease left
// is checked, and the attempt's timeout set from it, before the attempt
// waits for a delivery slot (Options.Parallel, shared by every sink and
// partition). While another sink's hanging receiver holds the slots, an
// attempt waits there for seconds and then delivers long after its lease
// lapsed. Relay a stops renewing (cut off from the ledger), relay b takes
// its partitions once the leases lapse and delivers them, and a's queued
// attempts still go out: one partition delivered by two relays at once.
func TestAttackAttemptQueuedForASlotOutlivesItsLease(t *testing.T) {
	fullTier(t)
	ctx := context.Background()
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.SQLite, DSN: testenv.SQLitePath(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	program := keys.MustID("show-slot")
	skus := makeSKUs(t, l, program.String(), 8)
	for i := range 160 {
		buy(t, l, skus[i%len(skus)])
	}
	events := allEvents(t, l, program)
	rcv := &overlapReceiver{partition: partitions(t, l, program), spans: map[int][]span{}, ids: map[string]bool{}}
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}))
	t.Cleanup(hang.Close)
	secret := webhook.NewSecret()
	hook := func(name, url string) relay.Sink {
		s, err := relay.NewWebhook(relay.WebhookOptions{Name: name, URL: url, Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	var wg sync.WaitGroup
	var stops []context.CancelFunc
	t.Cleanup(func() {
		for _, s := range stops {
			s()
		}
		wg.Wait()
	})
	// run starts a relay; its stop ends it, and done closes once its Run
	// has returned (every attempt it started is over).
	run := func(rl relay.Ledger, o relay.Options) (stop context.CancelFunc, done <-chan struct{}) {
		r, err := relay.New(rl, o)
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		stops = append(stops, stop)
		ended := make(chan struct{})
		wg.Go(func() {
			defer close(ended)
			r.Run(rctx)
		})
		return stop, ended
	}
	const ttl = 1500 * time.Millisecond
	la := &claimCut{Ledger: l}
	oa := fastOptions(hook("hanging", hang.URL), hook("webhook", srv.URL))
	oa.Owner, oa.LeaseTTL, oa.Parallel, oa.KeepLeases = "relay-a", ttl, 2, true
	stopA, doneA := run(la, oa)
	waitFor(t, 30*time.Second, "relay-a delivering", func() bool { return rcv.distinct() >= 3 })
	la.cut.Store(true)
	ob := fastOptions(hook("webhook", srv.URL))
	ob.Owner, ob.LeaseTTL = "relay-b", ttl
	run(l, ob)
	waitFor(t, 60*time.Second, "every event delivered", func() bool { return rcv.distinct() == len(events) })
	// relay-a's attempts still queued behind the hanging receiver go out
	// (or not) before its Run returns: stop it and wait for that.
	stopA()
	<-doneA
	if n := rcv.overlaps(); n > 0 {
		t.Fatalf("%d deliveries of a partition overlapped another relay's: relay-a delivered after its lease lapsed; want none", n)
	}
}

// fullTier marks an attack: the full tier only (make test); -short, the
// fast tier (make test-short), skips it.
func fullTier(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("an attack: full tier only, skipped with -short")
	}
}

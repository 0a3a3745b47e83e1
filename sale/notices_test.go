package sale

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/stock"
)

// heldNotifier is a Redis client's pub/sub that can hold its next
// publish until released, and counts the publishes per channel.
type heldNotifier struct {
	Notifier
	mu       sync.Mutex
	gate     chan struct{} // non-nil: the next publish waits for it
	blocked  chan struct{} // closed when a publish waits at the gate
	channels map[string]int
}

func (n *heldNotifier) Publish(ctx context.Context, channel string, message any) *redis.IntCmd {
	n.mu.Lock()
	n.channels[channel]++
	gate, blocked := n.gate, n.blocked
	n.gate = nil
	n.mu.Unlock()
	if gate != nil {
		close(blocked)
		<-gate
	}
	return n.Notifier.Publish(ctx, channel, message)
}

func (n *heldNotifier) count(channel string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.channels[channel]
}

// The takes a ledger refuses together (the end of its outage) give their
// units back together, and each give-back tells the other replicas. A
// publish each held every answer behind a Redis connection and a message
// every node relays (stockbench faults, node lost: 1,206 answers waiting
// to publish, past the work timeout). A give-back does not wait for its
// notice, and the notices due while one is published go as one per SKU.
func TestBackNoticesDoNotHoldTheirGiveBacks(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.NewCluster(t, testenv.ClusterOptions{}).Client()
	t.Cleanup(func() { rdb.Close() })
	n := &heldNotifier{Notifier: rdb, channels: map[string]int{}}
	s, _ := testService(t, rdb, nil, func(o *Options) { o.Notifier = n })

	sub := rdb.Subscribe(ctx, backChannel)
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil { // the subscription confirmed
		t.Fatal(err)
	}
	heard := sub.Channel()

	skus := make([]stock.SKU, 3)
	for i := range skus {
		skus[i] = stock.MustSKU("notices", fmt.Sprintf("t%d", i))
	}
	gate, blocked := make(chan struct{}), make(chan struct{})
	n.mu.Lock()
	n.gate, n.blocked = gate, blocked
	n.mu.Unlock()
	s.notifyBack(ctx, skus[0])
	<-blocked // the first notice's publish is under way, and held

	var wg sync.WaitGroup
	var returned atomic.Int64
	for i := range 300 {
		wg.Go(func() {
			s.notifyBack(ctx, skus[i%len(skus)])
			returned.Add(1)
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }() // owned by the test: the calls return or it fails
	select {
	case <-done:
	case <-time.After(time.Minute): // a fail-safe: the calls return at once when right
		t.Fatalf("%d of 300 give-backs' notices returned while a publish was held: they wait for it", returned.Load())
	}
	close(gate)

	want := map[string]bool{}
	for _, sku := range skus {
		want[sku.String()] = true
	}
	deadline := time.After(time.Minute) // a fail-safe: the notices come at once
	for len(want) > 0 {
		select {
		case m := <-heard:
			delete(want, m.Payload)
		case <-deadline:
			t.Fatalf("no back notice heard for %v", want)
		}
	}
	s.backs.wg.Wait() // the publisher ends once none is due
	// The held one, then one per SKU for the 300 marked meanwhile.
	if got := n.count(backChannel); got != 1+len(skus) {
		t.Fatalf("%d back notices published for 301 give-backs of %d SKUs, want %d", got, len(skus), 1+len(skus))
	}
}

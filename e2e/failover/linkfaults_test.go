package failover_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
)

// TestFaultLinksMisbehave: the links of a replica to its SKU's Redis
// master and to PostgreSQL, each in turn slowed (5, 50 and 500 ms each
// way), throttled to a trickle, or resetting every connection that
// carries a byte, for a spell of 2 s each while 12 buyers buy on. Every
// purchase is answered 201, or 503 with Retry-After, never another
// status, within the work timeout (and a margin for a busy machine);
// each 503 sent again with its key once the link is healed is sold
// exactly once; afterwards the ledger, Redis and the answers agree. The
// silent link (a black hole) has tests of its own, which also count the
// goroutines left (TestFaultRedisMasterLinkBlackHole,
// TestFaultLedgerLinkBlackHole), as has a COMMIT reply lost; here a slow
// link rightly leaves the ledger's pool with more connections (and the
// proxy with their goroutines) until they idle out.
func TestFaultLinksMisbehave(t *testing.T) {
	systest.FullTier(t)
	c, sku, _, redisLink, dial := linkedMaster(t)
	pgLink, dsn := systest.LedgerLink(t, systest.LedgerDSN(t, ledger.Postgres))
	const work = 1500 * time.Millisecond
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Cluster: c, Dialer: dial, Drift: true,
		Tune: func(o *app.Options) { o.Sale.WorkTimeout = work }})
	const total = 100000
	e.PutSKU(t, sku, total, 1, 4)
	buy := func(key string) systest.Reply { return e.Buy(t, sku, key, "b", 1) }
	if got := systest.BuyAll(40, 8, func(i int) systest.Reply { return buy(fmt.Sprintf("before-%d", i)) }); got[http.StatusCreated] != 40 {
		t.Fatalf("before the faults: %v", got)
	}

	sold := 40
	for i, f := range []struct {
		name  string
		link  *systest.Link
		fault func(l *systest.Link)
	}{
		{"redis +5ms", redisLink, func(l *systest.Link) { l.Latency(t, 5*time.Millisecond) }},
		{"redis +50ms", redisLink, func(l *systest.Link) { l.Latency(t, 50*time.Millisecond) }},
		{"redis +500ms", redisLink, func(l *systest.Link) { l.Latency(t, 500*time.Millisecond) }},
		{"redis 8KB/s", redisLink, func(l *systest.Link) { l.Bandwidth(t, 8) }},
		{"redis resets", redisLink, func(l *systest.Link) { l.Reset(t) }},
		{"postgres +5ms", pgLink, func(l *systest.Link) { l.Latency(t, 5*time.Millisecond) }},
		{"postgres +50ms", pgLink, func(l *systest.Link) { l.Latency(t, 50*time.Millisecond) }},
		{"postgres 64KB/s", pgLink, func(l *systest.Link) { l.Bandwidth(t, 64) }},
		{"postgres resets", pgLink, func(l *systest.Link) { l.Reset(t) }},
	} {
		f.fault(f.link)
		counts, refused, slowest, bad := buySpell(t, buy, fmt.Sprintf("f%d", i), 12, 2*time.Second)
		f.link.Heal(t)
		t.Logf("%s for 2 s: %v, the slowest answered in %v", f.name, counts, slowest.Round(time.Millisecond))
		if len(bad) > 0 {
			t.Errorf("%s: %d answers neither 201 nor 503 with Retry-After: %v", f.name, len(bad), bad[:min(len(bad), 5)])
		}
		// The work timeout bounds every answer; 3 s more for a busy machine.
		if slowest > work+3*time.Second {
			t.Errorf("%s: an answer took %v with the work timeout at %v", f.name, slowest, work)
		}
		for _, key := range refused {
			if r, _ := e.Retried(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", key, `{"buyer":"b","quantity":1}`); r.Status != http.StatusCreated {
				t.Errorf("%s: %s sent again after the link healed = %d %s", f.name, key, r.Status, r.Body)
			}
		}
		sold += counts[http.StatusCreated] + len(refused)
	}

	systest.WaitSettled(t, e, sku)
	got := e.State(t, sku)
	if got.Orders != got.Sold || got.OrderUnits != got.Sold || got.Sold != int64(sold) {
		t.Errorf("ledger %+v after %d purchases answered 201 (first or sent again)", got, sold)
	}
	systest.RedisConsistent(t, e, sku)
}

// buySpell has buyers buy one unit each, again and again, for d (the
// time under test: a fault's spell), under keys prefixed spell. It
// returns the answers by status, the keys answered 503 with Retry-After,
// the slowest answer, and the answers neither 201 nor such a 503.
func buySpell(t *testing.T, buy func(key string) systest.Reply, spell string, buyers int, d time.Duration) (counts map[int]int, refused []string, slowest time.Duration, bad []string) {
	t.Helper()
	var mu sync.Mutex
	counts = map[int]int{}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range buyers {
		wg.Go(func() {
			for i := 0; time.Now().Before(end); i++ {
				key := fmt.Sprintf("%s-%d-%d", spell, w, i)
				began := time.Now()
				r := buy(key)
				took := time.Since(began)
				mu.Lock()
				counts[r.Status]++
				slowest = max(slowest, took)
				switch {
				case r.Status == http.StatusCreated:
				case r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") != "":
					refused = append(refused, key)
				default:
					bad = append(bad, fmt.Sprintf("%s: %d %s", key, r.Status, r.Body))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return counts, refused, slowest, bad
}

package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/cluster"
	"github.com/stockgate/stockgate/gateway"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

func TestMain(m *testing.M) {
	if os.Getenv("STOCKGATE_TEST_HELPER") == "reseed-holder" {
		os.Exit(reseedHolder())
	}
	os.Exit(testenv.Main(m))
}

// env is one gateway on a real Redis Cluster (the shared one unless the
// test brings its own) and a real ledger.
type env struct {
	seats  *seats.Store
	url    string
	srv    *sale.Service // the flows, for tests that reach past HTTP
	http   *gateway.Server
	ledger *ledger.Ledger
	gate   *shard.Store
	rdb    *redis.ClusterClient // the test's own client (see startEnv)
	// guarded is the gateway's client: every command through its node's
	// breaker.
	guarded *redis.ClusterClient
	reg     *prometheus.Registry
	client  *http.Client
	// kill stops the replica at once: its server, its loops (a relay
	// with KeepLeases leaves its leases to lapse, as a crash does), its
	// connections.
	kill func()
}

type envOptions struct {
	driver  string
	dsn     string           // an existing ledger (several gateways share it); default a fresh one
	cluster *testenv.Cluster // default the shared cluster
	dialer  func(ctx context.Context, network, addr string) (net.Conn, error)
	drift   bool // run the drift check
	sweep   bool // run the hold sweeper
	relay   bool // run the outbox relay (configure its sinks with tune)
	pacer   bool // run the waiting rooms' pacer
	tune    func(*app.Options)
}

func newEnv(t *testing.T, driver string) *env { return startEnv(t, envOptions{driver: driver}) }

// ledgerDSN is a fresh ledger of the driver, for replicas to share.
func ledgerDSN(t *testing.T, driver string) string {
	if driver == ledger.Postgres {
		return testenv.PostgresURL(t)
	}
	return testenv.SQLitePath(t)
}

func startEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	if o.cluster == nil {
		o.cluster = testenv.SharedCluster(t)
	}
	if o.dsn == "" {
		o.dsn = ledgerDSN(t, o.driver)
	}
	opts := app.Options{
		Redis:  cluster.Options{Addrs: o.cluster.Addrs(), Dialer: o.dialer},
		Ledger: ledger.Options{Driver: o.driver, DSN: o.dsn},
		Lock:   lock.Options{TTL: time.Second, CallTimeout: 300 * time.Millisecond},
		Sale:   sale.Options{DriftEvery: 200 * time.Millisecond},
		Logger: testLogger(t),
	}
	if o.tune != nil {
		o.tune(&opts)
	}
	a, err := app.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	a.Start(app.Loops{Drift: o.drift, Sweep: o.sweep, Notices: true, Relay: o.relay, Pacer: o.pacer})
	a.Server.SetReady(true)
	hs := httptest.NewServer(a.Server.Handler())
	t.Cleanup(hs.Close)
	tr := &http.Transport{MaxIdleConnsPerHost: 256}
	t.Cleanup(tr.CloseIdleConnections)
	// The test's own Redis client, for what it reads and pokes: it goes
	// through none of the gateway's breakers (nor trips them), and drops
	// no replies.
	probe, err := cluster.New(cluster.Options{Addrs: opts.Redis.Addrs, TLS: opts.Redis.TLS, Username: opts.Redis.Username, Password: opts.Redis.Password})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { probe.Close() })
	gate, err := shard.New(shard.Options{Redis: probe})
	if err != nil {
		t.Fatal(err)
	}
	seatStore, err := seats.New(probe)
	if err != nil {
		t.Fatal(err)
	}
	return &env{seats: seatStore, url: hs.URL, srv: a.Sale, http: a.Server, ledger: a.Ledger, gate: gate, rdb: probe, guarded: a.Redis,
		reg: a.Registry, client: &http.Client{Transport: tr}, kill: func() { hs.CloseClientConnections(); hs.Close(); a.Close() }}
}

// testLogger shows the gateway's warnings and errors in the test's log
// when STOCKGATE_TEST_LOG is set, and discards them otherwise.
func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("STOCKGATE_TEST_LOG") == "" {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tlogWriter struct{ t *testing.T }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func eachDriver(t *testing.T, f func(t *testing.T, driver string)) {
	for _, d := range []string{ledger.SQLite, ledger.Postgres} {
		t.Run(d, func(t *testing.T) { f(t, d) })
	}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (e *env) do(t *testing.T, method, path string, header map[string]string, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		t.Error(err)
		return reply{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := reply{resp.StatusCode, resp.Header, b}
	checkContract(t, method, path, r)
	return r
}

func (e *env) putSKU(t *testing.T, sku stock.SKU, total int64, shards int, maxPerOrder int64) {
	t.Helper()
	// A 503 (the ledger has it, Redis is not seeded yet: a Redis call
	// timed out on a busy machine) is retried, as an operator would.
	var r reply
	waitFor(t, 10*time.Second, "PUT sku answered", func() bool {
		r = e.do(t, http.MethodPut, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String(), nil,
			fmt.Sprintf(`{"total":%d,"shards":%d,"max_per_order":%d}`, total, shards, maxPerOrder))
		return r.status != http.StatusServiceUnavailable
	})
	if r.status != http.StatusOK {
		t.Fatalf("PUT sku = %d %s", r.status, r.body)
	}
}

// putCapped creates or changes a SKU of 100 units, up to 4 per order and
// perBuyer per buyer.
func (e *env) putCapped(t *testing.T, sku stock.SKU, shards int, perBuyer int64) {
	t.Helper()
	r := e.do(t, http.MethodPut, adminPath(sku), nil,
		fmt.Sprintf(`{"total":100,"shards":%d,"max_per_order":4,"per_buyer":%d}`, shards, perBuyer))
	if r.status != http.StatusOK {
		t.Fatalf("PUT sku = %d %s", r.status, r.body)
	}
}

// mustBuy is buy for a purchase the test needs: anything but 201 ends it.
func (e *env) mustBuy(t *testing.T, sku stock.SKU, key, buyer string, q int64) reply {
	t.Helper()
	r := e.buy(t, sku, key, buyer, q)
	if r.status != http.StatusCreated {
		t.Fatalf("purchase %s = %d %s", key, r.status, r.body)
	}
	return r
}

func (e *env) buy(t *testing.T, sku stock.SKU, key, buyer string, q int64) reply {
	return e.do(t, http.MethodPost, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/purchases",
		map[string]string{"Idempotency-Key": key}, fmt.Sprintf(`{"buyer":%q,"quantity":%d}`, buyer, q))
}

// buyAll sends n purchases from `workers` concurrent clients; buy(i) makes
// the i-th. It returns the count of each status.
func (e *env) buyAll(n, workers int, buy func(i int) reply) map[int]int {
	counts := make(map[int]int)
	var mu sync.Mutex
	var wg sync.WaitGroup
	work := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range work {
				r := buy(i)
				mu.Lock()
				counts[r.status]++
				mu.Unlock()
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	return counts
}

// state is everything a purchase could have changed.
type state struct {
	Sold, Held, Version, Orders, OrderUnits, RedisRemaining int64
}

func (e *env) state(t *testing.T, sku stock.SKU) state {
	t.Helper()
	ctx := context.Background()
	st, err := e.ledger.SKU(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	orders, units, err := e.ledger.OrderTotals(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	left, _, err := e.gate.Remaining(ctx, sku, st.Shards)
	if err != nil {
		t.Fatal(err)
	}
	return state{st.Sold, st.Held, st.Version, orders, units, left}
}

// orderOf is the order the request (buyer, key) committed, as the ledger
// has it now; ledger.ErrNotFound when the request committed nothing.
func orderOf(ctx context.Context, l *ledger.Ledger, buyer, key string) (ledger.Order, error) {
	rec, err := l.RequestByKey(ctx, keys.MustID(buyer), keys.MustID(key))
	if err != nil {
		return ledger.Order{}, err
	}
	if rec.Order == nil {
		return ledger.Order{}, fmt.Errorf("request %s/%s answered a %s, not an order", buyer, key, rec.Op)
	}
	return l.OrderByID(ctx, rec.Order.ID)
}

// holdOf is the hold the request (buyer, key) created, as the ledger has
// it now.
func holdOf(ctx context.Context, l *ledger.Ledger, buyer, key string) (ledger.Hold, error) {
	rec, err := l.RequestByKey(ctx, keys.MustID(buyer), keys.MustID(key))
	if err != nil {
		return ledger.Hold{}, err
	}
	if rec.Hold == nil {
		return ledger.Hold{}, fmt.Errorf("request %s/%s answered a %s, not a hold", buyer, key, rec.Op)
	}
	return l.HoldByID(ctx, rec.Hold.ID)
}

// epoch is the SKU's gate epoch in the ledger: a test that writes Redis
// behind the gateway's back writes at it, as a rebuild would.
func (e *env) epoch(t *testing.T, sku stock.SKU) int64 {
	t.Helper()
	st, err := e.ledger.SKU(context.Background(), sku)
	if err != nil {
		t.Fatal(err)
	}
	return st.GateEpoch
}

func newSKU(t *testing.T) stock.SKU {
	return stock.SKU{Program: keys.MustID(testenv.ID(t, "p")), Ticket: keys.MustID("ga")}
}

// TestFlashSale: 2,000 concurrent buyers of one ticket each, stock 100.
func TestFlashSale(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		for _, shards := range []int{1, 8} {
			t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
				e := newEnv(t, driver)
				sku := newSKU(t)
				e.putSKU(t, sku, 100, shards, 4)
				counts := e.buyAll(2000, 200, func(i int) reply {
					return e.buy(t, sku, fmt.Sprintf("flash-%d", i), fmt.Sprintf("buyer-%d", i), 1)
				})
				got := e.state(t, sku)
				t.Logf("%s shards=%d: answers %v; ledger orders %d sold %d; redis remaining %d",
					driver, shards, counts, got.Orders, got.Sold, got.RedisRemaining)
				if counts[201] != 100 || counts[409] != 1900 || len(counts) != 2 {
					t.Errorf("answers = %v, want 100×201 and 1900×409", counts)
				}
				if got.Orders != 100 || got.Sold != 100 || got.OrderUnits != 100 || got.RedisRemaining != 0 {
					t.Errorf("state = %+v, want 100 orders, sold 100, redis remaining 0", got)
				}
			})
		}
	})
}

// TestMixedQuantities: q in 1..4 racing for 50 units over 8 shards.
func TestMixedQuantities(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver)
		sku := newSKU(t)
		e.putSKU(t, sku, 50, 8, 4)
		var mu sync.Mutex
		var units int64
		var created []string
		var wg sync.WaitGroup
		for i := range 300 {
			wg.Go(func() {
				key := fmt.Sprintf("mixed-%d", i)
				q := int64(i%4 + 1)
				r := e.buy(t, sku, key, "b", q)
				switch r.status {
				case 201:
					var o struct {
						OrderID  string `json:"order_id"`
						Quantity int64  `json:"quantity"`
					}
					if err := json.Unmarshal(r.body, &o); err != nil || o.Quantity != q {
						t.Errorf("201 body %s: %v", r.body, err)
					}
					mu.Lock()
					units += q
					created = append(created, key)
					mu.Unlock()
				case 409:
				default:
					t.Errorf("purchase = %d %s", r.status, r.body)
				}
			})
		}
		wg.Wait()
		got := e.state(t, sku)
		if got.Sold > 50 || got.Sold != units || got.OrderUnits != units {
			t.Errorf("sold %d, order units %d, acknowledged units %d; want equal and <= 50", got.Sold, got.OrderUnits, units)
		}
		if got.Sold+got.RedisRemaining != 50 {
			t.Errorf("sold %d + redis remaining %d != 50", got.Sold, got.RedisRemaining)
		}
		for _, key := range created {
			if _, err := orderOf(context.Background(), e.ledger, "b", key); err != nil {
				t.Errorf("201 for key %s but no order row: %v", key, err)
			}
		}
		t.Logf("%s: %d units sold in %d orders, redis remaining %d", driver, units, len(created), got.RedisRemaining)
	})
}

// TestSameKeyConcurrently: 20 copies of one request at once.
func TestSameKeyConcurrently(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver)
		sku := newSKU(t)
		e.putSKU(t, sku, 10, 2, 4)
		replies := make([]reply, 20)
		var wg sync.WaitGroup
		for i := range replies {
			wg.Go(func() { replies[i] = e.buy(t, sku, "same-key", "alice", 3) })
		}
		wg.Wait()
		var first []byte
		for i, r := range replies {
			if r.status != 201 {
				t.Fatalf("copy %d = %d %s, want 201", i, r.status, r.body)
			}
			if first == nil {
				first = r.body
			}
			if diff := cmp.Diff(string(first), string(r.body)); diff != "" {
				t.Errorf("copy %d differs (-first +this):\n%s", i, diff)
			}
		}
		// A later retry replays the stored answer.
		r := e.buy(t, sku, "same-key", "alice", 3)
		if r.status != 201 || !bytes.Equal(r.body, first) || r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry = %d %s (replayed %q), want the first answer", r.status, r.body, r.header.Get("Idempotent-Replayed"))
		}
		// The same key for a different request is refused and moves nothing.
		before := e.state(t, sku)
		if r := e.buy(t, sku, "same-key", "alice", 2); r.status != 422 {
			t.Errorf("reused key = %d %s, want 422", r.status, r.body)
		}
		got := e.state(t, sku)
		if got != before || got.Sold != 3 || got.Orders != 1 || got.RedisRemaining != 7 {
			t.Errorf("state = %+v, want one order of 3 and redis remaining 7 (before %+v)", got, before)
		}
	})
}

// TestBadInput: every malformed request is a 4xx problem+json that changes
// nothing in Redis or the ledger.
func TestBadInput(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver)
		sku := newSKU(t)
		e.putSKU(t, sku, 20, 4, 4)
		base := "/v1/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/purchases"
		key := map[string]string{"Idempotency-Key": "k-1"}
		long := strings.Repeat("x", 65)
		tests := []struct {
			name   string
			path   string
			header map[string]string
			body   string
			want   int
		}{
			{"program with {", "/v1/skus/a%7Bb/ga/purchases", key, `{"buyer":"b","quantity":1}`, 400},
			{"program with }", "/v1/skus/a%7Db/ga/purchases", key, `{"buyer":"b","quantity":1}`, 400},
			{"program with space", "/v1/skus/a%20b/ga/purchases", key, `{"buyer":"b","quantity":1}`, 400},
			{"program of 65", "/v1/skus/" + long + "/ga/purchases", key, `{"buyer":"b","quantity":1}`, 400},
			{"empty ticket", "/v1/skus/" + sku.Program.String() + "//purchases", key, `{"buyer":"b","quantity":1}`, 400},
			{"buyer with {", base, key, `{"buyer":"{b}","quantity":1}`, 422},
			{"buyer of 65", base, key, `{"buyer":"` + long + `","quantity":1}`, 422},
			{"empty buyer", base, key, `{"buyer":"","quantity":1}`, 422},
			{"key with space", base, map[string]string{"Idempotency-Key": "a b"}, `{"buyer":"b","quantity":1}`, 400},
			{"key of 65", base, map[string]string{"Idempotency-Key": long}, `{"buyer":"b","quantity":1}`, 400},
			{"no key", base, nil, `{"buyer":"b","quantity":1}`, 400},
			{"q=0", base, key, `{"buyer":"b","quantity":0}`, 422},
			{"q=-1", base, key, `{"buyer":"b","quantity":-1}`, 422},
			{"q=1.5", base, key, `{"buyer":"b","quantity":1.5}`, 422},
			{`q="1"`, base, key, `{"buyer":"b","quantity":"1"}`, 422},
			{"q=1e3", base, key, `{"buyer":"b","quantity":1e3}`, 422},
			{"q=1000 over max", base, key, `{"buyer":"b","quantity":1000}`, 422},
			{"q=5 over max 4", base, key, `{"buyer":"b","quantity":5}`, 422},
			{"q=2^63", base, key, `{"buyer":"b","quantity":9223372036854775808}`, 422},
			{"q missing", base, key, `{"buyer":"b"}`, 422},
			{"malformed JSON", base, key, `{"buyer":"b","quantity":1`, 400},
			{"unknown field", base, key, `{"buyer":"b","quantity":1,"price":0}`, 400},
			{"two objects", base, key, `{"buyer":"b","quantity":1}{"buyer":"b","quantity":1}`, 400},
			{"not JSON", base, key, `quantity=1`, 400},
			{"body over limit", base, key, `{"buyer":"b","quantity":1,"pad":"` + strings.Repeat("x", 5000) + `"}`, 413},
			{"valid object then padding over limit", base, key, `{"buyer":"b","quantity":1}` + strings.Repeat(" ", 5000), 413},
			{"unknown sku", "/v1/skus/" + sku.Program.String() + "/nope/purchases", key, `{"buyer":"b","quantity":1}`, 404},
		}
		for _, tt := range tests {
			before := e.state(t, sku)
			r := e.do(t, http.MethodPost, tt.path, tt.header, tt.body)
			if r.status != tt.want {
				t.Errorf("%s: status %d %s, want %d", tt.name, r.status, r.body, tt.want)
				continue
			}
			var p gateway.Problem
			if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("%s: Content-Type %q, want application/problem+json", tt.name, ct)
			}
			if err := json.Unmarshal(r.body, &p); err != nil || p.Status != tt.want || p.Type == "" || p.Title == "" {
				t.Errorf("%s: problem body %s: %v", tt.name, r.body, err)
			}
			if got := e.state(t, sku); got != before {
				t.Errorf("%s: state changed from %+v to %+v", tt.name, before, got)
			}
		}
		// The key used by every refused request above is still free: a good
		// request with it succeeds, so none of them left a record behind.
		if r := e.buy(t, sku, "k-1", "b", 1); r.status != 201 {
			t.Errorf("purchase after bad inputs = %d %s, want 201", r.status, r.body)
		}
	})
}

func TestAdminValidation(t *testing.T) {
	e := newEnv(t, ledger.SQLite)
	sku := newSKU(t)
	path := "/v1/admin/skus/" + sku.Program.String() + "/" + sku.Ticket.String()
	for _, body := range []string{`{"total":-1}`, `{"total":10,"shards":0}`, `{"total":10,"shards":257}`,
		`{"total":10,"max_per_order":0}`, `{}`, `{"total":1.5}`, `[`} {
		if r := e.do(t, http.MethodPut, path, nil, body); r.status < 400 || r.status >= 500 {
			t.Errorf("PUT %s = %d %s, want 4xx", body, r.status, r.body)
		}
	}
	if r := e.do(t, http.MethodGet, path, nil, ""); r.status != 404 {
		t.Errorf("GET after refused PUTs = %d, want 404 (nothing created)", r.status)
	}
	e.putSKU(t, sku, 5, 1, 4)
	e.mustBuy(t, sku, "a1", "b", 3)
	if r := e.do(t, http.MethodPut, path, nil, `{"total":2}`); r.status != 409 {
		t.Errorf("PUT total below sold = %d %s, want 409", r.status, r.body)
	}
	// Restock: the new units are buyable at once.
	e.putSKU(t, sku, 10, 2, 4)
	if got := e.state(t, sku); got.RedisRemaining != 7 || got.Sold != 3 {
		t.Errorf("after restock state = %+v, want redis remaining 7, sold 3", got)
	}
}

func TestStockRead(t *testing.T) {
	e := newEnv(t, ledger.SQLite)
	sku := newSKU(t)
	e.putSKU(t, sku, 12, 3, 4)
	r := e.do(t, http.MethodGet, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/stock", nil, "")
	var v struct {
		Remaining int64 `json:"remaining"`
		SoldOut   bool  `json:"sold_out"`
	}
	if r.status != 200 || json.Unmarshal(r.body, &v) != nil || v.Remaining != 12 || v.SoldOut {
		t.Errorf("GET stock = %d %s, want remaining 12", r.status, r.body)
	}
	if r := e.do(t, http.MethodGet, "/v1/skus/"+sku.Program.String()+"/nope/stock", nil, ""); r.status != 404 {
		t.Errorf("GET stock of unknown sku = %d, want 404", r.status)
	}
	if r := e.do(t, http.MethodGet, "/livez", nil, ""); r.status != 200 {
		t.Errorf("livez = %d", r.status)
	}
	if r := e.do(t, http.MethodGet, "/readyz", nil, ""); r.status != 200 {
		t.Errorf("readyz = %d", r.status)
	}
}

func (e *env) seatStore(t *testing.T) *seats.Store { return e.seats }

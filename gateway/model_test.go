package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// TestModel runs seeded random sequences of purchases, holds, confirms,
// cancels, refunds, retries (same key on any replica, the key with another
// request), reconciles, restocks, resizes, the end of a sale, hold expiry
// and the loss of everything in Redis, over 3 gateway replicas on one
// ledger, and checks each answer and the ledger against a reference model
// after every step: sold + held <= total, every 2xx in the ledger, one
// movement per request, the same answer for a retry, 422 for a reused key,
// Redis remaining = ledger remaining once settled, and no "sold out" while
// the ledger has the quantity for longer than a bound.
//
// A failure names its seed; STOCKGATE_MODEL_SEED=<seed> replays it, and
// STOCKGATE_MODEL_STEPS sets the steps per ledger (default 1000).
func TestModel(t *testing.T) {
	steps := 1000
	if v, err := strconv.Atoi(os.Getenv("STOCKGATE_MODEL_STEPS")); err == nil && v > 0 {
		steps = v
	}
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("STOCKGATE_MODEL_SEED"), 10, 64); err == nil {
		seed = v
	}
	eachDriver(t, func(t *testing.T, driver string) {
		t.Logf("seed %d: STOCKGATE_MODEL_SEED=%d go test -run 'TestModel/%s' ./gateway reproduces it", seed, seed, driver)
		m := newModel(t, driver, seed)
		for i := range steps {
			m.step = i
			m.settleExpiries()
			m.do()
			m.checkLedger()
			if i%100 == 99 {
				m.checkRedis()
			}
		}
		m.checkRedis()
		t.Logf("%d steps: %v; longest false sold-out %v; longest stale-flag retry %v", steps, m.ops,
			m.falseSoldOut.Round(time.Millisecond), m.staleRetry.Round(time.Millisecond))
	})
}

// falseSoldOutBound is how long a 409 sold-out may last while the ledger
// has the quantity (a replica's sold-out flag outliving a return made on
// another replica: the flag's TTL, re-checked once per period).
const falseSoldOutBound = 3 * time.Second

type sim struct {
	t            *testing.T
	rng          *rand.Rand
	seed         uint64
	step         int
	envs         []*env
	redis        *testenv.Cluster
	skus         []*mSKU
	holds        []*mHold
	orders       []*mOrder
	done         []mRequest // committed requests, for retries
	keys         int
	ended        bool
	flushed      bool
	ops          map[string]int
	falseSoldOut time.Duration
	staleRetry   time.Duration
}

type mSKU struct {
	sku               stock.SKU
	total, sold, held int64
	shards            int
	ended             bool
}

type mHold struct {
	id      string
	sku     *mSKU
	buyer   string
	q       int64
	state   string
	expires time.Time
}

type mOrder struct {
	id       string
	sku      *mSKU
	buyer    string
	q        int64
	refunded bool
}

// mRequest is a committed request and the answer it got.
type mRequest struct {
	path, key, body string
	buyer           string
	status          int
	id              string // order or hold id in the answer
}

func newModel(t *testing.T, driver string, seed uint64) *sim {
	c := testenv.NewCluster(t, testenv.ClusterOptions{})
	dsn := ledgerDSN(t, driver)
	m := &sim{t: t, rng: rand.New(rand.NewPCG(seed, 13)), seed: seed, redis: c, ops: map[string]int{}}
	for range 3 {
		m.envs = append(m.envs, startEnv(t, envOptions{driver: driver, dsn: dsn, cluster: c, sweep: true,
			tune: func(o *app.Options) {
				o.Sale.SweepEvery = 50 * time.Millisecond
				o.Sale.RestoreGrace = 200 * time.Millisecond
			}}))
	}
	for i := range 3 {
		s := &mSKU{sku: stock.SKU{Program: keys.MustID(testenv.ID(t, "m")), Ticket: keys.MustID(fmt.Sprintf("t%d", i))}, total: int64(5 + 10*i), shards: 1 + i}
		m.envs[0].putSKU(t, s.sku, s.total, s.shards, 4)
		m.skus = append(m.skus, s)
	}
	return m
}

func (m *sim) fail(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("seed %d step %d: %s", m.seed, m.step, fmt.Sprintf(format, args...))
}

func (m *sim) env() *env { return m.envs[m.rng.IntN(len(m.envs))] }

func (m *sim) newKey() string {
	m.keys++
	return fmt.Sprintf("k%d", m.keys)
}

func (m *sim) buyer() string { return fmt.Sprintf("buyer%d", m.rng.IntN(4)) }

func (s *mSKU) left() int64 { return s.total - s.sold - s.held }

// do runs one random operation.
func (m *sim) do() {
	r := m.rng.IntN(100)
	switch {
	case r < 28:
		m.take(false)
	case r < 42:
		m.take(true)
	case r < 50:
		m.confirm()
	case r < 56:
		m.cancel()
	case r < 62:
		m.refund()
	case r < 76:
		m.retry()
	case r < 81:
		m.reuse()
	case r < 85:
		m.admin("reconcile")
	case r < 89:
		m.admin("restock")
	case r < 92:
		m.admin("resize")
	case r < 93 && m.step > 600 && !m.ended:
		m.admin("end")
	case r < 94 && !m.flushed:
		m.flushRedis()
	default:
		m.take(false)
	}
}

func (m *sim) take(hold bool) {
	s := m.skus[m.rng.IntN(len(m.skus))]
	buyer, key, q := m.buyer(), m.newKey(), int64(1+m.rng.IntN(3))
	path, body, op := skuPath(s.sku)+"/purchases", fmt.Sprintf(`{"buyer":%q,"quantity":%d}`, buyer, q), "purchase"
	short := false
	if hold {
		ttl := 900
		if short = m.rng.IntN(4) == 0; short {
			ttl = 1
		}
		path, body, op = skuPath(s.sku)+"/holds", fmt.Sprintf(`{"buyer":%q,"quantity":%d,"ttl_seconds":%d}`, buyer, q, ttl), "hold"
	}
	m.ops[op]++
	e := m.env()
	start := time.Now()
	for {
		r := e.do(m.t, http.MethodPost, path, map[string]string{"Idempotency-Key": key}, body)
		want := 201
		kind := ""
		switch {
		case s.ended:
			want, kind = 409, "sale-ended"
		case s.left() < q:
			want, kind = 409, "sold-out"
		}
		if r.status == 409 && problemKind(r) == "sold-out" && want == 201 {
			// A stale sold-out flag on this replica: bounded, then sold.
			if time.Since(start) > falseSoldOutBound {
				m.fail("%s %s q %d: 409 sold-out for %v while the model has %d left", op, s.sku, q, time.Since(start), s.left())
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		m.falseSoldOut = max(m.falseSoldOut, time.Since(start))
		if s.ended && problemKind(r) == "sold-out" {
			// The end rebuilt the gate at 0 at once; a replica's settings
			// learn of the end within SettingsTTL. Either way a 409.
			kind = "sold-out"
		}
		if r.status != want || (kind != "" && problemKind(r) != kind) {
			m.fail("%s %s q %d (left %d, ended %v) = %d %s, want %d %s", op, s.sku, q, s.left(), s.ended, r.status, r.body, want, kind)
		}
		if want != 201 {
			return
		}
		id := orderID(r)
		if hold {
			var h holdReply
			_ = json.Unmarshal(r.body, &h)
			id = h.HoldID
			s.held += q
			m.holds = append(m.holds, &mHold{id: id, sku: s, buyer: buyer, q: q, state: "held", expires: h.ExpiresAt})
			_ = short
		} else {
			s.sold += q
			m.orders = append(m.orders, &mOrder{id: id, sku: s, buyer: buyer, q: q})
		}
		m.done = append(m.done, mRequest{path: path, key: key, body: body, buyer: buyer, status: 201, id: id})
		return
	}
}

func problemKind(r reply) string {
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(r.body, &p)
	for i := len(p.Type) - 1; i >= 0; i-- {
		if p.Type[i] == '/' {
			return p.Type[i+1:]
		}
	}
	return p.Type
}

// liveHold picks a held hold not close to its expiry (a confirm racing
// the sweeper is another test's subject).
func (m *sim) liveHold() *mHold {
	var live []*mHold
	for _, h := range m.holds {
		if h.state == "held" && time.Until(h.expires) > 800*time.Millisecond {
			live = append(live, h)
		}
	}
	if len(live) == 0 {
		return nil
	}
	return live[m.rng.IntN(len(live))]
}

func (m *sim) act(path, buyer string, want int) reply {
	key := m.newKey()
	body := fmt.Sprintf(`{"buyer":%q}`, buyer)
	r := m.env().do(m.t, http.MethodPost, path, map[string]string{"Idempotency-Key": key}, body)
	if r.status != want {
		m.fail("POST %s = %d %s, want %d", path, r.status, r.body, want)
	}
	id := orderID(r)
	if id == "" || want == 200 && path[len(path)-6:] == "cancel" {
		var h holdReply
		_ = json.Unmarshal(r.body, &h)
		id = h.HoldID
	}
	m.done = append(m.done, mRequest{path: path, key: key, body: body, buyer: buyer, status: want, id: id})
	return r
}

func (m *sim) confirm() {
	h := m.liveHold()
	if h == nil {
		return
	}
	m.ops["confirm"]++
	r := m.act("/v1/holds/"+h.id+"/confirm", h.buyer, 201)
	h.state = "confirmed"
	h.sku.held -= h.q
	h.sku.sold += h.q
	m.orders = append(m.orders, &mOrder{id: orderID(r), sku: h.sku, buyer: h.buyer, q: h.q})
}

func (m *sim) cancel() {
	h := m.liveHold()
	if h == nil {
		return
	}
	m.ops["cancel"]++
	m.act("/v1/holds/"+h.id+"/cancel", h.buyer, 200)
	h.state = "cancelled"
	h.sku.held -= h.q
}

func (m *sim) refund() {
	var live []*mOrder
	for _, o := range m.orders {
		if !o.refunded {
			live = append(live, o)
		}
	}
	if len(live) == 0 {
		return
	}
	o := live[m.rng.IntN(len(live))]
	m.ops["refund"]++
	m.act("/v1/orders/"+o.id+"/refund", o.buyer, 200)
	o.refunded = true
	o.sku.sold -= o.q
}

// retry re-sends a committed request to any replica: the same answer,
// replayed, and nothing moves.
func (m *sim) retry() {
	if len(m.done) == 0 {
		return
	}
	q := m.done[m.rng.IntN(len(m.done))]
	m.ops["retry"]++
	e := m.env()
	start := time.Now()
	r := e.do(m.t, http.MethodPost, q.path, map[string]string{"Idempotency-Key": q.key}, q.body)
	for r.status == 409 && problemKind(r) == "sold-out" && time.Since(start) < falseSoldOutBound {
		// A replica whose sold-out flag predates stock coming back (and
		// being sold again on another replica) answers from memory until
		// the flag's next re-check: bounded, and measured here.
		time.Sleep(20 * time.Millisecond)
		r = e.do(m.t, http.MethodPost, q.path, map[string]string{"Idempotency-Key": q.key}, q.body)
	}
	if d := time.Since(start); r.status == q.status && d > 5*time.Millisecond {
		m.ops["retry-stale-flag"]++
		m.staleRetry = max(m.staleRetry, d)
	}
	id := orderID(r)
	if id == "" {
		var h holdReply
		_ = json.Unmarshal(r.body, &h)
		id = h.HoldID
	}
	if r.status != q.status || id != q.id || r.header.Get("Idempotent-Replayed") != "true" {
		m.fail("retry of %s key %s = %d %s (replayed %q), want %d with %s replayed",
			q.path, q.key, r.status, r.body, r.header.Get("Idempotent-Replayed"), q.status, q.id)
	}
}

// reuse sends another request with a committed request's key and buyer:
// 422, and nothing moves (the ledger check after the step proves it).
func (m *sim) reuse() {
	if len(m.done) == 0 {
		return
	}
	q := m.done[m.rng.IntN(len(m.done))]
	s := m.skus[m.rng.IntN(len(m.skus))]
	m.ops["reuse"]++
	path, body := skuPath(s.sku)+"/purchases", fmt.Sprintf(`{"buyer":%q,"quantity":4}`, q.buyer)
	if q.path == path && q.body == body {
		return
	}
	if m.rng.IntN(2) == 0 {
		path, body = skuPath(s.sku)+"/holds", fmt.Sprintf(`{"buyer":%q,"quantity":4,"ttl_seconds":77}`, q.buyer)
	}
	r := m.env().do(m.t, http.MethodPost, path, map[string]string{"Idempotency-Key": q.key}, body)
	if r.status == 422 {
		return
	}
	// A SKU that takes no more requests (or that this replica's sold-out
	// flag says so of) answers its refusal from memory without a ledger
	// call; only its own committed keys are known there. The request moves
	// nothing either way (checked after the step).
	if r.status == 409 && (problemKind(r) == "sale-ended" || problemKind(r) == "sold-out") {
		m.ops["reuse-refused-closed"]++
		return
	}
	m.fail("reuse of key %s (first %s) for %s %s = %d %s, want 422", q.key, q.path, path, body, r.status, r.body)
}

func (m *sim) admin(what string) {
	s := m.skus[m.rng.IntN(len(m.skus))]
	m.ops[what]++
	e := m.env()
	switch what {
	case "reconcile":
		if r := e.do(m.t, http.MethodPost, adminPath(s.sku)+"/reconcile", nil, ""); r.status != 200 && r.status != 409 {
			m.fail("reconcile = %d %s", r.status, r.body)
		}
	case "restock":
		s.total += int64(1 + m.rng.IntN(4))
		e.putSKU(m.t, s.sku, s.total, s.shards, 4)
	case "resize":
		s.shards = 1 + m.rng.IntN(4)
		e.putSKU(m.t, s.sku, s.total, s.shards, 4)
	case "end":
		if r := e.do(m.t, http.MethodPost, adminPath(s.sku)+"/end", nil, ""); r.status != 200 {
			m.fail("end = %d %s", r.status, r.body)
		}
		s.ended, m.ended = true, true
	}
}

// flushRedis loses everything in Redis at once, as a restart without
// persistence does.
func (m *sim) flushRedis() {
	m.flushed = true
	m.ops["redis-lost"]++
	ctx := context.Background()
	for _, n := range m.redis.Nodes {
		cl := n.Client()
		if err := cl.FlushAll(ctx).Err(); err != nil {
			m.fail("FLUSHALL: %v", err)
		}
		cl.Close()
	}
}

// settleExpiries waits for the sweepers to expire holds past their time,
// and applies that to the model.
func (m *sim) settleExpiries() {
	ctx := context.Background()
	for _, h := range m.holds {
		if h.state != "held" || time.Now().Before(h.expires) {
			continue
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			got, err := m.envs[0].ledger.HoldByID(ctx, keys.MustID(h.id))
			if err != nil {
				m.fail("hold %s: %v", h.id, err)
			}
			if got.State == ledger.Expired {
				break
			}
			if time.Now().After(deadline) {
				m.fail("hold %s still %s 5s after its expiry", h.id, got.State)
			}
			time.Sleep(20 * time.Millisecond)
		}
		m.ops["expired"]++
		h.state = "expired"
		h.sku.held -= h.q
	}
}

// checkLedger compares the ledger with the model. A hold may expire
// between the model's accounting and the read: then account and read again.
func (m *sim) checkLedger() {
	ctx := context.Background()
	led := m.envs[0].ledger
	for _, s := range m.skus {
		for attempt := 0; ; attempt++ {
			st, err := led.SKU(ctx, s.sku)
			if err != nil {
				m.fail("ledger: %v", err)
			}
			if st.Sold+st.Held > st.Total {
				m.fail("OVERSOLD %s: sold %d + held %d > total %d", s.sku, st.Sold, st.Held, st.Total)
			}
			if st.Sold == s.sold && st.Held == s.held && st.Total == s.total {
				break
			}
			if attempt == 2 {
				m.fail("%s: ledger total %d sold %d held %d, model total %d sold %d held %d",
					s.sku, st.Total, st.Sold, st.Held, s.total, s.sold, s.held)
			}
			m.settleExpiries()
		}
	}
}

// checkRedis waits (bounded) for every SKU's Redis remaining to equal the
// ledger's: restores, expiries and rebuilds done.
func (m *sim) checkRedis() {
	ctx := context.Background()
	e := m.envs[0]
	for _, s := range m.skus {
		deadline := time.Now().Add(10 * time.Second)
		for {
			st, err := e.ledger.SKU(ctx, s.sku)
			if err != nil {
				m.fail("ledger: %v", err)
			}
			left, seeded, err := e.gate.Remaining(ctx, s.sku, st.Shards)
			want := st.Remaining()
			if !st.EndedAt.IsZero() {
				want = 0
			}
			if err == nil && seeded && left == want {
				break
			}
			if !seeded {
				// Lost with the rest of Redis and not asked for since: a
				// stock read rebuilds nothing, a reconcile does.
				e.do(m.t, http.MethodPost, adminPath(s.sku)+"/reconcile", nil, "")
			}
			if time.Now().After(deadline) {
				m.fail("%s: Redis remaining %d (seeded %v, %v), ledger remaining %d, 10s after the step", s.sku, left, seeded, err, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

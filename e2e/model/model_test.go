package model_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// TestModel runs seeded random sequences of purchases, holds, carts (bought
// or held, of 1 to 3 tickets of one program), confirms, cancels, refunds
// (of a hold or an order, of a whole cart or one of its lines), retries
// (same key on any replica, a cart's lines in another order, a refused
// cart evaluated again, one cart sent to two replicas at once), reused keys
// (another request, a cart with other lines), a cart line's hold confirmed
// or cancelled alone, cart actions in every state and by another buyer,
// per-buyer caps of a ticket and of the program (changed on the way),
// reconciles, restocks, resizes, the end of a sale, hold expiry and the
// loss of everything in Redis, over 3 gateway replicas on one ledger; and
// purchases and holds in a code-only presale pool of a ticket (its codes
// used up, given back by refunds, cancels and expiry; wrong codes; the
// pool closed while its orders still stand, its later returns moved on to
// the public pool by a sweeper); and a second program sold only through
// its waiting room (waitroom_test.go: joins, checks, and takes with the
// buyer's admission token, another's, a forged one or none). It
// checks each answer and the ledger against a reference model after every
// step: the status (and for a refusal its kind, and the cart line it
// names) of every answer, sold + held <= total, every 2xx in the ledger,
// one movement per request, a refused cart moves nothing, the same answer
// for a retry, 422 for a reused key, each buyer's counted units (a pool's
// counting toward its ticket's caps), each code's standing uses, each
// cart's holds and orders, Redis remaining = ledger remaining once
// settled, and no refusal the ledger's state does not justify (a stale
// sold-out flag or quota count) for longer than a bound.
//
// A failure names its seed; STOCKGATE_MODEL_SEED=<seed> replays its
// sequence (as far as timing lets it: which holds have expired steers the
// choices), STOCKGATE_MODEL_STEPS sets the steps per ledger (default
// 150, which keeps make test within its time on 2 cores beside
// TestModelConcurrent's 5,000 operations a shape, which covers every
// operation too; more find more),
// and STOCKGATE_MODEL_TRACE=1 logs every request and its answer.
func TestModel(t *testing.T) {
	systest.FullTier(t)
	t.Parallel() // its own cluster and ledgers: it overlaps the other long tests
	steps, seed := runOf(150, 1)
	systest.EachShape(t, func(t *testing.T, shape string) {
		t.Logf("seed %d: STOCKGATE_MODEL_SEED=%d go test -run 'TestModel/%s' ./e2e/model reproduces it", seed, seed, shape)
		m := newModel(t, shape, seed)
		for i := range steps {
			m.step = i
			m.settleExpiries(time.Now())
			m.settlePoolMoves()
			m.do()
			m.checkLedger()
			m.queueStepped()
			if i%10 == 9 {
				m.checkBuyers()
				m.checkLine()
				m.checkQueue(false)
			}
			if i%100 == 99 {
				m.checkRedis()
				m.checkCarts(false)
			}
		}
		m.checkRedis()
		m.checkBuyers()
		m.checkLine()
		m.checkCarts(true)
		m.checkEvents()
		m.checkReport()
		m.checkQueue(true)
		m.checkQueueMoves()
		m.t.Logf("waiting room: %s", m.queueSummary())
		t.Logf("%d steps: %v; longest false sold-out %v, false limit %v; longest stale-flag retry %v", steps, m.ops,
			m.falseSoldOut.Round(time.Millisecond), m.falseLimit.Round(time.Millisecond), m.staleRetry.Round(time.Millisecond))
	})
}

// falseSoldOutBound is how long a refusal the ledger's state does not
// justify may last: a 409 sold-out while the ledger has the quantity (a
// replica's sold-out flag outliving a return made on another replica: the
// flag's TTL, re-checked once per period), or a 409 limit-reached while
// the buyer is under the cap (a quota count the sweeper gives back after
// an expiry, a replica's cached program cap from before a raise).
const falseSoldOutBound = 3 * time.Second

// modelBuyers is how many buyers the model's requests come from.
const modelBuyers = 8

type sim struct {
	shape        string // systest.EachShape's
	t            *testing.T
	rng          *rand.Rand
	seed         uint64
	step         int
	envs         []*systest.Env
	redis        *testenv.Cluster
	program      keys.ID
	programCap   int64 // per buyer, over every ticket of the program; 0: none
	skus         []*mSKU
	pool         *mSKU // the presale pool of skus[1], sold with codes
	codes        []string
	holds        []*mHold
	orders       []*mOrder
	carts        []*mCart
	done         []mRequest // committed requests, for retries
	refused      []mTake    // refused carts, for retries (evaluated again)
	keys         int
	ended        bool
	flushed      bool
	ops          map[string]int
	line         []*mWait // skus[0]'s waitlist, in line order
	q            *mQueue  // the program sold through its waiting room
	trace        bool     // log every request and its answer
	falseSoldOut time.Duration
	falseLimit   time.Duration
	staleRetry   time.Duration
}

type mSKU struct {
	sku               stock.SKU
	total, sold, held int64
	shards            int
	perBuyer          int64
	ended             bool
	// A pool's: the ticket it is a pool of (whose caps count it), its id,
	// and whether it is closed.
	base   *mSKU
	name   string
	closed bool
}

// capped is the SKU whose caps count s: its ticket's for a pool.
func (s *mSKU) capped() *mSKU { return cmp.Or(s.base, s) }

type mHold struct {
	id      string
	sku     *mSKU
	buyer   string
	code    string // the access code it used
	q       int64
	state   string
	expires time.Time
	cart    *mCart // the cart it is a line of, if any
}

type mOrder struct {
	id       string
	sku      *mSKU
	buyer    string
	code     string
	q        int64
	refunded bool
	cart     *mCart  // the cart it is a line of, if any
	purchase *mOrder // the order a transfer split it from (its first), which its code's use stays one with
}

// mCart is a committed cart: bought (an order per line), or held (a hold
// per line, then confirmed, cancelled or expired whole).
type mCart struct {
	id     string
	take   mTake
	state  string // bought, held, confirmed, cancelled, expired
	holds  []*mHold
	orders []*mOrder
}

// mLine is q units of a SKU: a purchase's or a hold's, or a cart's line.
type mLine struct {
	sku *mSKU
	q   int64
}

// mTake is a request that takes stock: a purchase, a hold (one line), or
// a cart (bought or held).
type mTake struct {
	path, key, buyer string
	lines            []mLine
	hold, cart       bool
	ttl              int    // seconds; holds only
	code             string // a pool take's access code
}

// mRequest is a committed request and the answer it got.
type mRequest struct {
	path, key, body string
	take            *mTake // a take: a cart's retry sends its lines in another order
	buyer           string
	status          int
	id              string // cart, order or hold id in the answer
}

func newModel(t *testing.T, shape string, seed uint64) *sim {
	c := testenv.NewCluster(t, testenv.ClusterOptions{})
	base := systest.NewLedger(t, shape)
	m := &sim{shape: shape, t: t, rng: rand.New(rand.NewPCG(seed, 13)), seed: seed, redis: c, ops: map[string]int{},
		program: keys.MustID(testenv.ID(t, "m")), programCap: 10, trace: os.Getenv("STOCKGATE_MODEL_TRACE") != ""}
	for i := range 3 {
		o := base
		o.Cluster, o.Sweep, o.Pacer = c, true, true
		o.Tune = func(o *app.Options) {
			o.Sale.SweepEvery = 50 * time.Millisecond
			o.Sale.RestoreGrace = 200 * time.Millisecond
			o.Sale.OfferTTL = offerTTL(i)
		}
		m.envs = append(m.envs, systest.Start(t, o))
	}
	m.placeOnSecond(m.program)
	for i := range 3 {
		s := &mSKU{sku: stock.SKU{Program: m.program, Ticket: keys.MustID(fmt.Sprintf("t%d", i))},
			total: int64(5 + 10*i), shards: 1 + i, perBuyer: []int64{3, 0, 0}[i]}
		m.put(m.envs[0], s)
		m.skus = append(m.skus, s)
	}
	m.putProgram(m.envs[0])
	m.putPool(m.envs[0])
	m.newQueue(m.envs[0])
	return m
}

// placeOnSecond puts a program of the model on the second primary (p1) of
// a two-primary ledger, not the one keeping the directory: a call sent to
// the wrong primary finds nothing there. Every program of the model goes
// there: an Idempotency-Key is unique per buyer within a primary (a key
// reused for a program on another primary is that primary's first use;
// docs/OPERATIONS.md), and the model reuses keys across its programs.
func (m *sim) placeOnSecond(program keys.ID) {
	m.t.Helper()
	if m.shape != systest.TwoPrimaries {
		return
	}
	if err := m.envs[0].Ledger.Place(context.Background(), program, systest.PrimaryName(0)); err != nil {
		m.t.Fatal(err)
	}
}

// modelPool is the name of the model's presale pool.
const modelPool = "fans"

// putPool splits a code-only pool of 8 off skus[1] and adds 6 codes of 2
// uses each (FANS-0 … FANS-5).
func (m *sim) putPool(e *systest.Env) {
	m.t.Helper()
	base := m.skus[1]
	m.pool = &mSKU{sku: stock.SKU{Program: m.program, Ticket: keys.Pooled(base.sku.Ticket, keys.MustID(modelPool))},
		total: 8, shards: 2, base: base, name: modelPool}
	path := systest.AdminPath(base.sku) + "/pools/" + modelPool
	if r := e.Do(m.t, http.MethodPut, path, nil, `{"allotment":8,"shards":2,"access":"code"}`); r.Status != http.StatusOK {
		m.fail("PUT pool = %d %s", r.Status, r.Body)
	}
	base.total -= m.pool.total
	var cs []string
	for i := range 6 {
		m.codes = append(m.codes, fmt.Sprintf("FANS-%d", i))
		cs = append(cs, fmt.Sprintf(`{"code":"FANS-%d","max_uses":2}`, i))
	}
	if r := e.Do(m.t, http.MethodPost, path+"/codes", nil, `{"codes":[`+strings.Join(cs, ",")+`]}`); r.Status >= 300 {
		m.fail("POST codes = %d %s", r.Status, r.Body)
	}
}

// codeUses is how many live holds and purchases with an order standing
// use code: a transfer's split is one use with the order it came from, so
// refunding either part leaves the use while the other stands.
func (m *sim) codeUses(code string) int64 {
	var n int64
	for _, h := range m.holds {
		if h.code == code && h.state == ledger.Held {
			n++
		}
	}
	standing := map[*mOrder]bool{}
	for _, o := range m.orders {
		if o.code == code && !o.refunded {
			standing[cmp.Or(o.purchase, o)] = true
		}
	}
	return n + int64(len(standing))
}

// poolTake buys or holds in the pool with one of its codes (or, one time
// in ten, a code it does not have).
func (m *sim) poolTake(hold bool) {
	s := m.pool
	t := mTake{path: systest.SKUPath(s.base.sku) + "/purchases?pool=" + modelPool, key: m.newKey(), buyer: m.buyer(),
		lines: []mLine{{s, int64(1 + m.rng.IntN(2))}}, code: m.codes[m.rng.IntN(len(m.codes))]}
	if m.rng.IntN(10) == 0 {
		t.code = "NOT-A-CODE"
	}
	op := "pool-purchase"
	if hold {
		t.path, t.hold, t.ttl, op = systest.SKUPath(s.base.sku)+"/holds?pool="+modelPool, true, m.holdTTL(), "pool-hold"
	}
	m.ops[op]++
	body := m.body(t)
	if r := m.send(m.env(), t, body); r.Status == http.StatusCreated {
		if r.Header.Get("Idempotent-Replayed") != "" {
			m.fail("new %s %s key %s = %s, replayed", op, body, t.key, r.Body)
		}
		m.ops[op+"-created"]++
		m.taken(t, body, r)
	}
}

// closePool closes the pool: what it has left moves to the public pool at
// once; what comes back to it later is moved by a sweeper (settlePoolMoves).
// Nothing moves into an ended sale: the pool of an ended ticket keeps it.
func (m *sim) closePool() {
	m.ops["pool-close"]++
	r := m.post(m.env(), systest.AdminPath(m.pool.base.sku)+"/pools/"+modelPool+"/close", "", "")
	if r.Status != http.StatusOK {
		m.fail("close pool = %d %s", r.Status, r.Body)
	}
	m.pool.closed = true
	if m.pool.base.ended {
		return
	}
	m.pool.base.total += m.pool.left()
	m.pool.total -= m.pool.left()
}

// settlePoolMoves waits (bounded) for a sweeper to move what came back to
// the closed pool on to the public pool, and applies the move; none moves
// once the ticket's sale has ended.
func (m *sim) settlePoolMoves() {
	if !m.pool.closed || m.pool.left() == 0 || m.pool.base.ended {
		return
	}
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := m.envs[0].Ledger.SKU(ctx, m.pool.sku)
		if err != nil {
			m.fail("ledger: %v", err)
		}
		if st.Remaining() == 0 {
			moved := m.pool.total - st.Total
			m.tracef("%d returned to the closed pool moved on", moved)
			m.pool.total -= moved
			m.pool.base.total += moved
			m.ops["pool-moved"]++
			return
		}
		if time.Now().After(deadline) {
			m.fail("closed pool still has %d left 5s on", st.Remaining())
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}

// stocks are the SKUs whose stock the model keeps: the tickets' public
// pools and the presale pool.
func (m *sim) stocks() []*mSKU { return append(slices.Clone(m.skus), m.pool) }

func (m *sim) fail(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("seed %d step %d: %s", m.seed, m.step, fmt.Sprintf(format, args...))
}

func (m *sim) env() *systest.Env { return m.envs[m.rng.IntN(len(m.envs))] }

// tracef logs a step's request and answer when STOCKGATE_MODEL_TRACE is set.
func (m *sim) tracef(format string, args ...any) {
	if m.trace {
		m.t.Helper()
		m.t.Logf("step %d: %s", m.step, fmt.Sprintf(format, args...))
	}
}

// post sends a POST with an Idempotency-Key (none when key is empty).
func (m *sim) post(e *systest.Env, path, key, body string) systest.Reply {
	m.t.Helper()
	var h map[string]string
	if key != "" {
		h = map[string]string{"Idempotency-Key": key}
	}
	r := e.Do(m.t, http.MethodPost, path, h, body)
	m.tracef("POST %s key %s %s on %d = %d %s (replayed %q)", path, key, body, slices.Index(m.envs, e), r.Status, r.Body, r.Header.Get("Idempotent-Replayed"))
	return r
}

func (m *sim) newKey() string {
	m.keys++
	return fmt.Sprintf("k%d", m.keys)
}

func (m *sim) buyer() string { return fmt.Sprintf("buyer%d", m.rng.IntN(modelBuyers)) }

func (s *mSKU) left() int64 { return s.total - s.sold - s.held }

func (s *mSKU) ticket() string { return s.sku.Ticket.String() }

// put writes the SKU's settings (PUT replaces them all, the cap included).
// A ticket's total is its whole stock: its public pool's and its pools'.
func (m *sim) put(e *systest.Env, s *mSKU) {
	m.t.Helper()
	total := s.total
	if m.pool != nil && m.pool.base == s {
		m.settlePoolMoves()
		total += m.pool.total
	}
	r := e.Do(m.t, http.MethodPut, systest.AdminPath(s.sku), nil,
		fmt.Sprintf(`{"total":%d,"shards":%d,"max_per_order":4,"per_buyer":%d}`, total, s.shards, s.perBuyer))
	m.tracef("PUT %s total %d shards %d = %d", s.ticket(), s.total, s.shards, r.Status)
	if r.Status != http.StatusOK {
		m.fail("PUT %s = %d %s", s.sku, r.Status, r.Body)
	}
}

func (m *sim) putProgram(e *systest.Env) {
	m.t.Helper()
	r := e.Do(m.t, http.MethodPut, "/v1/admin/programs/"+m.program.String(), nil, fmt.Sprintf(`{"per_buyer":%d}`, m.programCap))
	m.tracef("PUT program per_buyer %d = %d", m.programCap, r.Status)
	if r.Status != http.StatusOK {
		m.fail("PUT program = %d %s", r.Status, r.Body)
	}
}

// units is what buyer holds and owns of s (nil: of the whole program):
// what the caps count.
func (m *sim) units(buyer string, s *mSKU) int64 {
	var n int64
	for _, h := range m.holds {
		if h.state == ledger.Held && h.buyer == buyer && (s == nil || h.sku.capped() == s) {
			n += h.q
		}
	}
	for _, o := range m.orders {
		if !o.refunded && o.buyer == buyer && (s == nil || o.sku.capped() == s) {
			n += o.q
		}
	}
	return n
}

// do runs one random operation.
func (m *sim) do() {
	if m.rng.IntN(100) < 8 {
		m.waitOp()
		return
	}
	if m.rng.IntN(100) < 15 {
		m.queueOp()
		return
	}
	r := m.rng.IntN(100)
	switch {
	case r < 12:
		m.take(false)
	case r < 14:
		m.poolTake(false)
	case r < 16:
		m.poolTake(true)
	case r < 24:
		m.take(true)
	case r < 34:
		m.cart(false)
	case r < 41:
		m.cart(true)
	case r < 44 && m.rng.IntN(3) == 0:
		m.extend()
	case r < 44:
		m.confirm()
	case r < 47 && m.rng.IntN(2) == 0:
		m.transfer()
	case r < 47:
		m.cancel()
	case r < 50:
		m.refund(false)
	case r < 54:
		m.cartAction("confirm")
	case r < 57:
		m.cartAction("cancel")
	case r < 60:
		m.cartAction("refund")
	case r < 62:
		m.refund(true)
	case r < 64:
		m.lineAlone()
	case r < 66:
		m.cartOdd()
	case r < 76:
		m.retry()
	case r < 78:
		m.retryRefused()
	case r < 80:
		m.cartTwice()
	case r < 83:
		m.reuse()
	case r < 86:
		m.cartReuse()
	case r < 89:
		m.admin("reconcile")
	case r < 93:
		m.admin("restock")
	case r < 95:
		m.admin("resize")
	case r < 97:
		m.admin("cap")
	case r < 98 && m.step > 400 && !m.pool.closed && m.rng.IntN(3) == 0:
		m.closePool()
	case r < 98 && m.step > 600 && !m.ended:
		m.admin("end")
	case r < 99 && !m.flushed:
		m.flushRedis()
	default:
		m.take(false)
	}
}

// body is the JSON of a take; a cart's lines come in a random order (the
// same request whatever their order).
func (m *sim) body(t mTake) string {
	ttl := ""
	if t.hold {
		ttl = fmt.Sprintf(`,"ttl_seconds":%d`, t.ttl)
	}
	if !t.cart {
		code := ""
		if t.code != "" {
			code = fmt.Sprintf(`,"access_code":%q`, t.code)
		}
		return fmt.Sprintf(`{"buyer":%q,"quantity":%d%s%s}`, t.buyer, t.lines[0].q, ttl, code)
	}
	var ls []string
	for _, i := range m.rng.Perm(len(t.lines)) {
		ls = append(ls, fmt.Sprintf(`{"ticket":%q,"quantity":%d}`, t.lines[i].sku.ticket(), t.lines[i].q))
	}
	return fmt.Sprintf(`{"buyer":%q,"lines":[%s]%s}`, t.buyer, strings.Join(ls, ","), ttl)
}

// fingerprint is what makes two takes the same request (with one key).
func (t mTake) fingerprint() string {
	var ls []string
	for _, l := range t.lines {
		ls = append(ls, fmt.Sprintf("%s:%d", l.sku.ticket(), l.q))
	}
	slices.Sort(ls)
	return fmt.Sprintf("%s %s %d %s %s", t.path, t.buyer, t.ttl, strings.Join(ls, ","), t.code)
}

// holdTTL is a new hold's lifetime: long enough to outlive the run, or
// (a quarter of them) 1s, to expire while the model runs.
func (m *sim) holdTTL() int {
	if m.rng.IntN(4) == 0 {
		return 1
	}
	return 900
}

func (m *sim) take(hold bool) {
	s := m.skus[m.rng.IntN(len(m.skus))]
	t := mTake{path: systest.SKUPath(s.sku) + "/purchases", key: m.newKey(), buyer: m.buyer(), lines: []mLine{{s, int64(1 + m.rng.IntN(3))}}}
	op := "purchase"
	if hold {
		t.path, t.hold, t.ttl, op = systest.SKUPath(s.sku)+"/holds", true, m.holdTTL(), "hold"
	}
	m.ops[op]++
	e := m.env()
	body := m.body(t)
	if r := m.send(e, t, body); r.Status == http.StatusCreated {
		if r.Header.Get("Idempotent-Replayed") != "" {
			m.fail("new %s %s key %s = %s, replayed", op, body, t.key, r.Body)
		}
		m.ops[op+"-created"]++
		m.taken(t, body, r)
	}
}

// newCart is a cart of 1 to 3 tickets of the program (mostly several, and
// rarely one whose sale has ended), 1 or 2 units each.
func (m *sim) newCart(hold bool) mTake {
	t := mTake{path: "/v1/programs/" + m.program.String() + "/carts", key: m.newKey(), buyer: m.buyer(), cart: true}
	if hold {
		t.path, t.hold, t.ttl = "/v1/programs/"+m.program.String()+"/cart-holds", true, m.holdTTL()
	}
	n := 1 + m.rng.IntN(len(m.skus))
	if n == 1 && m.rng.IntN(2) == 0 {
		n = 2 // mostly carts of several lines
	}
	for _, i := range m.rng.Perm(len(m.skus)) {
		if len(t.lines) < n && (!m.skus[i].ended || m.rng.IntN(4) == 0) {
			t.lines = append(t.lines, mLine{m.skus[i], int64(1 + m.rng.IntN(2))})
		}
	}
	return t
}

func (m *sim) cart(hold bool) {
	t := m.newCart(hold)
	m.ops[map[bool]string{false: "cart", true: "cart-hold"}[hold]]++
	m.sendCart(m.env(), t)
}

// sendCart sends a cart until its answer is one the model allows and
// applies it: a new cart, or a refusal kept for a retry.
func (m *sim) sendCart(e *systest.Env, t mTake) {
	body := m.body(t)
	r := m.send(e, t, body)
	if r.Status != http.StatusCreated {
		m.refused = append(m.refused, t)
		if len(m.refused) > 40 {
			m.refused = m.refused[1:]
		}
		return
	}
	if r.Header.Get("Idempotent-Replayed") != "" {
		m.fail("new cart %s key %s = %s, replayed", body, t.key, r.Body)
	}
	m.ops[map[bool]string{false: "cart-bought", true: "cart-held"}[t.hold]]++
	m.taken(t, body, r)
}

// refusals are the refusals the model allows when buyer asks for lines
// now: kind → the tickets a refusal of that kind may name ("*": any line,
// or none). None: the request must get its stock.
func (m *sim) refusals(t mTake) map[string]map[string]bool {
	buyer, lines := t.buyer, t.lines
	out := map[string]map[string]bool{}
	add := func(kind, ticket string) {
		if out[kind] == nil {
			out[kind] = map[string]bool{}
		}
		out[kind][ticket] = true
	}
	var all int64
	for _, l := range lines {
		if p := l.sku; p.base != nil {
			// The pool's own rules come first, in whatever order the
			// replica meets them: closed (or sold out, its stock moved on),
			// a code it does not have, a code used up.
			if p.closed {
				add("pool-closed", "*")
				add("sold-out", "*")
			}
			if !slices.Contains(m.codes, t.code) {
				add("access-code-invalid", "*")
			} else if m.codeUses(t.code) >= 2 {
				add("access-code-used-up", "*")
			}
			if p.base.ended {
				add("sale-ended", "*")
				add("sold-out", "*")
			}
		}
		if l.sku.ended {
			// The end rebuilt the gate at 0 at once; a replica's settings
			// learn of the end within SettingsTTL. Either way a 409.
			add("sale-ended", l.sku.ticket())
			add("sold-out", l.sku.ticket())
		}
		if l.sku.left() < l.q {
			add("sold-out", l.sku.ticket())
		}
		if c := l.sku.capped(); c.perBuyer > 0 && m.units(buyer, c)+l.q > c.perBuyer {
			add("limit-reached", l.sku.ticket())
		}
		all += l.q
	}
	if m.programCap > 0 && m.units(buyer, nil)+all > m.programCap {
		// The gate counts a cart line by line and names the line that
		// passed the cap; the ledger refuses the cart as a whole.
		add("limit-reached", "*")
	}
	return out
}

// problemLine is a cart line a refusal names.
type problemLine struct {
	Ticket string `json:"ticket"`
	Code   string `json:"code"`
}

func problemLines(r systest.Reply) []problemLine {
	var p struct {
		Lines []problemLine `json:"lines"`
	}
	_ = json.Unmarshal(r.Body, &p)
	return p.Lines
}

// judge says whether an answer to a take is one the model allows (want:
// see refusals), and if not, whether it is a refusal a stale replica may
// give for a bounded time (a sold-out flag, a quota count or a program cap
// not yet caught up with a return).
func judge(r systest.Reply, cart bool, want map[string]map[string]bool) (ok, transient bool) {
	kind := systest.ProblemKind(r)
	status := http.StatusConflict
	if kind == "access-code-invalid" {
		status = http.StatusForbidden
	}
	switch {
	case len(want) == 0 && r.Status == http.StatusCreated:
		return true, false
	case len(want) > 0 && r.Status == status && want[kind] != nil:
		named := problemLines(r)
		switch {
		case !cart:
			ok = len(named) == 0
		case len(named) == 1:
			ok = named[0].Code == kind && (want[kind][named[0].Ticket] || want[kind]["*"])
		case len(named) == 0:
			ok = want[kind]["*"]
		}
		if ok {
			return true, false
		}
	}
	// A code's use given back by an expiry reaches the gate with the
	// sweeper's restore, as a buyer's count does.
	return false, r.Status == http.StatusConflict && (kind == "sold-out" || kind == "limit-reached" || kind == "access-code-used-up")
}

// send sends a take and then the same request again (with its key: a
// refused request is not remembered) while the answer is a refusal the
// model does not allow but a stale replica may give, for at most
// falseSoldOutBound. It returns the answer the model allows, and fails
// the test on any other.
func (m *sim) send(e *systest.Env, t mTake, body string) systest.Reply {
	m.t.Helper()
	return m.sendFrom(e, t, body, m.post(e, t.path, t.key, body), time.Now())
}

// sendFrom is send given the first answer, received at.
func (m *sim) sendFrom(e *systest.Env, t mTake, body string, r systest.Reply, at time.Time) systest.Reply {
	m.t.Helper()
	start := at
	var stale string
	for {
		want := m.refusals(t)
		ok, transient := judge(r, t.cart, want)
		if !ok && r.Status == http.StatusCreated && m.settleExpiries(at) {
			// A hold due before the answer may have given its stock or
			// its buyer's count back in time for it (and a sweeper may
			// have moved it on from a closed pool).
			m.settlePoolMoves()
			want = m.refusals(t)
			ok, transient = judge(r, t.cart, want)
		}
		if ok {
			switch d := time.Since(start); stale {
			case "sold-out":
				m.falseSoldOut = max(m.falseSoldOut, d)
			case "limit-reached":
				m.falseLimit = max(m.falseLimit, d)
			}
			if r.Status != http.StatusCreated {
				m.ops[map[bool]string{false: "refused-", true: "cart-refused-"}[t.cart]+systest.ProblemKind(r)]++
			}
			return r
		}
		if !transient || time.Since(start) > falseSoldOutBound {
			var left, units []int64
			for _, s := range m.stocks() {
				left = append(left, s.left())
				units = append(units, m.units(t.buyer, s))
			}
			m.fail("POST %s %s key %s = %d %s after %v; model: left %v, ended %v, %s units %v of caps %v, program %d of %d (the gate counts %s); allowed %v; %s",
				t.path, body, t.key, r.Status, r.Body, time.Since(start).Round(time.Millisecond), left, m.ended, t.buyer, units,
				[]int64{m.skus[0].perBuyer, m.skus[1].perBuyer, m.skus[2].perBuyer}, m.units(t.buyer, nil), m.programCap, m.gateCounts(t.buyer), want,
				m.gates())
		}
		stale = systest.ProblemKind(r)
		m.ops["stale-"+stale]++
		time.Sleep(20 * time.Millisecond) // poll interval
		r = m.post(e, t.path, t.key, body)
		at = time.Now()
	}
}

// cartView is a cart as the API answers it.
type cartView struct {
	CartID    string          `json:"cart_id"`
	Buyer     string          `json:"buyer"`
	Orders    []cartOrderView `json:"orders"`
	Holds     []cartHoldView  `json:"holds"`
	ExpiresAt *time.Time      `json:"expires_at"`
}

type cartOrderView struct {
	OrderID    string     `json:"order_id"`
	Ticket     string     `json:"ticket"`
	Quantity   int64      `json:"quantity"`
	HoldID     string     `json:"hold_id"`
	RefundedAt *time.Time `json:"refunded_at"`
}

type cartHoldView struct {
	HoldID    string    `json:"hold_id"`
	Ticket    string    `json:"ticket"`
	Quantity  int64     `json:"quantity"`
	State     string    `json:"state"`
	ExpiresAt time.Time `json:"expires_at"`
}

func parseCart(r systest.Reply) cartView {
	var v cartView
	_ = json.Unmarshal(r.Body, &v)
	return v
}

// taken applies a take's 201 to the model.
func (m *sim) taken(t mTake, body string, r systest.Reply) {
	id := systest.OrderID(r)
	switch {
	case t.cart:
		id = m.cartTaken(t, r)
	case t.hold:
		var h systest.HoldReply
		_ = json.Unmarshal(r.Body, &h)
		id = h.HoldID
		s := t.lines[0].sku
		s.held += t.lines[0].q
		m.holds = append(m.holds, &mHold{id: id, sku: s, buyer: t.buyer, code: t.code, q: t.lines[0].q, state: ledger.Held, expires: h.ExpiresAt})
	default:
		s := t.lines[0].sku
		s.sold += t.lines[0].q
		m.orders = append(m.orders, &mOrder{id: id, sku: s, buyer: t.buyer, code: t.code, q: t.lines[0].q})
	}
	m.done = append(m.done, mRequest{path: t.path, key: t.key, body: body, take: &t, buyer: t.buyer, status: http.StatusCreated, id: id})
}

// cartTaken checks a new cart's answer against what it asked and applies
// it to the model.
func (m *sim) cartTaken(t mTake, r systest.Reply) string {
	v := parseCart(r)
	c := &mCart{id: v.CartID, take: t, state: "bought"}
	if t.hold {
		c.state = ledger.Held
	}
	n := len(v.Orders)
	if t.hold {
		n = len(v.Holds)
	}
	if v.CartID == "" || v.Buyer != t.buyer || n != len(t.lines) || t.hold != (len(v.Orders) == 0) || t.hold == (len(v.Holds) == 0) ||
		t.hold == (v.ExpiresAt == nil) || r.Header.Get("Location") != "/v1/carts/"+v.CartID {
		m.fail("cart %s key %s = %s, want a cart of %d lines held %v", t.fingerprint(), t.key, r.Body, len(t.lines), t.hold)
	}
	for _, l := range t.lines {
		found := false
		for _, o := range v.Orders {
			if o.Ticket == l.sku.ticket() && o.Quantity == l.q && o.OrderID != "" {
				found = true
				c.orders = append(c.orders, &mOrder{id: o.OrderID, sku: l.sku, buyer: t.buyer, q: l.q, cart: c})
				l.sku.sold += l.q
			}
		}
		for _, h := range v.Holds {
			if h.Ticket == l.sku.ticket() && h.Quantity == l.q && h.State == ledger.Held && h.ExpiresAt.Equal(*v.ExpiresAt) {
				found = true
				c.holds = append(c.holds, &mHold{id: h.HoldID, sku: l.sku, buyer: t.buyer, q: l.q, state: ledger.Held, expires: h.ExpiresAt, cart: c})
				l.sku.held += l.q
			}
		}
		if !found {
			m.fail("cart %s key %s = %s: no line %s:%d", t.fingerprint(), t.key, r.Body, l.sku.ticket(), l.q)
		}
	}
	m.orders = append(m.orders, c.orders...)
	m.holds = append(m.holds, c.holds...)
	m.carts = append(m.carts, c)
	return c.id
}

// cartTwice sends one new cart to two replicas at once: one commits it,
// the other replays it (or both are refused), and it moves once. (The
// copies take turns; a copy that waits too long is answered 503 and sent
// again.)
func (m *sim) cartTwice() {
	t := m.newCart(m.rng.IntN(3) == 0)
	m.ops["cart-twice"]++
	i := m.rng.IntN(len(m.envs))
	es := []*systest.Env{m.envs[i], m.envs[(i+1+m.rng.IntN(len(m.envs)-1))%len(m.envs)]}
	bodies := []string{m.body(t), m.body(t)}
	rs, ats := make([]systest.Reply, 2), make([]time.Time, 2)
	var wg sync.WaitGroup
	for k := range 2 {
		wg.Go(func() {
			rs[k] = m.post(es[k], t.path, t.key, bodies[k])
			ats[k] = time.Now()
		})
	}
	wg.Wait()
	created, fresh := -1, 0
	for k := range 2 {
		for start := time.Now(); rs[k].Status == http.StatusServiceUnavailable && systest.ProblemKind(rs[k]) == "unavailable"; {
			// The copies take turns; one that waited too long for the
			// other is answered 503, to retry with the same key.
			if time.Since(start) > falseSoldOutBound {
				m.fail("copy %d of cart %s key %s still 503 after %v: %s", k, bodies[k], t.key, time.Since(start), rs[k].Body)
			}
			m.ops["cart-twice-busy"]++
			time.Sleep(20 * time.Millisecond) // poll interval
			rs[k], ats[k] = m.post(es[k], t.path, t.key, bodies[k]), time.Now()
		}
		rs[k] = m.sendFrom(es[k], t, bodies[k], rs[k], ats[k])
		if rs[k].Status != http.StatusCreated {
			continue
		}
		if rs[k].Header.Get("Idempotent-Replayed") == "" {
			fresh++
		}
		if created >= 0 && parseCart(rs[k]).CartID != parseCart(rs[created]).CartID {
			m.fail("one cart sent twice at once made two: %s and %s", rs[created].Body, rs[k].Body)
		}
		created = k
	}
	if created < 0 {
		return
	}
	if fresh != 1 {
		m.fail("one cart sent twice at once: %d answers not replayed, want 1: %s / %s", fresh, rs[0].Body, rs[1].Body)
	}
	m.taken(t, bodies[created], rs[created])
}

// retryRefused sends a refused cart again with its key, on any replica,
// as it was or (one time in three) with a line's quantity changed: either
// way it is evaluated again, as a refusal is not remembered.
func (m *sim) retryRefused() {
	if len(m.refused) == 0 {
		return
	}
	i := m.rng.IntN(len(m.refused))
	t := m.refused[i]
	m.refused = slices.Delete(m.refused, i, i+1)
	m.ops["cart-retry-refused"]++
	if m.rng.IntN(3) == 0 {
		t.lines = slices.Clone(t.lines)
		l := &t.lines[m.rng.IntN(len(t.lines))]
		l.q = l.q%2 + 1
		m.ops["cart-retry-refused-changed"]++
	}
	m.sendCart(m.env(), t)
}

// live says a hold is held and far from its expiry: a long hold, never a
// short one (a confirm racing the sweeper is another test's subject, and
// on a busy machine a request may take a while).
func (h *mHold) live() bool {
	return h.state == ledger.Held && time.Until(h.expires) > 10*time.Second
}

// liveHold picks a live hold that is not a cart's line.
func (m *sim) liveHold() *mHold {
	var live []*mHold
	for _, h := range m.holds {
		if h.cart == nil && h.live() {
			live = append(live, h)
		}
	}
	if len(live) == 0 {
		return nil
	}
	return live[m.rng.IntN(len(live))]
}

func (m *sim) act(path, buyer string, want int) systest.Reply {
	key := m.newKey()
	body := fmt.Sprintf(`{"buyer":%q}`, buyer)
	r := m.post(m.env(), path, key, body)
	if r.Status != want {
		m.fail("POST %s = %d %s, want %d", path, r.Status, r.Body, want)
	}
	m.done = append(m.done, mRequest{path: path, key: key, body: body, buyer: buyer, status: want, id: systest.ReplyID(r)})
	return r
}

func (m *sim) confirm() {
	h := m.liveHold()
	if h == nil {
		return
	}
	if h.q > 1 && m.rng.IntN(3) == 0 {
		m.confirmPart(h)
		return
	}
	m.ops["confirm"]++
	r := m.act("/v1/holds/"+h.id+"/confirm", h.buyer, 201)
	h.state = ledger.Confirmed
	h.sku.held -= h.q
	h.sku.sold += h.q
	m.orders = append(m.orders, &mOrder{id: systest.OrderID(r), sku: h.sku, buyer: h.buyer, code: h.code, q: h.q})
}

// confirmPart confirms some of a hold's units: the order has them, the
// rest come back at once (to a waitlist first), and the code's use stays
// with the order.
func (m *sim) confirmPart(h *mHold) {
	m.ops["confirm-part"]++
	keep := 1 + m.rng.Int64N(h.q-1)
	path, key := "/v1/holds/"+h.id+"/confirm", m.newKey()
	body := fmt.Sprintf(`{"buyer":%q,"quantity":%d}`, h.buyer, keep)
	r := m.post(m.env(), path, key, body)
	var o struct{ Quantity int64 }
	_ = json.Unmarshal(r.Body, &o)
	if r.Status != http.StatusCreated || o.Quantity != keep {
		m.fail("POST %s %s = %d %s, want 201 with %d", path, body, r.Status, r.Body, keep)
	}
	m.done = append(m.done, mRequest{path: path, key: key, body: body, buyer: h.buyer, status: http.StatusCreated, id: systest.ReplyID(r)})
	h.state = ledger.Confirmed
	h.sku.held -= h.q
	h.sku.sold += keep
	m.orders = append(m.orders, &mOrder{id: systest.OrderID(r), sku: h.sku, buyer: h.buyer, code: h.code, q: keep})
	m.returned(h.sku, h.q-keep)
}

// extend moves a live hold's expiry: ttl_seconds from now (the SKUs'
// maximum lifetime, an hour, is never reached within a run), or never
// nearer than it was; another buyer's extension is refused and changes
// nothing.
func (m *sim) extend() {
	h := m.liveHold()
	if h == nil {
		return
	}
	m.ops["extend"]++
	ttl := 1 + m.rng.IntN(600)
	path, key := "/v1/holds/"+h.id+"/extend", m.newKey()
	if m.rng.IntN(8) == 0 {
		body := fmt.Sprintf(`{"buyer":%q,"ttl_seconds":%d}`, h.buyer+"x", ttl)
		if r := m.post(m.env(), path, key, body); r.Status != http.StatusForbidden {
			m.fail("POST %s %s = %d %s, want 403", path, body, r.Status, r.Body)
		}
		return
	}
	body := fmt.Sprintf(`{"buyer":%q,"ttl_seconds":%d}`, h.buyer, ttl)
	sent := time.Now().Truncate(time.Millisecond)
	r := m.post(m.env(), path, key, body)
	answered := time.Now()
	var got struct {
		ExpiresAt time.Time `json:"expires_at"`
		State     string    `json:"state"`
	}
	_ = json.Unmarshal(r.Body, &got)
	lo := sent.Add(time.Duration(ttl) * time.Second)
	hi := answered.Add(time.Duration(ttl) * time.Second)
	if lo.Before(h.expires) {
		lo = h.expires
	}
	if hi.Before(h.expires) {
		hi = h.expires
	}
	if r.Status != http.StatusOK || got.State != ledger.Held || got.ExpiresAt.Before(lo) || got.ExpiresAt.After(hi) {
		m.fail("POST %s %s = %d %s, want 200 held until between %v and %v", path, body, r.Status, r.Body, lo, hi)
	}
	m.done = append(m.done, mRequest{path: path, key: key, body: body, buyer: h.buyer, status: http.StatusOK, id: systest.ReplyID(r)})
	h.expires = got.ExpiresAt
}

func (m *sim) cancel() {
	h := m.liveHold()
	if h == nil {
		return
	}
	m.ops["cancel"]++
	m.act("/v1/holds/"+h.id+"/cancel", h.buyer, 200)
	h.state = ledger.Cancelled
	h.sku.held -= h.q
	m.returned(h.sku, h.q)
}

// transfer moves some or all of a standing order's tickets (not a cart's
// line) to a buyer holding nothing (so its count is the model's orders):
// 200 with the receiver's order when its caps allow, else 409
// limit-reached and nothing moves.
func (m *sim) transfer() {
	var standing []*mOrder
	for _, o := range m.orders {
		if !o.refunded && o.cart == nil && slices.Contains(m.stocks(), o.sku) {
			standing = append(standing, o)
		}
	}
	if len(standing) == 0 {
		return
	}
	o := standing[m.rng.IntN(len(standing))]
	to := m.buyer()
	for _, h := range m.holds {
		if h.buyer == to && h.state == ledger.Held {
			return // its count depends on when the sweeper gets there
		}
	}
	if to == o.buyer {
		return
	}
	m.ops["transfer"]++
	q := 1 + m.rng.Int64N(o.q)
	path, key := "/v1/orders/"+o.id+"/transfer", m.newKey()
	body := fmt.Sprintf(`{"buyer":%q,"to":%q,"quantity":%d}`, o.buyer, to, q)
	r := m.post(m.env(), path, key, body)
	if !m.mayHold(to, o.sku, q) {
		if r.Status != http.StatusConflict || systest.ProblemKind(r) != "limit-reached" {
			m.fail("POST %s %s = %d %s, want 409 limit-reached", path, body, r.Status, r.Body)
		}
		m.ops["transfer-refused"]++
		return
	}
	var got struct {
		OrderID  string `json:"order_id"`
		Buyer    string `json:"buyer"`
		Quantity int64  `json:"quantity"`
	}
	_ = json.Unmarshal(r.Body, &got)
	if r.Status != http.StatusOK || got.Buyer != to || got.Quantity != q || (q == o.q) != (got.OrderID == o.id) {
		m.fail("POST %s %s = %d %s, want 200 with %d for %s", path, body, r.Status, r.Body, q, to)
	}
	m.done = append(m.done, mRequest{path: path, key: key, body: body, buyer: o.buyer, status: http.StatusOK, id: got.OrderID})
	if q == o.q {
		o.buyer = to
		return
	}
	o.q -= q
	m.orders = append(m.orders, &mOrder{id: got.OrderID, sku: o.sku, buyer: to, code: o.code, q: q, purchase: cmp.Or(o.purchase, o)})
}

// refund refunds an order alone: any (a cart's line among them), or only
// a cart's line.
func (m *sim) refund(lineOnly bool) {
	var live []*mOrder
	for _, o := range m.orders {
		if !o.refunded && (!lineOnly || o.cart != nil) {
			live = append(live, o)
		}
	}
	if len(live) == 0 {
		return
	}
	o := live[m.rng.IntN(len(live))]
	m.ops[map[bool]string{false: "refund", true: "refund-line"}[lineOnly]]++
	m.act("/v1/orders/"+o.id+"/refund", o.buyer, 200)
	o.refunded = true
	o.sku.sold -= o.q
	m.returned(o.sku, o.q)
}

// live says a cart's state is known for the length of a request: not a
// held cart close to its expiry.
func (c *mCart) live() bool {
	return c.state != ledger.Held || c.holds[0].live()
}

// cartAction runs action on a cart in a state it applies to: confirm or
// cancel a live held cart, refund a bought or confirmed one.
func (m *sim) cartAction(action string) {
	var cs []*mCart
	for _, c := range m.carts {
		if action == "refund" && (c.state == "bought" || c.state == ledger.Confirmed) ||
			action != "refund" && c.state == ledger.Held && c.live() {
			cs = append(cs, c)
		}
	}
	if len(cs) == 0 {
		return
	}
	m.ops["cart-"+action]++
	c := cs[m.rng.IntN(len(cs))]
	m.cartDo(c, action, c.take.buyer)
}

// cartOdd runs any action on any cart, one time in five by another buyer:
// the model predicts the answer for every state (a confirm of a bought,
// cancelled or expired cart is refused; of a confirmed one, answered with
// its orders; a cancel of a cart that has ended, answered as it is).
func (m *sim) cartOdd() {
	if len(m.carts) == 0 {
		return
	}
	c := m.carts[m.rng.IntN(len(m.carts))]
	if !c.live() {
		return
	}
	action := []string{"confirm", "cancel", "refund"}[m.rng.IntN(3)]
	buyer := c.take.buyer
	if m.rng.IntN(5) == 0 {
		buyer = fmt.Sprintf("buyer%d", (int(buyer[len(buyer)-1]-'0')+1)%modelBuyers)
	}
	m.ops["cart-odd"]++
	m.cartDo(c, action, buyer)
}

// cartDo sends action on c as buyer, checks the answer against the
// model's prediction for c's state, and applies it.
func (m *sim) cartDo(c *mCart, action, buyer string) {
	path := "/v1/carts/" + c.id + "/" + action
	want, kind := http.StatusOK, ""
	switch {
	case buyer != c.take.buyer:
		want, kind = http.StatusForbidden, "not-owner"
	case action == "confirm" && c.state == "bought", action == "cancel" && (c.state == "bought" || c.state == ledger.Confirmed):
		want, kind = http.StatusConflict, "hold-confirmed"
	case action == "confirm" && c.state == ledger.Cancelled:
		want, kind = http.StatusConflict, "hold-cancelled"
	case action == "confirm" && c.state == ledger.Expired:
		want, kind = http.StatusGone, "hold-expired"
	case action == "confirm":
		want = http.StatusCreated
	case action == "refund" && c.state != "bought" && c.state != ledger.Confirmed:
		want, kind = http.StatusConflict, "cart-not-bought" // a held cart has no orders
	}
	key, body := m.newKey(), fmt.Sprintf(`{"buyer":%q}`, buyer)
	r := m.post(m.env(), path, key, body)
	if r.Status != want || kind != "" && systest.ProblemKind(r) != kind {
		m.fail("POST %s (cart %s, as %s) = %d %s, want %d %s", path, c.state, buyer, r.Status, r.Body, want, kind)
	}
	if want >= 300 {
		m.ops["cart-refused-"+kind]++
		return
	}
	v := parseCart(r)
	if v.CartID != c.id || r.Header.Get("Idempotent-Replayed") != "" {
		m.fail("POST %s (cart %s) = %s %v, want cart %s, not replayed", path, c.state, r.Body, r.Header, c.id)
	}
	states := map[string]string{}
	for _, h := range v.Holds {
		states[h.HoldID] = h.State
	}
	refunded := map[string]bool{}
	for _, o := range v.Orders {
		refunded[o.OrderID] = o.RefundedAt != nil
	}
	switch {
	case action == "confirm" && c.state == ledger.Held:
		for _, h := range c.holds {
			h.state = ledger.Confirmed
			h.sku.held -= h.q
			h.sku.sold += h.q
			for _, o := range v.Orders {
				if o.HoldID == h.id && o.Ticket == h.sku.ticket() && o.Quantity == h.q {
					c.orders = append(c.orders, &mOrder{id: o.OrderID, sku: h.sku, buyer: h.buyer, q: h.q, cart: c})
				}
			}
		}
		if len(c.orders) != len(c.holds) {
			m.fail("confirm of cart %s = %s: want an order per hold", c.id, r.Body)
		}
		m.orders = append(m.orders, c.orders...)
		c.state = ledger.Confirmed
	case action == "cancel" && c.state == ledger.Held:
		for _, h := range c.holds {
			h.state = ledger.Cancelled
			h.sku.held -= h.q
		}
		c.state = ledger.Cancelled
		for _, h := range c.holds {
			m.returned(h.sku, h.q)
		}
	case action == "refund":
		var back []*mOrder
		for _, o := range c.orders {
			if !o.refunded {
				o.refunded = true
				o.sku.sold -= o.q
				back = append(back, o)
			}
		}
		for _, o := range back {
			m.returned(o.sku, o.q)
		}
	}
	for _, h := range c.holds {
		if states[h.id] != h.state {
			m.fail("POST %s = %s: hold %s %s, want %s", path, r.Body, h.id, states[h.id], h.state)
		}
	}
	for _, o := range c.orders {
		if got, ok := refunded[o.id]; !ok || got != o.refunded {
			m.fail("POST %s = %s: order %s refunded %v (listed %v), want %v", path, r.Body, o.id, got, ok, o.refunded)
		}
	}
	m.done = append(m.done, mRequest{path: path, key: key, body: body, buyer: buyer, status: want, id: c.id})
}

// lineAlone confirms or cancels one line's hold of a held cart (in any
// state) through the hold's own routes: 409 in-cart, and nothing moves.
func (m *sim) lineAlone() {
	var hs []*mHold
	for _, h := range m.holds {
		if h.cart != nil {
			hs = append(hs, h)
		}
	}
	if len(hs) == 0 {
		return
	}
	h := hs[m.rng.IntN(len(hs))]
	path := "/v1/holds/" + h.id + "/" + []string{"confirm", "cancel"}[m.rng.IntN(2)]
	m.ops["line-alone"]++
	r := m.post(m.env(), path, m.newKey(), fmt.Sprintf(`{"buyer":%q}`, h.buyer))
	if r.Status != http.StatusConflict || systest.ProblemKind(r) != "in-cart" {
		m.fail("POST %s (a line of cart %s, %s) = %d %s, want 409 in-cart", path, h.cart.id, h.cart.state, r.Status, r.Body)
	}
}

// retry re-sends a committed request to any replica (a cart's lines in
// another order): the same answer, replayed, and nothing moves.
func (m *sim) retry() {
	if len(m.done) == 0 {
		return
	}
	q := m.done[m.rng.IntN(len(m.done))]
	m.ops["retry"]++
	body := q.body
	if q.take != nil && q.take.cart {
		body = m.body(*q.take)
	}
	e := m.env()
	start := time.Now()
	r := m.post(e, q.path, q.key, body)
	for r.Status == 409 && systest.ProblemKind(r) == "sold-out" && time.Since(start) < falseSoldOutBound {
		// A replica whose sold-out flag predates stock coming back (and
		// being sold again on another replica) answers from memory until
		// the flag's next re-check: bounded, and measured here.
		time.Sleep(20 * time.Millisecond) // poll interval
		r = m.post(e, q.path, q.key, body)
	}
	if d := time.Since(start); r.Status == q.status && d > 5*time.Millisecond {
		m.ops["retry-stale-flag"]++
		m.staleRetry = max(m.staleRetry, d)
	}
	if id := systest.ReplyID(r); r.Status != q.status || id != q.id || r.Header.Get("Idempotent-Replayed") != "true" {
		m.fail("retry of %s %s key %s = %d %s (replayed %q), want %d with %s replayed",
			q.path, body, q.key, r.Status, r.Body, r.Header.Get("Idempotent-Replayed"), q.status, q.id)
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
	path, body := systest.SKUPath(s.sku)+"/purchases", fmt.Sprintf(`{"buyer":%q,"quantity":4}`, q.buyer)
	if q.path == path && q.body == body {
		return
	}
	if m.rng.IntN(2) == 0 {
		path, body = systest.SKUPath(s.sku)+"/holds", fmt.Sprintf(`{"buyer":%q,"quantity":4,"ttl_seconds":77}`, q.buyer)
	}
	r := m.post(m.env(), path, q.key, body)
	if r.Status == 422 {
		return
	}
	// A SKU that takes no more requests (or that this replica's sold-out
	// flag says so of), or a buyer at its cap whose key was never counted
	// for this SKU, is answered from memory without a ledger call; only
	// the SKU's own committed keys are known there. The request moves
	// nothing either way (checked after the step).
	if r.Status == 409 && (systest.ProblemKind(r) == "sale-ended" || systest.ProblemKind(r) == "sold-out" || systest.ProblemKind(r) == "limit-reached") {
		m.ops["reuse-refused-closed"]++
		return
	}
	m.fail("reuse of key %s (first %s) for %s %s = %d %s, want 422", q.key, q.path, path, body, r.Status, r.Body)
}

// cartReuse sends a cart with a committed request's key and buyer that
// asks for something else (other lines, quantities or lifetime, held
// instead of bought, or after a purchase's or an action's key): 422
// whatever the cart's lines would meet, and nothing moves.
func (m *sim) cartReuse() {
	if len(m.done) == 0 {
		return
	}
	q := m.done[m.rng.IntN(len(m.done))]
	t := m.newCart(m.rng.IntN(2) == 0)
	if q.take != nil && q.take.cart && m.rng.IntN(3) > 0 {
		// The same cart but for one thing.
		t.hold, t.ttl, t.path = q.take.hold, q.take.ttl, q.take.path
		t.lines = slices.Clone(q.take.lines)
		switch i := m.rng.IntN(len(t.lines)); m.rng.IntN(3) {
		case 0:
			t.lines[i].q = t.lines[i].q%3 + 1
		case 1:
			if len(t.lines) > 1 {
				t.lines = slices.Delete(t.lines, i, i+1)
			} else {
				t.lines[i].q++
			}
		default:
			if t.hold {
				t.ttl = map[int]int{1: 900, 900: 2}[t.ttl]
			} else {
				t.hold, t.ttl, t.path = true, 900, "/v1/programs/"+m.program.String()+"/cart-holds"
			}
		}
	}
	t.key, t.buyer = q.key, q.buyer
	if q.take != nil && t.fingerprint() == q.take.fingerprint() {
		return
	}
	m.ops["cart-reuse"]++
	body := m.body(t)
	r := m.post(m.env(), t.path, t.key, body)
	if r.Status != http.StatusUnprocessableEntity || systest.ProblemKind(r) != "idempotency-key-reused" {
		m.fail("reuse of key %s (first %s %s) for cart %s = %d %s, want 422 idempotency-key-reused", q.key, q.path, q.body, body, r.Status, r.Body)
	}
}

func (m *sim) admin(what string) {
	s := m.skus[m.rng.IntN(len(m.skus))]
	m.ops[what]++
	e := m.env()
	switch what {
	case "reconcile":
		if r := m.post(e, systest.AdminPath(s.sku)+"/reconcile", "", ""); r.Status != 200 && r.Status != 409 {
			m.fail("reconcile = %d %s", r.Status, r.Body)
		}
	case "restock":
		s.total += int64(1 + m.rng.IntN(8))
		m.put(e, s)
	case "resize":
		s.shards = 1 + m.rng.IntN(4)
		m.put(e, s)
	case "cap":
		// A cap set, changed or lifted: the program's, or a ticket's.
		if m.rng.IntN(2) == 0 {
			m.programCap = []int64{0, 0, 12, 24, 40}[m.rng.IntN(5)]
			m.putProgram(e)
		} else {
			s.perBuyer = []int64{0, 0, 2, 4}[m.rng.IntN(4)]
			m.put(e, s)
		}
	case "end":
		if r := m.post(e, systest.AdminPath(s.sku)+"/end", "", ""); r.Status != 200 {
			m.fail("end = %d %s", r.Status, r.Body)
		}
		s.ended, m.ended = true, true
		if m.pool.base == s {
			m.pool.ended = true // a ticket's end ends its pools
		}
	}
}

// flushRedis loses everything in Redis at once, as a restart without
// persistence does.
func (m *sim) flushRedis() {
	m.flushed = true
	m.ops["redis-lost"]++
	m.tracef("FLUSHALL")
	m.queueFlushing()
	defer m.queueFlushed()
	ctx := context.Background()
	for _, n := range m.redis.Nodes {
		cl := n.Client()
		if err := cl.FlushAll(ctx).Err(); err != nil {
			m.fail("FLUSHALL: %v", err)
		}
		cl.Close()
	}
}

// settleExpiries waits for the sweepers to expire the holds due before
// the given time, applies that to the model, and reports whether there
// were any. A held cart expires whole.
func (m *sim) settleExpiries(before time.Time) bool {
	ctx := context.Background()
	settled := false
	back := map[*mSKU]int64{}
	defer func() {
		for _, s := range m.stocks() {
			m.returned(s, back[s])
		}
	}()
	for _, h := range m.holds {
		if h.state != ledger.Held || !h.expires.Before(before) {
			continue
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			got, err := m.envs[0].Ledger.HoldByID(ctx, keys.MustID(h.id))
			if err != nil {
				m.fail("hold %s: %v", h.id, err)
			}
			if got.State == ledger.Expired {
				break
			}
			if time.Now().After(deadline) {
				m.fail("hold %s still %s 5s after its expiry", h.id, got.State)
			}
			time.Sleep(20 * time.Millisecond) // poll interval
		}
		m.ops["expired"]++
		m.tracef("hold %s of %d %s expired", h.id, h.q, h.sku.ticket())
		h.state = ledger.Expired
		h.sku.held -= h.q
		back[h.sku] += h.q
		settled = true
		if c := h.cart; c != nil && !slices.ContainsFunc(c.holds, func(h *mHold) bool { return h.state != ledger.Expired }) {
			c.state = ledger.Expired
		}
	}
	return settled
}

// checkLedger compares the ledger with the model. A hold may expire
// between the model's accounting and the read: then account and read again.
func (m *sim) checkLedger() {
	ctx := context.Background()
	led := m.envs[0].Ledger
	for _, s := range m.ledgerStocks() {
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
			m.settleExpiries(time.Now())
			m.settlePoolMoves()
		}
	}
}

// checkBuyers compares every buyer's counted units, of each ticket and of
// the program that has a cap now, in the ledger with the model's holds
// and orders (the ledger counts only under a cap, and a cap switched on
// counts what stands then).
func (m *sim) checkBuyers() {
	ctx := context.Background()
	led := m.envs[0].Ledger
	for attempt := 0; ; attempt++ {
		var diff []string
		for b := range modelBuyers {
			buyer := fmt.Sprintf("buyer%d", b)
			for _, s := range append(slices.Clone(m.skus), nil) {
				if (s == nil && m.programCap == 0) || (s != nil && s.capped().perBuyer == 0) {
					continue // no cap: nothing counted
				}
				var got int64
				var err error
				name := "program"
				if s == nil {
					got, err = led.ProgramUnits(ctx, m.program, keys.MustID(buyer))
				} else {
					name = s.ticket()
					got, err = led.BuyerUnits(ctx, s.sku, keys.MustID(buyer))
				}
				if err != nil {
					m.fail("buyer units: %v", err)
				}
				if want := m.units(buyer, s); got != want {
					diff = append(diff, fmt.Sprintf("%s %s: ledger %d, model %d", buyer, name, got, want))
				}
			}
		}
		for _, code := range m.codes {
			got, err := led.CodeUses(ctx, m.pool.sku, sale.CodeHash(m.pool.sku, code))
			if err != nil {
				m.fail("code uses: %v", err)
			}
			if want := m.codeUses(code); got != want || got > 2 {
				diff = append(diff, fmt.Sprintf("code %s: ledger %d uses, model %d (of 2)", code, got, want))
			}
		}
		if len(diff) == 0 {
			return
		}
		if attempt == 2 {
			m.fail("buyer units: %s", strings.Join(diff, "; "))
		}
		m.settleExpiries(time.Now())
	}
}

// checkReport reads the program's reconciliation report through the API:
// every SKU and pool adds up to its total, its row agrees with its order
// and hold rows, and its sold is the model's.
func (m *sim) checkReport() {
	r := m.env().Do(m.t, http.MethodGet, "/v1/admin/programs/"+m.program.String()+"/report", nil, "")
	var rep struct {
		Balanced bool
		SKUs     []struct {
			Ticket, Pool            string
			Total, Sold, Held, Open int64
			Balanced                bool
		}
	}
	if err := json.Unmarshal(r.Body, &rep); r.Status != http.StatusOK || err != nil || !rep.Balanced {
		m.fail("report = %d %s (%v), want balanced", r.Status, r.Body, err)
	}
	lines := map[string]int{}
	for i, l := range rep.SKUs {
		name := l.Ticket
		if l.Pool != "" {
			name += "." + l.Pool
		}
		lines[name] = i
		if !l.Balanced || l.Sold+l.Held+l.Open != l.Total {
			m.fail("report line %+v does not add up", l)
		}
	}
	for _, s := range m.stocks() {
		i, ok := lines[s.sku.Ticket.String()]
		if !ok {
			m.fail("the report has no line of %s: %s", s.sku, r.Body)
		} else if rep.SKUs[i].Sold != s.sold {
			m.fail("the report has %s sold %d, the model %d", s.sku, rep.SKUs[i].Sold, s.sold)
		}
	}
}

// checkEvents reads the program's event log through the API and replays
// it: each order and hold has at most one event of each kind, and what
// the events say each stock sold and holds is what the ledger has.
func (m *sim) checkEvents() {
	// A hold may expire between the log's read and the ledger's: then
	// read both again.
	for attempt := 0; ; attempt++ {
		diff := m.replayEvents()
		if diff == "" {
			return
		}
		if attempt == 2 {
			m.fail("%s", diff)
		}
		m.settleExpiries(time.Now())
	}
}

// replayEvents is one read and replay of the event log for checkEvents:
// what differs from the ledger, "" for nothing.
func (m *sim) replayEvents() string {
	type count struct{ sold, held int64 }
	got := map[string]*count{}
	seen := map[string]bool{}
	kinds := map[string]int{}
	var after int64
	for {
		r := m.envs[0].Do(m.t, http.MethodGet, fmt.Sprintf("/v1/admin/events?program=%s&after=%d&limit=500", m.program, after), nil, "")
		var page struct {
			Events []struct {
				Seq      int64  `json:"seq"`
				Type     string `json:"type"`
				Ticket   string `json:"ticket"`
				Pool     string `json:"pool"`
				Subject  string `json:"subject"`
				Quantity int64  `json:"quantity"`
			} `json:"events"`
			Next int64 `json:"next"`
		}
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &page) != nil {
			m.fail("GET events = %d %s", r.Status, r.Body)
		}
		if len(page.Events) == 0 {
			break
		}
		for _, e := range page.Events {
			kinds[e.Type]++
			// One event per subject and type, but for transfers: an order's
			// tickets may move again and again.
			if e.Subject != "" && e.Type != "order.transferred" {
				if k := e.Type + " " + e.Subject; seen[k] {
					m.fail("event %s twice", k)
				} else {
					seen[k] = true
				}
			}
			stock := e.Ticket
			if e.Pool != "" {
				stock += "." + e.Pool
			}
			if got[stock] == nil {
				got[stock] = &count{}
			}
			c := got[stock]
			switch e.Type {
			case "order.created":
				c.sold += e.Quantity
			case "order.refunded":
				c.sold -= e.Quantity
			case "hold.created", "waitlist.offer_made":
				c.held += e.Quantity
			case "hold.confirmed":
				c.held -= e.Quantity
				c.sold += e.Quantity
			case "hold.cancelled", "hold.expired", "waitlist.offer_expired", "hold.released":
				c.held -= e.Quantity
			}
		}
		after = page.Next
	}
	ctx := context.Background()
	for _, s := range m.stocks() {
		st, err := m.envs[0].Ledger.SKU(ctx, s.sku)
		if err != nil {
			m.fail("ledger: %v", err)
		}
		c := got[s.sku.Ticket.String()]
		if c == nil {
			c = &count{}
		}
		if c.sold != st.Sold || c.held != st.Held {
			return fmt.Sprintf("%s: the event log replayed says sold %d held %d, the ledger %d and %d", s.sku, c.sold, c.held, st.Sold, st.Held)
		}
	}
	m.t.Logf("event log: %v", kinds)
	return ""
}

// checkCarts reads carts through the API (every cart, or a sample) and
// compares their holds and orders with the model.
func (m *sim) checkCarts(all bool) {
	cs := m.carts
	if !all && len(cs) > 10 {
		cs = nil
		for _, i := range m.rng.Perm(len(m.carts))[:10] {
			cs = append(cs, m.carts[i])
		}
	}
	for _, c := range cs {
		if c.state == ledger.Held && time.Until(c.holds[0].expires) < time.Second {
			continue // may be expiring as it is read
		}
		r := m.env().Do(m.t, http.MethodGet, "/v1/carts/"+c.id, nil, "")
		v := parseCart(r)
		if r.Status != http.StatusOK || v.CartID != c.id || v.Buyer != c.take.buyer || len(v.Holds) != len(c.holds) || len(v.Orders) != len(c.orders) {
			m.fail("GET cart %s (%s, %d holds, %d orders) = %d %s", c.id, c.state, len(c.holds), len(c.orders), r.Status, r.Body)
		}
		for _, h := range c.holds {
			if !slices.ContainsFunc(v.Holds, func(got cartHoldView) bool {
				return got.HoldID == h.id && got.State == h.state && got.Ticket == h.sku.ticket() && got.Quantity == h.q
			}) {
				m.fail("GET cart %s = %s: want hold %s %s of %d %s", c.id, r.Body, h.id, h.state, h.q, h.sku.ticket())
			}
		}
		for _, o := range c.orders {
			if !slices.ContainsFunc(v.Orders, func(got cartOrderView) bool {
				return got.OrderID == o.id && (got.RefundedAt != nil) == o.refunded && got.Ticket == o.sku.ticket() && got.Quantity == o.q
			}) {
				m.fail("GET cart %s = %s: want order %s of %d %s, refunded %v", c.id, r.Body, o.id, o.q, o.sku.ticket(), o.refunded)
			}
		}
	}
}

// gateCounts is what the gate counts of buyer per ticket and for the
// program, for a failure's message.
func (m *sim) gateCounts(buyer string) string {
	var out []string
	for _, t := range []keys.ID{m.skus[0].sku.Ticket, m.skus[1].sku.Ticket, m.skus[2].sku.Ticket, {}} {
		used, err := m.envs[0].Redis.HGet(context.Background(), keys.Quota(m.program, t, keys.MustID(buyer)), "used").Result()
		if err != nil {
			used = "none"
		}
		out = append(out, cmp.Or(t.String(), "program")+":"+used)
	}
	return strings.Join(out, " ")
}

// checkRedis waits (bounded) for every SKU's Redis remaining to equal the
// ledger's: restores, expiries and rebuilds done.
func (m *sim) checkRedis() {
	ctx := context.Background()
	e := m.envs[0]
	for _, s := range m.ledgerStocks() {
		deadline := time.Now().Add(10 * time.Second)
		for {
			st, err := e.Ledger.SKU(ctx, s.sku)
			if err != nil {
				m.fail("ledger: %v", err)
			}
			left, seeded, err := e.Gate.Remaining(ctx, s.sku, st.Shards)
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
				e.Do(m.t, http.MethodPost, systest.AdminPath(s.capped().sku)+"/reconcile"+poolParam(s), nil, "")
			}
			if time.Now().After(deadline) {
				pending, _ := e.Ledger.PendingRestores(ctx, 0, 100)
				m.fail("%s: Redis remaining %d (seeded %v, %v), ledger remaining %d (%+v), 10s after the step; pending restores %+v",
					s.sku, left, seeded, err, want, st, pending)
			}
			time.Sleep(20 * time.Millisecond) // poll interval
		}
	}
}

// gates describes each SKU's gate beside its ledger row and the restores
// still owed, for a failure that may come from their gap (a false
// sold-out: a return not yet in Redis, or a replica's flag outliving it).
func (m *sim) gates() string {
	ctx := context.Background()
	e := m.envs[0]
	var b strings.Builder
	for _, s := range m.ledgerStocks() {
		st, err := e.Ledger.SKU(ctx, s.sku)
		if err != nil {
			fmt.Fprintf(&b, "%s: ledger: %v; ", s.sku, err)
			continue
		}
		left, seeded, err := e.Gate.Remaining(ctx, s.sku, st.Shards)
		fmt.Fprintf(&b, "%s: ledger remaining %d (epoch %d, %d shards, version %d), Redis %d (seeded %v, %v); ",
			s.sku, st.Remaining(), st.GateEpoch, st.Shards, st.Version, left, seeded, err)
	}
	pending, err := e.Ledger.PendingRestores(ctx, 0, 100)
	fmt.Fprintf(&b, "pending restores %+v (%v)", pending, err)
	return b.String()
}

// poolParam is the query naming s's pool, if it is one.
func poolParam(s *mSKU) string {
	if s.base == nil {
		return ""
	}
	return "?pool=" + s.name
}

// runOf is a model run's length and seed: steps (STOCKGATE_MODEL_STEPS
// over per, when set) and a new seed (STOCKGATE_MODEL_SEED, when set,
// replays a run).
func runOf(steps, per int) (int, uint64) {
	if v, err := strconv.Atoi(os.Getenv("STOCKGATE_MODEL_STEPS")); err == nil && v > 0 {
		steps = v / per
	}
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("STOCKGATE_MODEL_SEED"), 10, 64); err == nil {
		seed = v
	}
	return steps, seed
}

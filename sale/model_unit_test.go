package sale_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockgate/stockgate/cache"
	"github.com/stockgate/stockgate/fleet"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// unitService is a sale.Service that starts no server: its gate and locks
// in memory (package shard/shardmem, held to Redis by shard's and lock's
// contract tests) and its ledger a SQLite file. It runs in the unit tier.
func unitService(t *testing.T) (*sale.Service, *shard.Store) {
	t.Helper()
	ctx := context.Background()
	mem := shardmem.New()
	c, err := cache.New(cache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gate, err := shard.New(shard.Options{Redis: mem, Empty: c})
	if err != nil {
		t.Fatal(err)
	}
	locker, err := lock.New(lock.Options{Redis: mem})
	if err != nil {
		t.Fatal(err)
	}
	led, err := fleet.Open(ctx, fleet.Options{Primaries: []fleet.Primary{{Name: "main",
		Ledger: ledger.Options{Driver: ledger.SQLite, DSN: testenv.LedgerSQLitePath(t)}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { led.Close() })
	svc, err := sale.New(sale.Options{Gate: gate, Ledger: led, Cache: c, Locker: locker,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	return svc, gate
}

// TestServiceAgainstAModel drives sale.Service, with no server, through
// random sequences of purchases, holds, confirms, cancels and refunds by
// four buyers over two SKUs (one shard, and three), retries under the
// same key and reuses of a key for another request among them, and holds
// every answer to a reference model of the stock: who got what, what is
// left, and that Redis (here the in-memory gate) counts what the ledger
// does after every step. Many seeds, in seconds: the sale's decisions
// exercised where make test-unit runs.
func TestServiceAgainstAModel(t *testing.T) {
	for seed := range uint64(12) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			svc, gate := unitService(t)
			m := newModel(t, svc, gate, seed)
			for step := range 150 {
				m.step(step)
			}
			m.check("at the end")
			t.Logf("%d orders (%d refunded), %d holds, %d sold-out answers, %d retries", len(m.orders), m.count["refunded"], len(m.holds), m.count["sold-out"], m.count["retry"])
		})
	}
}

type model struct {
	t      *testing.T
	ctx    context.Context
	svc    *sale.Service
	gate   *shard.Store
	rnd    *rand.Rand
	skus   []modelSKU
	orders []*modelOrder
	holds  []*modelHold
	done   []modelRequest // committed purchases and holds, by key, for retries
	keys   int
	where  string
	count  map[string]int // answers by kind, for the log
}

type modelSKU struct {
	sku                  stock.SKU
	shards               int
	total, remaining, on int64 // on: held
}

type modelOrder struct {
	id       keys.ID
	sku      int
	buyer    keys.ID
	q        int64
	refunded bool
}

type modelHold struct {
	id    keys.ID
	sku   int
	buyer keys.ID
	q     int64
	state string // held, confirmed, cancelled
	order keys.ID
}

type modelRequest struct {
	take sale.Take
	hold bool
	id   keys.ID // what it made
}

var modelBuyers = []keys.ID{keys.MustID("ann"), keys.MustID("bob"), keys.MustID("cat"), keys.MustID("dan")}

func newModel(t *testing.T, svc *sale.Service, gate *shard.Store, seed uint64) *model {
	m := &model{t: t, ctx: context.Background(), svc: svc, gate: gate, rnd: rand.New(rand.NewPCG(seed, 7)), count: map[string]int{}}
	program := keys.MustID(fmt.Sprintf("m%d", seed))
	for _, s := range []modelSKU{{shards: 1, total: 8}, {shards: 3, total: 12}} {
		s.sku = stock.SKU{Program: program, Ticket: keys.MustID(fmt.Sprintf("t%d", len(m.skus)))}
		s.remaining = s.total
		if _, err := svc.PutSKU(m.ctx, sale.SKUConfig{SKU: s.sku, Total: s.total, Shards: s.shards, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		// Seeded now, as a replica's first take of it would: the gate's
		// count is compared from the first step.
		if _, err := svc.Reconcile(m.ctx, s.sku); err != nil {
			t.Fatal(err)
		}
		m.skus = append(m.skus, s)
	}
	return m
}

func (m *model) fail(format string, a ...any) {
	m.t.Helper()
	m.t.Fatalf("%s: %s", m.where, fmt.Sprintf(format, a...))
}

func (m *model) key() keys.ID {
	m.keys++
	return keys.MustID(fmt.Sprintf("k%d", m.keys))
}

func (m *model) step(n int) {
	switch w := m.rnd.IntN(100); {
	case w < 30:
		m.take(n, false)
	case w < 50:
		m.take(n, true)
	case w < 60:
		m.retry(n)
	case w < 75:
		m.confirm(n)
	case w < 85:
		m.cancel(n)
	default:
		m.refund(n)
	}
	m.check("after it")
}

// take is a new purchase or hold: it sells when the stock is there.
func (m *model) take(n int, hold bool) {
	i := m.rnd.IntN(len(m.skus))
	s := &m.skus[i]
	tk := sale.Take{Ask: sale.Ask{Buyer: modelBuyers[m.rnd.IntN(len(modelBuyers))], Key: m.key()}, SKU: s.sku,
		Quantity: int64(m.rnd.IntN(4) + 1)}
	m.where = fmt.Sprintf("step %d: %s %v of %d (%d left)", n, map[bool]string{false: "purchase", true: "hold"}[hold], tk.Buyer, tk.Quantity, s.remaining)
	res, err := m.send(tk, hold)
	switch {
	case s.remaining < tk.Quantity:
		if !errors.Is(err, sale.ErrSoldOut) {
			m.fail("got %+v, %v; want sold out", res, err)
		}
		m.count["sold-out"]++
		return
	case err != nil:
		m.fail("refused: %v", err)
	}
	s.remaining -= tk.Quantity
	if hold {
		if res.Hold == nil || res.Hold.Quantity != tk.Quantity || res.Replayed {
			m.fail("answered %+v", res)
		}
		s.on += tk.Quantity
		m.holds = append(m.holds, &modelHold{id: res.Hold.ID, sku: i, buyer: tk.Buyer, q: tk.Quantity, state: "held"})
		m.done = append(m.done, modelRequest{take: tk, hold: true, id: res.Hold.ID})
		return
	}
	if res.Order == nil || res.Order.Quantity != tk.Quantity || res.Replayed {
		m.fail("answered %+v", res)
	}
	m.orders = append(m.orders, &modelOrder{id: res.Order.ID, sku: i, buyer: tk.Buyer, q: tk.Quantity})
	m.done = append(m.done, modelRequest{take: tk, id: res.Order.ID})
}

func (m *model) send(tk sale.Take, hold bool) (sale.Result, error) {
	if hold {
		tk.TTL = time.Hour
		return m.svc.Hold(m.ctx, tk)
	}
	return m.svc.Purchase(m.ctx, tk)
}

// retry sends a committed request again under its key: the same answer,
// nothing moved, whatever became of it since; or, a time in three,
// another quantity under that key: refused as a reuse, nothing moved.
func (m *model) retry(n int) {
	if len(m.done) == 0 {
		return
	}
	r := m.done[m.rnd.IntN(len(m.done))]
	tk := r.take
	reuse := m.rnd.IntN(3) == 0
	if reuse {
		tk.Quantity = tk.Quantity%4 + 1
	}
	m.where = fmt.Sprintf("step %d: retry of %v (hold %v, reuse %v)", n, tk.Key, r.hold, reuse)
	m.count["retry"]++
	res, err := m.send(tk, r.hold)
	switch {
	case reuse:
		if !errors.Is(err, sale.ErrKeyReused) {
			m.fail("got %+v, %v; want the key refused as reused", res, err)
		}
	case err != nil:
		m.fail("refused: %v", err)
	case r.hold && (res.Hold == nil || res.Hold.ID != r.id || !res.Replayed):
		m.fail("answered %+v; want hold %v replayed", res, r.id)
	case !r.hold && (res.Order == nil || res.Order.ID != r.id || !res.Replayed):
		m.fail("answered %+v; want order %v replayed", res, r.id)
	}
}

func (m *model) someHold() *modelHold {
	if len(m.holds) == 0 {
		return nil
	}
	return m.holds[m.rnd.IntN(len(m.holds))]
}

// confirm: a held hold becomes its buyer's order; another buyer is not
// its owner; a confirmed one answers its order; a cancelled one refuses.
func (m *model) confirm(n int) {
	h := m.someHold()
	if h == nil {
		return
	}
	owner := m.rnd.IntN(5) > 0
	a := sale.Ask{Buyer: h.buyer, Key: m.key()}
	if !owner {
		a.Buyer = modelBuyers[(slices.Index(modelBuyers, h.buyer)+1)%len(modelBuyers)]
	}
	m.where = fmt.Sprintf("step %d: confirm of a %s hold of %d (owner %v)", n, h.state, h.q, owner)
	res, err := m.svc.Confirm(m.ctx, h.id, a)
	switch {
	case !owner:
		if !errors.Is(err, sale.ErrNotOwner) {
			m.fail("got %+v, %v; want not owner", res, err)
		}
	case h.state == "cancelled":
		if !errors.Is(err, sale.ErrHoldCancelled) {
			m.fail("got %+v, %v; want hold cancelled", res, err)
		}
	case err != nil:
		m.fail("refused: %v", err)
	case res.Order == nil || res.Order.Quantity != h.q || (h.state == "confirmed" && res.Order.ID != h.order):
		m.fail("answered %+v", res)
	case h.state == "held":
		h.state, h.order = "confirmed", res.Order.ID
		m.skus[h.sku].on -= h.q
		m.orders = append(m.orders, &modelOrder{id: res.Order.ID, sku: h.sku, buyer: h.buyer, q: h.q})
	}
}

// cancel: a held hold gives its units back; a confirmed one refuses; a
// cancelled one stays so.
func (m *model) cancel(n int) {
	h := m.someHold()
	if h == nil {
		return
	}
	m.where = fmt.Sprintf("step %d: cancel of a %s hold of %d", n, h.state, h.q)
	res, err := m.svc.Cancel(m.ctx, h.id, sale.Ask{Buyer: h.buyer, Key: m.key()})
	switch h.state {
	case "confirmed":
		if !errors.Is(err, sale.ErrHoldConfirmed) {
			m.fail("got %+v, %v; want hold confirmed", res, err)
		}
	case "cancelled":
		if err != nil && !errors.Is(err, sale.ErrHoldCancelled) {
			m.fail("got %v; want the cancel again, or hold cancelled", err)
		}
	default:
		if err != nil {
			m.fail("refused: %v", err)
		}
		h.state = "cancelled"
		m.skus[h.sku].on -= h.q
		m.skus[h.sku].remaining += h.q
	}
}

// refund: a standing order's units come back; a refunded one stays so.
func (m *model) refund(n int) {
	if len(m.orders) == 0 {
		return
	}
	o := m.orders[m.rnd.IntN(len(m.orders))]
	m.where = fmt.Sprintf("step %d: refund of an order of %d (refunded %v)", n, o.q, o.refunded)
	res, err := m.svc.Refund(m.ctx, o.id, sale.Ask{Buyer: o.buyer, Key: m.key()})
	switch {
	case o.refunded:
		if err != nil && !errors.Is(err, sale.ErrOrderRefunded) {
			m.fail("got %v; want the refund again, or order refunded", err)
		}
	case err != nil:
		m.fail("refused: %v", err)
	case res.Order == nil || res.Order.ID != o.id || res.Order.RefundedAt.IsZero():
		m.fail("answered %+v", res)
	default:
		o.refunded = true
		m.count["refunded"]++
		m.skus[o.sku].remaining += o.q
	}
}

// check holds the ledger's report and the gate to the model: sold, held
// and open as the model counts them, balanced, and Redis's count the
// ledger's open stock.
func (m *model) check(when string) {
	m.t.Helper()
	rows, err := m.svc.Report(m.ctx, m.skus[0].sku.Program)
	if err != nil {
		m.fail("report %s: %v", when, err)
	}
	for i, s := range m.skus {
		r := rows[i]
		sold := s.total - s.remaining - s.on
		if r.SKU != s.sku || !r.Balanced() || r.Sold != sold || r.Held != s.on || r.Open != s.remaining {
			m.fail("report %s: %+v; the model: sold %d, held %d, open %d", when, r.StockReport, sold, s.on, s.remaining)
		}
		left, seeded, err := m.gate.Remaining(m.ctx, s.sku, s.shards)
		if err != nil || !seeded || left != s.remaining {
			m.fail("gate %s: %d left (seeded %v, %v); the ledger and the model: %d", when, left, seeded, err, s.remaining)
		}
	}
}

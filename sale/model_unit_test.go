package sale_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// unitServiceOn is a sale.Service that starts no server: its gate and
// locks on mem (package shard/shardmem, held to Redis by shard's and
// lock's contract tests) and its ledger a SQLite file. It runs in the
// unit tier.
func unitServiceOn(t *testing.T, mem lock.Redis) (*sale.Service, *shard.Store) {
	t.Helper()
	return sale.TestService(t, mem, nil)
}

// TestServiceAgainstAModel drives sale.Service, with no server, through
// random sequences of purchases, holds, whole and partial confirms,
// cancels, refunds, transfers of all or some of an order, and carts bought
// or held (then confirmed, cancelled or refunded whole) by four buyers
// over two SKUs (one shard, and three), where they meet (a cart's hold
// confirmed alone, a cart's order transferred, a transferred order
// refunded by its new buyer, a part-confirmed hold confirmed whole),
// retries under the same key and reuses of a key for another request
// among them, under the program's hold budgets (none, a buyer's, a
// device's shared by two buyers, both, by seed: a hold or held cart over
// one is refused and moves nothing, a confirm or cancel gives its units
// back to them), with resale (listings of some of an order, withdrawals,
// settles giving the sales to the listings "first" or "alongside" by
// seed, retries of a listing, refunds and transfers of listed and resold
// orders: model_resale_unit_test.go), with holds that expire as the
// clock moves and late payments of them, bought or refused for good
// (model_late_unit_test.go), and holds every answer to a
// reference model of the stock: who got what, what is left, what is
// listed and resold, and that Redis (here the in-memory gate) counts what
// the ledger does after every step. Many seeds, in
// seconds: the sale's decisions exercised where make test-unit runs.
func TestServiceAgainstAModel(t *testing.T) {
	for seed := range uint64(16) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			// The sale's and the ledger's clock, moved by step alone.
			var ahead atomic.Int64
			start := time.Now().Truncate(time.Second)
			now := func() time.Time { return start.Add(time.Duration(ahead.Load())) }
			svc, gate := sale.TestServiceAt(t, shardmem.New(), nil, now, func(o *sale.Options) {
				o.Now, o.LatePayment = now, modelLateWindow
			})
			m := newModel(t, svc, gate, seed)
			m.ahead, m.now = &ahead, now
			for step := range 200 {
				m.step(step)
			}
			m.check("at the end")
			t.Logf("%d orders (%d refunded, %d split off), %d holds (%d confirmed in part, %d expired, %d paid late, %d late refused), %d carts, %d listings (%d withdrawn, %d units resold, %d holds from before confirmed, %d settles that left sales inside the horizon), %d sold-out answers, %d hold budget refusals (budgets %d, device %d), %d retries",
				len(m.orders), m.count["refunded"], m.count["split"], len(m.holds), m.count["part"], m.count["expired"], m.count["late"], m.count["late refused"], len(m.carts),
				m.count["listed"], m.count["withdrawn"], m.count["resold"], m.count["prior"], m.count["horizon"], m.count["sold-out"],
				m.count["budget"], m.budget, m.deviceBudget, m.count["retry"])
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
	carts  []*modelCart
	done   []modelRequest // committed purchases, holds and carts, by key, for retries
	keys   int
	where  string
	count  map[string]int // answers by kind, for the log
	// The program's hold budgets (0: none): units one buyer, and one
	// device (modelDevices), may hold at once.
	budget, deviceBudget int64
	// Resale (model_resale_unit_test.go): the listings oldest first, the
	// listing requests made, and the ledger's clock ahead of the
	// machine's (most steps move it past ledger.ResaleHorizon, so a
	// settle counts every sale before it; one in two moves it 0.5 s).
	resale   string // the SKUs' resale mode, by seed
	seq      int64  // the sales and listings so far, in order
	listings []*modelListing
	lists    []modelListRequest
	ahead    *atomic.Int64
	now      func() time.Time // the sale's and the ledger's clock
}

type modelSKU struct {
	sku                  stock.SKU
	shards               int
	total, remaining, on int64 // on: held
	// listed: units of open listings not sold yet; sales: those sold
	// since the settle before (or the first listing), which a settle
	// gives to the listings begun before each.
	listed  int64
	sales   []modelSale
	carry   int64       // an alongside share's fraction, in millionths of a unit
	takers  []modelSale // every sale and withdrawal, for checkListings
	refunds []modelSale // every refund, in the sequence
}

type modelOrder struct {
	id       keys.ID
	sku      int
	buyer    keys.ID
	q        int64 // standing: less what transfers split off
	refunded bool
	cart     *modelCart // the cart it is a line of
	listed   int64      // its units on open listings, not sold yet
	resold   bool       // every unit resold: given up as refunded, no refund
	// resoldUnits: its units resold (q no longer counts them).
	resoldUnits int64
}

type modelHold struct {
	id    keys.ID
	sku   int
	buyer keys.ID
	q     int64
	state string // held, confirmed, cancelled, expired
	// expires: its expiry; late: an expired hold's late payment, paid
	// (its order lateOrder, of lateKept) or refused.
	expires   time.Time
	late      string
	lateOrder keys.ID
	lateKept  int64
	order     keys.ID
	kept      int64      // the units it was confirmed for
	cart      *modelCart // the cart it is a line of
	// prior: held when a listing of its SKU began (the first such
	// listing's since priorSince; 0 for the first of its SKU's listings):
	// its confirm sells none of that listing's units, nor a later one's.
	prior      bool
	priorSince int64
}

// modelCart is a cart: bought (its orders) or held (its holds, then the
// orders its confirm made).
type modelCart struct {
	id     keys.ID
	buyer  keys.ID
	held   bool
	state  string // bought, held, confirmed, cancelled
	holds  []*modelHold
	orders []*modelOrder
}

type modelRequest struct {
	take sale.Take
	cart *sale.CartTake // a cart's request instead of take
	hold bool
	id   keys.ID // what it made
}

var modelBuyers = []keys.ID{keys.MustID("ann"), keys.MustID("bob"), keys.MustID("cat"), keys.MustID("dan")}

// modelDevice is the device fingerprint a buyer's holds are sent with:
// two buyers share each, so a device's budget binds across buyers.
func modelDevice(b keys.ID) string {
	return fmt.Sprintf("device-%d", slices.Index(modelBuyers, b)/2)
}

// modelBudgets are the programs' hold budgets by seed: none, a buyer's,
// a device's, both.
var modelBudgets = [][2]int64{{0, 0}, {5, 0}, {0, 7}, {4, 6}}

func newModel(t *testing.T, svc *sale.Service, gate *shard.Store, seed uint64) *model {
	m := &model{t: t, ctx: context.Background(), svc: svc, gate: gate, rnd: rand.New(rand.NewPCG(seed, 7)), count: map[string]int{}}
	program := keys.MustID(fmt.Sprintf("m%d", seed))
	m.budget, m.deviceBudget = modelBudgets[seed%4][0], modelBudgets[seed%4][1]
	m.resale = []string{ledger.ResaleFirst, ledger.ResaleAlongside}[seed/4%2]
	if m.budget > 0 || m.deviceBudget > 0 {
		if err := svc.PutProgram(m.ctx, sale.Program{ID: program, HoldBudget: m.budget, DeviceHoldBudget: m.deviceBudget}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []modelSKU{{shards: 1, total: 16}, {shards: 3, total: 24}} {
		s.sku = stock.SKU{Program: program, Ticket: keys.MustID(fmt.Sprintf("t%d", len(m.skus)))}
		s.remaining = s.total
		if _, err := svc.PutSKU(m.ctx, sale.SKUConfig{SKU: s.sku, Total: s.total, Shards: s.shards, MaxPerOrder: 4, Resale: m.resale}); err != nil {
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
	// One step in two is short: the sales of the last few steps are then
	// inside ledger.ResaleHorizon, and a settle leaves them to the next.
	if m.rnd.IntN(2) == 0 {
		m.ahead.Add(int64(modelShortStep))
	} else {
		m.ahead.Add(int64(modelStep))
	}
	m.expire()
	switch w := m.rnd.IntN(122); {
	case w < 20:
		m.take(n, false)
	case w < 32:
		m.take(n, true)
	case w < 40:
		m.retry(n)
	case w < 48:
		m.confirm(n)
	case w < 54:
		m.confirmPart(n)
	case w < 61:
		m.cancel(n)
	case w < 70:
		m.refund(n)
	case w < 79:
		m.transfer(n)
	case w < 85:
		m.cart(n, m.rnd.IntN(2) == 0)
	case w < 100:
		m.cartEnd(n)
	case w < 110:
		m.list(n)
	case w < 116:
		m.withdraw(n)
	default:
		m.settle(n)
	}
	m.check("after it")
}

// take is a new purchase or hold: it sells when the stock is there.
func (m *model) take(n int, hold bool) {
	i := m.rnd.IntN(len(m.skus))
	s := &m.skus[i]
	b := modelBuyers[m.rnd.IntN(len(modelBuyers))]
	tk := sale.Take{Ask: sale.Ask{Buyer: b, Key: m.key(), Device: modelDevice(b)}, SKU: s.sku,
		Quantity: int64(m.rnd.IntN(4) + 1)}
	if hold {
		tk.TTL = modelTTLs[m.rnd.IntN(len(modelTTLs))]
	}
	over := hold && m.overBudget(b, tk.Quantity)
	m.where = fmt.Sprintf("step %d: %s %v of %d (%d left, over a hold budget %v)", n, map[bool]string{false: "purchase", true: "hold"}[hold], tk.Buyer, tk.Quantity, s.remaining, over)
	res, err := m.send(tk, hold)
	switch {
	case over:
		// Refused at the gate before any stock moves; a sold-out flag
		// the replica holds answers first.
		if !errors.Is(err, sale.ErrHoldBudget) && (s.remaining >= tk.Quantity || !errors.Is(err, sale.ErrSoldOut)) {
			m.fail("got %+v, %v; want hold budget reached", res, err)
		}
		m.count["budget"]++
		return
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
		if res.Hold == nil || res.Hold.Quantity != tk.Quantity || res.Replayed || !res.Hold.ExpiresAt.Equal(m.now().Add(tk.TTL)) {
			m.fail("answered %+v; want a hold until %v", res, m.now().Add(tk.TTL))
		}
		s.on += tk.Quantity
		m.holds = append(m.holds, &modelHold{id: res.Hold.ID, sku: i, buyer: tk.Buyer, q: tk.Quantity, state: "held", expires: res.Hold.ExpiresAt})
		m.done = append(m.done, modelRequest{take: tk, hold: true, id: res.Hold.ID})
		return
	}
	if res.Order == nil || res.Order.Quantity != tk.Quantity || res.Replayed {
		m.fail("answered %+v", res)
	}
	m.sold(i, tk.Quantity, nil)
	m.orders = append(m.orders, &modelOrder{id: res.Order.ID, sku: i, buyer: tk.Buyer, q: tk.Quantity})
	m.done = append(m.done, modelRequest{take: tk, id: res.Order.ID})
}

func (m *model) send(tk sale.Take, hold bool) (sale.Result, error) {
	if hold {
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
	reuse := m.rnd.IntN(3) == 0
	m.count["retry"]++
	if r.cart != nil {
		ct := *r.cart
		ct.Lines = slices.Clone(ct.Lines)
		if reuse {
			ct.Lines[0].Quantity = ct.Lines[0].Quantity%4 + 1
		}
		m.where = fmt.Sprintf("step %d: retry of cart %v (held %v, reuse %v)", n, ct.Key, r.hold, reuse)
		res, err := m.sendCart(ct, r.hold)
		switch {
		case reuse:
			if !errors.Is(err, sale.ErrKeyReused) {
				m.fail("got %+v, %v; want the key refused as reused", res, err)
			}
		case err != nil:
			m.fail("refused: %v", err)
		case res.Cart == nil || res.Cart.ID != r.id || !res.Replayed:
			m.fail("answered %+v; want cart %v replayed", res, r.id)
		}
		return
	}
	tk := r.take
	if reuse {
		tk.Quantity = tk.Quantity%4 + 1
	}
	m.where = fmt.Sprintf("step %d: retry of %v (hold %v, reuse %v)", n, tk.Key, r.hold, reuse)
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

// overBudget reports whether a hold of q more units by b passes a hold
// budget: what b holds now, or what b's device holds, with q.
func (m *model) overBudget(b keys.ID, q int64) bool {
	var buyer, device int64
	for _, h := range m.holds {
		if h.state != "held" {
			continue
		}
		if h.buyer == b {
			buyer += h.q
		}
		if modelDevice(h.buyer) == modelDevice(b) {
			device += h.q
		}
	}
	return m.budget > 0 && buyer+q > m.budget || m.deviceBudget > 0 && device+q > m.deviceBudget
}

func (m *model) someHold() *modelHold {
	if len(m.holds) == 0 {
		return nil
	}
	return m.holds[m.rnd.IntN(len(m.holds))]
}

// orderAsk picks an order (nil: none yet) and an ask of it under a new
// key: by its buyer, or a time in six by another (owner false).
func (m *model) orderAsk() (o *modelOrder, a sale.Ask, owner bool) {
	if len(m.orders) == 0 {
		return nil, a, false
	}
	o = m.orders[m.rnd.IntN(len(m.orders))]
	owner = m.rnd.IntN(6) > 0
	a = sale.Ask{Buyer: o.buyer, Key: m.key()}
	if !owner {
		a.Buyer = otherBuyer(o.buyer, m.rnd)
	}
	return o, a, owner
}

// otherBuyer is a buyer other than b.
func otherBuyer(b keys.ID, rnd *rand.Rand) keys.ID {
	return modelBuyers[(slices.Index(modelBuyers, b)+1+rnd.IntN(len(modelBuyers)-1))%len(modelBuyers)]
}

// confirm: a held hold becomes its buyer's order; another buyer is not
// its owner; a confirmed one answers its order (whatever it was confirmed
// for); a cancelled one refuses; a cart's line is confirmed by its cart.
func (m *model) confirm(n int) {
	h := m.someHold()
	if h == nil {
		return
	}
	owner := m.rnd.IntN(5) > 0
	a := sale.Ask{Buyer: h.buyer, Key: m.key()}
	if !owner {
		a.Buyer = otherBuyer(h.buyer, m.rnd)
	}
	if owner {
		m.expireDue(h) // the confirm's first step, whoever sweeps
	}
	m.where = fmt.Sprintf("step %d: confirm of a %s hold of %d (owner %v, in a cart %v, late %q)", n, h.state, h.q, owner, h.cart != nil, h.late)
	res, err := m.svc.Confirm(m.ctx, h.id, a)
	switch {
	case !owner:
		if !errors.Is(err, sale.ErrNotOwner) {
			m.fail("got %+v, %v; want not owner", res, err)
		}
	case h.state == "expired":
		m.paidLate(h, 0, res, err)
	case h.cart != nil:
		if !errors.Is(err, sale.ErrInCart) {
			m.fail("got %+v, %v; want in cart", res, err)
		}
	case h.state == "cancelled":
		if !errors.Is(err, sale.ErrHoldCancelled) {
			m.fail("got %+v, %v; want hold cancelled", res, err)
		}
	case err != nil:
		m.fail("refused: %v", err)
	case h.state == "confirmed":
		if res.Order == nil || res.Order.ID != h.order {
			m.fail("answered %+v; want order %v", res, h.order)
		}
	case res.Order == nil || res.Order.Quantity != h.q:
		m.fail("answered %+v", res)
	default:
		m.confirmed(h, res.Order.ID, h.q)
	}
}

// confirmed makes h's order of kept units, and gives the rest back.
func (m *model) confirmed(h *modelHold, order keys.ID, kept int64) {
	h.state, h.order, h.kept = "confirmed", order, kept
	s := &m.skus[h.sku]
	s.on -= h.q
	s.remaining += h.q - kept
	m.sold(h.sku, kept, h)
	if h.prior && h.priorSince == 0 && s.listed > 0 {
		m.count["prior"]++
	}
	m.orders = append(m.orders, &modelOrder{id: order, sku: h.sku, buyer: h.buyer, q: kept, cart: h.cart})
}

// confirmPart: a held hold keeps k of its units as an order and gives the
// rest back; a confirmed one answers its order for the k it was confirmed
// for and refuses another k as confirmed; more than the hold is invalid.
func (m *model) confirmPart(n int) {
	h := m.someHold()
	if h == nil {
		return
	}
	k := int64(m.rnd.IntN(int(h.q)+1) + 1) // one past the hold now and then
	m.expireDue(h)
	m.where = fmt.Sprintf("step %d: confirm of %d of a %s hold of %d (kept %d, in a cart %v, late %q)", n, k, h.state, h.q, h.kept, h.cart != nil, h.late)
	res, err := m.svc.ConfirmPart(m.ctx, h.id, sale.Ask{Buyer: h.buyer, Key: m.key()}, k)
	switch {
	case h.state == "expired":
		m.paidLate(h, k, res, err)
	case h.cart != nil:
		if !errors.Is(err, sale.ErrInCart) {
			m.fail("got %+v, %v; want in cart", res, err)
		}
	case h.state == "cancelled":
		if !errors.Is(err, sale.ErrHoldCancelled) {
			m.fail("got %+v, %v; want hold cancelled", res, err)
		}
	case h.state == "confirmed" && k == h.kept:
		if err != nil || res.Order == nil || res.Order.ID != h.order {
			m.fail("got %+v, %v; want order %v", res, err, h.order)
		}
	case h.state == "confirmed":
		if !errors.Is(err, sale.ErrHoldConfirmed) {
			m.fail("got %+v, %v; want hold confirmed", res, err)
		}
	case k > h.q:
		if !errors.Is(err, sale.ErrInvalid) {
			m.fail("got %+v, %v; want invalid", res, err)
		}
	case err != nil:
		m.fail("refused: %v", err)
	case res.Order == nil || res.Order.Quantity != k:
		m.fail("answered %+v", res)
	default:
		m.count["part"]++
		m.confirmed(h, res.Order.ID, k)
	}
}

// cancel: a held hold gives its units back; a confirmed one refuses; a
// cancelled one stays so; a cart's line is cancelled by its cart.
func (m *model) cancel(n int) {
	h := m.someHold()
	if h == nil {
		return
	}
	due := h.state == "held" && !m.now().Before(h.expires)
	m.expireDue(h)
	m.where = fmt.Sprintf("step %d: cancel of a %s hold of %d (in a cart %v, due %v)", n, h.state, h.q, h.cart != nil, due)
	res, err := m.svc.Cancel(m.ctx, h.id, sale.Ask{Buyer: h.buyer, Key: m.key()})
	switch {
	case h.state == "expired":
		// Ended either way, nothing moved: told as it is.
		if !errors.Is(err, sale.ErrHoldExpired) && (err != nil || res.Hold == nil || res.Hold.State != "expired") {
			m.fail("got %+v, %v; want the hold told expired", res, err)
		}
	case h.cart != nil:
		if !errors.Is(err, sale.ErrInCart) {
			m.fail("got %+v, %v; want in cart", res, err)
		}
	case h.state == "confirmed":
		if !errors.Is(err, sale.ErrHoldConfirmed) {
			m.fail("got %+v, %v; want hold confirmed", res, err)
		}
	case h.state == "cancelled":
		if !errors.Is(err, sale.ErrHoldCancelled) && (err != nil || res.Hold == nil || res.Hold.ID != h.id || res.Hold.State != "cancelled") {
			m.fail("got %+v, %v; want the cancel again, or hold cancelled", res, err)
		}
	default:
		if err != nil {
			m.fail("refused: %v", err)
		}
		m.cancelled(h)
	}
}

func (m *model) cancelled(h *modelHold) {
	h.state = "cancelled"
	m.skus[h.sku].on -= h.q
	m.skus[h.sku].remaining += h.q
}

// refund: a standing order's units come back, whoever holds it now; a
// refunded one stays so; another buyer is not its owner.
func (m *model) refund(n int) {
	o, a, owner := m.orderAsk()
	if o == nil {
		return
	}
	m.where = fmt.Sprintf("step %d: refund of an order of %d (refunded %v, resold %v, %d listed, owner %v, in a cart %v)", n, o.q, o.refunded, o.resold, o.listed, owner, o.cart != nil)
	res, err := m.svc.Refund(m.ctx, o.id, a)
	switch {
	case !owner:
		if !errors.Is(err, sale.ErrNotOwner) {
			m.fail("got %+v, %v; want not owner", res, err)
		}
	case o.resold:
		if !errors.Is(err, sale.ErrOrderResold) {
			m.fail("got %+v, %v; want order resold", res, err)
		}
	case o.listed > 0:
		if !errors.Is(err, sale.ErrOrderListed) {
			m.fail("got %+v, %v; want order listed", res, err)
		}
	case o.refunded:
		if !errors.Is(err, sale.ErrOrderRefunded) && (err != nil || res.Order == nil || res.Order.ID != o.id || res.Order.RefundedAt.IsZero()) {
			m.fail("got %+v, %v; want the refund again, or order refunded", res, err)
		}
	case err != nil:
		m.fail("refused: %v", err)
	case res.Order == nil || res.Order.ID != o.id || res.Order.RefundedAt.IsZero():
		m.fail("answered %+v", res)
	default:
		m.refunded(o)
	}
}

func (m *model) refunded(o *modelOrder) {
	o.refunded = true
	m.count["refunded"]++
	s := &m.skus[o.sku]
	s.remaining += o.q
	m.seq++
	s.refunds = append(s.refunds, modelSale{seq: m.seq, units: o.q})
}

// transfer moves all of an order (q 0, or all it stands for) to another
// buyer, or splits q of it off as the receiver's new order; more than it
// stands for, a refunded order, a cart's line and another's order are
// refused. A retry under the same key answers the receiver's order again.
// Nothing is sold or given back.
func (m *model) transfer(n int) {
	o, a, owner := m.orderAsk()
	if o == nil {
		return
	}
	to := otherBuyer(a.Buyer, m.rnd)
	q := int64(m.rnd.IntN(5)) // 0: all
	m.where = fmt.Sprintf("step %d: transfer of %d of an order of %d to %v (refunded %v, resold %v, %d listed, owner %v, in a cart %v)", n, q, o.q, to, o.refunded, o.resold, o.listed, owner, o.cart != nil)
	res, err := m.svc.Transfer(m.ctx, o.id, a, to, q)
	moved := q
	if q == 0 {
		moved = o.q
	}
	switch {
	case !owner:
		if !errors.Is(err, sale.ErrNotOwner) {
			m.fail("got %+v, %v; want not owner", res, err)
		}
		return
	case o.resold:
		if !errors.Is(err, sale.ErrOrderResold) {
			m.fail("got %+v, %v; want order resold", res, err)
		}
		return
	case !o.refunded && moved <= o.q && moved > o.q-o.listed:
		// Listed units stand in the order but are not free to move.
		if !errors.Is(err, sale.ErrOrderListed) {
			m.fail("got %+v, %v; want order listed", res, err)
		}
		return
	case o.cart != nil:
		// A cart's line says so first, refunded or not.
		if !errors.Is(err, sale.ErrInCart) {
			m.fail("got %+v, %v; want in cart", res, err)
		}
		return
	case o.refunded:
		if !errors.Is(err, sale.ErrOrderRefunded) {
			m.fail("got %+v, %v; want order refunded", res, err)
		}
		return
	case q > o.q && q <= o.q+o.resoldUnits:
		if !errors.Is(err, sale.ErrOrderResold) {
			m.fail("got %+v, %v; want more than stands refused as resold", res, err)
		}
		return
	case q > o.q:
		if !errors.Is(err, sale.ErrInvalid) {
			m.fail("got %+v, %v; want more than the order refused as invalid", res, err)
		}
		return
	case err != nil:
		m.fail("refused: %v", err)
	case res.Order == nil || res.Order.Buyer != to:
		m.fail("answered %+v", res)
	case q == 0 || q == o.q:
		if res.Order.ID != o.id || res.Order.Quantity != o.q {
			m.fail("answered %+v; want order %v of %d, now %v's", res.Order, o.id, o.q, to)
		}
		o.buyer = to
	default:
		if res.Order.ID == o.id || res.Order.Quantity != q {
			m.fail("answered %+v; want a new order of %d split off %v", res.Order, q, o.id)
		}
		o.q -= q
		m.count["split"]++
		m.orders = append(m.orders, &modelOrder{id: res.Order.ID, sku: o.sku, buyer: to, q: q})
	}
	if m.rnd.IntN(4) == 0 {
		again, err := m.svc.Transfer(m.ctx, o.id, a, to, q)
		if err != nil || again.Order == nil || again.Order.ID != res.Order.ID || !again.Replayed {
			m.fail("retry answered %+v, %v; want order %v replayed", again, err, res.Order.ID)
		}
	}
}

func (m *model) sendCart(ct sale.CartTake, hold bool) (sale.Result, error) {
	if hold {
		ct.TTL = time.Hour
		return m.svc.HoldCart(m.ctx, ct)
	}
	return m.svc.PurchaseCart(m.ctx, ct)
}

// cart buys or holds a line of each SKU (or of one), all or nothing:
// refused sold out when any line's stock is short, and then nothing moves.
func (m *model) cart(n int, hold bool) {
	b := modelBuyers[m.rnd.IntN(len(modelBuyers))]
	ct := sale.CartTake{Ask: sale.Ask{Buyer: b, Key: m.key(), Device: modelDevice(b)}, Program: m.skus[0].sku.Program}
	var idx []int
	short := false
	for i, s := range m.skus {
		if len(idx) > 0 && m.rnd.IntN(3) == 0 {
			continue
		}
		q := int64(m.rnd.IntN(3) + 1)
		ct.Lines = append(ct.Lines, sale.CartLine{Ticket: s.sku.Ticket, Quantity: q})
		idx = append(idx, i)
		short = short || s.remaining < q
	}
	var units int64
	for _, ln := range ct.Lines {
		units += ln.Quantity
	}
	over := hold && m.overBudget(b, units)
	m.where = fmt.Sprintf("step %d: cart of %v by %v (held %v, over a hold budget %v)", n, ct.Lines, b, hold, over)
	res, err := m.sendCart(ct, hold)
	switch {
	case over:
		if !errors.Is(err, sale.ErrHoldBudget) && (!short || !errors.Is(err, sale.ErrSoldOut)) {
			m.fail("got %+v, %v; want hold budget reached", res, err)
		}
		m.count["budget"]++
		return
	case short:
		if !errors.Is(err, sale.ErrSoldOut) {
			m.fail("got %+v, %v; want sold out", res, err)
		}
		m.count["sold-out"]++
		return
	case err != nil:
		m.fail("refused: %v", err)
	case res.Cart == nil || res.Replayed:
		m.fail("answered %+v", res)
	}
	c := &modelCart{id: res.Cart.ID, buyer: b, held: hold, state: "bought"}
	if hold {
		c.state = "held"
		if len(res.Cart.Holds) != len(ct.Lines) {
			m.fail("answered %+v; want a hold per line", res.Cart)
		}
	} else if len(res.Cart.Orders) != len(ct.Lines) {
		m.fail("answered %+v; want an order per line", res.Cart)
	}
	for l, ln := range ct.Lines {
		s := &m.skus[idx[l]]
		s.remaining -= ln.Quantity
		if hold {
			h := res.Cart.Holds[l]
			if h.SKU != s.sku || h.Quantity != ln.Quantity {
				m.fail("line %d answered %+v", l, h)
			}
			s.on += ln.Quantity
			mh := &modelHold{id: h.ID, sku: idx[l], buyer: b, q: ln.Quantity, state: "held", cart: c, expires: h.ExpiresAt}
			c.holds = append(c.holds, mh)
			m.holds = append(m.holds, mh)
			continue
		}
		o := res.Cart.Orders[l]
		if o.SKU != s.sku || o.Quantity != ln.Quantity {
			m.fail("line %d answered %+v", l, o)
		}
		m.sold(idx[l], ln.Quantity, nil)
		mo := &modelOrder{id: o.ID, sku: idx[l], buyer: b, q: ln.Quantity, cart: c}
		c.orders = append(c.orders, mo)
		m.orders = append(m.orders, mo)
	}
	m.carts = append(m.carts, c)
	m.done = append(m.done, modelRequest{cart: &ct, hold: hold, id: c.id})
}

// cartEnd confirms, cancels or refunds a cart whole: a held cart's
// confirm makes an order per hold, its cancel gives every line back; a
// bought or confirmed cart's refund gives back what its lines stand for
// (a line refunded alone stays so); a cart not bought has nothing to
// refund; an ended cart answers as it ended, or refuses.
func (m *model) cartEnd(n int) {
	if len(m.carts) == 0 {
		return
	}
	c := m.carts[m.rnd.IntN(len(m.carts))]
	a := sale.Ask{Buyer: c.buyer, Key: m.key()}
	switch w := m.rnd.IntN(3); {
	case w == 0:
		m.where = fmt.Sprintf("step %d: confirm of a %s cart", n, c.state)
		res, err := m.svc.ConfirmCart(m.ctx, c.id, a)
		switch c.state {
		case "held":
			if err != nil || res.Cart == nil || len(res.Cart.Orders) != len(c.holds) {
				m.fail("got %+v, %v; want an order per hold", res, err)
			}
			for l, h := range c.holds {
				m.confirmed(h, res.Cart.Orders[l].ID, h.q)
				c.orders = append(c.orders, m.orders[len(m.orders)-1])
			}
			c.state = "confirmed"
		case "confirmed":
			if err != nil || res.Cart == nil || len(res.Cart.Orders) != len(c.orders) {
				m.fail("got %+v, %v; want its orders", res, err)
			}
		case "cancelled":
			if !errors.Is(err, sale.ErrHoldCancelled) {
				m.fail("got %+v, %v; want hold cancelled", res, err)
			}
		default:
			if !errors.Is(err, sale.ErrHoldConfirmed) {
				m.fail("got %+v, %v; want a bought cart's confirm refused as confirmed", res, err)
			}
		}
	case w == 1:
		m.where = fmt.Sprintf("step %d: cancel of a %s cart", n, c.state)
		res, err := m.svc.CancelCart(m.ctx, c.id, a)
		switch c.state {
		case "held":
			if err != nil {
				m.fail("refused: %v", err)
			}
			for _, h := range c.holds {
				m.cancelled(h)
			}
			c.state = "cancelled"
		case "confirmed":
			if !errors.Is(err, sale.ErrHoldConfirmed) {
				m.fail("got %+v, %v; want hold confirmed", res, err)
			}
		case "cancelled":
			if !errors.Is(err, sale.ErrHoldCancelled) && (err != nil || res.Cart == nil || res.Cart.ID != c.id) {
				m.fail("got %+v, %v; want the cancel again, or hold cancelled", res, err)
			}
		default:
			if !errors.Is(err, sale.ErrHoldConfirmed) {
				m.fail("got %+v, %v; want a bought cart's cancel refused as confirmed", res, err)
			}
		}
	default:
		m.where = fmt.Sprintf("step %d: refund of a %s cart", n, c.state)
		res, err := m.svc.RefundCart(m.ctx, c.id, a)
		switch c.state {
		case "held", "cancelled":
			if !errors.Is(err, sale.ErrCartNotBought) {
				m.fail("got %+v, %v; want cart not bought", res, err)
			}
		default:
			if err != nil {
				m.fail("refused: %v", err)
			}
			for _, o := range c.orders {
				if !o.refunded {
					m.refunded(o)
				}
			}
		}
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
		// Sold counts the units standing with buyers and not on sale
		// again: the listed ones are in Open.
		sold := s.total - s.remaining - s.on - s.listed
		if r.SKU != s.sku || !r.Balanced() || r.Sold != sold || r.Held != s.on || r.Open != s.remaining || r.Listed != s.listed {
			m.fail("report %s: %+v; the model: sold %d, held %d, open %d, listed %d", when, r.StockReport, sold, s.on, s.remaining, s.listed)
		}
		left, seeded, err := m.gate.Remaining(m.ctx, s.sku, s.shards)
		if err != nil || !seeded || left != s.remaining {
			m.fail("gate %s: %d left (seeded %v, %v); the ledger and the model: %d", when, left, seeded, err, s.remaining)
		}
	}
}

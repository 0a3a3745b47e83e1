package sale_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/cache"
	"github.com/stockgate/stockgate/internal/wait"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// heldCommits is a ledger whose commits of one request key wait until
// release is closed: a slow ledger (a stalled synchronous standby) under
// the first attempt of that request.
type heldCommits struct {
	sale.Ledger
	key     keys.ID
	entered chan struct{} // closed when the first commit of key waits
	release chan struct{}
	once    sync.Once
}

func (h *heldCommits) Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult {
	if slices.ContainsFunc(takes, func(tk ledger.Take) bool { return tk.Req.Key == h.key }) {
		h.once.Do(func() { close(h.entered) })
		<-h.release
	}
	return h.Ledger.Commit(ctx, takes, direct)
}

// A retry of a purchase whose first attempt holds the last unit at the
// gate and is still committing is not told sold out by a replica that
// remembers the SKU as sold out: that 409 says nothing was sold, and the
// first attempt's order then stood (helper-74 #1). The flag is this
// replica's memory; while the ledger still has the unit free, the retry
// goes on to the gate, whose record of the first attempt's deduction
// makes it that request's copy.
func TestRetryOfACommittingTakeIsNotToldSoldOut(t *testing.T) {
	ctx := context.Background()
	held := &heldCommits{key: keys.MustID("k1"), entered: make(chan struct{}), release: make(chan struct{})}
	a, b := sale.TwoReplicas(t, shardmem.New(), func(o *sale.Options) {
		if held.Ledger == nil { // a's; b is then given a's, held
			held.Ledger = o.Ledger
			o.Ledger = held
		}
	})
	sku := stock.SKU{Program: keys.MustID("last"), Ticket: keys.MustID("t")}
	if _, err := a.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 1, Shards: 1, MaxPerOrder: 1}); err != nil {
		t.Fatal(err)
	}
	first := sale.Take{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID("k1")}, SKU: sku, Quantity: 1}
	type reply struct {
		res sale.Result
		err error
	}
	onA := make(chan reply, 1)
	go func() {
		res, err := a.Purchase(ctx, first)
		onA <- reply{res, err}
	}()
	<-held.entered // a holds the last unit and commits
	if _, err := b.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID("bob"), Key: keys.MustID("k2")}, SKU: sku, Quantity: 1}); !errors.Is(err, sale.ErrSoldOut) {
		t.Fatalf("another buyer on b: %v, want sold out", err)
	}
	onB := make(chan reply, 1)
	go func() {
		res, err := b.Purchase(ctx, first) // ann's client gave up on a
		onB <- reply{res, err}
	}()
	// The retry either answered already (the bug: sold out, at once) or
	// waits on a's attempt; a's commit goes on now either way.
	close(held.release)
	ra, rb := <-onA, <-onB
	if ra.err != nil || ra.res.Order == nil {
		t.Fatalf("a's attempt = %+v, %v", ra.res, ra.err)
	}
	if rb.err != nil || rb.res.Order == nil || rb.res.Order.ID != ra.res.Order.ID {
		t.Fatalf("the retry on b = %+v, %v; want order %v (a's attempt committed it)", rb.res, rb.err, ra.res.Order.ID)
	}
}

// lostReply is a ledger whose first commit of one request key loses its
// reply: the caller is told the COMMIT failed, and the commit lands when
// release is closed (a COMMIT waiting on a stalled synchronous standby,
// its client gone). Later commits of the key go through.
type lostReply struct {
	sale.Ledger
	key     keys.ID
	release chan struct{}
	landed  chan struct{} // closed once the lost commit landed
	once    sync.Once
}

func (l *lostReply) Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult {
	first := false
	if slices.ContainsFunc(takes, func(tk ledger.Take) bool { return tk.Req.Key == l.key }) {
		l.once.Do(func() { first = true })
	}
	if !first {
		return l.Ledger.Commit(ctx, takes, direct)
	}
	go func() {
		defer close(l.landed)
		<-l.release
		l.Ledger.Commit(context.Background(), takes, direct)
	}()
	out := make([]ledger.TakeResult, len(takes))
	for i, tk := range takes {
		out[i] = ledger.TakeResult{Take: tk, Err: errors.New("ledger: take: commit: EOF")}
	}
	return out
}

// The same for a cart, whose first attempt lost its COMMIT's reply (it
// answered "unknown" and let its cart lock go) while the commit was
// still to land: the retry on a replica whose flag remembers the line's
// SKU as sold out was refused from the flag without asking the gate, and
// the first attempt's cart then stood (helper-80 #1).
func TestRetryOfACommittingCartIsNotToldSoldOut(t *testing.T) {
	ctx := context.Background()
	lost := &lostReply{key: keys.MustID("k1"), release: make(chan struct{}), landed: make(chan struct{})}
	a, b := sale.TwoReplicas(t, shardmem.New(), func(o *sale.Options) {
		if lost.Ledger == nil {
			lost.Ledger = o.Ledger
			o.Ledger = lost
		}
	})
	sku := stock.SKU{Program: keys.MustID("lastcart"), Ticket: keys.MustID("t")}
	if _, err := a.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 1, Shards: 1, MaxPerOrder: 1}); err != nil {
		t.Fatal(err)
	}
	first := sale.CartTake{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID("k1")}, Program: sku.Program,
		Lines: []sale.CartLine{{Ticket: sku.Ticket, Quantity: 1}}}
	if res, err := a.PurchaseCart(ctx, first); !errors.Is(err, sale.ErrUnavailable) {
		t.Fatalf("a's attempt, its COMMIT's reply lost = %+v, %v; want unavailable (outcome unknown)", res, err)
	}
	if _, err := b.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID("bob"), Key: keys.MustID("k2")}, SKU: sku, Quantity: 1}); !errors.Is(err, sale.ErrSoldOut) {
		t.Fatalf("another buyer on b: %v, want sold out", err)
	}
	res, err := b.PurchaseCart(ctx, first) // ann's client retries
	close(lost.release)
	<-lost.landed
	if err != nil || res.Cart == nil {
		t.Fatalf("the retry on b = %+v, %v; want the cart (the first attempt's COMMIT lands)", res, err)
	}
	c, err := b.CartByID(ctx, res.Cart.ID)
	if err != nil || len(c.Orders) != 1 {
		t.Fatalf("the cart in the ledger = %+v, %v", c, err)
	}
}

// A retry refused at the bound of takes in flight moved nothing, but its
// first attempt may still commit (here on the same replica, waiting on a
// slow ledger): the refusal is ErrBusyShared, whose outcome is unknown,
// never ErrBusy's "unchanged" (helper-74 #2).
func TestTakeShedInFlightSaysItsOutcomeIsUnknown(t *testing.T) {
	ctx := context.Background()
	held := &heldCommits{key: keys.MustID("k1"), entered: make(chan struct{}), release: make(chan struct{})}
	svc, _ := sale.TestService(t, shardmem.New(), nil, func(o *sale.Options) {
		held.Ledger, o.Ledger = o.Ledger, held
		o.TakesInFlight = 1
	})
	sku := stock.SKU{Program: keys.MustID("shed"), Ticket: keys.MustID("t")}
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 5, Shards: 1, MaxPerOrder: 1}); err != nil {
		t.Fatal(err)
	}
	first := sale.Take{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID("k1")}, SKU: sku, Quantity: 1}
	done := make(chan error, 1)
	go func() {
		_, err := svc.Purchase(ctx, first)
		done <- err
	}()
	<-held.entered
	_, err := svc.Purchase(ctx, first)
	close(held.release)
	if !errors.Is(err, sale.ErrBusyShared) {
		t.Errorf("the retry at the bound: %v, want %v (outcome unknown)", err, sale.ErrBusyShared)
	}
	if err := <-done; err != nil {
		t.Fatalf("the first attempt: %v", err)
	}
}

// The same PUT of a ticket again, with its Redis out, answers the ticket:
// there is nothing to change, so no gate to close. It said 503 outcome
// "unchanged" (ErrGateNotClosed), which a PUT retried after its reply was
// lost read as "the ticket was not made", for a ticket the first attempt
// had made (helper-74 #3). A PUT that changes something still closes the
// gate first, and is still refused with nothing changed.
func TestSamePutWithRedisOutAnswersTheTicket(t *testing.T) {
	ctx := context.Background()
	mem := &quotaFaults{Scripter: shardmem.New()}
	svc, _ := sale.TestService(t, mem, nil)
	cfg := sale.SKUConfig{SKU: stock.SKU{Program: keys.MustID("put"), Ticket: keys.MustID("t")}, Total: 5, Shards: 2, MaxPerOrder: 2, PerBuyer: 3}
	if _, err := svc.PutSKU(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	first, err := svc.SKU(ctx, cfg.SKU) // as the gate's seed left it
	if err != nil {
		t.Fatal(err)
	}
	mem.down.Store(true)
	again, err := svc.PutSKU(ctx, cfg)
	if err != nil || again.Total != 5 || again.Version != first.Version {
		t.Errorf("the same PUT with Redis out = %+v, %v; want the ticket as it is (total 5, version %d)", again, err, first.Version)
	}
	cfg.Total = 6
	if _, err := svc.PutSKU(ctx, cfg); !errors.Is(err, sale.ErrGateNotClosed) {
		t.Errorf("a PUT of another total with Redis out = %v, want %v", err, sale.ErrGateNotClosed)
	}
	if st, err := svc.SKU(ctx, cfg.SKU); err != nil || st.Total != 5 {
		t.Errorf("after the refused PUT: %+v, %v; want total 5", st, err)
	}
}

// An end of sale sent again (its reply lost) with the ticket's Redis out
// answers the ended ticket: it said 503 "unchanged" of a sale that had
// ended (helper-77 #4).
func TestEndAgainWithRedisOutAnswersTheEnd(t *testing.T) {
	ctx := context.Background()
	mem := &quotaFaults{Scripter: shardmem.New()}
	svc, _ := sale.TestService(t, mem, nil)
	sku := stock.SKU{Program: keys.MustID("end"), Ticket: keys.MustID("t")}
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 5, Shards: 1, MaxPerOrder: 2}); err != nil {
		t.Fatal(err)
	}
	if st, err := svc.EndSale(ctx, sku); err != nil || !st.Ended {
		t.Fatalf("end = %+v, %v", st, err)
	}
	mem.down.Store(true)
	if st, err := svc.EndSale(ctx, sku); err != nil || !st.Ended {
		t.Errorf("the end again with Redis out = %+v, %v; want the ended ticket", st, err)
	}
}

// A pool's PUT sent again (its reply lost) with Redis out answers the
// pool as set; a PUT that changes it is still refused, nothing changed
// (helper-77 #4).
func TestSamePoolPutWithRedisOutAnswersThePool(t *testing.T) {
	ctx := context.Background()
	mem := &quotaFaults{Scripter: shardmem.New()}
	svc, _ := sale.TestService(t, mem, nil)
	sku := stock.SKU{Program: keys.MustID("pools"), Ticket: keys.MustID("t")}
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 50, Shards: 1, MaxPerOrder: 2}); err != nil {
		t.Fatal(err)
	}
	spec := sale.PoolSpec{SKU: sku, Pool: keys.MustID("fans"), Allotment: 10, Access: sale.AccessCode,
		OpensAt: time.Now().Add(-time.Minute), ClosesAt: time.Now().Add(time.Hour)}
	if _, err := svc.PutPool(ctx, spec); err != nil {
		t.Fatal(err)
	}
	mem.down.Store(true)
	if p, err := svc.PutPool(ctx, spec); err != nil || p.Total != 10 {
		t.Errorf("the same pool PUT with Redis out = %+v, %v; want the pool as set", p, err)
	}
	spec.Allotment = 12
	if _, err := svc.PutPool(ctx, spec); !errors.Is(err, sale.ErrGateNotClosed) {
		t.Errorf("a pool PUT of another allotment with Redis out = %v, want %v", err, sale.ErrGateNotClosed)
	}
}

// scriptCount is the in-memory gate counting the scripts it runs.
type scriptCount struct {
	*shardmem.Scripter
	n atomic.Int64
}

func (c *scriptCount) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	c.n.Add(1)
	return c.Scripter.EvalSha(ctx, sha, keys, args...)
}

func (c *scriptCount) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	c.n.Add(1)
	return c.Scripter.Eval(ctx, script, keys, args...)
}

// A unit the gate lost (taken there by an attempt that never committed:
// a replica that died mid-take) leaves the ledger with stock while the
// gate is empty, so the SKU's committed keys never seal. A take refused
// by the sold-out flag goes on to the gate only while an attempt may
// still be committing (twice the work timeout after this replica first
// missed); after that a storm is refused from memory again, no gate call
// each, until the drift check gives the unit back (helper-76).
func TestSoldOutStormAfterALostUnitCostsNoGateCalls(t *testing.T) {
	ctx := context.Background()
	mem := &scriptCount{Scripter: shardmem.New()}
	flags, err := cache.New(cache.Options{SoldOutTTL: time.Minute}) // no re-check of the flag within the test
	if err != nil {
		t.Fatal(err)
	}
	svc, gate := sale.TestService(t, mem, nil, func(o *sale.Options) { o.WorkTimeout, o.Cache = 200*time.Millisecond, flags })
	sku := stock.SKU{Program: keys.MustID("lost"), Ticket: keys.MustID("t")}
	if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 1, Shards: 1, MaxPerOrder: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Reconcile(ctx, sku); err != nil { // seeded, as a first take would
		t.Fatal(err)
	}
	if _, err := gate.Deduct(ctx, shard.Request{SKU: sku, Shards: 1, RequestID: keys.MustID("died"), Quantity: 1, MaxQuantity: 1}); err != nil {
		t.Fatal(err)
	}
	buy := func(key string) error {
		_, err := svc.Purchase(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID("fan"), Key: keys.MustID(key)}, SKU: sku, Quantity: 1})
		return err
	}
	if err := buy("first"); !errors.Is(err, sale.ErrSoldOut) { // finds the gate empty
		t.Fatalf("a purchase with the gate empty = %v, want sold out", err)
	}
	start := time.Now()
	if err := buy("second"); !errors.Is(err, sale.ErrSoldOut) { // the first miss
		t.Fatalf("= %v, want sold out", err)
	}
	if !wait.Until(10*time.Second, func() bool { return time.Since(start) > time.Second }) { // past 2 x WorkTimeout
		t.Fatal("the clock stood still")
	}
	before := mem.n.Load()
	for i := range 20 {
		if err := buy(fmt.Sprintf("storm-%d", i)); !errors.Is(err, sale.ErrSoldOut) {
			t.Fatalf("storm purchase %d = %v, want sold out", i, err)
		}
	}
	if calls := mem.n.Load() - before; calls != 0 {
		t.Errorf("20 purchases refused as sold out made %d gate calls, want none", calls)
	}
}

// The in-flight window starts at the first miss of a take the sold-out
// flag refused, not at a cap's refusal long before the sell-out: a
// retry of a take still committing was told sold out again once that
// old window had passed (helper-78 #3).
func TestRetryAtASellOutLongAfterACapRefusal(t *testing.T) {
	ctx := context.Background()
	held := &heldCommits{key: keys.MustID("d1"), entered: make(chan struct{}), release: make(chan struct{})}
	a, b := sale.TwoReplicas(t, shardmem.New(), func(o *sale.Options) {
		o.WorkTimeout = time.Second // its in-flight window: 2 s
		if held.Ledger == nil {
			held.Ledger = o.Ledger
			o.Ledger = held
		}
	})
	sku := stock.SKU{Program: keys.MustID("capped"), Ticket: keys.MustID("t")}
	if _, err := a.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 3, Shards: 1, MaxPerOrder: 1, PerBuyer: 1}); err != nil {
		t.Fatal(err)
	}
	take := func(buyer, key string) sale.Take {
		return sale.Take{Ask: sale.Ask{Buyer: keys.MustID(buyer), Key: keys.MustID(key)}, SKU: sku, Quantity: 1}
	}
	if _, err := b.Purchase(ctx, take("bob", "b1")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Purchase(ctx, take("bob", "b2")); !errors.Is(err, sale.ErrLimit) { // b looks the key up: a miss
		t.Fatalf("bob's second = %v, want the cap", err)
	}
	capped := time.Now()
	if !wait.Until(10*time.Second, func() bool { return time.Since(capped) > 2500*time.Millisecond }) { // past that window
		t.Fatal("the clock stood still")
	}
	if _, err := a.Purchase(ctx, take("carol", "c1")); err != nil {
		t.Fatal(err)
	}
	type reply struct {
		res sale.Result
		err error
	}
	onA := make(chan reply, 1)
	go func() {
		res, err := a.Purchase(ctx, take("dave", "d1"))
		onA <- reply{res, err}
	}()
	<-held.entered // a holds the last unit and commits
	if _, err := b.Purchase(ctx, take("eve", "e1")); !errors.Is(err, sale.ErrSoldOut) {
		t.Fatalf("eve on b = %v, want sold out", err)
	}
	onB := make(chan reply, 1)
	go func() {
		res, err := b.Purchase(ctx, take("dave", "d1"))
		onB <- reply{res, err}
	}()
	close(held.release)
	ra, rb := <-onA, <-onB
	if errors.Is(rb.err, sale.ErrSoldOut) {
		t.Fatalf("dave's retry on b = sold out, while his first attempt was committing (it answered %+v, %v)", ra.res, ra.err)
	}
	if ra.err == nil && (rb.err != nil || rb.res.Order == nil || rb.res.Order.ID != ra.res.Order.ID) {
		t.Errorf("the retry on b = %+v, %v; want order %v", rb.res, rb.err, ra.res.Order.ID)
	}
}

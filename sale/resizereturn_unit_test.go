package sale_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/wait"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// heldOnSweptPair is two replicas on one ledger (wrapped by wrap) and
// mem, b's sweeper running (every 20 ms, no grace: the tests wait for
// it), and a ticket of program with one unit, held by ann on a.
func heldOnSweptPair(t *testing.T, mem *shardmem.Scripter, program string, wrap func(sale.Ledger) sale.Ledger) (a, b *sale.Service, sku stock.SKU, res sale.Result) {
	t.Helper()
	ctx := context.Background()
	var wrapped sale.Ledger
	a, b = sale.TwoReplicas(t, mem, func(o *sale.Options) {
		o.SweepEvery, o.RestoreGrace = 20*time.Millisecond, time.Millisecond
		if wrapped == nil {
			wrapped = wrap(o.Ledger)
		}
		o.Ledger = wrapped
	})
	sctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); b.RunSweeper(sctx) }()
	t.Cleanup(func() { stop(); <-done })
	sku = stock.SKU{Program: keys.MustID(program), Ticket: keys.MustID("t")}
	if _, err := a.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 1, Shards: 1, MaxPerOrder: 1}); err != nil {
		t.Fatal(err)
	}
	res, err := a.Hold(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID("h1")}, SKU: sku, Quantity: 1, TTL: time.Hour})
	if err != nil || res.Hold == nil {
		t.Fatalf("hold = %+v, %v", res, err)
	}
	return a, b, sku, res
}

// afterAdvance is a ledger that runs then once, right after the first
// AdvanceGate of a rebuild returns: a return committing between the
// epoch's move and the seed of the new gate.
type afterAdvance struct {
	sale.Ledger
	then func()
	once sync.Once
}

func (l *afterAdvance) AdvanceGate(ctx context.Context, sku stock.SKU) (ledger.SKUState, error) {
	st, err := l.Ledger.AdvanceGate(ctx, sku)
	if err == nil && l.then != nil {
		l.once.Do(l.then)
	}
	return st, err
}

// A hold cancelled while a resize rebuilds the gate, after the ledger's
// epoch moved on, is stamped with the new layout; the seed writes the
// new layout from facts that do not count it. Its refill found the new
// layout's shard not there yet (or fenced and empty), took that for a
// gate Redis lost ("the seed counts it"), and marked the return done:
// the unit was out of the gate for good, every buyer told sold out
// while the ledger had it, until a drift check (helper-80 #2). The new
// layout is now fenced before the epoch moves, and a fenced, unwritten
// shard says "not yet": the sweeper refills it once the seed is done.
func TestReturnDuringAResizeReachesTheNewGate(t *testing.T) {
	ctx := context.Background()
	mem := shardmem.New()
	led := &afterAdvance{}
	a, b, sku, res := heldOnSweptPair(t, mem, "resize", func(l sale.Ledger) sale.Ledger { led.Ledger = l; return led })
	ann := sale.Ask{Buyer: res.Hold.Buyer}
	led.then = func() {
		if _, err := b.Cancel(ctx, res.Hold.ID, sale.Ask{Buyer: ann.Buyer, Key: keys.MustID("c1")}); err != nil {
			t.Errorf("cancel during the resize: %v", err)
		}
	}
	if _, err := a.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 1, Shards: 4, MaxPerOrder: 1}); err != nil {
		t.Fatal(err)
	}
	gate, err := shard.New(shard.Options{Redis: mem})
	if err != nil {
		t.Fatal(err)
	}
	var left int64
	if !wait.Until(10*time.Second, func() bool {
		left, _, err = gate.Remaining(ctx, sku, 4)
		return err == nil && left == 1
	}) {
		t.Fatalf("the gate holds %d (%v) of the cancelled hold's unit 10 s after the resize; the ledger has 1 left", left, err)
	}
}

// failingAdvance is a ledger whose next fails AdvanceGate calls fail: a
// rebuild that stops after its change and its fences.
type failingAdvance struct {
	sale.Ledger
	fails atomic.Int32
}

func (l *failingAdvance) AdvanceGate(ctx context.Context, sku stock.SKU) (ledger.SKUState, error) {
	if l.fails.Add(-1) >= 0 {
		return ledger.SKUState{}, errors.New("advance gate: the test's fault")
	}
	return l.Ledger.AdvanceGate(ctx, sku)
}

// A return stamped with a layout that two failed resizes left fenced and
// never written (the first fenced it, the second moved the SKU on to
// another) waited for that layout's seed forever: every sweep of every
// replica refilled it again, "not yet". Once the ledger's epoch is past
// the return's, a later seed's facts count its units: it is done
// (helper-81 #3).
func TestReturnToALayoutLeftBehindIsDone(t *testing.T) {
	ctx := context.Background()
	led := &failingAdvance{}
	a, _, sku, res := heldOnSweptPair(t, shardmem.New(), "behind", func(l sale.Ledger) sale.Ledger { led.Ledger = l; return led })
	ann := sale.Ask{Buyer: res.Hold.Buyer}
	led.fails.Store(1)
	// The change stands in the ledger; the gate stays fenced (the
	// answer is the ticket as the ledger has it).
	_, _ = a.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 1, Shards: 2, MaxPerOrder: 1})
	if led.fails.Load() != 0 {
		t.Fatal("the resize to 2 never reached AdvanceGate")
	}
	if _, err := a.Cancel(ctx, res.Hold.ID, sale.Ask{Buyer: ann.Buyer, Key: keys.MustID("c1")}); err != nil {
		t.Fatal(err)
	}
	led.fails.Store(1)
	// The change stands in the ledger; the gate stays fenced (the
	// answer is the ticket as the ledger has it).
	_, _ = a.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 1, Shards: 3, MaxPerOrder: 1})
	if led.fails.Load() != 0 {
		t.Fatal("the resize to 3 never reached AdvanceGate")
	}
	if _, err := a.Reconcile(ctx, sku); err != nil {
		t.Fatal(err)
	}
	var pending []ledger.Restore
	var err error
	if !wait.Until(10*time.Second, func() bool {
		pending, err = led.PendingRestores(ctx, 0, 10)
		return err == nil && len(pending) == 0
	}) {
		t.Fatalf("10 s after the rebuild the cancel's return is still pending: %+v, %v", pending, err)
	}
}

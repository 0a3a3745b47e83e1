package requests_test

// Attacks on "stock views per change" (c0fc75b): a replica that hears the
// notices keeps a stock view (GET .../stock) until a change notice drops
// it, up to NoticeMaxAge. Each test makes the victim V (StockTTL 50 ms,
// NoticeMaxAge a minute, so a stale view would last a minute) answer a
// remaining the ledger no longer has for longer than 3 s. Each break runs
// twice: "trusted" (the max age of a minute) and "ttl-only" (the max age
// at the TTL, the behaviour before the commit), the control that shows the
// test sound.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

const viewTTL = 50 * time.Millisecond

func viewVictimTune(maxAge time.Duration) func(o *app.Options) {
	return func(o *app.Options) {
		o.Cache.SoldOutTTL, o.Sale.StockTTL, o.Cache.NoticeMaxAge = attackTTL, viewTTL, maxAge
	}
}

type viewReply struct {
	Remaining int64 `json:"remaining"`
	SoldOut   bool  `json:"sold_out"`
}

// viewOf reads e's stock view of sku.
func viewOf(t *testing.T, e *systest.Env, sku stock.SKU) viewReply {
	t.Helper()
	r := e.Do(t, http.MethodGet, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/stock", nil, "")
	if r.Status != http.StatusOK {
		t.Fatalf("stock read = %d %s", r.Status, r.Body)
	}
	var v viewReply
	if err := json.Unmarshal(r.Body, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// viewShowsLedger fails the test unless e's stock view of sku shows the
// ledger's remaining within 3 s (the victim's view: 50 ms untrusted, a
// minute trusted).
func viewShowsLedger(t *testing.T, e *systest.Env, sku stock.SKU) {
	t.Helper()
	st, err := e.Ledger.SKU(context.Background(), sku)
	if err != nil {
		t.Fatal(err)
	}
	want := st.Remaining()
	start := time.Now()
	var last viewReply
	for deadline := start.Add(3 * time.Second); ; {
		last = viewOf(t, e, sku)
		if last.Remaining == want && last.SoldOut == (want == 0) {
			t.Logf("view shows the ledger's %d after %v", want, time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	st, _ = e.Ledger.SKU(context.Background(), sku)
	t.Fatalf("STALE VIEW: %v after the change the view says remaining %d sold_out %v; the ledger: remaining %d (total %d sold %d held %d)",
		time.Since(start).Round(time.Millisecond), last.Remaining, last.SoldOut, st.Remaining(), st.Total, st.Sold, st.Held)
}

// viewStands waits until e's view of sku shows want and stands past its
// TTL (e hears the notices): four TTLs of reads make no Redis call of the
// SKU's.
func viewStands(t *testing.T, e *systest.Env, sku stock.SKU, want int64) {
	t.Helper()
	calls := &skuCalls{program: sku.Program.String()}
	e.Guarded.AddHook(calls)
	systest.WaitFor(t, 10*time.Second, "a view that stands", func() bool {
		if viewOf(t, e, sku).Remaining != want {
			return false
		}
		before := calls.n.Load()
		for range 8 {
			viewOf(t, e, sku)
			time.Sleep(viewTTL / 2) // time under test: two reads per TTL
		}
		return calls.n.Load() == before
	})
}

// skuOffAllNotices is a one-shard SKU of a fresh program whose shard's
// master is the master of neither notice channel, and that master's port:
// a replica cut off it still hears and publishes every notice.
func skuOffAllNotices(t *testing.T) (stock.SKU, int) {
	t.Helper()
	ctx := context.Background()
	c := testenv.SharedCluster(t)
	busy := map[int]bool{}
	for _, ch := range []string{"sg:notices:restocked", "sg:notices:changed"} {
		m, err := c.MasterOf(ctx, keys.KeySlot(ch))
		if err != nil {
			t.Fatal(err)
		}
		busy[m.Port] = true
	}
	program := systest.NewSKU(t).Program
	for i := range 200 {
		sku := stock.SKU{Program: program, Ticket: keys.MustID(fmt.Sprintf("t%d", i))}
		m, err := c.MasterOf(ctx, keys.Shard(sku.Program, sku.Ticket, 0, 1).Slot())
		if err != nil {
			t.Fatal(err)
		}
		if !busy[m.Port] {
			return sku, m.Port
		}
	}
	t.Fatal("no SKU off both notice channels' masters in 200 tickets (the two channels' masters cover the cluster?)")
	return stock.SKU{}, 0
}

// BREAK V1. A sale around the gate (the seller S is cut off the SKU's
// master: "a failed master costs only the SKUs whose shards it owns")
// leaves Redis as it was and moves the ledger (the row's gate is stale).
// S marks the SKU changed; V drops its view and loads it again at once,
// with its cached settings, which still say the gate is fresh: the view
// reads the untouched Redis (10) and, loaded after the notice, is trusted
// until the next change. The ledger says 9. Before the commit the view
// lived 50 ms and the next one was read with the settings refreshed
// (SettingsTTL 1 s), from the ledger.
func TestAttackViewSaleAroundTheGateStaleSettings(t *testing.T) {
	for _, m := range flagModes {
		t.Run(m.name, func(t *testing.T) {
			dsn := systest.LedgerDSN(t, ledger.SQLite)
			d := &cutDialer{}
			s := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Dialer: d.Dial})
			v := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Tune: viewVictimTune(m.maxAge)})
			sku, port := skuOffAllNotices(t)
			v.PutSKU(t, sku, 10, 1, 4)
			systest.WaitFor(t, 5*time.Second, "V's view of 10", func() bool { return viewOf(t, v, sku).Remaining == 10 })
			d.Cut(port)
			systest.WaitFor(t, 10*time.Second, "a sale around the gate on S", func() bool {
				// V keeps reading: its settings stay cached as a busy
				// replica's are.
				viewOf(t, v, sku)
				return s.Buy(t, sku, "k", "ann", 1).Status == http.StatusCreated
			})
			if st := s.State(t, sku); st.Sold != 1 {
				t.Fatalf("ledger sold = %d, want 1", st.Sold)
			}
			if left, _, err := v.Gate.Remaining(context.Background(), sku, 1); err != nil || left != 10 {
				t.Fatalf("Redis remaining = %d (%v), want 10: the sale went through the gate", left, err)
			}
			viewShowsLedger(t, v, sku)
		})
	}
}

// BREAK V2 (fixed). A replica's change notices go out once per StockTTL
// (200 ms here, the default); a replica shut down (a rolling deploy, a
// scale-in) stopped its publisher without sending what it marked since
// the last tick, and a sale it committed just before was never told: V's
// view stood for the max age. Service.Close now sends what is left. Each
// try kills S right after its 201 (most fall between two ticks) and V
// must show the ledger's 9 within the bound, every time.
func TestAttackViewChangeLostAtShutdown(t *testing.T) {
	for _, m := range flagModes {
		t.Run(m.name, func(t *testing.T) {
			dsn := systest.LedgerDSN(t, ledger.SQLite)
			v := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Tune: viewVictimTune(m.maxAge)})
			for try := range 4 {
				s := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn})
				sku := systest.NewSKU(t)
				sku.Ticket = keys.MustID(fmt.Sprintf("ga%d", try))
				v.PutSKU(t, sku, 10, 1, 4)
				if m.maxAge > attackTTL {
					viewStands(t, v, sku, 10)
				}
				if r := s.Buy(t, sku, fmt.Sprintf("k%d", try), "ann", 1); r.Status != http.StatusCreated {
					t.Fatalf("purchase on S = %d %s", r.Status, r.Body)
				}
				s.Kill()
				viewShowsLedger(t, v, sku)
			}
		})
	}
}

// BREAK V5 (review of b38c2bb, fixed). A replica cut off its SKU's master
// reads the stock view from the ledger, and trusts it while it hears the
// notices. A refund there gives the unit back in the ledger, but the
// return's Redis half fails (the cut), and returnToRedis gave up before
// dropping the view: V said sold out for the max age while it would sell
// the unit around the gate, and no sweeper could end it (every one is cut
// off that master; here V is the only replica). It now drops the view and
// the flag whenever the ledger's half is done.
func TestAttackViewRefundWhoseRefillFails(t *testing.T) {
	for _, m := range flagModes {
		t.Run(m.name, func(t *testing.T) {
			dsn := systest.LedgerDSN(t, ledger.SQLite)
			d := &cutDialer{}
			v := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Dialer: d.Dial, Tune: viewVictimTune(m.maxAge)})
			sku, port := skuOffAllNotices(t)
			v.PutSKU(t, sku, 1, 1, 4)
			b := v.Buy(t, sku, "k", "ann", 1)
			if b.Status != http.StatusCreated {
				t.Fatalf("purchase = %d %s", b.Status, b.Body)
			}
			d.Cut(port)
			systest.WaitFor(t, 10*time.Second, "V's view of the sold-out SKU", func() bool { return viewOf(t, v, sku).SoldOut })
			if r := v.Act(t, "/v1/orders/"+systest.OrderID(b)+"/refund", "rf", "ann"); r.Status != http.StatusOK {
				t.Fatalf("refund = %d %s", r.Status, r.Body)
			}
			if st := v.State(t, sku); st.Sold != 0 {
				t.Fatalf("ledger sold = %d after the refund, want 0", st.Sold)
			}
			viewShowsLedger(t, v, sku)
		})
	}
}

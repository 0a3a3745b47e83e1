package requests_test

// Attacks on "a sold-out flag stands until a restock notice" (6c9f1a3):
// each test makes a replica that hears the notices keep answering sold out
// while the ledger has stock for the request. The victim's flag lives a
// TTL of 100 ms when it is not trusted, and a minute when it is: a buyer
// who is not sold the unit within 3 s met a trusted stale flag (before the
// commit, a flag lived 2 TTLs at most). Each break runs twice: "trusted"
// (the max age of a minute) and "ttl-only" (the max age at the TTL, the
// behaviour before the commit), the control that shows the test sound.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
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
	"github.com/stockgate/stockgate/stock"
)

const attackTTL = 100 * time.Millisecond

// flagModes are the victim's flag settings: the commit's, and the old
// behaviour (max age at the TTL) as the control.
var flagModes = []struct {
	name   string
	maxAge time.Duration
}{{"trusted", time.Minute}, {"ttl-only", attackTTL}}

func victimTune(maxAge time.Duration, more func(o *app.Options)) func(o *app.Options) {
	return func(o *app.Options) {
		o.Cache.SoldOutTTL, o.Cache.NoticeMaxAge = attackTTL, maxAge
		if more != nil {
			more(o)
		}
	}
}

// sellsWithin fails the test unless e sells q of sku within 3 s (the
// victim's flag: 100 ms untrusted, a minute trusted).
func sellsWithin(t *testing.T, e *systest.Env, sku stock.SKU, key, buyer string, q int64) {
	t.Helper()
	start := time.Now()
	var last systest.Reply
	n := 0
	deadline := time.Now().Add(3 * time.Second)
	for {
		n++
		last = e.Buy(t, sku, key, buyer, q)
		if last.Status == http.StatusCreated {
			t.Logf("sold %v after the return (%d tries)", time.Since(start).Round(time.Millisecond), n)
			return
		}
		if time.Now().After(deadline) {
			st, err := e.Ledger.SKU(context.Background(), sku)
			if err != nil {
				t.Fatal(err)
			}
			stockRead := e.Do(t, http.MethodGet, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/stock", nil, "")
			t.Fatalf("FALSE SOLD OUT: %d tries over %v answered %d %s while the ledger has remaining %d (total %d sold %d held %d); stock read: %d %s",
				n, time.Since(start).Round(time.Millisecond), last.Status, last.Body, st.Remaining(), st.Total, st.Sold, st.Held,
				stockRead.Status, stockRead.Body)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

// cutDialer is a replica's Redis dialer that can cut it off one node: its
// connections there are closed and new ones refused (a dial error, which
// the gateway knows ran nothing), as a partition between the replica and
// one master does. Its other connections (the notices' among them) live.
type cutDialer struct {
	mu    sync.Mutex
	cut   string
	conns map[string][]net.Conn
}

func (d *cutDialer) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cut != "" && strings.HasSuffix(addr, d.cut) {
		return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("cut by the test")}
	}
	c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, network, addr)
	if err == nil {
		if d.conns == nil {
			d.conns = map[string][]net.Conn{}
		}
		d.conns[addr] = append(d.conns[addr], c)
	}
	return c, err
}

// Cut cuts the replica off the node listening on port.
func (d *cutDialer) Cut(port int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cut = ":" + strconv.Itoa(port)
	for addr, cs := range d.conns {
		if strings.HasSuffix(addr, d.cut) {
			for _, c := range cs {
				_ = c.Close()
			}
			delete(d.conns, addr)
		}
	}
}

// skuOffNotices is a one-shard SKU of a fresh program whose shard's master
// is not the master of the notices' channel (where every replica's
// subscription lives), and that master's port.
func skuOffNotices(t *testing.T) (stock.SKU, int) {
	t.Helper()
	ctx := context.Background()
	c := testenv.SharedCluster(t)
	notices, err := c.MasterOf(ctx, keys.KeySlot("sg:notices:restocked"))
	if err != nil {
		t.Fatal(err)
	}
	program := systest.NewSKU(t).Program
	for i := range 100 {
		sku := stock.SKU{Program: program, Ticket: keys.MustID(fmt.Sprintf("t%d", i))}
		m, err := c.MasterOf(ctx, keys.Shard(sku.Program, sku.Ticket, 0, 1).Slot())
		if err != nil {
			t.Fatal(err)
		}
		if m.Port != notices.Port {
			return sku, m.Port
		}
	}
	t.Fatal("no SKU off the notices' master in 100 tickets")
	return stock.SKU{}, 0
}

// BREAK 1. A replica cut off its SKU's master sells around the gate (the
// design's "a failed master costs only the SKUs whose shards it owns"). Its
// purchase of the sold-out SKU is refused by the ledger, and ledgerSoldOut
// marks the flag from the ledger's row: trusted, since the replica's
// notices' connection (on another master) is fine. The hold is then
// cancelled, here (the return's Redis half cannot run: no ClearSoldOut, no
// notice) or on a healthy replica (the hold went around the gate at this
// epoch: the ledger owes Redis only counts, and a counts-only return clears
// nothing and publishes nothing). Either way the ledger has the unit, the
// victim would sell it through the ledger, and answers 409 sold out for
// the flag's max age. Before the commit, it re-checked after a TTL and
// sold it.
func TestAttackSoldOutFlagFromLedgerOutlivesReturn(t *testing.T) {
	for _, cancelOn := range []string{"victim", "other"} {
		for _, m := range flagModes {
			t.Run(cancelOn+"/"+m.name, func(t *testing.T) {
				dsn := systest.LedgerDSN(t, ledger.SQLite)
				a := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn})
				d := &cutDialer{}
				b := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Dialer: d.Dial, Tune: victimTune(m.maxAge, nil)})
				sku, port := skuOffNotices(t)
				b.PutSKU(t, sku, 1, 1, 4)
				d.Cut(port)
				var h systest.HoldReply
				systest.WaitFor(t, 10*time.Second, "a hold around the gate on B", func() bool {
					var r systest.Reply
					r, h = b.Hold(t, sku, "h", "xena", 1, 0)
					return r.Status == http.StatusCreated
				})
				systest.WaitFor(t, 10*time.Second, "B's 409 for the sold-out SKU", func() bool {
					return b.Buy(t, sku, "y", "yuri", 1).Status == http.StatusConflict
				})
				canceller := b
				if cancelOn == "other" {
					canceller = a
				}
				if c := canceller.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c", "xena"); c.Status != http.StatusOK {
					t.Fatalf("cancel = %d %s", c.Status, c.Body)
				}
				sellsWithin(t, b, sku, "z", "zoe", 1)
			})
		}
	}
}

// BREAK 3 (found by the model under load). Redis loses a sold-out SKU's
// gate (a restart without persistence), then its hold is cancelled on A:
// the return's refill finds no gate (the next seed counts the unit from
// the ledger) and published nothing. B's flag from before the loss stood
// for its max age, and nothing took B's buyers to the gate to seed it: a
// cart never asks past the flag, and a purchase was refused from the
// committed keys B had sealed at the sell-out. "fenced" is the gate lost
// and then fenced by a rebuild that failed before its seed (helper-81
// #1): the refill waits for a seed ("not yet") and told no one either.
func TestAttackReturnToALostGateReachesTrustedFlags(t *testing.T) {
	for _, fenced := range []bool{false, true} {
		for _, m := range flagModes {
			t.Run(map[bool]string{false: "lost", true: "fenced"}[fenced]+"/"+m.name, func(t *testing.T) {
				dsn := systest.LedgerDSN(t, ledger.SQLite)
				a := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn})
				b := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Tune: victimTune(m.maxAge, nil)})
				sku := systest.NewSKU(t)
				a.PutSKU(t, sku, 1, 1, 4)
				r, h := a.Hold(t, sku, "h", "xena", 1, 0)
				if r.Status != http.StatusCreated {
					t.Fatalf("hold = %d %s", r.Status, r.Body)
				}
				if r := b.Buy(t, sku, "y", "yuri", 1); r.Status != http.StatusConflict {
					t.Fatalf("purchase of the sold-out SKU on B = %d %s, want 409", r.Status, r.Body)
				}
				// The gate is lost: its one shard's stock hash (the shared
				// cluster serves other tests, so no FLUSHALL).
				ctx := context.Background()
				rdb, stockKey := testenv.SharedCluster(t).Client(), keys.Shard(sku.Program, sku.Ticket, 0, 1).Stock()
				defer rdb.Close()
				if err := rdb.Del(ctx, stockKey).Err(); err != nil {
					t.Fatal(err)
				}
				if fenced {
					if err := rdb.HSet(ctx, stockKey, "fence", "1").Err(); err != nil {
						t.Fatal(err)
					}
				}
				if c := a.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c", "xena"); c.Status != http.StatusOK {
					t.Fatalf("cancel = %d %s", c.Status, c.Body)
				}
				sellsWithin(t, b, sku, "z", "zoe", 1)
			})
		}
	}
}

// BREAK 4 (helper-80 #3). A return whose refill ran but whose buyer's
// counts could not go back (the master of the buyer's quota key cut off
// the returning replica A) took the error path, which cleared A's flag
// only: the sweeper's retry finds the refill done and tells no one, so
// B's trusted flag stood for its max age.
func TestAttackReturnWithCountsFailingReachesTrustedFlags(t *testing.T) {
	for _, m := range flagModes {
		t.Run(m.name, func(t *testing.T) {
			ctx := context.Background()
			c := testenv.SharedCluster(t)
			masterOf := func(slot int) int {
				n, err := c.MasterOf(ctx, slot)
				if err != nil {
					t.Fatal(err)
				}
				return n.Port
			}
			notices := masterOf(keys.KeySlot("sg:notices:restocked"))
			sku := systest.NewSKU(t)
			gate := masterOf(keys.Shard(sku.Program, sku.Ticket, 0, 1).Slot())
			var buyer string
			var quota int
			for i := range 200 {
				b := fmt.Sprintf("xena%d", i)
				if q := masterOf(keys.KeySlot(keys.Quota(sku.Program, sku.Ticket, keys.MustID(b)))); q != gate && q != notices {
					buyer, quota = b, q
					break
				}
			}
			if buyer == "" {
				t.Fatal("no buyer whose quota key is off the gate's and the notices' masters in 200")
			}
			dsn := systest.LedgerDSN(t, ledger.SQLite)
			d := &cutDialer{}
			a := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Dialer: d.Dial})
			b := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Tune: victimTune(m.maxAge, nil)})
			a.PutSKU(t, sku, 1, 1, 4)
			r, h := a.Hold(t, sku, "h", buyer, 1, 0)
			if r.Status != http.StatusCreated {
				t.Fatalf("hold = %d %s", r.Status, r.Body)
			}
			if r := b.Buy(t, sku, "y", "yuri", 1); r.Status != http.StatusConflict {
				t.Fatalf("purchase of the sold-out SKU on B = %d %s, want 409", r.Status, r.Body)
			}
			d.Cut(quota)
			if c := a.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c", buyer); c.Status != http.StatusOK {
				t.Fatalf("cancel = %d %s", c.Status, c.Body)
			}
			sellsWithin(t, b, sku, "z", "zoe", 1)
		})
	}
}

// BREAK 2, no fault. A purchase of 2 that assembles its units from two
// shards and falls short gives back what it took with shard.Store.Restore
// (shard/shard.go assemble): units back at the gate, and no notice. A
// replica that found the SKU empty while those units were out keeps its
// trusted flag. The assembling replica A's Redis writes are slowed (300 ms
// each) only to hold the window open; in a flash sale of multi-unit
// purchases on multi-shard SKUs the window is one round trip.
//
// SKU of 2 on 2 shards (1 each). X (2, on A) finds no shard with 2 and
// assembles: it takes shard i's unit. Y (1, on B) takes the other unit. Z
// (1, on B) finds both empty: B's flag, trusted. X finds shard j empty and
// gives shard i's unit back. The ledger: total 2, sold 1. B answers sold
// out.
func TestAttackAssembleShortfallGiveBackSendsNoNotice(t *testing.T) {
	for _, m := range flagModes {
		t.Run(m.name, func(t *testing.T) {
			const lag = 300 * time.Millisecond
			dsn := systest.LedgerDSN(t, ledger.SQLite)
			slow := &testenv.Latency{}
			a := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Dialer: slow.Dial, Tune: func(o *app.Options) {
				// Room for the slowed writes: one gate call is 4 of them.
				o.Redis.ReadTimeout, o.Redis.WriteTimeout = 5*time.Second, 5*time.Second
				o.Sale.RedisTimeout, o.Sale.WorkTimeout = 10*time.Second, 30*time.Second
			}})
			b := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Tune: victimTune(m.maxAge, nil)})
			// The race is X's second probe against Y's take: on a busy
			// machine Y may come after it, X then buys both and nothing
			// falls short. Each try is a SKU of its own; CI skips nothing,
			// so missing it every time fails.
			for try := range 3 {
				if shortfallThenSell(t, a, b, slow, lag, fmt.Sprint(try)) {
					return
				}
			}
			t.Fatal("X never fell short in 3 tries: the race was missed every time")
		})
	}
}

// shortfallThenSell runs BREAK 2 once; false when X did not fall short.
func shortfallThenSell(t *testing.T, a, b *systest.Env, slow *testenv.Latency, lag time.Duration, try string) bool {
	sku := systest.NewSKU(t)
	sku.Ticket = keys.MustID("ga" + try)
	b.PutSKU(t, sku, 2, 2, 4)
	remaining := func() int64 {
		left, _, err := b.Gate.Remaining(context.Background(), sku, 2)
		if err != nil {
			t.Fatal(err)
		}
		return left
	}
	slow.Set(lag)
	x := make(chan systest.Reply, 1)
	go func() { x <- a.Buy(t, sku, "x"+try, "xavier", 2) }()
	systest.WaitFor(t, 10*time.Second, "X's first part taken", func() bool { return remaining() == 1 })
	y := make(chan systest.Reply, 1)
	go func() { y <- b.Buy(t, sku, "y"+try, "yuri", 1) }()
	systest.WaitFor(t, 2*time.Second, "Y's unit taken", func() bool { return remaining() == 0 })
	if r := b.Buy(t, sku, "zz"+try, "zed", 1); r.Status != http.StatusConflict {
		t.Fatalf("Z on B while X and Y hold both units = %d %s, want 409", r.Status, r.Body)
	}
	if r := <-y; r.Status != http.StatusCreated {
		t.Fatalf("Y = %d %s", r.Status, r.Body)
	}
	rx := <-x
	slow.Set(0)
	if rx.Status != http.StatusConflict {
		t.Logf("X = %d %s: it did not fall short, the race was missed", rx.Status, rx.Body)
		return false
	}
	if got := remaining(); got != 1 {
		t.Fatalf("Redis remaining after X gave back = %d, want 1", got)
	}
	sellsWithin(t, b, sku, "z"+try, "zoe", 1)
	return true
}

// HELD: every ordinary way stock comes back on a healthy replica A reaches
// the victim B (its flag trusted for a minute) by a notice: B sells the
// returned unit within 3 s. The sold-out flag is marked on B by a 409
// after A took the SKU's last unit.
func TestAttackReturnsReachTrustedFlags(t *testing.T) {
	returns := map[string]struct {
		take func(t *testing.T, a *systest.Env, sku stock.SKU) string // the id the return acts on
		give func(t *testing.T, a *systest.Env, sku stock.SKU, id string)
	}{
		"hold-expired": {
			take: func(t *testing.T, a *systest.Env, sku stock.SKU) string {
				r, h := a.Hold(t, sku, sku.Program.String()+"-h", "xena", 1, 1)
				if r.Status != http.StatusCreated {
					t.Fatalf("hold = %d %s", r.Status, r.Body)
				}
				return h.HoldID
			},
			give: func(*testing.T, *systest.Env, stock.SKU, string) {}, // A's sweeper expires it
		},
		"refund": {
			take: func(t *testing.T, a *systest.Env, sku stock.SKU) string {
				return systest.OrderID(a.MustBuy(t, sku, sku.Program.String()+"-o", "xena", 1))
			},
			give: func(t *testing.T, a *systest.Env, _ stock.SKU, id string) {
				if r := a.Act(t, "/v1/orders/"+id+"/refund", id+"-rf", "xena"); r.Status != http.StatusOK {
					t.Fatalf("refund = %d %s", r.Status, r.Body)
				}
			},
		},
		"resale-listing": {
			take: func(t *testing.T, a *systest.Env, sku stock.SKU) string {
				return systest.OrderID(a.MustBuy(t, sku, sku.Program.String()+"-o", "xena", 1))
			},
			give: func(t *testing.T, a *systest.Env, _ stock.SKU, id string) {
				r := a.Do(t, http.MethodPost, "/v1/orders/"+id+"/resale", map[string]string{"Idempotency-Key": id + "-l"}, `{"buyer":"xena","quantity":1}`)
				if r.Status != http.StatusCreated {
					t.Fatalf("list = %d %s", r.Status, r.Body)
				}
			},
		},
		"restock": {
			take: func(t *testing.T, a *systest.Env, sku stock.SKU) string {
				return systest.OrderID(a.MustBuy(t, sku, sku.Program.String()+"-o", "xena", 1))
			},
			give: func(t *testing.T, a *systest.Env, sku stock.SKU, _ string) { a.PutSKU(t, sku, 2, 1, 4) },
		},
	}
	dsn := systest.LedgerDSN(t, ledger.SQLite)
	a := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Sweep: true, Tune: func(o *app.Options) {
		o.Sale.SweepEvery = 20 * time.Millisecond
	}})
	b := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: dsn, Tune: victimTune(time.Minute, nil)})
	for name, ret := range returns {
		t.Run(name, func(t *testing.T) {
			sku := systest.NewSKU(t)
			a.PutSKU(t, sku, 1, 1, 4)
			id := ret.take(t, a, sku)
			if r := b.Buy(t, sku, sku.Program.String()+"-y", "yuri", 1); r.Status != http.StatusConflict {
				t.Fatalf("purchase of a sold-out SKU on B = %d %s, want 409", r.Status, r.Body)
			}
			ret.give(t, a, sku, id)
			sellsWithin(t, b, sku, sku.Program.String()+"-z", "zoe", 1)
		})
	}
}

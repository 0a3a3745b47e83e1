package failover_test

// Attacks on a replay giving back what its request owes Redis, and on
// /readyz following the ledger. Two broke: a hold confirmed in part owed
// Redis the units transferred out of its order since (holdOwedUnits read
// the order's quantity now), and /readyz failed on a slow link and behind
// a busy pool while the ledger sold (the check shared the pool and gave
// two queries one second).

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

func holdOrder(t *testing.T, e *systest.Env, holdID string) string {
	t.Helper()
	g := e.Do(t, http.MethodGet, "/v1/holds/"+holdID, nil, "")
	var h systest.HoldReply
	_ = json.Unmarshal(g.Body, &h)
	return h.OrderID
}

// A partial confirm (2 of a hold's 4) whose COMMIT reply is lost owes
// Redis the 2 it released until its retry replays (no sweeper). Between
// the two, the order changes: 1 of its 2 tickets is transferred (or the
// order refunded). The replay's returnOwed (and the sweeper's
// PendingRestores, transfer-sweeper) computes what the hold owes as the
// hold's quantity less its order's quantity *now* (ledger.holdOwedUnits):
// 4-1 = 3, not the 2 the confirm released. Redis must still equal the
// ledger.
func TestAttackOwedAfterOrderChanged(t *testing.T) {
	systest.FullTier(t)
	link, dsn := systest.LedgerLink(t, systest.LedgerDSN(t, ledger.Postgres))
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn})
	ctx := context.Background()
	for _, change := range []string{"transfer", "refund", "none", "transfer-sweeper"} {
		t.Run(change, func(t *testing.T) {
			if change == "transfer-sweeper" {
				// No retry: the sweeper finishes the return (same sum).
				systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Sweep: true, Tune: func(o *app.Options) {
					o.Sale.RestoreGrace = time.Second
					o.Sale.SweepEvery = 200 * time.Millisecond
				}})
			}
			sku := systest.NewSKU(t)
			e.PutSKU(t, sku, 40, 1, 4)
			r, h := e.Hold(t, sku, "h-"+change, "ann", 4, 60)
			if r.Status != http.StatusCreated {
				t.Fatalf("hold = %d %s", r.Status, r.Body)
			}
			path := "/v1/holds/" + h.HoldID + "/confirm"
			body := `{"buyer":"ann","quantity":2}`
			lost := link.LoseCommitReplies(t, 0, 1)
			first := e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "pc-" + change}, body)
			n := lost()
			link.Heal(t)
			_, owed, err := e.Ledger.RestoreOwed(ctx, "hold", keys.MustID(h.HoldID))
			t.Logf("partial confirm, COMMIT reply lost (%d): %d %s; still owed to Redis: %v %v", n, first.Status, first.Body, owed, err)
			oid := holdOrder(t, e, h.HoldID)
			if oid == "" {
				t.Fatalf("no order after the partial confirm")
			}
			switch change {
			case "transfer", "transfer-sweeper":
				x := e.Do(t, http.MethodPost, "/v1/orders/"+oid+"/transfer", map[string]string{"Idempotency-Key": "t-" + change},
					`{"buyer":"ann","to":"bob","quantity":1}`)
				t.Logf("transfer 1 of the order = %d %s", x.Status, x.Body)
			case "refund":
				x := e.Do(t, http.MethodPost, "/v1/orders/"+oid+"/refund", map[string]string{"Idempotency-Key": "r-" + change}, `{"buyer":"ann"}`)
				t.Logf("refund the order = %d %s", x.Status, x.Body)
			}
			if change == "transfer-sweeper" {
				systest.WaitSettled(t, e, sku)
				return
			}
			again, _ := e.Retried(t, http.MethodPost, path, "pc-"+change, body)
			if again.Status != http.StatusCreated || systest.OrderID(again) != oid {
				t.Errorf("retry of the partial confirm = %d %s, want 201 order %s", again.Status, again.Body, oid)
			}
			st := e.State(t, sku)
			t.Logf("after: %+v", st)
			systest.WaitSettled(t, e, sku)
		})
	}
}

// The same keyed request sent to two replicas at once, several times
// over: a partial confirm, a cancel, a refund, a listing, a cart cancel
// and a cart refund. The first commits, the others replay (and now give
// back what is owed). No unit may come back twice: Redis equals the
// ledger, nothing negative.
func TestAttackReplayRaces(t *testing.T) {
	systest.FullTier(t)
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	a := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn})
	b := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn})
	envs := []*systest.Env{a, b, a, b}
	sku := systest.NewSKU(t)
	a.PutSKU(t, sku, 400, 2, 4)
	carts := "/v1/programs/" + sku.Program.String()
	line := func(q int) string {
		return fmt.Sprintf(`{"buyer":"ann","lines":[{"ticket":%q,"quantity":%d}]}`, sku.Ticket.String(), q)
	}
	race := func(what, path, key, body string, ok ...int) []systest.Reply {
		t.Helper()
		out := make([]systest.Reply, len(envs))
		var wg sync.WaitGroup
		for i, e := range envs {
			wg.Go(func() { out[i] = e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": key}, body) })
		}
		wg.Wait()
		for _, r := range out {
			good := false
			for _, s := range ok {
				good = good || r.Status == s
			}
			// A request racing its own first attempt may be told to come back.
			if !good && r.Status != http.StatusServiceUnavailable && r.Status != http.StatusConflict {
				t.Errorf("%s = %d %s", what, r.Status, r.Body)
			}
		}
		return out
	}
	id := func(r systest.Reply, field string) string {
		var v map[string]any
		_ = json.Unmarshal(r.Body, &v)
		s, _ := v[field].(string)
		return s
	}
	first := func(rs []systest.Reply, field string) string {
		for _, r := range rs {
			if s := id(r, field); s != "" {
				return s
			}
		}
		return ""
	}
	for i := range 8 {
		_, h := a.Hold(t, sku, fmt.Sprintf("h%d", i), "ann", 4, 60)
		race("partial confirm", "/v1/holds/"+h.HoldID+"/confirm", fmt.Sprintf("pc%d", i), `{"buyer":"ann","quantity":1}`, 201)
		_, h2 := a.Hold(t, sku, fmt.Sprintf("hc%d", i), "ann", 3, 60)
		race("cancel", "/v1/holds/"+h2.HoldID+"/cancel", fmt.Sprintf("c%d", i), `{"buyer":"ann"}`, 200)
		o := a.Buy(t, sku, fmt.Sprintf("b%d", i), "ann", 3)
		oid := systest.OrderID(o)
		if i%2 == 0 {
			race("listing", "/v1/orders/"+oid+"/resale", fmt.Sprintf("l%d", i), `{"buyer":"ann","quantity":2}`, 201)
		} else {
			race("refund", "/v1/orders/"+oid+"/refund", fmt.Sprintf("r%d", i), `{"buyer":"ann"}`, 200)
		}
		ch := a.Do(t, http.MethodPost, carts+"/cart-holds", map[string]string{"Idempotency-Key": fmt.Sprintf("ch%d", i)}, line(2))
		race("cart cancel", "/v1/carts/"+id(ch, "cart_id")+"/cancel", fmt.Sprintf("cc%d", i), `{"buyer":"ann"}`, 200)
		cb := a.Do(t, http.MethodPost, carts+"/carts", map[string]string{"Idempotency-Key": fmt.Sprintf("cb%d", i)}, line(2))
		race("cart refund", "/v1/carts/"+id(cb, "cart_id")+"/refund", fmt.Sprintf("cr%d", i), `{"buyer":"ann"}`, 200)
		_ = first
	}
	st := a.State(t, sku)
	t.Logf("after the races: %+v", st)
	if st.RedisRemaining < 0 || st.Sold < 0 || st.Held < 0 {
		t.Errorf("negative: %+v", st)
	}
	systest.WaitSettled(t, a, sku)
	systest.WaitSettled(t, b, sku)
}

// The ledger's database turns read-only (ALTER DATABASE ... SET
// default_transaction_read_only = on, then every session of it ended so
// new ones take the setting): /readyz fails (503) and the writable gauge
// reads 0; purchases, holds and confirms answer 503 (never a 500 nor a
// client's error, never a 201); turned back, /readyz passes and sales
// resume, and every key sent again sells once.
func TestAttackReadOnlyLedger(t *testing.T) {
	systest.FullTier(t)
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn})
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx := context.Background()
	var name string
	if err := db.QueryRowContext(ctx, `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 200, 2, 4)
	_, h := e.Hold(t, sku, "h-ro", "ann", 2, 120)
	ready := func() systest.Reply { return e.Do(t, http.MethodGet, "/readyz", nil, "") }
	if r := ready(); r.Status != http.StatusOK {
		t.Fatalf("/readyz before = %d %s", r.Status, r.Body)
	}
	kick := func() {
		if _, err := db.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
			t.Fatal(err)
		}
		_ = db.Close()
		db, _ = sql.Open("pgx", dsn)
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf(`ALTER DATABASE %q SET default_transaction_read_only = on`, name)); err != nil {
		t.Fatal(err)
	}
	kick()
	began := time.Now()
	systest.WaitFor(t, 15*time.Second, "/readyz to fail with the ledger read-only", func() bool { return ready().Status == http.StatusServiceUnavailable })
	r := ready()
	t.Logf("/readyz after %v: %d %s", time.Since(began).Round(time.Millisecond), r.Status, r.Body)
	if w := systest.Counter(t, e.Registry, "stockgate_ledger_writable", map[string]string{"primary": "main"}); w != 0 {
		t.Errorf("stockgate_ledger_writable = %v read-only, want 0", w)
	}
	var keys []string
	for i := range 20 {
		key := fmt.Sprintf("ro-%d", i)
		keys = append(keys, key)
		r := e.Buy(t, sku, key, "b", 1)
		if r.Status != http.StatusServiceUnavailable {
			t.Errorf("purchase %s with the ledger read-only = %d %s, want 503", key, r.Status, r.Body)
		}
	}
	hr, _ := e.Hold(t, sku, "h-ro2", "ann", 1, 60)
	if hr.Status != http.StatusServiceUnavailable {
		t.Errorf("hold with the ledger read-only = %d %s, want 503", hr.Status, hr.Body)
	}
	c := e.Act(t, "/v1/holds/"+h.HoldID+"/confirm", "c-ro", "ann")
	if c.Status != http.StatusServiceUnavailable {
		t.Errorf("confirm with the ledger read-only = %d %s, want 503", c.Status, c.Body)
	}
	writable := func() error {
		conn, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, `SET default_transaction_read_only = off`); err != nil {
			return err
		}
		_, err = conn.ExecContext(ctx, fmt.Sprintf(`ALTER DATABASE %q RESET default_transaction_read_only`, name))
		return err
	}
	if err := writable(); err != nil {
		t.Fatal(err)
	}
	kick()
	systest.WaitFor(t, 15*time.Second, "/readyz to pass with the ledger writable", func() bool { return ready().Status == http.StatusOK })
	for _, key := range keys {
		if r, _ := e.Retried(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", key, `{"buyer":"b","quantity":1}`); r.Status != http.StatusCreated {
			t.Errorf("%s sent again = %d %s", key, r.Status, r.Body)
		}
	}
	if c, _ := e.Retried(t, http.MethodPost, "/v1/holds/"+h.HoldID+"/confirm", "c-ro", `{"buyer":"ann"}`); c.Status != http.StatusCreated {
		t.Errorf("confirm sent again = %d %s", c.Status, c.Body)
	}
	if st := e.State(t, sku); st.Orders != int64(len(keys))+1 {
		t.Errorf("ledger %+v", st)
	}
	systest.WaitSettled(t, e, sku)
}

// A slow but working ledger link (300 ms each way) with the default work
// timeout (5 s): purchases sell. /readyz says whether the ledger takes
// writes; it must not take every replica out of the load balancer while
// the ledger takes them. (The health round gives two queries one second.)
func TestAttackReadyzSlowLink(t *testing.T) {
	systest.FullTier(t)
	link, dsn := systest.LedgerLink(t, systest.LedgerDSN(t, ledger.Postgres))
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: func(o *app.Options) {
		o.Sale.WorkTimeout = 5 * time.Second
		o.Sale.SettingsTTL = time.Minute
	}})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 200, 1, 4)
	e.Buy(t, sku, "warm", "b", 1)
	link.Latency(t, 300*time.Millisecond)
	notReady := 0
	var last systest.Reply
	sold := 0
	for i := range 8 {
		began := time.Now()
		r := e.Buy(t, sku, fmt.Sprintf("slow-%d", i), "b", 1)
		if r.Status == http.StatusCreated {
			sold++
		}
		rd := e.Do(t, http.MethodGet, "/readyz", nil, "")
		if rd.Status != http.StatusOK {
			notReady++
			last = rd
		}
		t.Logf("purchase %d = %d in %v; /readyz %d", i, r.Status, time.Since(began).Round(time.Millisecond), rd.Status)
	}
	link.Heal(t)
	if sold > 0 && notReady > 0 {
		t.Errorf("the ledger sold %d of 8 over a slow link while /readyz answered not-ready %d times: %s", sold, notReady, last.Body)
	}
	systest.WaitFor(t, 10*time.Second, "/readyz once healed", func() bool { return e.Do(t, http.MethodGet, "/readyz", nil, "").Status == http.StatusOK })
}

// A busy replica whose ledger pool is saturated by its own traffic (the
// ledger answers everything, only after a wait for a connection): the
// health round waits for a connection like any query. /readyz must not
// say the ledger takes no writes while the replica sells.
func TestAttackReadyzBusyPool(t *testing.T) {
	systest.FullTier(t)
	link, dsn := systest.LedgerLink(t, systest.LedgerDSN(t, ledger.Postgres))
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: func(o *app.Options) {
		o.Ledger.MaxConns = 4
		o.Sale.WorkTimeout = 5 * time.Second
	}})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 100000, 2, 4)
	order := systest.OrderID(e.Buy(t, sku, "o", "b", 1))
	link.Latency(t, 25*time.Millisecond)
	end := time.Now().Add(8 * time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[int]int{}
	for w := range 64 {
		wg.Go(func() {
			for i := 0; time.Now().Before(end); i++ {
				var r systest.Reply
				if w%4 == 0 {
					r = e.Buy(t, sku, fmt.Sprintf("busy-%d-%d", w, i), "b", 1)
				} else {
					r = e.Do(t, http.MethodGet, "/v1/orders/"+order, nil, "")
				}
				mu.Lock()
				got[r.Status]++
				mu.Unlock()
			}
		})
	}
	notReady := 0
	var last systest.Reply
	checks := 0
	for time.Now().Before(end) {
		rd := e.Do(t, http.MethodGet, "/readyz", nil, "")
		checks++
		if rd.Status != http.StatusOK {
			notReady++
			last = rd
		}
		time.Sleep(200 * time.Millisecond) // time under test: /readyz sampled every 200 ms through the fault
	}
	wg.Wait()
	link.Heal(t)
	t.Logf("answers %v; /readyz not ready %d of %d: %s", got, notReady, checks, last.Body)
	if got[http.StatusCreated] > 0 && notReady > 0 {
		t.Errorf("the replica sold %d while /readyz answered not-ready %d of %d times: %s", got[http.StatusCreated], notReady, checks, last.Body)
	}
}

// A change of a SKU whose first read fails (the ledger's link cut) is
// refused with nothing changed, and says so (helper-33: any failed read
// was taken for "a new SKU" and the change ran without closing the gate,
// answered "may or may not have been made"; with the link back before the
// write, a lowered total would have stood while Redis still admitted the
// old one).
func TestAdminPutOfALiveSKUWithTheLedgerCut(t *testing.T) {
	link, dsn := systest.LedgerLink(t, systest.LedgerDSN(t, ledger.Postgres))
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: func(o *app.Options) {
		o.Sale.WorkTimeout = time.Second
	}})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 10, 1, 4)
	link.Cut(t)
	r := e.Do(t, http.MethodPut, systest.AdminPath(sku), nil, `{"total":4,"shards":1,"max_per_order":4}`)
	link.Heal(t)
	if r.Status != http.StatusServiceUnavailable || !strings.Contains(string(r.Body), `"outcome":"unchanged"`) {
		t.Errorf("PUT with the ledger cut = %d %s, want 503 with outcome unchanged", r.Status, r.Body)
	}
	st, err := e.Ledger.SKU(context.Background(), sku)
	if err != nil || st.Total != 10 {
		t.Errorf("the ledger after the refused change: total %d, %v; want 10", st.Total, err)
	}
}

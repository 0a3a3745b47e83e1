package failover_test

import (
	"database/sql"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// TestFaultLedgerTakesNoWritesAWhile: what a failover looks like from the
// gateway, without the formation: every session of the ledger's database
// ended (57P01, as a primary shutting down ends them) and each new one
// read-only (25006, as a standby not yet promoted), then writable again.
// A purchase sent meanwhile waits for a server that takes writes, tries
// again (stockgate_ledger_primary_waits_total) and is sold once the
// ledger takes writes, within its work time: a failover of a second or
// two costs such a purchase no 503 (it cost every purchase in it one:
// stockbench faults). Under a heavy load the ledger's door still sheds
// what would queue past the wait budget (BENCHMARKS.md).
// Nothing is sold twice, Redis equals the ledger.
func TestFaultLedgerTakesNoWritesAWhile(t *testing.T) {
	systest.FullTier(t)
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: func(o *app.Options) {
		// Room for the test's steps on a loaded machine; the waits stop
		// a second before it either way.
		o.Sale.WorkTimeout = 30 * time.Second
	}})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 10, 1, 4)
	e.MustBuy(t, sku, "np-0", "b0", 1)

	writable := sessionsWritable(t, dsn)
	writable(false)
	answered := make(chan int, 1)
	go buyInto(e, sku, "np-1", "b1", answered) // ends with the request: its work time bounds it
	// Three waits: the purchase met the read-only sessions more than once.
	systest.WaitCounter(t, e, "stockgate_ledger_primary_waits_total", nil, 3, 20*time.Second)
	select {
	case status := <-answered:
		t.Fatalf("the purchase was answered %d while no session took writes", status)
	default:
	}
	writable(true)
	select {
	case status := <-answered:
		if status != http.StatusCreated {
			t.Fatalf("the purchase sent during the fault = %d, want 201 once the ledger takes writes", status)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the purchase sent during the fault was not answered in 60 s")
	}
	if r := e.Buy(t, sku, "np-1", "b1", 1); r.Status != http.StatusCreated {
		t.Fatalf("the same purchase again = %d %s, want its 201 replayed", r.Status, r.Body)
	}
	if st := e.State(t, sku); st.Sold != 2 {
		t.Fatalf("sold %d, want 2 (np-0, np-1 once)", st.Sold)
	}
	systest.RedisConsistent(t, e, sku)
}

// sessionsWritable returns what sets the database of dsn's sessions to
// start read-only or not and ends every session but its own, so the next
// ones do: a failover's gap (57P01, then 25006) without the formation.
func sessionsWritable(t *testing.T, dsn string) func(on bool) {
	t.Helper()
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	admin.SetMaxOpenConns(1)
	var db string
	if err := admin.QueryRowContext(t.Context(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	return func(on bool) {
		t.Helper()
		set := fmt.Sprintf(`ALTER DATABASE %q SET default_transaction_read_only = on`, db)
		if on {
			set = fmt.Sprintf(`ALTER DATABASE %q RESET default_transaction_read_only`, db)
		}
		if _, err := admin.ExecContext(t.Context(), set); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.ExecContext(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFaultLedgerGapKeepsItsArrivals: the purchases that arrive while no
// server takes writes wait for one without holding the replica's places
// in flight (TakesInFlight 4 here): twelve wait through the gap, none is
// turned away, and all twelve are sold once the ledger takes writes.
// Counted against the bound, eight of them were answered 503 at once, as
// a planned failover's arrivals were under load (stockbench faults).
func TestFaultLedgerGapKeepsItsArrivals(t *testing.T) {
	systest.FullTier(t)
	dsn := systest.LedgerDSN(t, ledger.Postgres)
	e := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: dsn, Tune: func(o *app.Options) {
		o.Sale.WorkTimeout = 30 * time.Second // room for the steps on a loaded machine
		o.Sale.TakesInFlight = 4
	}})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 100, 1, 4)
	e.MustBuy(t, sku, "gap-0", "g0", 1)
	writable := sessionsWritable(t, dsn)
	writable(false)
	const buyers = 12
	answered := make(chan int, buyers)
	for i := 1; i <= buyers; i++ {
		// One at a time, each sent once the one before has parked: the
		// bound of 4 is then never reached.
		if i > 1 {
			systest.WaitCounter(t, e, "stockgate_ledger_takes_parked", nil, float64(i-1), 30*time.Second)
		}
		go buyInto(e, sku, fmt.Sprintf("gap-%d", i), fmt.Sprintf("g%d", i), answered) // ends with its request
	}
	systest.WaitCounter(t, e, "stockgate_ledger_takes_parked", nil, buyers, 30*time.Second)
	select {
	case status := <-answered:
		t.Fatalf("a purchase was answered %d while no session took writes", status)
	default:
	}
	writable(true)
	for range buyers {
		select {
		case status := <-answered:
			if status != http.StatusCreated {
				t.Errorf("a purchase sent during the gap = %d, want 201 once the ledger takes writes", status)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("a purchase sent during the gap was not answered in 60 s")
		}
	}
	if st := e.State(t, sku); st.Sold != buyers+1 {
		t.Fatalf("sold %d, want %d", st.Sold, buyers+1)
	}
	systest.RedisConsistent(t, e, sku)
}

// buyInto sends a purchase of one unit of sku by buyer with key and puts
// its status on answered (0: no answer).
func buyInto(e *systest.Env, sku stock.SKU, key, buyer string, answered chan<- int) {
	body := fmt.Sprintf(`{"buyer":%q,"quantity":1}`, buyer)
	req, _ := http.NewRequest(http.MethodPost, e.URL+systest.SKUPath(sku)+"/purchases", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.Client.Do(req)
	if err != nil {
		answered <- 0
		return
	}
	resp.Body.Close()
	answered <- resp.StatusCode
}

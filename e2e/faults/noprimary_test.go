package faults_test

import (
	"database/sql"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/internal/systest"
	"github.com/stockgate/stockgate/ledger"
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

	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	admin.SetMaxOpenConns(1)
	var db string
	if err := admin.QueryRowContext(t.Context(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	// writable sets the database's sessions to start read-only or not,
	// and ends every session but the test's, so the next ones do.
	writable := func(on bool) {
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
	writable(false)
	answered := make(chan int, 1)
	go func() { // ends with the request: its work time bounds it
		req, _ := http.NewRequest(http.MethodPost, e.URL+systest.SKUPath(sku)+"/purchases", strings.NewReader(`{"buyer":"b1","quantity":1}`))
		req.Header.Set("Idempotency-Key", "np-1")
		req.Header.Set("Content-Type", "application/json")
		resp, err := e.Client.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
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

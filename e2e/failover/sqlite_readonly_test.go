package failover_test

import (
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
)

// TestFaultSQLiteReadOnly: the SQLite ledger's files turn read-only
// mid-sale (the immutable attribute, which even root cannot write
// through: a volume remounted read-only, a file an operator locked). A
// purchase the ledger cannot write is refused 503 with Retry-After, never
// another 5xx, and nothing is half-written: the rows add up, Redis equals
// the ledger. /readyz says not ready meanwhile (the load balancer sends
// the buyers to a replica that can sell), ready again after. Once the
// files are writable again, each refused purchase sent again with its key
// is sold exactly once.
func TestFaultSQLiteReadOnly(t *testing.T) {
	systest.FullTier(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	files := []string{db, db + "-wal"}
	chattr := func(flag string) {
		t.Helper()
		args := append([]string{flag}, files...)
		if out, err := exec.Command("chattr", args...).CombinedOutput(); err != nil {
			t.Fatalf("chattr %v (the test runs as root on a file system with attributes, as make test does): %v %s", args, err, out)
		}
	}
	e := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: db})
	sku := systest.NewSKU(t)
	const before = 20
	e.PutSKU(t, sku, 1000, 2, 4)
	buy := func(i int) systest.Reply { return e.Buy(t, sku, fmt.Sprintf("ro-%d", i), "b", 1) }
	if got := systest.BuyAll(before, 4, buy); got[http.StatusCreated] != before {
		t.Fatalf("before the files turned read-only: %v", got)
	}

	ready := func() int { return e.Do(t, http.MethodGet, "/readyz", nil, "").Status }
	if r := ready(); r != http.StatusOK {
		t.Fatalf("/readyz with the ledger writable = %d", r)
	}
	chattr("+i")
	t.Cleanup(func() { _ = exec.Command("chattr", append([]string{"-i"}, files...)...).Run() })
	counts, refused := map[int]int{}, []int{}
	for i := before; i < before+20; i++ {
		r := buy(i)
		counts[r.Status]++
		if r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") != "" {
			refused = append(refused, i)
			continue
		}
		t.Errorf("purchase %d with the ledger read-only = %d %s (Retry-After %q)", i, r.Status, r.Body, r.Header.Get("Retry-After"))
	}
	t.Logf("with the ledger read-only: %v", counts)
	if got := e.State(t, sku); got.Sold != before || got.Orders != before || got.OrderUnits != before {
		t.Errorf("ledger %+v with its files read-only, %d answered 201 before", got, before)
	}
	systest.WaitSettled(t, e, sku)
	systest.WaitFor(t, 15*time.Second, "/readyz to fail with the ledger read-only", func() bool { return ready() == http.StatusServiceUnavailable })

	chattr("-i")
	systest.WaitFor(t, 15*time.Second, "/readyz to pass with the ledger writable", func() bool { return ready() == http.StatusOK })
	sold := before
	for _, i := range refused {
		r, _ := e.Retried(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", fmt.Sprintf("ro-%d", i), `{"buyer":"b","quantity":1}`)
		if r.Status != http.StatusCreated {
			t.Errorf("ro-%d sent again with the files writable = %d %s", i, r.Status, r.Body)
			continue
		}
		sold++
	}
	if got := e.State(t, sku); got.Sold != int64(sold) || got.Orders != int64(sold) || got.OrderUnits != got.Sold {
		t.Errorf("ledger %+v after the refused were sent again, %d answered 201", got, sold)
	}
	systest.WaitSettled(t, e, sku)
}

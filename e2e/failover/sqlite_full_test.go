package failover_test

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
)

// TestFaultSQLiteDiskFull: the SQLite ledger's file on a file system that
// fills up mid-sale (a tmpfs of 8 MiB, the test's own; a filler file takes
// all but 128 KiB). Purchases that can't be written are refused 503 with
// Retry-After, never another 5xx, and nothing is half-written: the ledger's
// rows add up, Redis equals the ledger. /readyz fails while the disk is
// full. Once space is freed, it passes, and each refused purchase sent
// again with its key is sold exactly once.
func TestFaultSQLiteDiskFull(t *testing.T) {
	systest.FullTier(t)
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs for the ledger (the test runs as root, as make test does): %v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
	e := systest.Start(t, systest.Options{Driver: ledger.SQLite, DSN: filepath.Join(dir, "ledger.db")})
	sku := systest.NewSKU(t)
	const total, before, most = 100000, 50, 4000
	e.PutSKU(t, sku, total, 2, 4)
	buy := func(i int) systest.Reply { return e.Buy(t, sku, fmt.Sprintf("k-%d", i), "b", 1) }
	if got := systest.BuyAll(before, 8, buy); got[http.StatusCreated] != before {
		t.Fatalf("before the disk filled: %v", got)
	}

	ready := func() int { return e.Do(t, http.MethodGet, "/readyz", nil, "").Status }
	systest.WaitFor(t, 15*time.Second, "/readyz to pass before the disk fills", func() bool { return ready() == http.StatusOK })

	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	// ENOSPC is the goal reached early: the ledger's files grew between
	// the statfs and the write (a make test failure treated it as one).
	_, werr := f.Write(make([]byte, int64(fs.Bavail)*fs.Bsize-128<<10))
	if err := f.Close(); err != nil && !errors.Is(err, syscall.ENOSPC) {
		t.Fatal(err)
	}
	if werr != nil && !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("fill the disk: %v", werr)
	}

	// The replica says it takes no writes (the load balancer sends
	// elsewhere) while the disk is full.
	systest.WaitFor(t, 15*time.Second, "/readyz to fail with the disk full", func() bool {
		return ready() == http.StatusServiceUnavailable
	})

	// Bought one at a time until the ledger has refused 20 (bounded: a
	// disk that never fills fails the test).
	counts, refused, sold := map[int]int{}, []int{}, before
	for i := before; len(refused) < 20 && i < before+most; i++ {
		r := buy(i)
		counts[r.Status]++
		switch {
		case r.Status == http.StatusCreated:
			sold++
		case r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") != "":
			refused = append(refused, i)
		default:
			t.Errorf("purchase %d with the disk full = %d %s (Retry-After %q)", i, r.Status, r.Body, r.Header.Get("Retry-After"))
		}
	}
	t.Logf("with the disk full: %v", counts)
	if len(refused) < 20 {
		t.Fatalf("%d purchases refused in %d with the disk full: the fault did not land", len(refused), most)
	}
	// Nothing half-written: the rows and the SKU's counts agree with the
	// 201s, and Redis agrees with the ledger.
	got := e.State(t, sku)
	if got.Sold != int64(sold) || got.Orders != int64(sold) || got.OrderUnits != int64(sold) {
		t.Errorf("ledger %+v with the disk full, %d answered 201", got, sold)
	}
	systest.WaitSettled(t, e, sku)

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	systest.WaitFor(t, 15*time.Second, "/readyz to pass with space freed", func() bool { return ready() == http.StatusOK })
	for _, i := range refused {
		r, _ := e.Retried(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", fmt.Sprintf("k-%d", i), `{"buyer":"b","quantity":1}`)
		if r.Status != http.StatusCreated {
			t.Errorf("k-%d sent again with space freed = %d %s", i, r.Status, r.Body)
			continue
		}
		sold++
	}
	if got := e.State(t, sku); got.Sold != int64(sold) || got.Orders != int64(sold) || got.OrderUnits != got.Sold {
		t.Errorf("ledger %+v after the refused were sent again, %d answered 201", got, sold)
	}
	systest.WaitSettled(t, e, sku)
}

package failover_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
)

// unknownCommit is a ledger whose next take batch, once armed, commits
// nothing and fails as a COMMIT whose reply was lost does; before it
// fails, another request runs (meanwhile), as a client's or another
// replica's would.
type unknownCommit struct {
	sale.Ledger
	armed     atomic.Bool
	meanwhile func()
}

func (l *unknownCommit) Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult {
	if !l.armed.CompareAndSwap(true, false) {
		return l.Ledger.Commit(ctx, takes, direct)
	}
	l.meanwhile()
	out := make([]ledger.TakeResult, len(takes))
	for i, t := range takes {
		out[i] = ledger.TakeResult{Take: t, Err: errors.New("injected: ledger: take: commit: EOF")}
	}
	return out
}

// A take whose COMMIT's outcome is unknown, looked up and found to be
// another request's row under its key (the same key sent with another
// body, on another replica, meanwhile), did not commit: its claim of the
// key could not have. It is answered key-reused and its units go back to
// Redis at once. Kept (as an unknown outcome keeps them), they waited for
// the drift check, and the buyer's counts for their day.
func TestFaultCommitUnknownKeyTakenGivesBack(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn})
		w := &unknownCommit{}
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: func(o *app.Options) {
			o.WrapLedger = func(l sale.Ledger) sale.Ledger { w.Ledger = l; return w }
		}})
		sku := systest.NewSKU(t)
		a.PutCapped(t, sku, 1, 4)
		var other atomic.Int64
		w.meanwhile = func() {
			req, _ := http.NewRequest(http.MethodPost, b.URL+systest.SKUPath(sku)+"/purchases", strings.NewReader(`{"buyer":"ann","quantity":1}`))
			req.Header.Set("Idempotency-Key", "k1")
			req.Header.Set("Content-Type", "application/json")
			if resp, err := b.Client.Do(req); err == nil {
				other.Store(int64(resp.StatusCode))
				resp.Body.Close()
			}
		}
		w.armed.Store(true)
		r := a.Buy(t, sku, "k1", "ann", 2)
		if other.Load() != http.StatusCreated {
			t.Fatalf("the other request under the key = %d, want 201", other.Load())
		}
		if r.Status != http.StatusUnprocessableEntity || systest.ProblemKind(r) != "idempotency-key-reused" {
			t.Fatalf("the take whose COMMIT was unknown, its key another's = %d %s, want 422 idempotency-key-reused", r.Status, r.Body)
		}
		// Its 2 units and its counts are back: Redis has the 99 the ledger
		// has, and ann, at 1 of her cap of 4, may buy 3 more.
		systest.WaitFor(t, 10*time.Second, "Redis equal to the ledger", func() bool {
			st := a.State(t, sku)
			return st.Sold == 1 && st.RedisRemaining == 99
		})
		if r := a.Buy(t, sku, "k2", "ann", 3); r.Status != http.StatusCreated {
			t.Fatalf("ann's 3 more, at 1 of her cap of 4 = %d %s", r.Status, r.Body)
		}
	})
}

package sale_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// silentFirst is a ledger on which no return is given back at once (its
// RestoreOwed fails, so every one is left to the sweeper), whose pending
// restores list one program's first (as a fleet lists the first
// primary's first), and whose synchronous standby for that program does
// not answer (RestoreDurable fails).
type silentFirst struct {
	sale.Ledger
	silent keys.ID
}

var errSilent = errors.New("ledger: restore: not known to be on the standby: context deadline exceeded")

func (l *silentFirst) RestoreOwed(context.Context, string, keys.ID) (ledger.Restore, bool, error) {
	return ledger.Restore{}, false, errors.New("ledger: restore owed: connection reset")
}

func (l *silentFirst) PendingRestores(ctx context.Context, olderThan time.Duration, limit int) ([]ledger.Restore, error) {
	rs, err := l.Ledger.PendingRestores(ctx, olderThan, limit)
	slices.SortStableFunc(rs, func(a, b ledger.Restore) int {
		switch {
		case a.SKU.Program == b.SKU.Program:
			return 0
		case a.SKU.Program == l.silent:
			return -1
		case b.SKU.Program == l.silent:
			return 1
		}
		return 0
	})
	return rs, err
}

func (l *silentFirst) RestoreDurable(ctx context.Context, kind string, id keys.ID) error {
	r, _, err := l.Ledger.RestoreOwed(ctx, kind, id)
	if err == nil && r.SKU.Program == l.silent {
		return errSilent
	}
	return l.Ledger.RestoreDurable(ctx, kind, id)
}

// A program whose primary's standby does not answer keeps its own returns
// out of Redis, not every other program's: the sweep stopped at the first
// restore it could not confirm, and on a fleet the silent primary's rows
// come first, so a healthy primary's cancels never reached Redis while
// the other was silent (helper-112).
func TestASilentStandbyHoldsBackOnlyItsOwnReturns(t *testing.T) {
	ctx := context.Background()
	silent := keys.MustID("silent")
	var l *silentFirst
	svc, gate := sale.TestService(t, shardmem.New(), nil, func(o *sale.Options) {
		l = &silentFirst{Ledger: o.Ledger, silent: silent}
		o.Ledger, o.RestoreGrace = l, time.Millisecond
	})
	skus := []stock.SKU{{Program: silent, Ticket: keys.MustID("t")}, {Program: keys.MustID("healthy"), Ticket: keys.MustID("t")}}
	for i, sku := range skus {
		if _, err := svc.PutSKU(ctx, sale.SKUConfig{SKU: sku, Total: 2, Shards: 1, MaxPerOrder: 2}); err != nil {
			t.Fatal(err)
		}
		res, err := svc.Hold(ctx, sale.Take{Ask: sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID(fmt.Sprintf("h%d", i))}, SKU: sku, Quantity: 2})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := svc.Cancel(ctx, res.Hold.ID, sale.Ask{Buyer: keys.MustID("ann"), Key: keys.MustID(fmt.Sprintf("x%d", i))}); err != nil {
			t.Fatal(err)
		}
	}
	left := func(sku stock.SKU) int64 {
		n, _, err := gate.Remaining(ctx, sku, 1)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if left(skus[0]) != 0 || left(skus[1]) != 0 {
		t.Fatalf("Redis has %d and %d before the sweep, want both cancels owed", left(skus[0]), left(skus[1]))
	}
	sale.Sweep(svc)
	if n := left(skus[1]); n != 2 {
		t.Errorf("the healthy program's cancel after a sweep: Redis has %d, want 2", n)
	}
	if n := left(skus[0]); n != 0 {
		t.Errorf("the silent program's cancel after a sweep: Redis has %d, want 0 (not known to be on its standby)", n)
	}
}

package systest

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// CountLedger makes the replica o opens count every call it makes to its
// ledger, in the CountingLedger it returns (filled in when the replica
// opens).
func CountLedger(o *app.Options) *CountingLedger {
	c := &CountingLedger{}
	o.WrapLedger = func(l sale.Ledger) sale.Ledger {
		c.Ledger = l
		return c
	}
	return c
}

// Calls is how many ledger calls the replica has made.
func (l *CountingLedger) Calls() int64 { return l.calls.Load() }

// CountingLedger counts every call a replica makes to the real ledger.
// It overrides every method of sale.Ledger, so none reaches the real
// ledger through the embedded interface unseen; a method added to the
// interface must be added here too.
type CountingLedger struct {
	sale.Ledger
	calls   atomic.Int64
	mu      sync.Mutex
	methods map[string]int
}

func (l *CountingLedger) note(m string) {
	l.calls.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.methods == nil {
		l.methods = map[string]int{}
	}
	l.methods[m]++
}

func (l *CountingLedger) ByMethod() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.methods)
}

func (l *CountingLedger) PutSKU(ctx context.Context, c ledger.SKUConfig) (ledger.SKUState, error) {
	l.note("PutSKU")
	return l.Ledger.PutSKU(ctx, c)
}

func (l *CountingLedger) SKU(ctx context.Context, sku stock.SKU) (ledger.SKUState, error) {
	l.note("SKU")
	return l.Ledger.SKU(ctx, sku)
}

func (l *CountingLedger) OrderByKey(ctx context.Context, key keys.ID) (ledger.Order, error) {
	l.note("OrderByKey")
	return l.Ledger.OrderByKey(ctx, key)
}

func (l *CountingLedger) MarkGateSeeded(ctx context.Context, sku stock.SKU, seq int64) error {
	l.note("MarkGateSeeded")
	return l.Ledger.MarkGateSeeded(ctx, sku, seq)
}

func (l *CountingLedger) SKUs(ctx context.Context, after stock.SKU, limit int) ([]ledger.SKUState, error) {
	l.note("SKUs")
	return l.Ledger.SKUs(ctx, after, limit)
}

func (l *CountingLedger) LoadSeats(ctx context.Context, sku stock.SKU, seats []ledger.Seat) (int64, error) {
	l.note("LoadSeats")
	return l.Ledger.LoadSeats(ctx, sku, seats)
}

func (l *CountingLedger) Seats(ctx context.Context, sku stock.SKU, section keys.ID) ([]ledger.Seat, error) {
	l.note("Seats")
	return l.Ledger.Seats(ctx, sku, section)
}

func (l *CountingLedger) SeatFacts(ctx context.Context, sku stock.SKU) ([]ledger.SeatFact, error) {
	l.note("SeatFacts")
	return l.Ledger.SeatFacts(ctx, sku)
}

func (l *CountingLedger) HoldByID(ctx context.Context, id keys.ID) (ledger.Hold, error) {
	l.note("HoldByID")
	return l.Ledger.HoldByID(ctx, id)
}

func (l *CountingLedger) HoldByKey(ctx context.Context, key keys.ID) (ledger.Hold, error) {
	l.note("HoldByKey")
	return l.Ledger.HoldByKey(ctx, key)
}

func (l *CountingLedger) Confirm(ctx context.Context, id, buyer keys.ID, req ledger.Request) (ledger.Order, error) {
	l.note("Confirm")
	return l.Ledger.Confirm(ctx, id, buyer, req)
}

func (l *CountingLedger) RefuseLate(ctx context.Context, r ledger.LateRefusal) (ledger.Recorded, error) {
	l.note("RefuseLate")
	return l.Ledger.RefuseLate(ctx, r)
}

func (l *CountingLedger) AnswerWith(ctx context.Context, req ledger.Request, o ledger.Order) (ledger.Order, error) {
	l.note("AnswerWith")
	return l.Ledger.AnswerWith(ctx, req, o)
}

func (l *CountingLedger) Commit(ctx context.Context, takes []ledger.Take, direct bool) []ledger.TakeResult {
	l.note("Commit")
	return l.Ledger.Commit(ctx, takes, direct)
}

func (l *CountingLedger) ConfirmBatch(ctx context.Context, cs []ledger.HoldRequest) ([]ledger.BatchResult, error) {
	l.note("ConfirmBatch")
	return l.Ledger.ConfirmBatch(ctx, cs)
}

func (l *CountingLedger) CancelBatch(ctx context.Context, cs []ledger.HoldRequest) ([]ledger.HoldResult, error) {
	l.note("CancelBatch")
	return l.Ledger.CancelBatch(ctx, cs)
}

func (l *CountingLedger) Cancel(ctx context.Context, id, buyer keys.ID, req ledger.Request) (ledger.Hold, bool, error) {
	l.note("Cancel")
	return l.Ledger.Cancel(ctx, id, buyer, req)
}

func (l *CountingLedger) ExpireDue(ctx context.Context, limit int) ([]ledger.Hold, error) {
	l.note("ExpireDue")
	return l.Ledger.ExpireDue(ctx, limit)
}

func (l *CountingLedger) Refund(ctx context.Context, id, buyer keys.ID, req ledger.Request) (ledger.Order, bool, error) {
	l.note("Refund")
	return l.Ledger.Refund(ctx, id, buyer, req)
}

func (l *CountingLedger) CartByID(ctx context.Context, id keys.ID) (ledger.Cart, error) {
	l.note("CartByID")
	return l.Ledger.CartByID(ctx, id)
}

func (l *CountingLedger) OrderByID(ctx context.Context, id keys.ID) (ledger.Order, error) {
	l.note("OrderByID")
	return l.Ledger.OrderByID(ctx, id)
}

func (l *CountingLedger) PendingRestores(ctx context.Context, older time.Duration, limit int) ([]ledger.Restore, error) {
	l.note("PendingRestores")
	return l.Ledger.PendingRestores(ctx, older, limit)
}

func (l *CountingLedger) RestoreDurable(ctx context.Context, kind string, id keys.ID) error {
	l.note("RestoreDurable")
	return l.Ledger.RestoreDurable(ctx, kind, id)
}

func (l *CountingLedger) RestoreDone(ctx context.Context, kind string, id keys.ID) error {
	l.note("RestoreDone")
	return l.Ledger.RestoreDone(ctx, kind, id)
}

func (l *CountingLedger) EndSale(ctx context.Context, sku stock.SKU) (ledger.SKUState, error) {
	l.note("EndSale")
	return l.Ledger.EndSale(ctx, sku)
}

func (l *CountingLedger) SetProgram(ctx context.Context, p ledger.Program) error {
	l.note("SetProgram")
	return l.Ledger.SetProgram(ctx, p)
}

func (l *CountingLedger) Program(ctx context.Context, program keys.ID) (ledger.Program, error) {
	l.note("Program")
	return l.Ledger.Program(ctx, program)
}

func (l *CountingLedger) RequestByKey(ctx context.Context, program, scope, key keys.ID) (ledger.Recorded, error) {
	l.note("RequestByKey")
	return l.Ledger.RequestByKey(ctx, program, scope, key)
}

func (l *CountingLedger) CommittedSince(ctx context.Context, sku stock.SKU, after int64) (ledger.Committed, error) {
	l.note("CommittedSince")
	return l.Ledger.CommittedSince(ctx, sku, after)
}

func (l *CountingLedger) AdvanceGate(ctx context.Context, sku stock.SKU) (ledger.SKUState, error) {
	l.note("AdvanceGate")
	return l.Ledger.AdvanceGate(ctx, sku)
}

func (l *CountingLedger) RestoreOwed(ctx context.Context, kind string, id keys.ID) (ledger.Restore, bool, error) {
	l.note("RestoreOwed")
	return l.Ledger.RestoreOwed(ctx, kind, id)
}

// StartCounting is a replica on a PostgreSQL ledger whose every ledger
// call is counted, with SKU settings cached for a minute so their reloads
// do not count.
func StartCounting(t *testing.T) (*Env, *CountingLedger) {
	var counted *CountingLedger
	e := Start(t, Options{Driver: ledger.Postgres, Tune: func(o *app.Options) {
		counted = CountLedger(o)
		o.Sale.SettingsTTL = time.Minute
	}})
	return e, counted
}

func (l *CountingLedger) List(ctx context.Context, orderID, seller keys.ID, q int64, req ledger.Request) (ledger.Listing, error) {
	l.note("List")
	return l.Ledger.List(ctx, orderID, seller, q, req)
}

func (l *CountingLedger) Withdraw(ctx context.Context, listingID, seller keys.ID, expect, epoch int64, req ledger.Request) (ledger.Listing, []ledger.Event, error) {
	l.note("Withdraw")
	return l.Ledger.Withdraw(ctx, listingID, seller, expect, epoch, req)
}

func (l *CountingLedger) ListingByID(ctx context.Context, id keys.ID) (ledger.Listing, error) {
	l.note("ListingByID")
	return l.Ledger.ListingByID(ctx, id)
}

func (l *CountingLedger) SettleDue(ctx context.Context, limit int) ([]ledger.Event, error) {
	l.note("SettleDue")
	return l.Ledger.SettleDue(ctx, limit)
}

func (l *CountingLedger) Settle(ctx context.Context, sku stock.SKU) ([]ledger.Event, error) {
	l.note("Settle")
	return l.Ledger.Settle(ctx, sku)
}

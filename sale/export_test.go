package sale

import (
	"context"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/stock"
)

// TestService is testService for the package's external tests.
var TestService = testService

// TestServiceAt is testServiceAt for the package's external tests.
var TestServiceAt = testServiceAt

// SettleResales settles the sales of listed units as the sweeper does.
func SettleResales(s *Service) { s.settleResales(context.Background()) }

// ExpireHolds expires the holds past their expiry as the sweeper does.
func ExpireHolds(s *Service) { s.expireHolds(context.Background()) }

// OwedBudgetCalls is how many hold budget calls s owes its sweeper.
func OwedBudgetCalls(s *Service) int {
	s.budgetOwed.mu.Lock()
	defer s.budgetOwed.mu.Unlock()
	return len(s.budgetOwed.list)
}

// TwoReplicas is testService twice, on one ledger and one Redis: two
// replicas, each with its own caches; tune applies to both.
func TwoReplicas(t testing.TB, rdb lock.Redis, tune ...func(*Options)) (a, b *Service) {
	var led Ledger
	a, _ = testService(t, rdb, nil, append(tune, func(o *Options) { led = o.Ledger })...)
	b, _ = testService(t, rdb, nil, append(tune, func(o *Options) { o.Ledger = led })...)
	return a, b
}

// ReseedUnderWay starts a reseed of sku on s that holds the SKU's rebuild
// lock until release is called, as the fence's or the drift loop's does
// while it works (it rebuilds nothing).
func ReseedUnderWay(t testing.TB, s *Service, sku stock.SKU) (release func()) {
	t.Helper()
	locked, rel, done := make(chan error, 1), make(chan struct{}), make(chan struct{})
	go func() { // owned by the test: release ends it
		defer close(done)
		_, _, _ = s.reseeds.Do(sku.String(), func() (any, error) {
			lease, err := s.locker.Acquire(context.Background(), keys.Lock(sku.Program, sku.Ticket, lockReseed), time.Second)
			locked <- err
			if err != nil {
				return nil, err
			}
			<-rel
			return nil, lease.Release(context.Background())
		})
	}()
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	return func() { close(rel); <-done }
}

// Changed drains the SKUs s will tell every replica changed at its next
// change notice.
func Changed(s *Service) []stock.SKU { return s.changes.drain() }

// Sweep runs one pass of s's sweeper.
func Sweep(s *Service) { s.sweep(context.Background()) }

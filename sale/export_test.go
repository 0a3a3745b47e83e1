package sale

import (
	"testing"

	"github.com/stockgate/stockgate/lock"
)

// TestService is testService for the package's external tests.
var TestService = testService

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

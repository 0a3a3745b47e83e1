package sale

// TestService is testService for the package's external tests.
var TestService = testService

// OwedBudgetCalls is how many hold budget calls s owes its sweeper.
func OwedBudgetCalls(s *Service) int {
	s.budgetOwed.mu.Lock()
	defer s.budgetOwed.mu.Unlock()
	return len(s.budgetOwed.list)
}

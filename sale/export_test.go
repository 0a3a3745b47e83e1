package sale

// TestService is testService for the package's external tests.
var TestService = testService

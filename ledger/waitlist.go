package ledger

// waitlistTables are the waitlist's tables.
func waitlistTables(driver string) string { return "" }

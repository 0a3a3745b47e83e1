package ledger

// relayTables are the relay's tables (partition leases and cursors, dead
// letters).
func relayTables(driver string) string { return "" }

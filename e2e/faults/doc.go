// Package faults tests a flash sale under faults of Redis: a master killed
// or frozen, all of Redis down, scripts flushed, replies lost, a re-seed
// killed mid-way, the ledger out of reach of a replica; and that every
// write route's answer tells what stands with Redis down. The ledger is
// the oracle and histories are checked for linearizability. The ledger's
// own faults are e2e/failover's; a slow ledger's shedding is e2e/shed's.
package faults

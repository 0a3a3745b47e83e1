// Package faults tests a flash sale under faults of Redis and the ledger: a
// master killed or frozen, all of Redis down, scripts flushed, replies lost,
// the ledger unreachable, a re-seed killed mid-way; the ledger is the oracle
// and histories are checked for linearizability.
package faults

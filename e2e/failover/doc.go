// Package failover tests the ledger's own faults: a PostgreSQL failover
// (planned, and with asynchronous standbys), a slow or black-holed link, a
// primary that takes no writes a while, a COMMIT whose reply is lost or
// cut, a read-only or full SQLite file; and a replica's silent link to one
// Redis master, which no failover ends. Nothing confirmed is lost, nothing
// is sold twice, and a retry with the same key tells what happened.
package failover

// Package shed attacks a slow ledger where the commit lanes shed load at
// their door (503 overloaded, stock given back) and where replays wait on
// an unconfirmed standby, against every older operation, with retries on
// the other replica: each request moves its stock once, and Redis equals
// the ledger after.
package shed

// Package requests tests that a request is its Idempotency-Key (invariant 3)
// through the whole system: retries and reused keys across endpoints,
// replicas, rebuilds, refunds, cancels, per-buyer and program caps, and
// changed settings.
package requests

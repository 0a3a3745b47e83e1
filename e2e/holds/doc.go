// Package holds tests holds through the whole system: expiry across replicas,
// confirm racing expiry, refunds, per-buyer and program caps, group commit,
// and holds while Redis is down or around the gate.
package holds

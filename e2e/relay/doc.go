// Package relay tests the outbox relay through the whole system: every change
// reaching the webhook once, the events API, and the relay's admin API.
package relay

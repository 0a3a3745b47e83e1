// Package purchase tests buying through the whole system: flash sales on one
// and many shards, mixed quantities, bad input, admin changes, recovery after
// crashes and drift, hot SKUs, and shedding under overload.
package purchase

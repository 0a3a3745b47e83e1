// Package carts tests carts through the whole system: carts of several lines
// bought or held all or nothing, racing, on two replicas, with the breaker
// open, and their retries.
package carts

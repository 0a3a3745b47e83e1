// Package pools tests pools and access codes through the whole system: a
// presale closing while buying, pool rules and attacks on them, and codes
// with use limits raced from two replicas.
package pools

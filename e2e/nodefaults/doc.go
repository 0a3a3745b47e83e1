// Package nodefaults tests the four Redis faults of a steady sale over 100
// SKUs (a master killed, all of Redis down, a zombie master, a live reshard):
// what each costs in 503s and how soon every gate serves again.
package nodefaults

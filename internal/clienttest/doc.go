// Package clienttest holds the tests of the Go client (module
// github.com/stockgate/stockgate/client, standard library only) against a
// real gateway, which the client's own module cannot import: every public
// and admin call, retries with the same key, the waiting room, and that
// the client needs nothing beyond the standard library.
package clienttest

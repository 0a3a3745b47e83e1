// Package security tests the limits that protect the service (rate and body
// limits, a separate admin listener) and Redis over TLS with an ACL user.
package security

// Package seats tests reserved seating through the whole system: seat holds
// and best available seats racing through the API, expiry across replicas,
// consistency repair, seats while Redis is down, and seat lines in carts.
package seats

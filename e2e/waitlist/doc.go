// Package waitlist tests the waitlist through the whole system: returned
// stock offered to the head of the line first, offers that expire and pass
// on, and attacks on the offers.
package waitlist

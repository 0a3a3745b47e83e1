// Package resale tests resale through the whole system: listing an
// order's tickets, selling them to other buyers before public stock,
// settling the sellers' orders, withdrawing, and the races between them.
package resale

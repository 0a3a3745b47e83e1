// Package stock holds the vocabulary every other package shares: the SKU
// identity and the outcomes callers branch on with errors.Is. It is a leaf:
// it imports only package keys, for id validation.
package stock

import (
	"errors"
	"fmt"

	"github.com/stockgate/stockgate/keys"
)

// Outcomes. Sold out, limit reached and the like are answers, not failures:
// the breaker must not count them.
var (
	ErrSoldOut    = errors.New("stock: sold out")
	ErrUnknownSKU = errors.New("stock: unknown sku")
	ErrInvalid    = errors.New("stock: invalid request")
	ErrNotSeeded  = errors.New("stock: shard not seeded")
	// ErrFenced: the SKU's Redis shards are closed while a re-seed rebuilds
	// them from the ledger.
	ErrFenced = errors.New("stock: gate fenced for re-seed")
	// ErrLimit: the buyer would hold + own more of the SKU than it allows.
	ErrLimit = errors.New("stock: per-buyer limit reached")
	// ErrSaleEnded: an admin ended the SKU's sale.
	ErrSaleEnded = errors.New("stock: sale ended")
)

// SKU is one (program, ticket) pair: the unit of stock.
type SKU struct {
	Program string `json:"program"`
	Ticket  string `json:"ticket"`
}

// Validate reports ErrInvalid unless both ids are acceptable in keys.
func (s SKU) Validate() error {
	if err := keys.CheckID(s.Program); err != nil {
		return fmt.Errorf("%w: program: %w", ErrInvalid, err)
	}
	if err := keys.CheckID(s.Ticket); err != nil {
		return fmt.Errorf("%w: ticket: %w", ErrInvalid, err)
	}
	return nil
}

func (s SKU) String() string { return s.Program + "/" + s.Ticket }

// Limits that bound what a SKU may be configured with.
const (
	MaxShards      = 256
	MaxPerOrderCap = 1000
	MaxTotal       = 1_000_000_000
)

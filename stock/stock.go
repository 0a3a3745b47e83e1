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

// SKU is one (program, ticket) pair: the unit of stock. Its ids are checked
// once, by ParseSKU (or keys.ParseID), at the edge. A SKU with a zero
// Ticket is the whole program (see Whole): the scope of program-wide caps.
type SKU struct {
	Program keys.ID `json:"program"`
	Ticket  keys.ID `json:"ticket"`
}

// ParseSKU checks both ids; its error wraps ErrInvalid and keys.ErrInvalidID
// and names the one at fault.
func ParseSKU(program, ticket string) (SKU, error) {
	p, err := keys.ParseID(program)
	if err != nil {
		return SKU{}, fmt.Errorf("%w: program: %w", ErrInvalid, err)
	}
	t, err := keys.ParseID(ticket)
	if err != nil {
		return SKU{}, fmt.Errorf("%w: ticket: %w", ErrInvalid, err)
	}
	return SKU{Program: p, Ticket: t}, nil
}

// MustSKU is ParseSKU for SKUs written in the program (tests, tools); it
// panics on bad ids.
func MustSKU(program, ticket string) SKU {
	return SKU{Program: keys.MustID(program), Ticket: keys.MustID(ticket)}
}

// PublicPool is the name a request or an event gives a ticket's public
// stock where a pool is named (the zero pool).
var PublicPool = keys.MustID("public")

// InPool is the SKU whose stock is pool's allocation of s's ticket (s for
// the zero pool: the public one). A pool's stock is a SKU of its own in
// every store (its own row, shards, gate), named by keys.Pooled.
func (s SKU) InPool(pool keys.ID) SKU {
	return SKU{Program: s.Program, Ticket: keys.Pooled(s.Ticket, pool)}
}

// Pool is the pool whose stock s is (zero for the public stock).
func (s SKU) Pool() keys.ID {
	_, pool := s.Ticket.Unpooled()
	return pool
}

// Base is the ticket s is stock of: s without its pool. Per-buyer caps
// count a ticket's units whatever pool they came from.
func (s SKU) Base() SKU {
	ticket, _ := s.Ticket.Unpooled()
	return SKU{Program: s.Program, Ticket: ticket}
}

// ParseStored is ParseSKU for a SKU the service wrote itself (a notice
// from another replica, a stored row): its ticket may be a pool's.
func ParseStored(program, ticket string) (SKU, error) {
	p, err := keys.ParseID(program)
	if err != nil {
		return SKU{}, fmt.Errorf("%w: program: %w", ErrInvalid, err)
	}
	t, err := keys.ParseStored(ticket)
	if err != nil {
		return SKU{}, fmt.Errorf("%w: ticket: %w", ErrInvalid, err)
	}
	return SKU{Program: p, Ticket: t}, nil
}

// IsZero reports a SKU with no program: none at all.
func (s SKU) IsZero() bool { return s.Program.IsZero() }

// Whole is the program the SKU belongs to, as a SKU with no ticket: the
// scope of a per-program cap.
func (s SKU) Whole() SKU { return SKU{Program: s.Program} }

// Compare orders SKUs by program, then ticket: the one order in which
// every transaction locks SKU rows.
func (s SKU) Compare(o SKU) int {
	if c := s.Program.Compare(o.Program); c != 0 {
		return c
	}
	return s.Ticket.Compare(o.Ticket)
}

func (s SKU) String() string { return s.Program.String() + "/" + s.Ticket.String() }

// Limits that bound what a SKU may be configured with.
const (
	MaxShards      = 256
	MaxPerOrderCap = 1000
	MaxTotal       = 1_000_000_000
)

package sale

import (
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// Hold states.
const (
	Held      = ledger.Held
	Confirmed = ledger.Confirmed
	Cancelled = ledger.Cancelled
	Expired   = ledger.Expired
)

// Bounds of a hold's lifetime any SKU allows (each SKU has its own
// maximum within them).
const (
	MinHoldTTL = ledger.MinHoldTTL
	MaxHoldTTL = ledger.MaxHoldTTL
)

// Program is a program's caps across all of its tickets.
type Program = ledger.Program

// Order is a sale.
type Order struct {
	ID         keys.ID
	SKU        stock.SKU
	Buyer      keys.ID
	Quantity   int64
	HoldID     keys.ID // the hold it confirmed, if any
	Seats      []keys.ID
	CreatedAt  time.Time
	RefundedAt time.Time // zero until refunded (or every unit resold: Units.ResoldOut)
	// Units: where its units went besides its buyer (filled in by reads of
	// the order; an order just made has none).
	Units ledger.Units
}

// Told is the order's units as its money is told: standing with its
// buyer, refunded, and what it began with (ledger.Order.Told).
func (o Order) Told() (standing, refunded, began int64) {
	return ledger.Order{Quantity: o.Quantity, RefundedAt: o.RefundedAt, Units: o.Units}.Told()
}

func orderOf(o ledger.Order) Order {
	return Order{ID: o.ID, SKU: o.SKU, Buyer: o.Buyer, Quantity: o.Quantity, HoldID: o.HoldID, Seats: o.SeatIDs,
		CreatedAt: o.CreatedAt, RefundedAt: o.RefundedAt, Units: o.Units}
}

// Hold is stock set aside for a buyer until it is confirmed (an order),
// cancelled or expires.
type Hold struct {
	ID        keys.ID
	SKU       stock.SKU
	Buyer     keys.ID
	Quantity  int64
	State     string // Held, Confirmed, Cancelled or Expired
	ExpiresAt time.Time
	OrderID   keys.ID   // once confirmed
	Seats     []keys.ID // a seat hold's seats
	CreatedAt time.Time
}

// holdOf is h as told to a client at now (the Service's clock).
func holdOf(h ledger.Hold, now time.Time) Hold {
	state := h.State
	if state == ledger.Held && !now.Before(h.ExpiresAt) {
		state = ledger.Expired // past its time; the sweeper will catch up
	}
	return Hold{ID: h.ID, SKU: h.SKU, Buyer: h.Buyer, Quantity: h.Quantity, State: state,
		ExpiresAt: h.ExpiresAt, OrderID: h.OrderID, Seats: h.SeatIDs, CreatedAt: h.CreatedAt}
}

// Result is what a write made: an order or a hold. Replayed is set when
// the request had committed before and this is its stored answer.
type Result struct {
	Order    *Order
	Hold     *Hold
	Cart     *Cart
	Listing  *Listing
	Replayed bool
}

// Listing is tickets of an order listed for resale.
type Listing = ledger.Listing

// result is a as told to a client, its holds' states read at now (the
// Service's clock, called only for an answer with a hold or a cart).
func (a answer) result(now func() time.Time) (Result, error) {
	if a.err != nil {
		return Result{}, a.err
	}
	r := Result{Replayed: a.replayed}
	switch {
	case a.listing != nil:
		r.Listing = a.listing
	case a.cart != nil:
		c := cartOf(*a.cart, now())
		if a.replayed {
			for i := range c.Holds {
				c.Holds[i].State = a.cart.Holds[i].State
			}
		}
		r.Cart = &c
	case a.hold != nil:
		h := holdOf(*a.hold, now())
		if a.replayed {
			// As first told: the hold's expiry since is not what this
			// request answered, and the hold may have been confirmed
			// meanwhile ("expired" said neither, helper-69 #4).
			h.State = a.hold.State
		}
		r.Hold = &h
	case !a.order.ID.IsZero():
		o := orderOf(a.order)
		r.Order = &o
	default:
		return Result{}, ErrUnavailable // an answer with nothing in it: a bug, never a guess
	}
	return r, nil
}

// SKUConfig is what an admin sets on a SKU. Zero hold lifetimes take the
// defaults; Shards 0 means 1.
type SKUConfig struct {
	SKU         stock.SKU
	Total       int64
	Shards      int
	MaxPerOrder int64
	PerBuyer    int64
	HoldTTL     time.Duration
	HoldTTLMax  time.Duration
	// Resale is how listed tickets sell: "first" (before public stock),
	// "alongside" (by their share); "" keeps the SKU's.
	Resale string
}

// SKUState is a SKU's settings and counts, per the ledger.
type SKUState struct {
	SKU stock.SKU
	// Total is the organizer's stock, and Total = Sold + Held + Remain
	// always, as the report's sold + held + open. Listed are the units
	// orders listed for resale and not sold yet: for sale again (in
	// Remain, or in Held while a hold has them), so not in Sold (the
	// units standing with their buyers), though their sellers' orders
	// still have them. Counted in Sold, sold + held passed the total
	// whenever a hold took listed units (helper-110).
	Total, Sold, Held, Remain, Listed int64
	Shards                            int
	MaxPerOrder, PerBuyer             int64
	Version                           int64
	HoldTTL, HoldTTLMax               time.Duration
	Ended                             bool
	Resale                            string
}

func skuStateOf(st ledger.SKUState) SKUState {
	return SKUState{SKU: st.SKU, Total: st.Total - st.Listed, Sold: st.Sold - st.Listed, Held: st.Held, Remain: st.Remaining(),
		Listed: st.Listed, Shards: st.Shards, MaxPerOrder: st.MaxPerOrder, PerBuyer: st.PerBuyer, Version: st.Version,
		HoldTTL: st.HoldTTL, HoldTTLMax: st.HoldTTLMax, Ended: !st.EndedAt.IsZero(), Resale: st.Resale}
}

// Stock is what buyers can still get of a SKU.
type Stock struct {
	SKU       stock.SKU
	Remaining int64
	SoldOut   bool
}

// Seat is one seat of a seat map.
type Seat struct {
	ID, Section keys.ID
	Row         string
	Number      int
}

// SeatState is a seat and its state (free, held or sold).
type SeatState struct {
	Seat
	State string
}

// Section is the seats of one section (or of the whole map) and how many
// are free.
type Section struct {
	SKU     stock.SKU
	Section keys.ID // zero: the whole map
	Free    int
	Seats   []SeatState
}

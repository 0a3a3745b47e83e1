package sale

import (
	"context"
	"errors"
	"fmt"

	"github.com/stockgate/stockgate/stock"
)

// loadStock reads the gate's view (what buyers can still get), or the
// ledger's when Redis is unavailable, unseeded or behind ledger sales.
func (s *Service) loadStock(ctx context.Context, sku stock.SKU) (Stock, error) {
	st, err := s.settings.Get(ctx, sku)
	if err != nil {
		return Stock{}, err
	}
	var left int64
	seeded := false
	// A seated SKU sells seats, not the counted shards: a rebuild seeds
	// them (an admin PUT, a reconcile), and no seat hold or sale moves
	// them after, so read from there its stock froze at the rebuild's
	// count (helper-67). The ledger counts its seats.
	if !st.Seated {
		err = s.redis(ctx, "gate.remaining", func(ctx context.Context) (err error) {
			left, seeded, err = s.gate.Remaining(ctx, sku, st.Shards)
			return err
		})
	}
	if err != nil || !seeded || st.GateStale() {
		fresh, lerr := s.ledger.SKU(ctx, sku)
		if lerr != nil {
			return Stock{}, errors.Join(err, lerr)
		}
		left = fresh.Remaining()
	}
	return Stock{SKU: sku, Remaining: left, SoldOut: left == 0}, nil
}

// Stock is what buyers can still get of a SKU: the gate's view, served
// from memory for StockTTL (a miss loads it once for all readers), or
// sold out while the SKU's sold-out flag is fresh.
func (s *Service) Stock(ctx context.Context, sku stock.SKU) (Stock, error) {
	if s.cache.SoldOutFresh(sku) {
		// What the takes are told, from the same flag: a read flood of a
		// sold-out SKU costs Redis no call per StockTTL either. A seated
		// SKU's flag is not asked (see settingsRules), nor answered here.
		if set, err := s.settings.Get(ctx, sku); err == nil && !set.Seated {
			return Stock{SKU: sku, SoldOut: true}, nil
		}
	}
	st, err := s.stock.Get(ctx, sku)
	switch {
	case errors.Is(err, stock.ErrUnknownSKU) && !sku.Pool().IsZero():
		return Stock{}, ErrUnknownPool
	case errors.Is(err, stock.ErrUnknownSKU):
		return Stock{}, ErrUnknownSKU
	case err != nil:
		return Stock{}, fmt.Errorf("%w: %w", refuse(ErrUnavailable, "stock temporarily unavailable"), err)
	}
	return st, nil
}

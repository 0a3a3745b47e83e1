package shard

import (
	"context"
	"errors"
	"fmt"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/lua"
	"github.com/stockgate/stockgate/stock"
)

// Units given back to a SKU's shards: a deduction's parts restored (once
// per request and holder), and units the ledger took back refilled at
// the gate's epoch.

// Restore lets holder (Request.Holder; AllHolders: every holder) go of
// the parts its attempt of a request took or found (Deduction.Replayed),
// and gives each part back, once, when no holder is left: a part another
// attempt still holds (a copy of the request on another replica, which
// may commit on it) stays taken. Letting go twice is letting go once, so
// a call re-sent after a timeout moves nothing twice. A part whose record
// is gone, or that predates the shard's last seed, is not given back: the
// ledger facts behind the seed already count it. held reports a part
// that stays taken for another attempt holding it: that attempt may yet
// commit the request.
func (s *Store) Restore(ctx context.Context, sku stock.SKU, requestID keys.ID, holder string, parts []Part) (held bool, err error) {
	var errs []error
	for _, p := range parts {
		res, err := s.RestorePart(ctx, sku, requestID, holder, p)
		if err != nil {
			errs = append(errs, err)
		}
		held = held || res.Code == lua.Shared
	}
	return held, errors.Join(errs...)
}

// RestoreResult is one restore's outcome, a lua code and the units moved.
type RestoreResult struct {
	Code     int64
	Restored int64
	Avail    int64
}

// RestorePart is Restore of one part. Refusals (no record, stale,
// already restored, still held) are results, not errors.
func (s *Store) RestorePart(ctx context.Context, sku stock.SKU, requestID keys.ID, holder string, p Part) (RestoreResult, error) {
	if err := present(sku, requestID); err != nil {
		return RestoreResult{}, err
	}
	if holder == "" {
		holder = "_" // Request.Holder's anonymous holder
	}
	if len(holder) > 64 {
		return RestoreResult{}, fmt.Errorf("%w: holder %q", stock.ErrInvalid, holder)
	}
	if p.Shards < 1 || p.Shards > stock.MaxShards || p.Shard < 0 || p.Shard >= p.Shards {
		return RestoreResult{}, fmt.Errorf("%w: shard %d of %d", stock.ErrInvalid, p.Shard, p.Shards)
	}
	k := keys.Shard(sku.Program, sku.Ticket, p.Shard, p.Shards)
	v, err := s.restore.Run(ctx, s.rdb, []string{k.Stock(), k.Deduction(requestID)}, p.Gen, holder).Int64Slice()
	if err != nil {
		return RestoreResult{}, fmt.Errorf("restore shard %d: %w", p.Shard, err)
	}
	if len(v) != 3 {
		return RestoreResult{}, fmt.Errorf("restore shard %d: %w: %v", p.Shard, ErrScript, v)
	}
	res := RestoreResult{Code: v[0], Restored: v[1], Avail: v[2]}
	if res.Code == lua.BadArg {
		return res, fmt.Errorf("restore shard %d: %w", p.Shard, stock.ErrInvalid)
	}
	if res.Restored > 0 && s.empty != nil {
		s.empty.MarkStocked(sku, p.Shards, p.Shard)
	}
	return res, nil
}

// Refill outcomes.
const (
	Refilled = iota // the units are back in the shard
	Counted         // nothing to do: a later rebuild counts them, or they were added before
	NotYet          // the shard is not at the return's epoch yet: try again later
	// Unseeded: the gate is not built and no rebuild is under way (Redis
	// lost it); the seed that builds it reads facts that count the units.
	// Nothing tells another replica that stock is back but the caller (its
	// sold-out flag predates the loss).
	Unseeded
)

// Refill adds q units the ledger took back to the SKU's gate of the given
// epoch (laid out over n shards), once per returnID (a service-derived id
// of the hold or order). It returns Refilled, Counted, NotYet or Unseeded.
func (s *Store) Refill(ctx context.Context, sku stock.SKU, n int, returnID keys.ID, epoch, q int64) (int, error) {
	if err := present(sku, returnID); err != nil {
		return 0, err
	}
	if n < 1 || n > stock.MaxShards || q < 1 || epoch < 0 {
		return 0, fmt.Errorf("%w: refill %d units over %d shards at epoch %d", stock.ErrInvalid, q, n, epoch)
	}
	i := Start(returnID, n)
	k := keys.Shard(sku.Program, sku.Ticket, i, n)
	v, err := s.refill.Run(ctx, s.rdb, []string{k.Stock(), k.Refill(returnID)}, epoch, q, s.recordTTL).Int64Slice()
	if err != nil {
		return 0, fmt.Errorf("refill shard %d: %w", i, err)
	}
	if len(v) != 2 {
		return 0, fmt.Errorf("refill shard %d: %w: %v", i, ErrScript, v)
	}
	switch v[0] {
	case lua.OK:
		if s.empty != nil {
			s.empty.MarkStocked(sku, n, i)
		}
		return Refilled, nil
	case lua.Already, lua.RefillCounted:
		return Counted, nil
	case lua.NotSeeded:
		return Unseeded, nil
	case lua.RefillNotYet:
		return NotYet, nil
	case lua.BadArg:
		return 0, fmt.Errorf("refill shard %d: %w", i, stock.ErrInvalid)
	}
	return 0, fmt.Errorf("refill shard %d: %w: code %d", i, ErrScript, v[0])
}

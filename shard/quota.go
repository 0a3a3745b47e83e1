package shard

import (
	"context"
	"fmt"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/lua"
	"github.com/stockgate/stockgate/stock"
)

// A buyer's counts under a ticket's cap, kept at the gate beside the
// stock: taken with a purchase's key, given back when it does not sell.

// ErrKeyCounted: the request is over the buyer's cap, and its key was
// counted before (under this or another fingerprint): it may be the retry
// of a committed request whose stock came back, or a reuse of its key.
var ErrKeyCounted = fmt.Errorf("%w: the key was counted before", stock.ErrLimit)

// TakeQuota counts q units of a request against the buyer's cap on the SKU
// (or on the whole program when sku.Ticket is zero), once per request id;
// stock.ErrLimit when the cap would be passed (ErrKeyCounted when keyID was
// counted before). fresh reports that this call counted them (false: the
// request was counted before).
func (s *Store) TakeQuota(ctx context.Context, sku stock.SKU, buyer, requestID, keyID keys.ID, q, limit int64) (fresh bool, err error) {
	if sku.IsZero() || buyer.IsZero() || requestID.IsZero() || keyID.IsZero() || q < 1 || limit < 1 {
		return false, fmt.Errorf("%w: quota for %q/%q q %d limit %d", stock.ErrInvalid, buyer, requestID, q, limit)
	}
	v, err := s.quota.Run(ctx, s.rdb, []string{keys.Quota(sku.Program, sku.Ticket, buyer)},
		requestID, q, limit, s.recordTTL, keyID).Int64Slice()
	if err != nil {
		return false, fmt.Errorf("quota: %w", err)
	}
	if len(v) != 2 {
		return false, fmt.Errorf("quota: %w: %v", ErrScript, v)
	}
	switch v[0] {
	case lua.OK:
		return true, nil
	case lua.Already:
		return false, nil
	case lua.Empty:
		return false, stock.ErrLimit
	case lua.QuotaKeyKnown:
		return false, ErrKeyCounted
	}
	return false, fmt.Errorf("quota: %w: code %d", ErrScript, v[0])
}

// ReleaseQuota takes a request's units off the buyer's count, once. keyID
// names the key of a refused request, forgotten with it; the zero ID keeps the key
// known (stock of a committed request came back).
func (s *Store) ReleaseQuota(ctx context.Context, sku stock.SKU, buyer, requestID, keyID keys.ID) error {
	if sku.IsZero() || buyer.IsZero() || requestID.IsZero() {
		return fmt.Errorf("%w: quota release for %q/%q", stock.ErrInvalid, buyer, requestID)
	}
	_, err := s.unquota.Run(ctx, s.rdb, []string{keys.Quota(sku.Program, sku.Ticket, buyer)}, requestID.String(), keyID.String()).Int64Slice()
	if err != nil {
		return fmt.Errorf("quota release: %w", err)
	}
	return nil
}

package shard

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/lua"
	"github.com/stockgate/stockgate/stock"
)

// Budget is one identity's count of held units across a program, for its
// hold budget: a buyer, or a device or payment fingerprint (Device, the
// fingerprint's digest).
type Budget struct {
	Program keys.ID
	Buyer   keys.ID // set for a buyer's count
	Device  string  // set for a fingerprint's count (then Buyer is zero)
}

func (b Budget) keys() ([]string, error) {
	switch {
	case b.Program.IsZero():
	case !b.Buyer.IsZero() && b.Device == "":
		e, u := keys.HoldBudget(b.Program, "b", b.Buyer.String())
		return []string{e, u}, nil
	case b.Buyer.IsZero() && b.Device != "" && len(b.Device) <= 64:
		e, u := keys.HoldBudget(b.Program, "d", b.Device)
		return []string{e, u}, nil
	}
	return nil, fmt.Errorf("%w: hold budget of %q/%q/%q", stock.ErrInvalid, b.Program, b.Buyer, b.Device)
}

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// TakeBudget counts q units held by the hold entry (its gate request id)
// until expires against the identity's budget (0: count only), once per
// entry, noting device as the fingerprint it is also counted under;
// stock.ErrLimit when the budget would be passed. fresh reports that this
// call counted it (false: it was counted before); countedUnder is the
// fingerprint it is counted under (for one counted before: the one noted
// then).
func (s *Store) TakeBudget(ctx context.Context, b Budget, entry keys.ID, q, budget int64, expires time.Time, device string) (fresh bool, countedUnder string, err error) {
	k, err := b.keys()
	if err != nil || entry.IsZero() || q < 1 || budget < 0 {
		return false, "", fmt.Errorf("%w: hold budget take %q of %d under %d", stock.ErrInvalid, entry, q, budget)
	}
	v, err := s.budget.Run(ctx, s.rdb, k, "take", entry.String(), ms(time.Now()), q, budget, ms(expires), device).Slice()
	if err != nil {
		return false, "", fmt.Errorf("hold budget: %w", err)
	}
	switch code, _ := v[0].(int64); code {
	case lua.OK:
		return true, device, nil
	case lua.Already:
		if len(v) > 2 {
			countedUnder, _ = v[2].(string)
		}
		return false, countedUnder, nil
	case lua.Empty:
		return false, "", stock.ErrLimit
	}
	return false, "", fmt.Errorf("hold budget: %w: %v", ErrScript, v)
}

// EndBudget takes the hold entry off the identity's count, once, and
// returns the fingerprint it was also counted under ("" for none, or when
// it was not counted: never, ended before, or expired).
func (s *Store) EndBudget(ctx context.Context, b Budget, entry keys.ID) (device string, err error) {
	return s.budgetEntry(ctx, b, entry, "end", time.Time{})
}

// ExtendBudget moves the hold entry's expiry (an extended hold), and
// returns the fingerprint it was also counted under, as EndBudget.
func (s *Store) ExtendBudget(ctx context.Context, b Budget, entry keys.ID, expires time.Time) (device string, err error) {
	return s.budgetEntry(ctx, b, entry, "extend", expires)
}

func (s *Store) budgetEntry(ctx context.Context, b Budget, entry keys.ID, op string, expires time.Time) (string, error) {
	k, err := b.keys()
	if err != nil || entry.IsZero() {
		return "", fmt.Errorf("%w: hold budget %s of %q", stock.ErrInvalid, op, entry)
	}
	v, err := s.budget.Run(ctx, s.rdb, k, op, entry.String(), ms(time.Now()), ms(expires)).Slice()
	if err != nil {
		return "", fmt.Errorf("hold budget: %w", err)
	}
	code, _ := v[0].(int64)
	switch code {
	case lua.OK:
		device, _ := v[1].(string)
		return device, nil
	case lua.NoRecord:
		return "", nil
	}
	return "", fmt.Errorf("hold budget: %w: %v", ErrScript, v)
}

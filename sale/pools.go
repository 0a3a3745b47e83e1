package sale

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/access"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// Pools (allocations): a ticket's stock split into named pools, each sold
// in its own window to those its access rule lets in, each a SKU of its
// own at the gate and in the ledger (stock.SKU.InPool). The public pool
// is the ticket's own stock. At a pool's closing time the sweeper moves
// what it has left into the pool its rule names (the public one unless
// told otherwise), behind the pool's fence, and rebuilds the receiving
// gate at once, so the moved units are on sale there within the sweep.

// PublicPool is the name a request may give the public pool (or give none).
var PublicPool = stock.PublicPool

// Access rules of a pool, as admins name them (package access decides them).
const (
	AccessOpen    = "open"
	AccessCode    = access.Code
	AccessChannel = access.Channel
)

// PoolSpec is what an admin sets on a pool of a ticket.
type PoolSpec struct {
	SKU       stock.SKU // the ticket
	Pool      keys.ID
	Allotment int64 // units taken from (or given back to) the public pool
	Shards    int   // 0: 1
	OpensAt   time.Time
	ClosesAt  time.Time
	Access    string // AccessOpen (""), AccessCode or AccessChannel
	// Channel is the credential a channel pool's requests carry; it is
	// stored hashed.
	Channel string
	Into    keys.ID // the pool its unsold stock moves into at the close; zero: public
}

// PoolState is one pool of a ticket as the ledger has it.
type PoolState struct {
	Pool                      keys.ID // PublicPool for the public stock
	Total, Sold, Held, Remain int64
	Shards                    int
	OpensAt, ClosesAt         time.Time
	ClosedAt                  time.Time
	Access                    string
	Into                      keys.ID
}

func poolStateOf(st ledger.SKUState) PoolState {
	// The listed units are the public pool's, as SKUState counts them.
	p := PoolState{Pool: st.Pool(), Total: st.Total - st.Listed, Sold: st.Sold - st.Listed, Held: st.Held, Remain: st.Remaining(), Shards: st.Shards,
		OpensAt: st.Rule.OpensAt, ClosesAt: st.Rule.ClosesAt, ClosedAt: st.Rule.ClosedAt, Access: st.Rule.Access, Into: st.Rule.Into}
	if p.Pool.IsZero() {
		p.Pool = PublicPool
	}
	if p.Access == ledger.AccessOpen {
		p.Access = AccessOpen
	}
	if p.Into.IsZero() && !st.Pool().IsZero() {
		p.Into = PublicPool
	}
	return p
}

// PoolSKU is the SKU of pool's stock of a ticket: the ticket's own (the
// public pool) for a zero pool or "public".
func PoolSKU(sku stock.SKU, pool keys.ID) stock.SKU { return poolOf(sku, pool) }

// poolOf is PoolSKU.
func poolOf(sku stock.SKU, pool keys.ID) stock.SKU {
	if pool == PublicPool {
		pool = keys.ID{}
	}
	return sku.InPool(pool)
}

// Access is what a request presents to a pool's rule.
type Access struct {
	Pool    keys.ID // zero or PublicPool: the public pool
	Channel string  // a channel pool's credential
	Code    string  // an access code
}

// presented is what the request presents to its pool's rule.
func (a Access) presented() access.Presented {
	return access.Presented{Channel: a.Channel, Code: a.Code}
}

// fields adds what the request presents to the fields of its fingerprint
// (access.Presented.Fields).
func (a Access) fields(fields ...string) []string { return a.presented().Fields(fields...) }

// admit checks a request against its pool's window and rule (settings
// st of the pool's SKU), at now. The public pool has none.
func (s *Service) admit(st ledger.SKUState, a Access, now time.Time) error {
	if st.Pool().IsZero() {
		return nil
	}
	var r *access.Refusal
	if err := access.Check(st.Rule, a.presented(), now); !errors.As(err, &r) {
		return err
	}
	s.metrics.poolRefusals.WithLabelValues(r.Reason).Inc()
	switch {
	case errors.Is(r, access.ErrClosed):
		return ErrPoolClosed
	case errors.Is(r, access.ErrNotOpen):
		return refuse(ErrPoolNotOpen, r.Detail)
	default:
		return refuse(ErrPoolDenied, r.Detail)
	}
}

func (p PoolSpec) ledger() (ledger.PoolConfig, error) {
	if p.SKU.IsZero() || p.Pool.IsZero() || p.Pool == PublicPool || !p.SKU.Pool().IsZero() {
		return ledger.PoolConfig{}, refuse(ErrInvalid, "a pool is named by a ticket and a pool id other than public")
	}
	c := ledger.PoolConfig{SKU: p.SKU.InPool(p.Pool), Allotment: p.Allotment, Shards: max(p.Shards, 1),
		Rule: ledger.PoolRule{OpensAt: p.OpensAt, ClosesAt: p.ClosesAt, Access: p.Access, Into: p.Into}}
	switch p.Access {
	case AccessOpen:
		c.Rule.Access = ledger.AccessOpen
	case AccessChannel:
		if err := access.CheckChannel(p.Channel); err != nil {
			return c, refuse(ErrInvalid, err.Error())
		}
		c.Rule.Secret = access.SecretOf(p.Channel)
	}
	if p.Access != AccessChannel && p.Channel != "" {
		return c, refuse(ErrInvalid, "only a channel pool has a channel credential")
	}
	if c.Rule.Into == PublicPool {
		c.Rule.Into = keys.ID{}
	}
	if err := c.Validate(); err != nil {
		return c, refuse(ErrInvalid, err.Error())
	}
	return c, nil
}

// PutPool creates a pool of a ticket or changes it: its allotment moves
// between the public pool and it, behind both gates' fences (the public
// one first, as every two-gate change takes them), so neither gate ever
// shows more than the ledger allows. A new pool has no gate until the
// change has made it; a refused change makes no pool.
func (s *Service) PutPool(ctx context.Context, p PoolSpec) (PoolState, error) {
	c, err := p.ledger()
	if err != nil {
		return PoolState{}, err
	}
	ctx, cancel := s.detach(ctx)
	defer cancel()
	base, pool := p.SKU, c.SKU
	if !c.Rule.Into.IsZero() {
		if _, err := s.ledger.SKU(ctx, base.InPool(c.Rule.Into)); errors.Is(err, stock.ErrUnknownSKU) {
			return PoolState{}, refuse(ErrInvalid, "into names no pool of this ticket")
		}
	}
	switch b, err := s.ledger.SKU(ctx, base); {
	case errors.Is(err, stock.ErrUnknownSKU):
		return PoolState{}, ErrUnknownSKU
	case err != nil:
		s.log.ErrorContext(ctx, "read ticket", "sku", base.String(), "err", err)
		return PoolState{}, refuse(ErrUnavailable, "ledger unavailable")
	case b.Seated:
		return PoolState{}, refuse(ErrSeated, "a seated ticket sells its seats; it has no pools")
	}
	var st ledger.SKUState
	var putErr error
	put := func(ctx context.Context) error {
		st, putErr = s.ledger.PutPool(ctx, c)
		return putErr
	}
	was, err := s.ledger.SKU(ctx, pool)
	if c.Create = errors.Is(err, stock.ErrUnknownSKU); err != nil && !c.Create {
		s.log.ErrorContext(ctx, "read pool", "sku", pool.String(), "err", err)
		return PoolState{}, refuse(ErrUnavailable, "ledger unavailable")
	}
	// A closing time already past would close the pool as it is made (or
	// changed) and move its units on for good; a PUT that sends again the
	// time it has (to the millisecond the ledger keeps) is its settings
	// re-sent (helper-69 #3).
	if cl := c.Rule.ClosesAt; !cl.IsZero() && !cl.After(time.Now()) && (c.Create || was.Rule.ClosedAt.IsZero() && cl.UnixMilli() != was.Rule.ClosesAt.UnixMilli()) {
		return PoolState{}, refuse(ErrInvalid, "closes_at is in the past; to close a pool now, POST its /close")
	}
	if !c.Create && poolIs(was, c) {
		// Set so already (this PUT's retry, its reply lost, or the same
		// PUT on another replica): nothing to move, no gate to close.
		// Closing them again, with a master out, said "unchanged" of a
		// change the first had made (helper-77 #4).
		return poolStateOf(was), nil
	}
	if c.Create {
		// A new pool is made by the change's own transaction, so a refused
		// change makes none. It has no gate to fence yet; its row says the
		// gate is stale until it is built, after the change.
		_, err = s.rebuildWith(ctx, base, reasonAdmin, true, s.opts.ReseedWait, put)
		if errors.Is(putErr, ledger.ErrPoolExists) {
			c.Create, putErr = false, nil // made meanwhile by another change: change it as it is
		} else if err == nil {
			_, err = s.rebuild(ctx, pool, reasonAdmin, true, s.opts.ReseedWait)
		}
	}
	if !c.Create {
		_, err = s.rebuildWith(ctx, base, reasonAdmin, true, s.opts.ReseedWait, func(ctx context.Context) error {
			_, err := s.rebuildWith(ctx, pool, reasonAdmin, true, s.opts.ReseedWait, put)
			if err != nil && putErr == nil && !st.Program.IsZero() {
				// The pool's change was made and its rebuild failed after:
				// the public gate must not reopen as it was (helper-92 #1).
				return fmt.Errorf("%w: %w", errChangeMade, err)
			}
			return err
		})
	}
	for _, sku := range []stock.SKU{base, pool} {
		s.forgetClosed(sku)
		s.notifyRestocked(ctx, sku)
	}
	return s.poolPutAnswer(ctx, pool, st, putErr, err)
}

// poolPutAnswer is PutPool's answer: the ledger's refusal (putErr), the
// gates not closed (nothing ran), or the pool as committed, its gates
// rebuilt later if err says they were not.
func (s *Service) poolPutAnswer(ctx context.Context, pool stock.SKU, st ledger.SKUState, putErr, err error) (PoolState, error) {
	switch {
	case errors.Is(putErr, ledger.ErrPoolClosed):
		return PoolState{}, ErrPoolClosed
	case errors.Is(putErr, stock.ErrSaleEnded):
		return PoolState{}, ErrSaleEnded
	case errors.Is(putErr, stock.ErrInvalid):
		return PoolState{}, refuse(ErrBelowCommitted, putErr.Error())
	case putErr != nil:
		s.log.ErrorContext(ctx, "put pool", "sku", pool.String(), "err", putErr)
		return PoolState{}, refuse(ErrUnavailable, "ledger unavailable")
	case st.Program.IsZero():
		s.log.ErrorContext(ctx, "put pool: gates not closed", "sku", pool.String(), "err", err)
		return PoolState{}, ErrGateNotClosed
	case err != nil:
		// Committed: the change stands and the gates are rebuilt before
		// they serve (see PutSKU).
		s.log.WarnContext(ctx, "put pool: committed; gate rebuilt later", "sku", pool.String(), "err", err)
	}
	return poolStateOf(st), nil
}

// ticketState is a ticket as a whole: its public row's settings, with the
// stock of every pool added up (an admin's total is the ticket's).
func (s *Service) ticketState(ctx context.Context, st ledger.SKUState) (SKUState, error) {
	if !st.Pool().IsZero() {
		return skuStateOf(st), nil
	}
	sts, err := s.ledger.Pools(ctx, st.SKU)
	if err != nil {
		return skuStateOf(st), err
	}
	return wholeOf(st, sts[1:]), nil
}

// wholeOf is a ticket's state: its public row st with its pools' counts.
func wholeOf(st ledger.SKUState, pools []ledger.SKUState) SKUState {
	out := skuStateOf(st)
	for _, p := range pools {
		out.Total, out.Sold, out.Held, out.Remain = out.Total+p.Total, out.Sold+p.Sold, out.Held+p.Held, out.Remain+p.Remaining()
	}
	return out
}

// forgetPools makes every replica read a ticket's pools' settings again
// (they follow the ticket's).
func (s *Service) forgetPools(ctx context.Context, sku stock.SKU) {
	sts, err := s.ledger.Pools(ctx, sku)
	if err != nil {
		return // their settings' TTL bounds the wait
	}
	for _, st := range sts {
		s.forgetClosed(st.SKU)
		s.notifyRestocked(ctx, st.SKU)
	}
}

// endPools ends every pool of a ticket whose sale ended, each behind its
// fence, as EndSale ends the ticket's public stock.
func (s *Service) endPools(ctx context.Context, sku stock.SKU) error {
	sts, err := s.ledger.Pools(ctx, sku)
	if err != nil {
		return err
	}
	for _, st := range sts[1:] {
		if !st.EndedAt.IsZero() {
			continue
		}
		if _, err := s.rebuildWith(ctx, st.SKU, reasonAdmin, true, s.opts.ReseedWait, func(ctx context.Context) error {
			_, err := s.ledger.EndSale(ctx, st.SKU)
			return err
		}); err != nil {
			return err
		}
		s.forgetClosed(st.SKU)
		s.notifyRestocked(ctx, st.SKU)
	}
	return nil
}

// Pools lists a ticket's pools, the public one first.
func (s *Service) Pools(ctx context.Context, sku stock.SKU) ([]PoolState, error) {
	sts, err := s.ledger.Pools(ctx, sku)
	switch {
	case errors.Is(err, stock.ErrUnknownSKU):
		return nil, ErrUnknownSKU
	case err != nil:
		return nil, fmt.Errorf("%w: %w", refuse(ErrUnavailable, "ledger unavailable"), err)
	}
	out := make([]PoolState, 0, len(sts))
	for _, st := range sts {
		out = append(out, poolStateOf(st))
	}
	return out, nil
}

// ClosePool closes a pool now (before its closing time, or at it): what
// it has left moves on as at its closing time. Closing a closed pool again
// moves what came back to it since, if anything.
func (s *Service) ClosePool(ctx context.Context, sku stock.SKU, pool keys.ID) (PoolState, error) {
	if pool.IsZero() || pool == PublicPool || !sku.Pool().IsZero() {
		return PoolState{}, refuse(ErrInvalid, "a pool is named by a ticket and a pool id other than public")
	}
	ctx, cancel := s.detach(ctx)
	defer cancel()
	p := sku.InPool(pool)
	if _, err := s.ledger.SKU(ctx, p); errors.Is(err, stock.ErrUnknownSKU) {
		return PoolState{}, ErrUnknownPool
	}
	if err := s.closePool(ctx, p, false); err != nil {
		s.log.ErrorContext(ctx, "close pool", "sku", p.String(), "err", err)
		return PoolState{}, refuse(ErrUnavailable, "could not close the pool; repeat the request")
	}
	st, err := s.ledger.SKU(ctx, p)
	if err != nil {
		return PoolState{}, refuse(ErrUnavailable, "ledger unavailable")
	}
	return poolStateOf(st), nil
}

// poolIs reports whether pool row st, open and selling, is set as c
// would set it: its allotment, shards and rule, times to the millisecond
// the ledger keeps.
func poolIs(st ledger.SKUState, c ledger.PoolConfig) bool {
	r, w := st.Rule, c.Rule
	return st.EndedAt.IsZero() && r.ClosedAt.IsZero() && st.Total == c.Allotment && st.Shards == c.Shards &&
		r.OpensAt.UnixMilli() == w.OpensAt.UnixMilli() && r.ClosesAt.UnixMilli() == w.ClosesAt.UnixMilli() &&
		r.OpensAt.IsZero() == w.OpensAt.IsZero() && r.ClosesAt.IsZero() == w.ClosesAt.IsZero() &&
		r.Access == w.Access && r.Secret == w.Secret && r.Into == w.Into
}

// closePool moves what a pool has left on, behind its fence (a purchase
// admitted by its gate before commits before the move, or is refused as
// stale and then finds the pool closed), then rebuilds the receiving gate
// and tells every replica it has stock again. due: the sweeper's close
// at the closing time, which the ledger skips for a pool whose time was
// moved on since it was read due.
func (s *Service) closePool(ctx context.Context, pool stock.SKU, due bool) error {
	var moved int64
	var into stock.SKU
	_, err := s.rebuildWith(ctx, pool, reasonAdmin, true, s.opts.ReseedWait, func(ctx context.Context) (err error) {
		moved, into, err = s.ledger.ClosePool(ctx, pool, due)
		return err
	})
	s.forgetClosed(pool)
	if into.IsZero() {
		return err // the move never ran
	}
	s.notifyRestocked(ctx, pool) // every replica reads the pool's closed rule again
	if moved > 0 {
		s.metrics.poolMoved.Add(float64(moved))
		// The receiving gate was marked stale by the move: rebuild it now
		// rather than at its next request.
		if rerr := s.reseed(ctx, into, reasonAdmin, true); rerr != nil {
			s.log.WarnContext(ctx, "rebuild after a pool close; the next request or drift check will", "sku", into.String(), "err", rerr)
		}
		s.forgetClosed(into)
		s.notifyRestocked(ctx, into)
	}
	return err
}

// closeDuePools closes every pool whose closing time has passed and that
// has stock to move on. Any number of replicas run it: the fence lets one
// move at a time, and the ledger moves what is left, once.
func (s *Service) closeDuePools(ctx context.Context) {
	due, err := s.ledger.PoolsDue(ctx, 100)
	if err != nil {
		// Those that were read still close (a ledger over several
		// primaries answers what the reachable ones hold).
		s.log.WarnContext(ctx, "pools due", "err", err)
	}
	for _, p := range due {
		if err := s.closePool(ctx, p, true); err != nil {
			s.log.WarnContext(ctx, "close pool; the next sweep retries", "sku", p.String(), "err", err)
		}
	}
}

package sale

import (
	"context"
	"errors"
	"fmt"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// errOverCap: one request asks for more than the program's per-buyer cap
// (no count needed to refuse it).
var errOverCap = fmt.Errorf("%w: one request over the cap", stock.ErrLimit)

// errCodeUsedUp: the request's access code has no uses left at the gate.
var errCodeUsedUp = errors.New("sale: access code used up at the gate")

// quotaScope is one count a request makes at the gate: a buyer's units of
// a ticket or a program, or a code's uses (its "buyer" the code).
type quotaScope struct {
	sku   stock.SKU
	buyer keys.ID
}

// quotaTicket is a request's counts against its buyer's caps at the gate
// (the SKU's, the program's) and its access code's uses; release gives
// them back when the request did not end in a commit.
type quotaTicket struct {
	s        *Service
	scopes   []quotaScope
	fresh    []quotaScope // the scopes this attempt counted (not counted before)
	key      keys.ID      // the request's gate id
	keyID    keys.ID      // the client key's id (see quota.lua); zero: keep it known
	released bool
}

// release gives back the request's counts: it did not commit.
func (q *quotaTicket) release(ctx context.Context) {
	if q == nil || q.released {
		return
	}
	q.released = true
	q.s.releaseQuota(ctx, q.scopes, q.key, q.keyID)
}

// keepKey makes release leave the key's mark: the request may still commit.
func (q *quotaTicket) keepKey() {
	if q != nil {
		q.keyID = keys.ID{}
	}
}

// replayed gives back the counts this attempt made for a request that had
// committed before: its own counts stand (or were given back with its
// stock, by a refund or a cancel), so a count made again is one too many.
func (q *quotaTicket) replayed(ctx context.Context) {
	if q == nil || q.released || len(q.fresh) == 0 {
		return
	}
	q.released = true
	q.s.releaseQuota(ctx, q.fresh, q.key, keys.ID{}) // the key stays known: it committed
}

func (s *Service) releaseQuota(ctx context.Context, scopes []quotaScope, key, keyID keys.ID) {
	ctx = context.WithoutCancel(ctx) // as giveBack: a give-back outlives the request's budget
	for _, sc := range scopes {
		r := quotaRelease{scope: sc, key: key, keyID: keyID}
		if err := s.giveQuota(ctx, r); err != nil {
			s.log.WarnContext(ctx, "release quota; the sweeper tries again", "scope", sc.sku.String(), "err", err)
			s.quotaOwed.add(r)
		}
	}
}

func (s *Service) giveQuota(ctx context.Context, r quotaRelease) error {
	return s.redis(ctx, "gate.release_quota", func(ctx context.Context) error {
		return s.gate.ReleaseQuota(ctx, r.scope.sku, r.scope.buyer, r.key, r.keyID)
	})
}

// quotaRelease is one count to give back at the gate (releaseQuota's).
type quotaRelease struct {
	scope      quotaScope
	key, keyID keys.ID
}

// releaseOwedQuota gives back the counts whose release failed (see owed).
// A late release is safe: unquota.lua takes a request's units off once,
// so it can only under-count a request that was counted again and
// committed meanwhile, which the ledger's check at commit covers.
func (s *Service) releaseOwedQuota(ctx context.Context, slow *int) {
	if dropped := s.quotaOwed.retry(ctx, slow, s.giveQuota); dropped > 0 {
		s.log.WarnContext(ctx, "quota releases dropped; their counts stay until the buyer's count lapses", "dropped", dropped)
	}
}

// takeQuota counts the request against the buyer's caps in Redis (the
// SKU's, then the program's) and against its access code's uses, so a
// flood from one buyer, or for one code, is turned away there with no
// ledger call per request. The ledger checks all of them again when it
// commits. No cap and no code, no call.
func (s *Service) takeQuota(ctx context.Context, w want, st ledger.SKUState) (*quotaTicket, error) {
	program, err := s.programs.Get(ctx, w.sku.Program)
	if err != nil {
		return nil, err
	}
	programCap := program.PerBuyer
	if programCap > 0 && w.q > programCap {
		return nil, errOverCap
	}
	t := &quotaTicket{s: s, key: w.req.gateID(), keyID: w.req.keyID()}
	counts := []struct {
		scope quotaScope
		cap   int64
		q     int64
	}{{quotaScope{w.sku.Base(), w.buyer}, st.PerBuyer, w.q}, {quotaScope{stock.SKU{Program: w.sku.Program}, w.buyer}, programCap, w.q}}
	if w.code != nil {
		counts = append(counts, struct {
			scope quotaScope
			cap   int64
			q     int64
		}{quotaScope{codeScope(w.sku), w.code.id}, w.code.max, 1})
	}
	for _, c := range counts {
		if c.cap == 0 {
			continue
		}
		var fresh bool
		err := s.redis(ctx, "gate.take_quota", func(ctx context.Context) (err error) {
			fresh, err = s.gate.TakeQuota(ctx, c.scope.sku, c.scope.buyer, w.req.gateID(), w.req.keyID(), c.q, c.cap)
			return err
		})
		if err != nil {
			// Only the counts this attempt made: a count found (another
			// attempt of this request, in flight or committed) is not ours.
			if errors.Is(err, stock.ErrLimit) && len(t.scopes) > len(t.fresh) {
				// A scope counted this request before: another cap refuses
				// what may be a retry of a committed request (a cap lowered
				// since). Look it up, as for a key counted before.
				err = shard.ErrKeyCounted
			}
			if errors.Is(err, shard.ErrKeyCounted) {
				t.keyID = keys.ID{} // the key may be a committed request's: keep its mark
			}
			if !isOutcome(err) && !notRun(err) {
				// Sent, then no answer: the count may stand. Released by the
				// request id, it goes if it was made (and only under-counts
				// if another attempt of this request made it and commits).
				t.fresh = append(t.fresh, c.scope)
			}
			t.scopes = t.fresh
			t.release(ctx)
			if w.code != nil && c.scope == (quotaScope{codeScope(w.sku), w.code.id}) &&
				(errors.Is(err, stock.ErrLimit) || errors.Is(err, shard.ErrKeyCounted)) {
				return nil, errCodeUsedUp
			}
			return nil, err
		}
		t.scopes = append(t.scopes, c.scope)
		if fresh {
			t.fresh = append(t.fresh, c.scope)
		}
	}
	if len(t.scopes) == 0 {
		return nil, nil
	}
	return t, nil
}

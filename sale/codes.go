package sale

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/stockgate/stockgate/access"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// Access codes: a code pool sells to buyers presenting one of its codes.
// A code is stored hashed (with its pool, so one text in two pools is two
// codes) with a use limit and, optionally, the one buyer who may use it.
// Each request that commits is one use. Uses are counted at the gate, as
// a buyer's cap is (the code is the "buyer" of a count of its own, so
// losers of a race for a code are turned away in Redis), and again in the
// ledger, which counts the orders and holds standing on the code: a
// refund, a cancel or an expiry gives the use back in both.

// Bounds of access codes.
const (
	MinCodeLen      = access.MinCodeLen
	MaxCodeLen      = access.MaxCodeLen
	MaxCodesPerCall = ledger.MaxCodesPerCall
	MaxCodeUses     = access.MaxCodeUses
)

// CodeSpec is one code an admin adds to a pool.
type CodeSpec struct {
	Code    string
	MaxUses int64
	Buyer   keys.ID // zero: anyone holding it
}

// codeUse is what a request's code is at the gate: its hash (the ledger's
// name for it), its id at the gate and its use limit.
type codeUse struct {
	hash string
	id   keys.ID
	max  int64
}

// CodeHash names a code of a pool (access.CodeHash): what the ledger
// stores of it.
func CodeHash(pool stock.SKU, code string) string { return access.CodeHash(pool, code) }

// codeKey is a code's entry in the codes cache.
type codeKey struct {
	pool stock.SKU
	hash string
}

// PutCodes adds access codes to a code pool of a ticket: the given ones,
// and generate new random ones with maxUses each, returned once (only
// their hashes are kept). It answers how many were new.
func (s *Service) PutCodes(ctx context.Context, sku stock.SKU, pool keys.ID, codes []CodeSpec, generate int, maxUses int64) (added int, generated []string, err error) {
	if pool.IsZero() || pool == PublicPool || !sku.Pool().IsZero() {
		return 0, nil, refuse(ErrInvalid, "codes belong to a pool other than public")
	}
	// generate is bounded before it is added to: a huge count overflowed
	// the sum into a negative one that passed, and make panicked.
	if generate < 0 || generate > MaxCodesPerCall-len(codes) || len(codes)+generate == 0 {
		return 0, nil, refuse(ErrInvalid, fmt.Sprintf("1 to %d codes per call", MaxCodesPerCall))
	}
	if generate > 0 && access.CheckUses(maxUses) != nil {
		return 0, nil, refuse(ErrInvalid, fmt.Sprintf("max_uses of generated codes in 1..%d", MaxCodeUses))
	}
	p := sku.InPool(pool)
	st, err := s.ledger.SKU(ctx, p)
	switch {
	case errors.Is(err, stock.ErrUnknownSKU):
		return 0, nil, ErrUnknownPool
	case err != nil:
		return 0, nil, refuse(ErrUnavailable, "ledger unavailable")
	case st.Rule.Access != ledger.AccessCode:
		return 0, nil, refuse(ErrInvalid, "the pool's access rule is not code")
	}
	rows := make([]ledger.Code, 0, len(codes)+generate)
	for _, c := range codes {
		if err := cmp.Or(access.CheckCode(c.Code), access.CheckUses(c.MaxUses)); err != nil {
			return 0, nil, refuse(ErrInvalid, err.Error())
		}
		rows = append(rows, ledger.Code{Hash: CodeHash(p, c.Code), MaxUses: c.MaxUses, Buyer: c.Buyer})
	}
	for range generate {
		c := rand.Text() // 26 base32 characters: 130 random bits
		generated = append(generated, c)
		rows = append(rows, ledger.Code{Hash: CodeHash(p, c), MaxUses: maxUses})
	}
	added, err = s.ledger.PutCodes(ctx, p, rows)
	if errors.Is(err, ledger.ErrNotCommitted) {
		// Known not written (the program moving, a connection refused
		// before the write): nothing to tell but a retry.
		s.log.WarnContext(ctx, "put codes", "sku", p.String(), "err", err)
		return 0, nil, refuse(ErrUnavailable, "ledger unavailable: no code was added; send the request again")
	}
	if err != nil {
		// The route takes no key, and generated codes are never kept in
		// plain text: no retry can tell whether they were added. Say what
		// a retry does tell, and that an unknown generated code is safe.
		s.log.ErrorContext(ctx, "put codes", "sku", p.String(), "err", err)
		return 0, nil, refuse(ErrUnavailable, "ledger unavailable: the codes may or may not have been added. "+
			"Given codes sent again are told by added (0 for those already there); generated ones are never kept in plain text, "+
			"so generate new ones: a code nobody was given admits no one")
	}
	for _, r := range rows {
		s.codes.Invalidate(codeKey{p, r.Hash}) // a code refused as unknown a moment ago is known now
	}
	return added, generated, nil
}

// loadCode reads a code for the codes cache; an unknown one is cached as
// a zero limit (and read again before it is refused: codeFor).
func (s *Service) loadCode(ctx context.Context, k codeKey) (ledger.Code, error) {
	c, err := s.ledger.CodeOf(ctx, k.pool, k.hash)
	if errors.Is(err, ledger.ErrNotFound) {
		return ledger.Code{Hash: k.hash}, nil
	}
	return c, err
}

// codeFor checks the code a request presents to its code pool and
// returns it as the gate counts it.
func (s *Service) codeFor(ctx context.Context, w want) (*codeUse, error) {
	if access.CheckCode(w.access.Code) != nil {
		s.metrics.poolRefusals.WithLabelValues("code-invalid").Inc()
		return nil, ErrCodeInvalid
	}
	hash := CodeHash(w.sku, w.access.Code)
	k := codeKey{w.sku, hash}
	c, err := s.codes.Get(ctx, k)
	if err != nil {
		return nil, err
	}
	if c.MaxUses == 0 {
		// Unknown as cached: maybe only here. Another replica's PutCodes
		// drops only its own entries, and a refreshing cache serves a
		// miss once more past its TTL, so a code added there a moment
		// after this replica was asked for it was refused here as
		// invalid, a wrong guess counted against the buyer's network
		// (helper-94 #2). Asked again, a guess costs two point reads,
		// and concurrent requests with one unknown code share one
		// (helper-95 B2); a client's wrong guesses are limited at the
		// door, and a random guess missed the cache anyway.
		v, err, _ := s.codeMisses.Do(k.pool.String()+"\x00"+k.hash, func() (any, error) {
			// Shared: not cut short by the first asker's end.
			ctx, cancel := s.detach(ctx)
			defer cancel()
			return s.loadCode(ctx, k)
		})
		if err != nil {
			return nil, err
		}
		c = v.(ledger.Code)
		if c.MaxUses > 0 {
			s.codes.Invalidate(k)
		}
	}
	if !access.CodeLets(c.MaxUses, c.Buyer, w.buyer) {
		s.metrics.poolRefusals.WithLabelValues("code-invalid").Inc()
		return nil, ErrCodeInvalid
	}
	return &codeUse{hash: hash, id: keys.MustID(hash), max: c.MaxUses}, nil
}

// codeScope is the scope of a pool's code use counts at the gate.
func codeScope(pool stock.SKU) stock.SKU {
	return stock.SKU{Program: pool.Program, Ticket: keys.CodeScope(pool.Ticket)}
}

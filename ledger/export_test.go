package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// SchemaDigest is the digest the builds from before versioned migrations
// look for in ledger_schema.
var SchemaDigest = schemaDigest

// LatestStep is this build's newest schema step.
var LatestStep = thisBuild.latest()

// FutureStep is a migration a later build would ship, for the tests of
// rollouts and rollbacks across schema changes: SQL run in its transaction.
type FutureStep struct {
	Version     int64
	OldestBuild int64 // > 0: a contract step
	Up, Down    string
}

// OpenBuild opens the ledger as a build whose migrations are this build's
// followed by steps, and whose code runs on schemas from minimum up.
func OpenBuild(ctx context.Context, opts Options, minimum int64, steps ...FutureStep) (*Ledger, error) {
	b := schemaSteps{steps: append([]migration(nil), thisBuild.steps...), minimum: minimum}
	for _, s := range steps {
		m := migration{version: s.Version, name: "future", oldestBuild: s.OldestBuild,
			up: func(_ *Ledger, ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, s.Up)
				return err
			}}
		if s.Down != "" {
			m.down = func(_ *Ledger, ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, s.Down)
				return err
			}
		}
		b.steps = append(b.steps, m)
	}
	return open(ctx, opts, b)
}

// Steps are this build's schema steps as (version, name), and its minimum.
func Steps() (steps [][2]any, minimum int64) {
	for _, m := range thisBuild.steps {
		steps = append(steps, [2]any{m.version, m.name})
	}
	return steps, thisBuild.minimum
}

// CommitRefused is commitRefused, for its table test.
var CommitRefused = commitRefused

// Purchase commits an order the Redis gate admitted: the request's row,
// the conditional update sold + q where sold + held + q <= total at the
// order's gate epoch, and the order row, in one transaction. It returns
// stock.ErrSoldOut when the ledger has not enough left, ErrStaleGate when
// a rebuild closed the order's gate epoch, or ErrDuplicate with the order
// already stored for the request (ErrKeyReused for another request).
func (l *Ledger) Purchase(ctx context.Context, o Order) (_ Order, err error) {
	defer l.observe("purchase", time.Now(), &err)
	r := l.commitOne(ctx, PurchaseTake(o), false)
	return r.Order(), r.Err
}

// PurchaseDirect commits an order that bypassed the Redis gate (the breaker
// is open) at the SKU row version the caller read: ErrConflict says it
// moved. It also bumps bypass_seq, so Redis is re-seeded before it serves
// the SKU again. Other outcomes are as for Purchase.
func (l *Ledger) PurchaseDirect(ctx context.Context, o Order, version int64) (_ Order, err error) {
	defer l.observe("purchase_direct", time.Now(), &err)
	if version < 0 {
		return Order{}, fmt.Errorf("%w: version %d", stock.ErrInvalid, version)
	}
	t := PurchaseTake(o)
	t.version, t.versioned = version, true
	r := l.commitOne(ctx, t, true)
	return r.Order(), r.Err
}

// Hold sets stock aside: the request's row, the hold row and held + q under
// the same checks as a purchase (stock, per-buyer cap, sale not ended, gate
// epoch; a seat hold's seats all free). version >= 0 takes it around the
// Redis gate at that row version, as PurchaseDirect. It returns
// ErrDuplicate with the hold stored for the request, or ErrKeyReused.
func (l *Ledger) Hold(ctx context.Context, h Hold, version int64) (_ Hold, err error) {
	defer l.observe("hold", time.Now(), &err)
	t := HoldTake(h)
	if version >= 0 {
		t.version, t.versioned = version, true
	}
	r := l.commitOne(ctx, t, version >= 0)
	return r.Hold(), r.Err
}

// PurchaseCart commits a cart: the request's row, every line's conditional
// update (sold + q where sold + held + q <= total, at the line's gate epoch
// or, when direct, at the row's, bumping bypass_seq), the buyer's counts
// under the SKU and program caps (the program's counting every line), and
// the order rows, in one transaction. A refusal is a *LineError, or
// stock.ErrLimit for the program's cap, and writes nothing. ErrDuplicate
// returns the cart already stored for the request; ErrKeyReused says the
// key was used for another request.
func (l *Ledger) PurchaseCart(ctx context.Context, c Cart, direct bool) (_ Cart, err error) {
	defer l.observe("cart", time.Now(), &err)
	c.Holds = nil
	return l.takeCart(ctx, c, direct)
}

// HoldCart is PurchaseCart for a held cart: every line (c.Holds) held
// until its expiry, all or nothing, as holds of the cart.
func (l *Ledger) HoldCart(ctx context.Context, c Cart, direct bool) (_ Cart, err error) {
	defer l.observe("cart_hold", time.Now(), &err)
	c.Orders = nil
	return l.takeCart(ctx, c, direct)
}

func (l *Ledger) takeCart(ctx context.Context, c Cart, direct bool) (Cart, error) {
	r := l.commitOne(ctx, CartTake(c), direct)
	if r.Cart == nil || (r.Err != nil && !errors.Is(r.Err, ErrDuplicate)) {
		return Cart{}, r.Err
	}
	out := *r.Cart
	out.Req = Request{}
	return out, r.Err
}

// EnsurePool creates a pool's row, with no stock and the ticket's
// settings, if it has none, so that its gate can be fenced before stock
// moves into it. stock.ErrUnknownSKU when the ticket has no row.
func (l *Ledger) EnsurePool(ctx context.Context, pool stock.SKU) error {
	if pool.Pool().IsZero() {
		return fmt.Errorf("%w: not a pool's sku", stock.ErrInvalid)
	}
	base := pool.Base()
	res, err := l.db.ExecContext(ctx, insertPool, base.Program, base.Ticket, pool.Ticket, l.now().UnixMilli())
	if err != nil {
		return fmt.Errorf("ledger: ensure pool: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	st, err := l.SKU(ctx, base)
	if err != nil {
		return err
	}
	if st.Seated {
		return fmt.Errorf("%w: a seated ticket has no pools", stock.ErrInvalid)
	}
	_, err = l.SKU(ctx, pool)
	return err
}

// PutProgram sets a program's per-buyer cap (0 removes it), and no hold
// budgets.
func (l *Ledger) PutProgram(ctx context.Context, program keys.ID, perBuyer int64) error {
	return l.SetProgram(ctx, Program{ID: program, PerBuyer: perBuyer})
}

// DB is the ledger's connection pool, for tests that change a pooled
// session.
func (l *Ledger) DB() *sql.DB { return l.db }

// SettleAged settles sku as the sweeper does (SettleDue): the sales
// inside ResaleHorizon are left to the next settle.
func (l *Ledger) SettleAged(ctx context.Context, sku stock.SKU) ([]Event, error) {
	return l.settle(ctx, sku, ResaleHorizon)
}

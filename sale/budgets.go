package sale

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/stock"
)

// Hold budgets: what one buyer, and one device or payment fingerprint, may
// hold at once across a program (ledger.Program). They are the gate's to
// enforce: a hold counts against them before its stock is taken, so an
// identity at its budget is refused with nothing moved and no ledger call,
// and its count ends when the hold does (confirmed, cancelled, expired).
// An end Redis failed is owed: the sweeper makes it again. A count the
// replica could not end (it died between the ledger and Redis) leaves by
// itself at the hold's expiry plus budgetGrace. The budgets are
// one identity's counts across the program's SKUs, so they live in their
// own slot, not in the deduction's script. While Redis cannot be used the
// holds that go around the gate are not counted: selling goes on.

// budgetGrace is how long a count outlives its hold's expiry: the sweeper
// ends an expired hold a little after it is due.
const budgetGrace = 5 * time.Second

// budgetEntry is one count a take made: a hold line's under its buyer's
// budget, or under its device's.
type budgetEntry struct {
	b     shard.Budget
	entry keys.ID
}

// deviceTag is the name a device fingerprint is counted under: a digest,
// so the raw fingerprint (often personal data) never reaches Redis.
func deviceTag(device string) string {
	sum := sha256.Sum256([]byte(device))
	return hex.EncodeToString(sum[:16])
}

// takeBudgets counts each hold line of t against its program's hold
// budgets; ok is false with the refusal when one would be passed (the
// counts this attempt made are given back). Redis failing counts nothing:
// the take goes on without (see the package comment above).
func (t *take) takeBudgets(ctx context.Context) (answer, bool) {
	s := t.s
	if !t.lines[0].w.hold {
		return answer{}, true
	}
	program := t.program()
	p, err := s.programs.Get(ctx, program)
	if err != nil {
		s.log.ErrorContext(ctx, "load program", "program", program.String(), "err", err)
		return ansUnavailable, false
	}
	if p.HoldBudget == 0 && p.DeviceHoldBudget == 0 {
		return answer{}, true
	}
	tag := ""
	if t.device != "" && p.DeviceHoldBudget > 0 {
		tag = deviceTag(t.device)
	}
	now := t.s.now()
	for i, ln := range t.lines {
		ttl := t.ttl
		if ttl == 0 {
			ttl = ln.st.HoldTTL
		}
		expires := now.Add(ttl + budgetGrace)
		entry := ln.w.req.gateID()
		counts := []struct {
			b      shard.Budget
			budget int64
			tag    string
		}{{shard.Budget{Program: program, Buyer: ln.w.buyer}, p.HoldBudget, tag}}
		if tag != "" {
			counts = append(counts, struct {
				b      shard.Budget
				budget int64
				tag    string
			}{shard.Budget{Program: program, Device: tag}, p.DeviceHoldBudget, ""})
		}
	counting:
		for _, c := range counts {
			var fresh bool
			var under string
			err := s.redis(ctx, "gate.hold_budget", func(ctx context.Context) (err error) {
				fresh, under, err = s.gate.TakeBudget(ctx, c.b, entry, ln.w.q, c.budget, expires, c.tag)
				return err
			})
			switch {
			case errors.Is(err, stock.ErrLimit):
				s.metrics.budgetRefusals.WithLabelValues(budgetKind(c.b)).Inc()
				t.settleBudgets(ctx, answer{err: ErrHoldBudget})
				detail := fmt.Sprintf("this buyer may hold %d of this program's tickets at once", p.HoldBudget)
				if c.b.Buyer.IsZero() {
					detail = fmt.Sprintf("this device may hold %d of this program's tickets at once", p.DeviceHoldBudget)
				}
				if t.cart {
					return t.no(ctx, i, lineRefusal{kind: ErrHoldBudget, detail: detail}), false
				}
				// A retry of a hold that committed gets its replay: its key
				// is looked up in the ledger (one primary-key read per
				// refusal). The SKU's committed-key set read at the cached
				// settings' version was free, but that row may be older
				// than the hold's commit on another replica, and a retry
				// then read "budget reached" for a hold that stands
				// (found by the concurrent model).
				return s.lookupOr(ctx, ln.w.req, fail(refuse(ErrHoldBudget, detail))), false
			case err != nil && notRun(err):
				// This count's master is out: not counted, and the take
				// goes on. The line's device count goes with its buyer's
				// (a hold's end finds it through the buyer's), but the
				// later lines are counted still: their slots may answer
				// (a device's master out left every later line's buyer
				// count uncounted, helper-95 N4).
				break counting
			case err != nil:
				// Maybe counted: given back with the others if the take
				// does not commit.
				s.log.WarnContext(ctx, "hold budget outcome unknown", "program", program.String(), "err", err)
				t.budgets = append(t.budgets, budgetEntry{c.b, entry})
			case fresh:
				t.budgets = append(t.budgets, budgetEntry{c.b, entry})
			case under != c.tag:
				// The buyer's count of this hold was made before (a
				// retry) under another device: nothing is counted under
				// this one, as the hold's end would not end it.
				break counting
			default:
				// Made before under this device too (a retry, or a copy
				// on another replica): the device is counted still (the
				// same entry; made before too, or given back with this
				// take's others if it fails). A copy that stopped here
				// held uncounted when the other copy, refused by the
				// device's budget, gave the buyer's count back
				// (helper-57).
			}
		}
	}
	return answer{}, true
}

func budgetKind(b shard.Budget) string {
	if b.Buyer.IsZero() {
		return "device"
	}
	return "buyer"
}

// settleBudgets keeps the counts of a take that made its holds, and gives
// back the ones this request counted otherwise (refused, failed, or a
// replay of holds that ended since). A replay's holds still held keep the
// count: the count is the hold's own entry, which this attempt made when
// a copy of the request on another replica, which found it made and
// counted nothing, committed first.
func (t *take) settleBudgets(ctx context.Context, a answer) {
	if len(t.budgets) == 0 {
		return
	}
	if a.err == nil && !a.replayed {
		t.budgets = nil
		return
	}
	ctx = context.WithoutCancel(ctx)
	var held map[keys.ID]bool
	if a.err == nil {
		held = t.s.stillHeld(ctx, a)
	}
	// A 503 leaves the request's outcome open: another copy of it (the
	// client's retry on another replica) may commit its hold on a count
	// this attempt made, which it found made and so did not list as its
	// own; ended here, that hold stands uncounted (helper-95 B1). Owing
	// the end to the sweeper instead (checked against the ledger) kept
	// the counts of every 503 a second or more, and under a 503 storm
	// past the owed list's bound for the hold's whole lifetime: buyers
	// holding nothing refused 409 (helper-96). The gate may under-count
	// a budget, never over: the end is made now.
	for _, e := range t.budgets {
		if held[e.entry] {
			continue
		}
		// Its device's count is one of t.budgets too (a count this
		// attempt made): ended by itself, not through the buyer's.
		if err := t.s.redis(ctx, "gate.hold_budget", func(ctx context.Context) error {
			_, err := t.s.gate.EndBudget(ctx, e.b, e.entry)
			return err
		}); err != nil {
			t.s.log.WarnContext(ctx, "give back a hold budget count; the sweeper tries again", "err", err)
			t.s.budgetOwed.add(budgetCall{b: e.b, entry: e.entry, giveBack: true})
		}
	}
	t.budgets = nil
}

// stillHeld is the set of entries (gate request ids) of replay a's holds
// that are held now, read from the ledger: a replay's stored answer shows
// its holds as they were answered. A read that fails counts none.
func (s *Service) stillHeld(ctx context.Context, a answer) map[keys.ID]bool {
	var holds []ledger.Hold
	switch {
	case a.hold != nil:
		h, err := s.ledger.HoldByID(ctx, a.hold.ID)
		if err != nil {
			return nil
		}
		holds = []ledger.Hold{h}
	case a.cart != nil && len(a.cart.Holds) > 0:
		c, err := s.ledger.CartByID(ctx, a.cart.ID)
		if err != nil {
			return nil
		}
		holds = c.Holds
	}
	held := map[keys.ID]bool{}
	for _, h := range holds {
		if h.State == ledger.Held {
			held[h.IdempotencyKey] = true
		}
	}
	return held
}

// holdEnded ends the hold budget counts of a hold that ended (confirmed,
// cancelled, expired): entry is its gate request id. It is ended whatever
// the program's budgets are now: a hold counted under a budget since
// removed (or by a replica whose cache already had it) must not be counted
// when the budget is back. A count missed here leaves by itself.
func (s *Service) holdEnded(ctx context.Context, program, buyer, entry keys.ID) {
	s.budgetEntry(ctx, program, buyer, entry, time.Time{})
}

// holdExtended moves the budget counts of an extended hold to its new
// expiry (as holdEnded, whatever the program's budgets are now).
func (s *Service) holdExtended(ctx context.Context, h ledger.Hold) {
	s.budgetEntry(ctx, h.SKU.Program, h.Buyer, h.IdempotencyKey, h.ExpiresAt.Add(budgetGrace))
}

// budgetEntry ends (expires zero) or moves the entry's counts: one Redis
// call for a hold never counted. A call that fails is owed: the sweeper
// makes it again (retryOwedBudgets).
func (s *Service) budgetEntry(ctx context.Context, program, buyer, entry keys.ID, expires time.Time) {
	if program.IsZero() || buyer.IsZero() || entry.IsZero() {
		return
	}
	s.budgetCall(context.WithoutCancel(ctx), budgetCall{b: shard.Budget{Program: program, Buyer: buyer}, entry: entry, expires: expires})
}

// budgetCall is one end (expires zero) or extension of a hold's count
// under one identity's budget.
type budgetCall struct {
	b       shard.Budget
	entry   keys.ID
	expires time.Time
	// giveBack: the end of an attempt's count that made no hold
	// (settleBudgets'), not of a hold that ended. A retry of the request
	// under the same key finds the count standing and makes it its own
	// hold's, so it is made only while no hold of the request stands.
	giveBack bool
}

// budgetCall makes c, or owes it when Redis fails it: an end left undone
// refuses a buyer who holds nothing (409 hold-budget-reached) until the
// hold's old expiry, and an extension left undone lets the count lapse
// while the hold lives on.
func (s *Service) budgetCall(ctx context.Context, c budgetCall) {
	if err := s.makeBudgetCall(ctx, c); err != nil {
		if !notRun(err) {
			s.log.WarnContext(ctx, "hold budget count; the sweeper tries again", "program", c.b.Program.String(), "err", err)
		}
		s.budgetOwed.add(c)
	}
}

// makeBudgetCall makes c once; a buyer's count that was also counted
// under a device has that one made too (owed if it fails).
func (s *Service) makeBudgetCall(ctx context.Context, c budgetCall) error {
	var device string
	if err := s.redis(ctx, "gate.hold_budget", func(ctx context.Context) (err error) {
		if c.expires.IsZero() {
			device, err = s.gate.EndBudget(ctx, c.b, c.entry)
		} else {
			device, err = s.gate.ExtendBudget(ctx, c.b, c.entry, c.expires)
		}
		return err
	}); err != nil {
		return err
	}
	if device != "" && !c.b.Buyer.IsZero() && !c.giveBack {
		s.budgetCall(ctx, budgetCall{b: shard.Budget{Program: c.b.Program, Device: device}, entry: c.entry, expires: c.expires})
	}
	return nil
}

// makeOwedBudgetCall makes c again for the sweeper: a give-back whose
// request has a hold now (a retry under its key that committed on the
// count) is dropped, as the hold's end will end the count.
func (s *Service) makeOwedBudgetCall(ctx context.Context, c budgetCall) error {
	if c.giveBack {
		switch h, err := s.ledger.HoldByKey(ctx, c.entry); {
		case err == nil && h.State == ledger.Held:
			return nil
		case err != nil && !errors.Is(err, ledger.ErrNotFound):
			return err
		}
	}
	return s.makeBudgetCall(ctx, c)
}

// retryOwedBudgets makes the budget calls that failed again (see owed).
// One made late is safe: an end takes its entry off once, and an
// extension only moves an expiry later.
func (s *Service) retryOwedBudgets(ctx context.Context, slow *int) {
	if dropped := s.budgetOwed.retry(ctx, slow, s.makeOwedBudgetCall); dropped > 0 {
		s.log.WarnContext(ctx, "hold budget calls dropped; their counts lapse at their holds' expiry", "dropped", dropped)
	}
}

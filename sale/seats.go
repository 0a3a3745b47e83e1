package sale

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/stock"
)

// Reserved seating: seat maps, seat holds of given seats in one section or
// of the best adjacent seats, and seat status. A seat hold is a hold like
// any other (confirm, cancel, expiry, refund through the same flows); its
// seats are held in Redis under its request's gate id and in the ledger
// under its hold id, and its gate record (which seats, package seats'
// encoding) tells a return what to release.

// seatMap is a SKU's seat id → section, loaded once per SettingsTTL.
type seatMap map[keys.ID]keys.ID

// section is the one section of the seats ids, or what keeps them from
// having one: the seats not in the map, or seats of two sections.
func (m seatMap) section(ids []keys.ID) (section keys.ID, unknown []string, spans bool) {
	for _, id := range ids {
		sec, ok := m[id]
		switch {
		case !ok:
			unknown = append(unknown, id.String())
		case section.IsZero():
			section = sec
		case sec != section:
			spans = true
		}
	}
	return section, unknown, spans
}

func (s *Service) loadSeatMap(ctx context.Context, sku stock.SKU) (seatMap, error) {
	all, err := s.ledger.Seats(ctx, sku, keys.ID{})
	if err != nil {
		return nil, err
	}
	m := make(seatMap, len(all))
	for _, st := range all {
		m[st.ID] = st.Section
	}
	return m, nil
}

// takeSeats holds the given seats of one section for request r. The seats'
// owner in Redis is the request's gate id (derived from buyer, key and
// fingerprint), so a reused key with other seats can neither take nor
// release the first request's seats.
// seatSettings reads the SKU's settings and refuses what they refuse for a
// seat hold of n seats, before any seat is taken in Redis.
func (s *Service) seatSettings(ctx context.Context, sku stock.SKU, r request, n int, ttl time.Duration) (ledger.SKUState, answer, bool) {
	st, err := s.settings.Get(ctx, sku)
	switch {
	case errors.Is(err, stock.ErrUnknownSKU):
		return st, ansUnknownSKU, false
	case err != nil:
		return st, ansUnavailable, false
	case !st.Seated:
		return st, s.lookupOr(ctx, r, fail(ErrNotSeated)), false
	case int64(n) > st.MaxPerOrder:
		return st, s.lookupOr(ctx, r, fail(refuse(ErrOverMax,
			fmt.Sprintf("%d seats over this ticket's maximum of %d per order", n, st.MaxPerOrder)))), false
	case ttl != 0 && (ttl < ledger.MinHoldTTL || ttl > st.HoldTTLMax):
		return st, s.lookupOr(ctx, r, fail(refuse(ErrInvalid, "ttl_seconds out of this ticket's bounds"))), false
	case !st.EndedAt.IsZero():
		return st, s.lookupOr(ctx, r, ansSaleEnded), false
	}
	return st, answer{}, true
}

func (s *Service) takeSeats(ctx context.Context, sku stock.SKU, r request, buyer keys.ID, ids []keys.ID, ttl time.Duration) answer {
	owner := r.gateID()
	if s.seats == nil {
		return fail(ErrNoSeating)
	}
	st, refused, ok := s.seatSettings(ctx, sku, r, len(ids), ttl)
	if !ok {
		return refused
	}
	m, err := s.seatMaps.Get(ctx, sku)
	if err != nil {
		return ansUnavailable
	}
	section, unknown, spans := m.section(ids)
	switch {
	case spans:
		return fail(ErrSeatsSpan)
	case len(unknown) > 0:
		return fail(refuseSeats(ErrUnknownSeats, unknown))
	}
	if ttl == 0 {
		ttl = st.HoldTTL
	}
	// GateEpoch -1: seats are not counted stock, and the seat gate has no
	// epochs (the consistency check rewrites it from the ledger's seats).
	h := ledger.Hold{IdempotencyKey: owner, SKU: sku, Buyer: buyer, Quantity: int64(len(ids)),
		SeatIDs: ids, ExpiresAt: time.Now().Add(ttl), Req: r.ledger(), GateEpoch: -1}

	// The gate: take the seats in Redis first (all or nothing), so a race for
	// the same seats is settled there; the ledger decides for good.
	rerr := s.redis(ctx, func(ctx context.Context) error { return s.seats.Hold(ctx, sku, section, owner, ids) })
	var se *seats.SeatError
	switch {
	case errors.As(rerr, &se) && errors.Is(rerr, seats.ErrTaken):
		return s.lookupOr(ctx, r, fail(refuseSeats(ErrSeatsTaken, se.Seats)))
	case errors.As(rerr, &se):
		return fail(refuseSeats(ErrSeatsNotInGate, se.Seats))
	case rerr != nil && !notRun(rerr):
		return ansUnavailable
	}
	// The gate record names the seats and their owner even for a hold taken
	// around the gate: the seat consistency check may write them into Redis
	// as held by this owner, so its end must release them there (a release
	// by owner is a no-op for seats this owner does not hold).
	h.Gate = seats.EncodeGate(section, ids)
	version := int64(-1)
	if rerr != nil {
		// Redis is out: straight to the ledger, optimistically.
		fresh, err := s.ledger.SKU(ctx, sku)
		if err != nil {
			return ansUnavailable
		}
		version = fresh.Version
	}
	var got ledger.Hold
	if version < 0 {
		// Through the gate: group-committed with the SKU's other takes.
		got, err = s.committer.commitHold(h)
	} else {
		got, err = s.ledger.Hold(ctx, h, version)
	}
	release := func() {
		if rerr == nil {
			_ = s.redis(ctx, func(ctx context.Context) error {
				_, err := s.seats.Release(ctx, sku, section, owner, ids)
				return err
			})
		}
	}
	var te *ledger.SeatsTakenError
	switch {
	case err == nil:
		return answer{hold: &got}
	case errors.Is(err, ledger.ErrDuplicate):
		// A retry of a committed seat hold. If that hold has ended since
		// (cancelled, expired, its order refunded), its seats were freed,
		// and this attempt just took them again under the same owner:
		// give them back.
		if cur, herr := s.ledger.HoldByID(ctx, got.ID); herr == nil && cur.State != ledger.Held {
			if cur.State != ledger.Confirmed || s.orderRefunded(ctx, cur.OrderID) {
				release()
			}
		}
		return answer{hold: &got, replayed: true}
	case errors.Is(err, ledger.ErrKeyReused):
		release()
		return ansKeyReused
	case errors.As(err, &te):
		release()
		return fail(refuseSeats(ErrSeatsTaken, te.Seats))
	case errors.Is(err, stock.ErrLimit):
		release()
		return ansLimit
	case errors.Is(err, stock.ErrSaleEnded):
		release()
		return ansSaleEnded
	case errors.Is(err, ledger.ErrConflict):
		release()
		return ansBusy
	case errors.Is(err, errLedgerBusy):
		release()
		return ansLedgerBusy
	case errors.Is(err, ledger.ErrNotCommitted):
		release()
		return ansUnavailable
	}
	s.log.ErrorContext(ctx, "seat hold commit", "sku", sku.String(), "err", err)
	return s.lookupOr(ctx, r, ansUnavailable)
}

// orderRefunded reports whether the order was refunded (false when it
// cannot be read: keeping the seats taken is the safe side).
func (s *Service) orderRefunded(ctx context.Context, id keys.ID) bool {
	o, err := s.ledger.OrderByID(ctx, id)
	return err == nil && !o.RefundedAt.IsZero()
}

// takeBestSeats picks the best q adjacent free seats of a section (in
// Redis, or from the ledger's map while the breaker is open) and holds them
// like given seats.
func (s *Service) takeBestSeats(ctx context.Context, sku stock.SKU, r request, buyer, section keys.ID, q int, ttl time.Duration) answer {
	if s.seats == nil {
		return fail(ErrNoSeating)
	}
	if a, ok, err := s.recorded(ctx, r); err != nil {
		return ansUnavailable
	} else if ok {
		return a
	}
	// What the settings refuse is refused before Redis picks (and holds)
	// any seat: a refusal after the pick would leave them held.
	if _, refused, ok := s.seatSettings(ctx, sku, r, q, ttl); !ok {
		return refused
	}
	if section.IsZero() {
		// The whole price tier: the first section, in order, that has them.
		m, err := s.seatMaps.Get(ctx, sku)
		if err != nil {
			return ansUnavailable
		}
		var sections []keys.ID
		for _, sec := range m {
			if !slices.Contains(sections, sec) {
				sections = append(sections, sec)
			}
		}
		slices.SortFunc(sections, keys.ID.Compare)
		last := fail(refuse(ErrNoAdjacent, fmt.Sprintf("no %d adjacent seats free in any section", q)))
		for _, sec := range sections {
			a := s.takeBestSeats(ctx, sku, r, buyer, sec, q, ttl)
			if !errors.Is(a.err, ErrNoAdjacent) {
				return a
			}
		}
		return last
	}
	var ids []keys.ID
	err := s.redis(ctx, func(ctx context.Context) (err error) {
		ids, err = s.seats.Best(ctx, sku, section, r.gateID(), q)
		return err
	})
	switch {
	case errors.Is(err, seats.ErrNoAdjacent):
		return fail(refuse(ErrNoAdjacent, fmt.Sprintf("no %d adjacent seats free in section %s", q, section)))
	case err != nil && notRun(err):
		all, lerr := s.ledger.Seats(ctx, sku, section)
		if lerr != nil {
			return ansUnavailable
		}
		if ids = bestAdjacent(all, q); ids == nil {
			return fail(refuse(ErrNoAdjacent, fmt.Sprintf("no %d adjacent seats free in section %s", q, section)))
		}
	case err != nil:
		return ansUnavailable
	}
	// The seats are held in Redis under key (or Redis is out); the given-
	// seats path holds them again (a no-op for the same key) and commits.
	a := s.takeSeats(ctx, sku, r, buyer, ids, ttl)
	if err == nil && refusedBeforeGate(a.err) {
		// Refused before its own Redis hold (the map or the settings
		// changed since the pick): nothing will release what Best held.
		if rerr := s.redis(ctx, func(ctx context.Context) error {
			_, err := s.seats.Release(ctx, sku, section, r.gateID(), ids)
			return err
		}); rerr != nil {
			s.log.WarnContext(ctx, "release best seats after a refusal; the seat check repairs them", "sku", sku.String(), "err", rerr)
		}
	}
	return a
}

// refusedBeforeGate reports the refusals takeSeats decides before it holds
// seats in Redis.
func refusedBeforeGate(err error) bool {
	for _, k := range []*Err{ErrUnknownSKU, ErrNotSeated, ErrOverMax, ErrInvalid, ErrSaleEnded, ErrUnknownSeats, ErrSeatsSpan, ErrNoSeating} {
		if errors.Is(err, k) {
			return true
		}
	}
	return false
}

// bestAdjacent is seats_best.lua's choice over the ledger's map, for when
// Redis is out: the front-most row with q consecutive free seats, without
// stranding a single seat where another run allows.
func bestAdjacent(all []ledger.Seat, q int) []keys.ID {
	rows := map[string][]ledger.Seat{}
	var names []string
	for _, st := range all {
		if _, ok := rows[st.Row]; !ok {
			names = append(names, st.Row)
		}
		rows[st.Row] = append(rows[st.Row], st)
	}
	slices.SortFunc(names, rowCompare)
	var best []keys.ID
	bestOrphan := true
	for _, name := range names {
		row := rows[name]
		slices.SortFunc(row, func(a, b ledger.Seat) int { return a.Number - b.Number })
		for i := 0; i < len(row); {
			if row[i].State != "free" {
				i++
				continue
			}
			j := i
			for j+1 < len(row) && row[j+1].State == "free" && row[j+1].Number == row[j].Number+1 {
				j++
			}
			if n := j - i + 1; n >= q && (best == nil || (bestOrphan && n-q != 1)) {
				best, bestOrphan = nil, n-q == 1
				for k := i; k < i+q; k++ {
					best = append(best, row[k].ID)
				}
				if !bestOrphan {
					return best
				}
			}
			i = j + 1
		}
	}
	return best
}

// rowCompare orders row labels naturally, as seats_best.lua does: a
// shorter label first, then alphabetical (2 before 10, Z before AA).
func rowCompare(a, b string) int {
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	return strings.Compare(a, b)
}

// loadSection reads a section's seats (all seats for section "") from the
// ledger. The loading cache is keyed by SKU: the section rides in the
// ticket field after a byte no id may contain.
// sectionKey names one section of a SKU's map (the zero section: all of it)
// in the cache of section views.
type sectionKey struct {
	sku     stock.SKU
	section keys.ID
}

func (s *Service) loadSection(ctx context.Context, key sectionKey) (Section, error) {
	sku, section := key.sku, key.section
	all, err := s.ledger.Seats(ctx, sku, section)
	if err != nil {
		return Section{}, err
	}
	v := Section{SKU: sku, Section: section, Seats: make([]SeatState, len(all))}
	for i, st := range all {
		v.Seats[i] = SeatState{Seat: Seat{ID: st.ID, Section: st.Section, Row: st.Row, Number: st.Number}, State: st.State}
		if st.State == "free" {
			v.Free++
		}
	}
	return v, nil
}

// SeatCheck is what a consistency check of a seat map found and did.
type SeatCheck struct {
	Checked  int
	Differed []string
	Repaired int
}

// checkSeats compares the gate's seat states with the ledger's and writes
// the ledger's over every seat that differs (the ledger wins). With
// confirmOnly it repairs only seats in prev that differed the same way at
// the previous check, so a hold between its Redis and ledger halves is not
// "repaired" mid-flight; it returns what differs now, for the next check.
func (s *Service) checkSeats(ctx context.Context, sku stock.SKU, prev map[keys.ID]string) (SeatCheck, map[keys.ID]string, error) {
	var out SeatCheck
	if s.seats == nil {
		return out, nil, ErrNoSeating
	}
	facts, err := s.ledger.SeatFacts(ctx, sku)
	if err != nil {
		return out, nil, err
	}
	bySection := map[keys.ID][]ledger.SeatFact{}
	for _, f := range facts {
		bySection[f.Section] = append(bySection[f.Section], f)
	}
	now := map[keys.ID]string{}
	for section, fs := range bySection {
		ids := make([]keys.ID, len(fs))
		for i, f := range fs {
			ids[i] = f.ID
		}
		var raw []string
		if err := s.redis(ctx, func(ctx context.Context) (err error) {
			raw, err = s.seats.Raw(ctx, sku, section, ids)
			return err
		}); err != nil {
			return out, nil, err
		}
		fix := map[keys.ID]string{}
		for i, f := range fs {
			out.Checked++
			want := seats.Gate(f.State, f.HoldKey)
			if raw[i] == want {
				continue
			}
			out.Differed = append(out.Differed, f.ID.String())
			seen := raw[i] + "→" + want
			now[f.ID] = seen
			if prev == nil || prev[f.ID] == seen {
				fix[f.ID] = want
			}
		}
		if err := s.redis(ctx, func(ctx context.Context) error { return s.seats.Repair(ctx, sku, section, fix) }); err != nil {
			return out, nil, err
		}
		out.Repaired += len(fix)
	}
	s.metrics.seatRepairs.Add(float64(out.Repaired))
	return out, now, nil
}

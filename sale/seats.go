package sale

import (
	"context"
	"slices"
	"strings"

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

// orderRefunded reports whether the order was refunded (false when it
// cannot be read: keeping the seats taken is the safe side).
func (s *Service) orderRefunded(ctx context.Context, id keys.ID) bool {
	o, err := s.ledger.OrderByID(ctx, id)
	return err == nil && !o.RefundedAt.IsZero()
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
		if err := s.redis(ctx, "gate.seats_read", func(ctx context.Context) (err error) {
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
		if err := s.redis(ctx, "gate.seats_repair", func(ctx context.Context) error { return s.seats.Repair(ctx, sku, section, fix) }); err != nil {
			return out, nil, err
		}
		out.Repaired += len(fix)
	}
	s.metrics.seatRepairs.Add(float64(out.Repaired))
	return out, now, nil
}

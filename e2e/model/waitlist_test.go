package model_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// The model's waitlist: the line of skus[0], its entries for one unit each.
// One unit each keeps the reference simple and exact: what comes back is
// offered unit by unit to the first entries in line whose buyers the caps
// allow, however the sweepers group expiries into transactions.

// mWait is a buyer's entry on the line.
type mWait struct {
	buyer string
	state string // ledger.Waiting, ledger.Offered or ledger.Left
	hold  *mHold // the offer, once offered
}

// waitOf is buyer's entry, or nil.
func (m *sim) waitOf(buyer string) *mWait {
	for _, w := range m.line {
		if w.buyer == buyer {
			return w
		}
	}
	return nil
}

// waitSettled says no hold of the waitlist's SKU may end during a request:
// its answer (sold out or not, an offer live or not) is then known.
func (m *sim) waitSettled() bool {
	for _, h := range m.holds {
		if h.sku == m.skus[0] && h.state == ledger.Held && !h.live() {
			return false
		}
	}
	return true
}

// waitOp joins, leaves or reads the line as a random buyer.
func (m *sim) waitOp() {
	if !m.waitSettled() {
		return
	}
	s := m.skus[0]
	buyer := m.buyer()
	w := m.waitOf(buyer)
	path := systest.WaitPath(s.sku, buyer)
	e := m.env()
	switch r := m.rng.IntN(10); {
	case r < 6:
		want, kind := http.StatusCreated, ""
		switch {
		case s.ended:
			want, kind = http.StatusConflict, "sale-ended"
		case w != nil && (w.state == ledger.Waiting || w.state == ledger.Offered && w.hold.state == ledger.Held):
			want = http.StatusOK
		case s.left() >= 1:
			want, kind = http.StatusConflict, "not-sold-out"
		}
		rep := e.Do(m.t, http.MethodPut, path, nil, `{"quantity":1}`)
		m.tracef("PUT %s = %d %s", path, rep.Status, rep.Body)
		if rep.Status != want || kind != "" && systest.ProblemKind(rep) != kind {
			m.fail("join %s (entry %+v, left %d) = %d %s, want %d %s", buyer, w, s.left(), rep.Status, rep.Body, want, kind)
		}
		if want != http.StatusCreated {
			m.ops["wait-join-"+map[bool]string{true: "again", false: kind}[kind == ""]]++
			return
		}
		m.ops["wait-join"]++
		if w != nil {
			m.line = slices.DeleteFunc(m.line, func(x *mWait) bool { return x == w })
		}
		m.line = append(m.line, &mWait{buyer: buyer, state: ledger.Waiting})
	case r < 8:
		want, kind := http.StatusOK, ""
		switch {
		case w == nil:
			want, kind = http.StatusNotFound, "not-on-waitlist"
		case w.state == ledger.Offered && w.hold.state == ledger.Held:
			want, kind = http.StatusConflict, "waitlist-offered"
		}
		rep := e.Do(m.t, http.MethodDelete, path, nil, "")
		m.tracef("DELETE %s = %d %s", path, rep.Status, rep.Body)
		if rep.Status != want || kind != "" && systest.ProblemKind(rep) != kind {
			m.fail("leave %s (entry %+v) = %d %s, want %d %s", buyer, w, rep.Status, rep.Body, want, kind)
		}
		m.ops["wait-leave"]++
		if want == http.StatusOK && w.state == ledger.Waiting {
			w.state = ledger.Left
		}
	default:
		rep := e.Do(m.t, http.MethodGet, path, nil, "")
		if w == nil {
			if rep.Status != http.StatusNotFound {
				m.fail("GET %s of no entry = %d %s", path, rep.Status, rep.Body)
			}
			return
		}
		m.ops["wait-read"]++
		if rep.Status != http.StatusOK {
			m.fail("GET %s = %d %s", path, rep.Status, rep.Body)
		}
	}
}

// returned offers units of s that came back in one ledger transaction to
// the line, as the ledger does, and takes the offers' holds from the
// ledger into the model.
func (m *sim) returned(s *mSKU, units int64) {
	if s != m.skus[0] || s.ended {
		return
	}
	ctx := context.Background()
	for _, w := range m.line {
		if units == 0 {
			break
		}
		if w.state != ledger.Waiting || !m.mayHold(w.buyer, s, 1) {
			continue
		}
		got, err := m.envs[0].Ledger.WaitEntryOf(ctx, s.sku, keys.MustID(w.buyer))
		if err != nil || got.State != ledger.Offered || got.Offer == nil || got.Offer.Quantity != 1 {
			m.fail("%s first in line when %d came back: the ledger has %+v (%v), want an offer", w.buyer, units, got, err)
		}
		h := &mHold{id: got.Offer.ID.String(), sku: s, buyer: w.buyer, q: 1, state: ledger.Held, expires: got.Offer.ExpiresAt}
		m.holds = append(m.holds, h)
		s.held++
		w.state, w.hold = ledger.Offered, h
		units--
		m.ops["wait-offer"]++
		m.tracef("offer %s to %s until %v", h.id, w.buyer, h.expires)
	}
}

// mayHold says the caps let buyer hold q more of s.
func (m *sim) mayHold(buyer string, s *mSKU, q int64) bool {
	c := s.capped()
	return (c.perBuyer == 0 || m.units(buyer, c)+q <= c.perBuyer) &&
		(m.programCap == 0 || m.units(buyer, nil)+q <= m.programCap)
}

// checkLine compares every entry with the ledger's: its state, its offer,
// and a waiting entry's place in line. A hold may expire (and its unit be
// offered) between the model's accounting and the read: then account and
// read again.
func (m *sim) checkLine() {
	for attempt := 0; ; attempt++ {
		diff := m.lineDiff()
		if diff == "" {
			return
		}
		if attempt == 2 {
			m.fail("%s", diff)
		}
		m.settleExpiries(time.Now())
	}
}

// lineDiff is the first entry whose ledger state differs from the model's,
// "" for none.
func (m *sim) lineDiff() string {
	ctx := context.Background()
	var ahead int64
	for _, w := range m.line {
		got, err := m.envs[0].Ledger.WaitEntryOf(ctx, m.skus[0].sku, keys.MustID(w.buyer))
		if err != nil && !errors.Is(err, ledger.ErrNotFound) {
			m.fail("waitlist %s: %v", w.buyer, err)
		}
		ok := got.State == w.state
		switch w.state {
		case ledger.Waiting:
			ok = ok && got.Ahead == ahead
			ahead++
		case ledger.Offered:
			ok = ok && got.Offer != nil && got.Offer.ID.String() == w.hold.id
		}
		if !ok {
			return fmt.Sprintf("waitlist %s: ledger %+v (offer %+v), model %s %s", w.buyer, got, got.Offer, w.state, fmt.Sprint(w.hold))
		}
	}
	return ""
}

// offerTTL is replica i's offer TTL: two keep offers long enough to buy
// or decline, one lets them lapse and pass on within the run.
func offerTTL(i int) time.Duration {
	return []time.Duration{15 * time.Minute, 15 * time.Minute, time.Second}[i]
}

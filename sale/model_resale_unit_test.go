package sale_test

import (
	"errors"
	"fmt"
	"math"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
)

// Resale in the unit model (TestServiceAgainstAModel): a buyer lists some
// of an order's units, which go back on sale at once; a settle gives the
// units sold since the one before (purchases, a cart's lines, confirms of
// holds taken while the SKU had listings) to its listings oldest first,
// each sale only to those begun before it (a SKU's resale is "first"
// unless configured), each unit leaving the
// SKU's total and sold and the seller's order ("alongside", by seed: the
// listings' share of them); a withdrawal settles
// first, then takes a listing's unsold units back off sale while the free
// stock has them. Most steps move the ledger's clock past
// ledger.ResaleHorizon; after a few short ones a settle counts the sales
// up to the first inside it, and leaves the rest (and counts them as not
// made yet in a share's whole, and as where listed units may be).

type modelListing struct {
	id     keys.ID
	order  *modelOrder
	seller keys.ID
	q      int64
	sold   int64
	state  string // listed, sold, withdrawn
	since  int64  // the model's seq when it began: later sales may take its units
}

// modelSale is units sold at key: it may have taken the units of the
// listings begun before (since < key). at is when (the ledger's clock,
// in ms): a settle counts the sales up to the first inside the
// horizon. A hold's confirm carries the hold's prior and priorSince.
type modelSale struct {
	key, units, at int64
	seq            int64 // its own place in the sequence (key may be lower)
	prior          bool
	priorSince     int64
}

// sold counts q units sold of SKU i, now; h is the hold confirmed, if
// any: held when a listing began, it took that listing's units (and any
// later one's) no more than a sale before it would have.
func (m *model) sold(i int, q int64, h *modelHold) {
	m.seq++
	sl := modelSale{key: m.seq, seq: m.seq, units: q, at: m.now().UnixMilli()}
	if h != nil && h.prior {
		sl.key = min(sl.key, h.priorSince)
		sl.prior, sl.priorSince = true, h.priorSince
	}
	s := &m.skus[i]
	s.sales = append(s.sales, sl)
	s.takers = append(s.takers, sl)
}

// modelListRequest is a listing made, for retries under its key.
type modelListRequest struct {
	o   *modelOrder
	ask sale.Ask
	q   int64
	id  keys.ID
}

// list puts 1–4 units of an order on sale again (or, a time in four,
// sends a listing made before again under its key: the same listing, or,
// for another quantity, the key refused as reused). Another buyer's
// order, a cart's line, a refunded or resold order and more than the
// order has unlisted are refused, and nothing moves.
func (m *model) list(n int) {
	if len(m.lists) > 0 && m.rnd.IntN(4) == 0 {
		m.listAgain(n)
		return
	}
	o, a, owner := m.orderAsk()
	if o == nil {
		return
	}
	q := int64(m.rnd.IntN(4) + 1)
	s := &m.skus[o.sku]
	m.where = fmt.Sprintf("step %d: listing of %d of an order of %d (%d listed, refunded %v, resold %v, owner %v, in a cart %v)",
		n, q, o.q, o.listed, o.refunded, o.resold, owner, o.cart != nil)
	res, err := m.svc.ListForResale(m.ctx, o.id, a, q)
	switch {
	case !owner:
		if !errors.Is(err, sale.ErrNotOwner) {
			m.fail("got %+v, %v; want not owner", res, err)
		}
		return
	case o.cart != nil:
		if !errors.Is(err, sale.ErrInCart) {
			m.fail("got %+v, %v; want in cart", res, err)
		}
		return
	case o.resold:
		if !errors.Is(err, sale.ErrOrderResold) {
			m.fail("got %+v, %v; want order resold", res, err)
		}
		return
	case o.refunded:
		if !errors.Is(err, sale.ErrOrderRefunded) {
			m.fail("got %+v, %v; want order refunded", res, err)
		}
		return
	case q > o.q && q <= o.q+o.resoldUnits:
		// Past what stands by what was resold: told as resold.
		if !errors.Is(err, sale.ErrOrderResold) {
			m.fail("got %+v, %v; want more than the order has refused as resold", res, err)
		}
		return
	case q > o.q-o.listed:
		if !errors.Is(err, sale.ErrInvalid) {
			m.fail("got %+v, %v; want more than the order has unlisted refused", res, err)
		}
		return
	case err != nil:
		m.fail("refused: %v", err)
	case res.Listing == nil || res.Replayed || res.Listing.OrderID != o.id || res.Listing.Quantity != q || res.Listing.State != "listed":
		m.fail("answered %+v", res)
	}
	// The listing begins after every sale so far and after every other
	// listing (its event has a seq of its own). The holds held now took
	// their units before: at the first listing, public stock (since 0:
	// no listing's).
	m.seq++
	since := m.seq
	if s.listed == 0 {
		// The first listing: sales before it are not resales.
		s.sales, s.carry = nil, 0
		since = 0
		for _, h := range m.holds {
			if h.sku == o.sku {
				h.prior = false
			}
		}
	}
	for _, h := range m.holds {
		if h.sku == o.sku && h.state == "held" && !h.prior {
			h.prior, h.priorSince = true, since
		}
	}
	s.total += q
	s.remaining += q
	s.listed += q
	o.listed += q
	m.listings = append(m.listings, &modelListing{id: res.Listing.ID, order: o, seller: a.Buyer, q: q, state: "listed", since: m.seq})
	m.lists = append(m.lists, modelListRequest{o: o, ask: a, q: q, id: res.Listing.ID})
	m.count["listed"]++
}

// listAgain sends a listing request made before again: the same listing,
// whatever became of it and its order since, with nothing moved; another
// quantity under the key is refused as reused.
func (m *model) listAgain(n int) {
	r := m.lists[m.rnd.IntN(len(m.lists))]
	q, reuse := r.q, m.rnd.IntN(3) == 0
	if reuse {
		q = q%4 + 1
	}
	m.where = fmt.Sprintf("step %d: retry of listing %v (reuse %v)", n, r.id, reuse)
	res, err := m.svc.ListForResale(m.ctx, r.o.id, r.ask, q)
	m.count["retry"]++
	switch {
	case reuse && r.o.buyer != r.ask.Buyer:
		// The order was transferred since: told as another's.
		if !errors.Is(err, sale.ErrNotOwner) {
			m.fail("got %+v, %v; want not owner", res, err)
		}
	case reuse:
		if !errors.Is(err, sale.ErrKeyReused) {
			m.fail("got %+v, %v; want the key refused as reused", res, err)
		}
	case err != nil:
		m.fail("refused: %v", err)
	case res.Listing == nil || res.Listing.ID != r.id || !res.Replayed:
		m.fail("answered %+v; want listing %v replayed", res, r.id)
	}
}

// withdraw takes a listing's unsold units back off sale, after settling
// what sold: refused when another asks, when the listing sold out or was
// withdrawn, and when the free stock no longer has its units (held or
// bought), nothing moved then.
func (m *model) withdraw(n int) {
	if len(m.listings) == 0 {
		return
	}
	x := m.listings[m.rnd.IntN(len(m.listings))]
	a := sale.Ask{Buyer: x.seller, Key: m.key()}
	owner := m.rnd.IntN(6) > 0
	if !owner {
		a.Buyer = otherBuyer(x.seller, m.rnd)
	}
	s := &m.skus[x.order.sku]
	m.where = fmt.Sprintf("step %d: withdrawal of a %s listing of %d (sold %d, owner %v, %d left, sold since the settle before %v)",
		n, x.state, x.q, x.sold, owner, s.remaining, s.sales)
	res, err := m.svc.WithdrawListing(m.ctx, x.id, a)
	if !owner {
		if !errors.Is(err, sale.ErrNotOwner) {
			m.fail("got %+v, %v; want not owner", res, err)
		}
		return
	}
	m.settled(x.order.sku, true)
	defer m.checkListings(x.order.sku)
	left := x.q - x.sold
	switch {
	case x.state != "listed":
		if !errors.Is(err, sale.ErrListingEnded) {
			m.fail("got %+v, %v; want listing ended (%s, sold %d)", res, err, x.state, x.sold)
		}
		return
	case s.remaining < left:
		if !errors.Is(err, sale.ErrListingSelling) {
			m.fail("got %+v, %v; want listing selling (%d unsold, %d free)", res, err, left, s.remaining)
		}
		return
	case err != nil:
		m.fail("refused: %v (%d unsold, %d free)", err, left, s.remaining)
	case res.Listing == nil || res.Listing.ID != x.id || res.Listing.State != "withdrawn" || res.Listing.Withdrawn != left:
		m.fail("answered %+v; want %d withdrawn", res, left)
	}
	x.state = "withdrawn"
	// The withdrawal takes its units out of the free stock, whichever
	// listing's they were by the shares.
	m.seq++
	s.takers = append(s.takers, modelSale{key: m.seq, units: left})
	// The withdrawn units take their part of the fraction carried.
	if s.listed > left {
		s.carry = s.carry * (s.listed - left) / s.listed
	} else {
		s.carry = 0
	}
	s.total -= left
	s.remaining -= left
	s.listed -= left
	x.order.listed -= left
	m.count["withdrawn"]++
}

// settle settles every SKU's sales to its listings, as the sweeper does.
func (m *model) settle(n int) {
	m.where = fmt.Sprintf("step %d: settle", n)
	sale.SettleResales(m.svc)
	for i := range m.skus {
		m.settled(i, false)
		m.checkListings(i)
	}
}

// settled is what a settle of SKU i does: the units sold since the one
// before go to its listings begun before each sale, oldest first, up to
// what they have unsold (and at least what the free and newly held stock
// no longer has); each leaves the SKU's total and sold, the listing, and
// the seller's order, whose last unit resold ends it as resold. all: a
// withdrawal's settle, which counts the sales inside the horizon too.
func (m *model) settled(i int, all bool) {
	s := &m.skus[i]
	var open []*modelListing
	for _, x := range m.listings {
		if x.order.sku == i && x.state == "listed" {
			open = append(open, x)
		}
	}
	if s.listed == 0 || len(open) == 0 {
		return
	}
	prior := m.priorHeld(i, open[0].since)
	// The sales up to the first inside the horizon are counted; the rest
	// wait for the next settle.
	cut, since := len(s.sales), m.now().Add(-ledger.ResaleHorizon).UnixMilli()
	for k, sl := range s.sales {
		if sl.at > since && !all {
			cut = k
			break
		}
	}
	counted, rest := s.sales[:cut], s.sales[cut:]
	if len(rest) > 0 {
		m.count["horizon"]++
	}
	// What the stock for sale lost after the counted sales: the sales
	// since (but for confirms of holds before every open listing), less
	// what refunds since gave back.
	var last int64
	for _, sl := range counted {
		last = max(last, sl.seq)
	}
	notMade := recent(rest, open[0].since)
	for _, r := range s.refunds {
		if r.seq > last {
			notMade -= r.units
		}
	}
	// Each sale goes to the listings begun before it: the sales grouped
	// by how many of the open listings (oldest first) that is.
	got := make([]int64, len(open))
	units := make([]int64, len(open)+1)
	var later int64 // units sold in this group and after it
	for _, sl := range counted {
		c := 0
		for c < len(open) && open[c].since < sl.key {
			c++
		}
		units[c] += sl.units
		later += sl.units
	}
	for c, u := range units {
		var listed, notYet int64
		for k, x := range open {
			if k < c {
				listed += x.q - x.sold - got[k]
			} else {
				notYet += x.q - x.sold
			}
		}
		if c > 0 && u > 0 {
			n := min(u, listed)
			if m.resale == ledger.ResaleAlongside {
				// What was for sale before this group: the free and held
				// units now, less those of holds before every listing,
				// with the sales of this group and after, less the
				// listings not begun yet.
				// The sales not counted yet had not been made either.
				n = share(u, listed, s.remaining+s.on-prior+notMade+later-notYet, &s.carry)
			}
			for k := 0; k < c && n > 0; k++ {
				y := min(n, open[k].q-open[k].sold-got[k])
				got[k] += y
				n -= y
			}
		}
		later -= u
	}
	var n int64
	for _, y := range got {
		n += y
	}
	if s.listed-n > s.remaining {
		// Units listed that are neither free, nor in a hold taken since
		// the first listing (whichever listing's unit it holds), nor in a
		// sale not counted yet, were sold: the oldest listings' first.
		if least := min(s.listed, s.listed-s.remaining-(s.on-m.priorHeld(i, -1))-recent(rest, -1)); least > n {
			for k, x := range open {
				y := min(least-n, x.q-x.sold-got[k])
				got[k] += y
				n += y
			}
			s.carry = 0
		}
	}
	s.sales = append([]modelSale(nil), rest...)
	for k, x := range open {
		y := got[k]
		if y == 0 {
			continue
		}
		x.sold += y
		if x.sold == x.q {
			x.state = "sold"
		}
		x.order.resoldUnits += y
		if o := x.order; y < o.q {
			o.q -= y
		} else {
			o.resold = true
		}
		x.order.listed -= y
		s.total -= y
		s.listed -= y
		m.count["resold"] += int(y)
	}
}

// recent is the units of sales not counted yet, but for the confirms of
// holds taken before the listing begun at since (and every later one;
// since < 0: before the first listing).
func recent(rest []modelSale, since int64) int64 {
	var n int64
	for _, sl := range rest {
		if !sl.prior || sl.priorSince != 0 && sl.priorSince > since {
			n += sl.units
		}
	}
	return n
}

// priorHeld is the units of SKU i held by holds taken before the
// listing begun at since, and so before every later one; since < 0,
// those taken before the first listing alone.
func (m *model) priorHeld(i int, since int64) int64 {
	var prior int64
	for _, h := range m.holds {
		if h.sku == i && h.state == "held" && h.prior && (h.priorSince == 0 || h.priorSince <= since) {
			prior += h.q
		}
	}
	return prior
}

// share is an alongside settle's units of a group of sales of units:
// the share of listed in what was for sale before them, with the fraction
// carried from the settle before; the fraction left is carried on, none
// when the share reaches what sold or is listed.
func share(units, listed, before int64, carry *int64) int64 {
	most := min(units, listed)
	if before <= 0 {
		*carry = 0
		return most
	}
	const unit = 1_000_000
	share := float64(units)*float64(listed)/float64(before) + float64(*carry)/unit
	n := int64(share)
	*carry = int64(math.Round((share - float64(n)) * unit))
	if *carry >= unit {
		n, *carry = n+1, *carry-unit
	}
	if n >= most {
		n, *carry = most, 0
	}
	return n
}

// checkListings holds SKU i's listings to the ledger's, and both to a
// rule that needs no formula: the listings begun at or after any one of
// them never sold more units together than were taken from the stock
// after it began, by buyers or by withdrawals (each sale's units went
// to one listing at most, begun before it; a withdrawal may take the
// free units a later listing put on sale).
func (m *model) checkListings(i int) {
	for _, x := range m.listings {
		if x.order.sku != i {
			continue
		}
		var sold, bought int64
		for _, y := range m.listings {
			if y.order.sku == i && y.since >= x.since {
				sold += y.sold
			}
		}
		for _, b := range m.skus[i].takers {
			if b.key > x.since {
				bought += b.units
			}
		}
		if sold > bought {
			m.fail("the listings begun since %v sold %d; buyers and withdrawals took %d since it began", x.id, sold, bought)
		}
	}
	for _, x := range m.listings {
		if x.order.sku != i {
			continue
		}
		got, err := m.svc.ListingByID(m.ctx, x.id)
		if err != nil || got.Sold != x.sold || got.State != x.state {
			m.fail("listing %v: %+v, %v; the model: %s, sold %d of %d", x.id, got, err, x.state, x.sold, x.q)
		}
	}
}

package ledger

import (
	"errors"
	"maps"
	"slices"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// A take batch's decisions, with no I/O: which takes of a batch go on
// (within), what the rows a careful attempt read refuse (decide, taking
// the takes in turn) and what the statements did against what they were
// to do (check). decide_test.go tests them without a database.

// within keeps, of the takes live, the first of each request (or row
// key): the others are duplicates, answered by its replay. A take naming
// a seat an earlier take of the batch names is refused: the seat is the
// earlier's. It returns the kept takes' lines, the kept and the
// duplicates.
func (b *takeBatch) within(live []int) (lines []tline, kept, dups []int) {
	seenReq := map[ScopedKey]bool{}
	seenKey := map[keys.ID]bool{}
	seenSeat := map[seatName]bool{}
	for _, i := range live {
		t := &b.takes[i]
		ls := b.lines(i)
		dup := false
		if !t.Req.IsZero() {
			k := ScopedKey{t.Req.Scope, t.Req.Key}
			dup = seenReq[k]
			seenReq[k] = true
		}
		for _, ln := range ls {
			dup = dup || seenKey[ln.key]
		}
		if dup {
			dups = append(dups, i)
			continue
		}
		if ln, named := namedBefore(ls, seenSeat); len(named) > 0 {
			b.refuse(ln, &SeatsTakenError{Seats: named})
			continue
		}
		for _, ln := range ls {
			seenKey[ln.key] = true
			for _, s := range ln.seats {
				seenSeat[seatName{ln.sku, s}] = true
			}
		}
		lines = append(lines, ls...)
		kept = append(kept, i)
	}
	return lines, kept, dups
}

// skusOf is the SKUs lines name, in the order their rows are locked.
func skusOf(lines []tline) []stock.SKU {
	set := map[stock.SKU]bool{}
	for _, ln := range lines {
		set[ln.sku] = true
	}
	return slices.SortedFunc(maps.Keys(set), stock.SKU.Compare)
}

// decideRead drops from kept, first, the takes whose requests committed
// meanwhile (a copy of the request on another replica, while an earlier
// attempt of this batch rolled back): duplicates, decided before any row
// says "sold out" to a request that stands. Then those the rows read
// refuse (decide). It returns what is left and the duplicates.
func (b *takeBatch) decideRead(kept []int, lines []tline, rd readRows) (_ []int, _ []tline, dups []int) {
	drop := map[int]bool{}
	for _, i := range kept {
		if t := &b.takes[i]; !t.Req.IsZero() && rd.committed[ScopedKey{t.Req.Scope, t.Req.Key}] {
			drop[i] = true
			dups = append(dups, i)
		}
	}
	kept, lines = without(kept, lines, drop)
	kept, lines = without(kept, lines, b.decide(kept, lines, rd.rows, rd.buyers, rd.codes))
	return kept, lines, dups
}

// without is kept and lines without the takes in drop.
func without(kept []int, lines []tline, drop map[int]bool) ([]int, []tline) {
	if len(drop) == 0 {
		return kept, lines
	}
	kept = slices.DeleteFunc(kept, func(i int) bool { return drop[i] })
	lines = slices.DeleteFunc(lines, func(ln tline) bool { return drop[ln.take] })
	return kept, lines
}

// checked is what an attempt's statements did against what they were to
// do: the takes refused, those of them another committed first (dups),
// and whether a SKU's update or a code's use refused.
type checked struct {
	refused   map[int]bool
	dups      []int
	sku, code bool
}

// check reads what the statements w did for the kept takes' lines: a
// request or row key not claimed (another committed it first), a seat
// not got (taken), a SKU's update that did not happen, a code used past
// its uses or by another buyer.
func (b *takeBatch) check(kept []int, lines []tline, w *writes) checked {
	c := checked{refused: map[int]bool{}}
	for _, i := range kept {
		t := &b.takes[i]
		if !t.Req.IsZero() && !w.claimed[ScopedKey{t.Req.Scope, t.Req.Key}] {
			c.refused[i] = true
			c.dups = append(c.dups, i)
		}
	}
	for _, ln := range lines {
		if c.refused[ln.take] {
			continue
		}
		if !w.inserted[ln.key] {
			c.refused[ln.take] = true
			c.dups = append(c.dups, ln.take)
			continue
		}
		if missing := missingSeats(ln, w.seatsGot); len(missing) > 0 {
			c.refused[ln.take] = true
			b.refuse(ln, &SeatsTakenError{Seats: missing})
		}
	}
	for _, ln := range lines { // the lines written, after a careful attempt's refusals
		if _, ok := w.updated[ln.sku]; !ok {
			c.sku = true
		}
	}
	for cn, cr := range w.codes {
		if cr.uses > cr.maxUses || !w.codeFound[cn] {
			c.code = true
		}
	}
	if !c.code {
		for _, ln := range lines {
			if ln.code == "" || c.refused[ln.take] {
				continue
			}
			if cr := w.codes[codeName{ln.sku, ln.code}]; !cr.buyer.IsZero() && cr.buyer != ln.buyer {
				c.code = true
			}
		}
	}
	return c
}

// committed fills in what the commit of the kept takes decided: lines
// taken at the row's epoch took it as their update saw it, and a cart
// carries its lines.
func (b *takeBatch) committed(kept []int, lines []tline, w *writes) {
	for _, ln := range lines {
		e := ln.epoch
		if e < 0 {
			e = w.updated[ln.sku].epoch
		}
		t := &b.takes[ln.take]
		if ln.hold {
			t.Holds[ln.idx].TakeEpoch = e
		} else {
			t.Orders[ln.idx].TakeEpoch = e
		}
	}
	for _, i := range kept {
		if t := &b.takes[i]; t.Cart != nil {
			t.Cart.Orders, t.Cart.Holds = t.Orders, t.Holds
		}
	}
}

// refuse records why take ln.take is refused, naming the line in a cart.
func (b *takeBatch) refuse(ln tline, why error) {
	t := &b.takes[ln.take]
	if t.Cart != nil && !(errors.Is(why, stock.ErrLimit) && ln.sku.Ticket.IsZero()) {
		why = &LineError{Line: ln.idx, Err: why}
	}
	if b.res[ln.take].Err == nil {
		b.res[ln.take].Err = why
	}
}

// decide runs through the takes in order against the rows read, as if
// each were committed in turn, and refuses the takes that would not pass:
// an unknown SKU, an ended sale, counted units of a seated ticket, a gate
// since rebuilt, not enough left; with buyers and codes read, a cap or a
// code's uses. It returns the takes refused (their results say why).
func (b *takeBatch) decide(kept []int, lines []tline, rows map[stock.SKU]skuRow, buyers map[buyerName][2]int64,
	codes map[codeName]codeRow) map[int]bool {
	byTake := map[int][]tline{}
	for _, ln := range lines {
		byTake[ln.take] = append(byTake[ln.take], ln)
	}
	left := map[stock.SKU]int64{}
	for sku, r := range rows {
		left[sku] = r.remaining()
	}
	units := map[buyerName]int64{}
	uses := map[codeName]int64{}
	refused := map[int]bool{}
	for _, i := range kept {
		ls := byTake[i]
		need, at, why := rowsRefusal(&b.takes[i], ls, rows, left)
		var counts map[buyerName]int64
		if why == nil && buyers != nil {
			counts, at, why = capsRefusal(ls, buyers, units)
		}
		if why == nil && codes != nil {
			at, why = codesRefusal(ls, codes, uses)
		}
		if why != nil {
			refused[i] = true
			b.refuse(at, why)
			continue
		}
		for sku, q := range need {
			left[sku] -= q
		}
		for n, q := range counts {
			units[n] += q
		}
		for _, ln := range ls {
			if ln.code != "" {
				uses[codeName{ln.sku, ln.code}]++
			}
		}
	}
	return refused
}

// rowsRefusal is why the rows read refuse take t of lines ls (nil: they
// do not) and the line refused, with what t needs of each SKU, given
// what the takes decided before it left.
func rowsRefusal(t *Take, ls []tline, rows map[stock.SKU]skuRow, left map[stock.SKU]int64) (need map[stock.SKU]int64, at tline, why error) {
	need = map[stock.SKU]int64{}
	for _, ln := range ls {
		r, ok := rows[ln.sku]
		switch {
		case !ok:
			why = stock.ErrUnknownSKU
		case r.ended:
			why = stock.ErrSaleEnded
		case len(ln.seats) == 0 && r.seated:
			why = ErrSeatedTake
		case ln.epoch >= 0 && ln.epoch != r.epoch:
			why = ErrStaleGate
		case left[ln.sku]-need[ln.sku] < ln.q:
			why = stock.ErrSoldOut
		case t.versioned && r.version != t.version:
			why = ErrConflict
		}
		if why != nil {
			return need, ln, why
		}
		need[ln.sku] += ln.q
	}
	return need, tline{}, nil
}

// capsRefusal is whether the buyers' counts read refuse lines ls under a
// ticket's or the program's cap (stock.ErrLimit; the line refused names
// the whole program's SKU for the program's), given the units the takes
// decided before them count; and what ls count.
func capsRefusal(ls []tline, buyers map[buyerName][2]int64, units map[buyerName]int64) (counts map[buyerName]int64, at tline, why error) {
	counts = map[buyerName]int64{}
	for _, ln := range ls {
		base, whole := ln.sku.Base(), ln.sku.Whole()
		counts[buyerName{base.Program, base.Ticket, ln.buyer}] += ln.q
		counts[buyerName{whole.Program, whole.Ticket, ln.buyer}] += ln.q
	}
	for _, ln := range ls {
		for _, n := range []buyerName{{ln.sku.Base().Program, ln.sku.Base().Ticket, ln.buyer}, {ln.sku.Program, keys.ID{}, ln.buyer}} {
			bu := buyers[n]
			if bu[1] > 0 && bu[0]+units[n]+counts[n] > bu[1] {
				at = ln
				if n.ticket.IsZero() {
					at.sku = ln.sku.Whole()
				}
				return counts, at, stock.ErrLimit
			}
		}
	}
	return counts, tline{}, nil
}

// codesRefusal is whether the code uses read refuse lines ls: a code
// unknown or another buyer's, or one used up, given the uses the takes
// decided before them make.
func codesRefusal(ls []tline, codes map[codeName]codeRow, uses map[codeName]int64) (at tline, why error) {
	for _, ln := range ls {
		if ln.code == "" {
			continue
		}
		c := codeName{ln.sku, ln.code}
		cr, ok := codes[c]
		switch {
		case !ok || (!cr.buyer.IsZero() && cr.buyer != ln.buyer):
			return ln, ErrCodeInvalid
		case cr.uses+uses[c]+1 > cr.maxUses:
			return ln, ErrCodeUsedUp
		}
	}
	return tline{}, nil
}

// missingSeats are the seats of ln the seat statement did not get.
func missingSeats(ln tline, got map[seatName]bool) []string {
	var out []string
	for _, s := range ln.seats {
		if !got[seatName{ln.sku, s}] {
			out = append(out, s.String())
		}
	}
	slices.Sort(out)
	return out
}

// namedBefore finds the first line of ls naming seats already in seen,
// and those seats.
func namedBefore(ls []tline, seen map[seatName]bool) (tline, []string) {
	for _, ln := range ls {
		var named []string
		for _, s := range ln.seats {
			if seen[seatName{ln.sku, s}] {
				named = append(named, s.String())
			}
		}
		if len(named) > 0 {
			slices.Sort(named)
			return ln, named
		}
	}
	return tline{}, nil
}

type seatName struct {
	sku  stock.SKU
	seat keys.ID
}

package waitroom

import "math"

// Conversion-aware admission. Near the end of a sale every admitted buyer
// who walks away holds a ticket's place for the whole window, so with no
// more admitted than tickets left the last tickets go out one window at a
// time (stockbench's on-sale: 1,000 tickets, 30 % walking away, a minute's
// window: five minutes). A room with a sold-out share above 0 admits past
// the tickets left as far as the line's conversion allows: the most
// admitted-but-unused buyers U such that, if each buys with the line's
// conversion c, the buyers expected to find it sold out are at most that
// share of every buyer admitted (D done before, and U):
//
//	E[max(0, Binomial(U, c) - left)] <= share x (D + U)
//
// Share 0 keeps the older promise (no more admitted than tickets left, as
// per_remaining says). Each admitted buyer is taken to buy one ticket, as
// per_remaining does.

// DefaultSoldOutShare is a room's sold-out share when its settings name
// none.
const DefaultSoldOutShare = 0.05

// convPrior is how many buyers who bought the estimate starts with: a line
// is taken to convert fully until its own buyers say otherwise.
const convPrior = 20

// conversion estimates the share of admitted buyers who buy, from those
// whose outcome is known: spent bought, abandoned walked away.
func conversion(spent, abandoned int64) float64 {
	spent, abandoned = max(spent, 0), max(abandoned, 0)
	return float64(spent+convPrior) / float64(spent+abandoned+convPrior)
}

// conversionLimit is the most admitted-but-unused buyers for left tickets
// when each buys with probability c, so that those expected to meet sold
// out are at most share of every buyer admitted: before the ones unused
// now (done: those who bought or walked away) and the unused themselves.
// Only the buyers unused when the last ticket sells can meet sold out, so
// the budget is the whole line's: the last tickets may go to a few more
// buyers than there are tickets, where a budget of the unused alone would
// let them out one window at a time.
func conversionLimit(left, done int64, c, share float64) int64 {
	if left <= 0 || share <= 0 || c <= 0 {
		return max(left, 0)
	}
	c = min(c, 1)
	done = max(done, 0)
	ok := func(u int64) bool { return excess(u, left, c) <= share*float64(done+u) }
	// excess/u grows with u: search between left (always fine) and the
	// first u found too many.
	lo, hi := left, left
	for ok(hi) {
		lo = hi
		hi = hi*2 + 1
		if hi > 1<<31 {
			return lo
		}
	}
	for hi-lo > 1 {
		m := lo + (hi-lo)/2
		if ok(m) {
			lo = m
		} else {
			hi = m
		}
	}
	return lo
}

// excess is E[max(0, B - left)] for B ~ Binomial(u, c): exactly up to
// exactUpTo buyers, by the normal approximation past them.
func excess(u, left int64, c float64) float64 {
	if u <= left {
		return 0
	}
	if c >= 1 {
		return float64(u - left)
	}
	if u > exactUpTo {
		mu, sd := float64(u)*c, math.Sqrt(float64(u)*c*(1-c))
		z := (float64(left) + 0.5 - mu) / sd
		phi := math.Exp(-z*z/2) / math.Sqrt(2*math.Pi)
		tail := 0.5 * math.Erfc(z/math.Sqrt2)
		return max(sd*phi+(mu-float64(left)-0.5)*tail, 0)
	}
	lu, _ := math.Lgamma(float64(u) + 1)
	lc, l1c := math.Log(c), math.Log1p(-c)
	var e float64
	for k := left + 1; k <= u; k++ {
		lk, _ := math.Lgamma(float64(k) + 1)
		lr, _ := math.Lgamma(float64(u-k) + 1)
		e += float64(k-left) * math.Exp(lu-lk-lr+float64(k)*lc+float64(u-k)*l1c)
	}
	return e
}

// exactUpTo bounds the exact sum: past it the normal approximation is
// within a buyer of it.
const exactUpTo = 2000

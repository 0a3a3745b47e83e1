package waitroom

import (
	"math"
	"time"
)

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

// convTrack estimates a line's conversion from its latest buyers as well
// as all of them. A line's buyers can change mid-sale (the curious first,
// then the fans), and the whole line's outcomes lag such a change by a
// window at least, since a walk-away is known only when its window ends:
// a line going from 60 % to all buying was let in as if 60 %, and 7 % of
// the admitted met sold out where 5 % were allowed (the model in
// TestPacerStaysWithinItsSoldOutShare). The latest buyers' share who
// bought already is known sooner: of those let in over about the last
// window, all but the unused have bought, and the unused may still buy, so
// that share is a floor under their conversion. So is the share who
// bought of each cohort the step counts (let in within the window, at
// least an eighth, a quarter, half of it ago), and theirs is the closer
// one, since most who buy have bought by then: with them the line above
// had 5.1 % meet sold out. The pacer admits by the highest, which lets in
// fewest. A line whose buyers buy less than before is then let in as if
// they bought as much: slower, never past the share.
type convTrack struct {
	snaps []convSnap // oldest first; the first at least a span old once there is one
}

type convSnap struct {
	at      time.Time
	serving int64
}

// convSnaps bounds the snapshots a convTrack keeps per span.
const convSnaps = 256

// estimate records the serving counter at now and returns the conversion
// to admit by, from the outcomes known (spent bought, abandoned walked
// away), the admitted within their window who have not bought (unused),
// and the step's cohorts.
func (t *convTrack) estimate(now time.Time, span time.Duration, serving, unused, spent, abandoned int64, cohorts ...Cohort) float64 {
	all := conversion(spent, abandoned)
	for _, c := range cohorts {
		if c.Size >= convPrior {
			all = max(all, float64(min(c.Bought, c.Size))/float64(c.Size))
		}
	}
	if serving < 0 {
		return all // a pacer that has not looked yet: -1 is no count
	}
	if n := len(t.snaps); n > 0 && serving < t.snaps[n-1].serving {
		t.snaps = t.snaps[:0] // a line made again: its counts start over
	}
	// At most about convSnaps a span: a room's window may be a day, and
	// the pacer steps five times a second.
	if n := len(t.snaps); n == 0 || t.snaps[n-1].serving != serving && now.Sub(t.snaps[n-1].at) >= span/convSnaps {
		t.snaps = append(t.snaps, convSnap{at: now, serving: serving})
	}
	// Keep one snapshot at least span old, and none older.
	drop := 0
	for drop+1 < len(t.snaps) && now.Sub(t.snaps[drop+1].at) >= span {
		drop++
	}
	t.snaps = t.snaps[drop:]
	// Too few let in lately to say anything the prior does not.
	latest := serving - t.snaps[0].serving
	if latest < convPrior {
		return all
	}
	return max(all, float64(latest-min(unused, latest))/float64(latest))
}

// conversionLimit is the most admitted-but-unused buyers for left tickets
// when each buys with probability c, so that those who would meet sold
// out stay within share of every buyer admitted (done: those who bought
// or walked away before, and the unused themselves) in all but about one
// sale in a hundred: their expected number plus soldOutMargin standard
// deviations. Only the buyers unused when the last ticket sells can meet
// sold out, and the pacer spends the line's whole budget on them, so a
// bound on the expectation alone is passed by every other sale: at 30 %
// walking away, 5.6 % of the admitted met sold out over four on-sales of
// 500 tickets, with 5 % allowed. The budget is the whole line's: the last
// tickets may go to a few more buyers than there are tickets, where a
// budget of the unused alone would let them out one window at a time.
func conversionLimit(left, done int64, c, share float64) int64 {
	if left <= 0 || share <= 0 || c <= 0 {
		return max(left, 0)
	}
	c = min(c, 1)
	done = max(done, 0)
	ok := func(u int64) bool {
		mean, sd := excess(u, left, c)
		return mean+soldOutMargin*sd <= share*float64(done+u)
	}
	// The excess grows faster than the budget with u: search between
	// left (always fine) and the first u found too many.
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

// soldOutMargin is how many standard deviations of the buyers who would
// meet sold out the pacer keeps below its budget: 2.326, one-sided 99 %
// were their number normal. At 1.645 (95 %) one model sale in 20 at 90 %
// buying passed the share; at 2.326 none of the model's does, at a cost
// of 0.4-3 % in time to sell out (TestPacerStaysWithinItsSoldOutShare).
const soldOutMargin = 2.326

// excess is the mean and standard deviation of max(0, B - left) for B ~
// Binomial(u, c): exactly up to exactUpTo buyers, by the normal
// approximation past them.
func excess(u, left int64, c float64) (mean, sd float64) {
	if u <= left {
		return 0, 0
	}
	if c >= 1 {
		return float64(u - left), 0
	}
	var m1, m2 float64
	if u > exactUpTo {
		mu, sigma := float64(u)*c, math.Sqrt(float64(u)*c*(1-c))
		d := mu - float64(left) - 0.5
		z := -d / sigma
		phi := math.Exp(-z*z/2) / math.Sqrt(2*math.Pi)
		tail := 0.5 * math.Erfc(z/math.Sqrt2)
		m1 = max(sigma*phi+d*tail, 0)
		m2 = max((sigma*sigma+d*d)*tail+d*sigma*phi, 0)
	} else {
		lu, _ := math.Lgamma(float64(u) + 1)
		lc, l1c := math.Log(c), math.Log1p(-c)
		for k := left + 1; k <= u; k++ {
			lk, _ := math.Lgamma(float64(k) + 1)
			lr, _ := math.Lgamma(float64(u-k) + 1)
			pk := math.Exp(lu - lk - lr + float64(k)*lc + float64(u-k)*l1c)
			x := float64(k - left)
			m1 += x * pk
			m2 += x * x * pk
		}
	}
	return m1, math.Sqrt(max(m2-m1*m1, 0))
}

// exactUpTo bounds the exact sum: past it the normal approximation is
// within a buyer of it.
const exactUpTo = 2000

package waitroom

import (
	"math/rand/v2"
	"testing"
)

// The limit admits no more than the tickets left at share 0 or with
// nothing known; past them, as far as the expected buyers who would meet
// sold out stay within the share, and not one more.
func TestConversionLimit(t *testing.T) {
	for _, tc := range []struct {
		left, done int64
		c, share   float64
		want       int64
	}{
		{0, 0, 0.5, 0.05, 0},
		{10, 0, 0.5, 0, 10},
		{1, 0, 0.7, 0.05, 1},     // the first ticket: two admitted would meet it 49 % of the time
		{1, 1000, 0.7, 0.05, 78}, // the last of a thousand: the line's budget lets 78 try
		{20, 0, 1, 0.05, 21},     // everyone buys: 1 of 21 meets sold out
		{1000, 0, 1, 0.05, 1052}, // 52 of 1,052 is under 5 %
	} {
		if got := conversionLimit(tc.left, tc.done, tc.c, tc.share); got != tc.want {
			t.Errorf("conversionLimit(%d, %d, %v, %v) = %d, want %d", tc.left, tc.done, tc.c, tc.share, got, tc.want)
		}
	}
	for _, left := range []int64{3, 50, 1000, 5000} {
		for _, c := range []float64{0.3, 0.7, 0.95} {
			u := conversionLimit(left, 0, c, 0.05)
			if excess(u, left, c) > 0.05*float64(u) || excess(u+1, left, c) <= 0.05*float64(u+1) {
				t.Errorf("conversionLimit(%d, %v) = %d: not the most within the share", left, c, u)
			}
			if u < left {
				t.Errorf("conversionLimit(%d, %v) = %d: under the tickets left", left, c, u)
			}
		}
	}
	// The exact sum and the normal approximation meet at exactUpTo.
	a, b := excess(exactUpTo, 1380, 0.7), excess(exactUpTo+1, 1380, 0.7)
	if d := b - a; d < 0 || d > 1 {
		t.Errorf("excess jumps %v at the approximation's edge (%v, %v)", d, a, b)
	}
}

// sim is a sale through a room in whole seconds: each admitted buyer buys
// with probability p a few seconds after admission, or walks away and holds
// its place for the window; the pacer admits at most rate a second under
// the rule's limit, from the outcomes it has seen.
func sim(seed uint64, tickets int64, p, share float64) (seconds int, admitted, metSoldOut int64) {
	const window, rate = 60, 1000
	rng := rand.New(rand.NewPCG(seed, 7))
	type adm struct {
		at, buysAt int // buysAt -1: walks away
	}
	var line []adm
	sold := int64(0)
	for now := 0; sold < tickets && now < 3600; now++ {
		// Purchases due now.
		for i := range line {
			if line[i].buysAt == now {
				if sold < tickets {
					sold++
				} else {
					metSoldOut++
				}
			}
		}
		var unused, spent, abandoned int64
		for _, a := range line {
			switch {
			case a.buysAt >= 0 && a.buysAt <= now:
				spent++
			case now-a.at >= window:
				abandoned++
			default:
				unused++
			}
		}
		left := tickets - sold
		limit := left
		if share > 0 {
			limit = max(limit, conversionLimit(left, spent+abandoned, conversion(spent, abandoned), share))
		}
		for n := min(limit-unused, rate); n > 0; n-- {
			a := adm{at: now, buysAt: -1}
			if rng.Float64() < p {
				a.buysAt = now + 1 + rng.IntN(20)
			}
			line = append(line, a)
		}
		seconds = now
	}
	return seconds, int64(len(line)), metSoldOut
}

// A model of the pacer with random walk-aways: at share 0 nobody admitted
// meets sold out; at 5 % the share who do stays within it on average over
// the runs (and each run within twice it), and the sale ends sooner.
func TestPacerStaysWithinItsSoldOutShare(t *testing.T) {
	for _, p := range []float64{0.9, 0.7, 0.4} {
		var met, adm int64
		var slow, fast int
		for seed := range uint64(20) {
			s0, _, m0 := sim(seed, 1000, p, 0)
			if m0 != 0 {
				t.Fatalf("p %v seed %d: share 0, yet %d met sold out", p, seed, m0)
			}
			s5, a5, m5 := sim(seed, 1000, p, 0.05)
			if float64(m5) > 0.1*float64(a5) {
				t.Errorf("p %v seed %d: %d of %d admitted met sold out", p, seed, m5, a5)
			}
			met, adm, slow, fast = met+m5, adm+a5, slow+s0, fast+s5
		}
		share := float64(met) / float64(adm)
		t.Logf("buy rate %.0f %%: %.2f %% of admitted met sold out; sold out in %.1f s on average, against %.1f s at share 0",
			100*p, 100*share, float64(fast)/20, float64(slow)/20)
		if share > 0.05 {
			t.Errorf("buy rate %v: %.3f of admitted met sold out, over the 5 %% share", p, share)
		}
		if fast >= slow {
			t.Errorf("buy rate %v: sold out in %d s with the share, %d s without", p, fast, slow)
		}
	}
}

package waitroom

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

func powRoom(program, secret string) room {
	return roomOf(ledger.QueueConfig{Program: keys.MustID(program), Secret: secret, PowBits: 8})
}

// failingNonce is a nonce that does not solve challenge at bits.
func failingNonce(challenge string, bits int) string {
	for n := 0; ; n++ {
		if s := strconv.Itoa(n); leadingZeros(challenge, s) < bits {
			return s
		}
	}
}

// A solved puzzle lets its buyer in; anything else is refused with why:
// a forged or altered challenge, another buyer's or another program's, an
// expired one, one easier than the room asks now, a nonce that does not
// solve it, an empty or overlong one.
func TestPowProofChecks(t *testing.T) {
	ctx := context.Background()
	c := powRoom("show", "aa11")
	ann, bob := keys.MustID("ann"), keys.MustID("bob")
	now := time.Now()
	pz := c.puzzle(ann, 10, now)
	if pz.Bits != 10 || !pz.ExpiresAt.After(now) {
		t.Fatalf("puzzle = %+v", pz)
	}
	nonce, err := Solve(ctx, pz)
	if err != nil {
		t.Fatal(err)
	}
	if why := c.checkProof(ann, Proof{pz.Challenge, nonce}, 8, now); why != "" {
		t.Fatalf("a solved puzzle: %s", why)
	}
	// The same proof again (a join repeated): still good while it lasts.
	if why := c.checkProof(ann, Proof{pz.Challenge, nonce}, 8, now.Add(time.Minute)); why != "" {
		t.Fatalf("a solved puzzle a minute later: %s", why)
	}

	other := powRoom("show", "bb22")         // the same program, another room's secret
	sameKey := powRoom("other-show", "aa11") // another program under the same secret
	altered := strings.Replace(pz.Challenge, ".10.", ".20.", 1)
	cases := []struct {
		name  string
		c     room
		buyer keys.ID
		p     Proof
		least int
		at    time.Time
		want  string
	}{
		{"another room's secret", other, ann, Proof{pz.Challenge, nonce}, 8, now, "not a challenge"},
		{"difficulty altered", c, ann, Proof{altered, nonce}, 8, now, "not a challenge"},
		{"not a challenge", c, ann, Proof{"pw1.x", nonce}, 8, now, "not a challenge"},
		{"another buyer", c, bob, Proof{pz.Challenge, nonce}, 8, now, "another buyer"},
		{"another program", sameKey, ann, Proof{pz.Challenge, nonce}, 8, now, "another buyer or program"},
		{"expired", c, ann, Proof{pz.Challenge, nonce}, 8, now.Add(powLife + time.Second), "expired"},
		{"easier than asked now", c, ann, Proof{pz.Challenge, nonce}, 12, now, "easier"},
		{"wrong nonce", c, ann, Proof{pz.Challenge, failingNonce(pz.Challenge, 10)}, 8, now, "does not solve"},
		{"no nonce", c, ann, Proof{pz.Challenge, ""}, 8, now, "1..64"},
		{"overlong nonce", c, ann, Proof{pz.Challenge, strings.Repeat("1", 65)}, 8, now, "1..64"},
	}
	for _, tc := range cases {
		if why := tc.c.checkProof(tc.buyer, tc.p, tc.least, tc.at); !strings.Contains(why, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, why, tc.want)
		}
	}
}

// The difficulty rises one bit per doubling of a network's joins past the
// free ones, to a bound; addresses count by network; the count slides.
func TestPowDifficultyFollowsTheNetworksJoins(t *testing.T) {
	for joins, want := range map[int64]int{1: 0, netFree: 0, netFree + 1: 1, 2 * netFree: 1, 2*netFree + 1: 2, 1 << 40: netMaxExtra} {
		if got := extraBits(joins); got != want {
			t.Errorf("extraBits(%d) = %d, want %d", joins, got, want)
		}
	}
	for addr, want := range map[string]string{
		"192.0.2.17": "192.0.2.0/24", "::ffff:192.0.2.200": "192.0.2.0/24",
		"2001:db8:1:2::5": "2001:db8:1::/48", "not-an-ip": "not-an-ip",
	} {
		if got := networkOf(addr); got != want {
			t.Errorf("networkOf(%s) = %s, want %s", addr, got, want)
		}
	}
	m := newNetMeter()
	now := time.Now()
	var n int64
	for range 100 {
		n = m.add("192.0.2.0/24", now)
	}
	if n != 100 || m.add("198.51.100.0/24", now) != 1 {
		t.Fatalf("joins counted = %d, want 100 (and 1 for another network)", n)
	}
	// Half a window on, the first half still counts in full (the window
	// covers it all); three quarters on, half of it; after a quiet window,
	// none.
	if got := m.add("192.0.2.0/24", now.Add(netWindow/2)); got != 101 {
		t.Errorf("half a window on: %d, want 101", got)
	}
	if got := m.add("192.0.2.0/24", now.Add(3*netWindow/4)); got != 52 {
		t.Errorf("three quarters of a window on: %d, want 52", got)
	}
	if got := m.add("192.0.2.0/24", now.Add(3*netWindow)); got != 1 {
		t.Errorf("after a quiet window: %d, want 1", got)
	}
	// count reads without counting, as add would.
	if got := m.count("192.0.2.0/24", now.Add(3*netWindow)); got != 1 {
		t.Errorf("count = %d, want 1", got)
	}
	if got := m.count("203.0.113.0/24", now); got != 0 {
		t.Errorf("count of a network never seen = %d", got)
	}
	// A network's joins never push a puzzle past MaxPowBits (its expected
	// work would outlive it), unless the room asks for that much itself.
	if got := powBits(20, 1<<40); got != MaxPowBits {
		t.Errorf("powBits(20, many) = %d, want %d", got, MaxPowBits)
	}
	if got := powBits(8, 1<<40); got != 8+netMaxExtra {
		t.Errorf("powBits(8, many) = %d, want %d", got, 8+netMaxExtra)
	}
	if got := powBits(MaxPowBits, 0); got != MaxPowBits {
		t.Errorf("powBits(max, 0) = %d", got)
	}
}

// What a join's proof costs the gateway to check, against what a puzzle
// costs to solve (2^bits hashes on average): `go test -run XXX -bench MicroPow
// ./waitroom`.
func BenchmarkMicroPowVerify(b *testing.B) {
	c := powRoom("show", "aa11")
	ann := keys.MustID("ann")
	now := time.Now()
	pz := c.puzzle(ann, 12, now)
	nonce, err := Solve(context.Background(), pz)
	if err != nil {
		b.Fatal(err)
	}
	p := Proof{pz.Challenge, nonce}
	b.ReportAllocs()
	for b.Loop() {
		if why := c.checkProof(ann, p, 12, now); why != "" {
			b.Fatal(why)
		}
	}
}

// BenchmarkMicroPowHash is one try of a solver: a bot's cost per place is
// 2^bits of these.
func BenchmarkMicroPowHash(b *testing.B) {
	c := powRoom("show", "aa11")
	pz := c.puzzle(keys.MustID("ann"), 12, time.Now())
	n := 0
	for b.Loop() {
		leadingZeros(pz.Challenge, strconv.Itoa(n))
		n++
	}
}

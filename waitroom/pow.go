package waitroom

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"math"
	"math/bits"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/maypok86/otter/v2"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// Proof of work at the door. A room with a difficulty (QueueConfig.PowBits)
// takes a join only with a solved puzzle: a challenge the gateway signed
// for that program and buyer, and a nonce such that
//
//	SHA-256(challenge + ":" + nonce)
//
// starts with at least the challenge's number of zero bits. A join without
// one (or with a wrong, expired or foreign one) is refused with a new
// puzzle, which the waiting room's page solves in a web worker. Nothing is
// stored: the challenge carries what it is for, its difficulty and its
// expiry, under the room's secret, so any replica verifies it with two
// hashes. A bot farm pays 2^bits hashes per place: one solution serves one
// buyer of one program.
//
// The difficulty rises with the join rate of the caller's network (an IPv4
// /24, an IPv6 /48, as the gateway sees the client): one bit per doubling
// past netFree joins in netWindow, at most netMaxExtra bits more and never
// past MaxPowBits. Only joins that brought a valid proof count: each cost
// its sender the work, so asking for puzzles without solving them (free)
// cannot make a neighbour's harder. Counted per replica: behind a load
// balancer that spreads one network over n replicas, each sees 1/n of it.

const (
	// powLife is how long a puzzle may be solved and used.
	powLife = 2 * time.Minute
	// netWindow and netFree: a network's joins in netWindow past netFree
	// raise its puzzles' difficulty.
	netWindow   = 10 * time.Second
	netFree     = 32
	netMaxExtra = 8
	// maxNonce bounds a nonce's length (a decimal counter needs 20).
	maxNonce = 64
)

// MaxPowBits bounds a room's proof of work.
const MaxPowBits = ledger.MaxPowBits

// PowAlgorithm names the puzzle, as the API tells it.
const PowAlgorithm = "sha-256-leading-zero-bits"

// Puzzle is what a join must solve.
type Puzzle struct {
	Challenge string
	Bits      int
	ExpiresAt time.Time
}

// Proof is a solved puzzle, as the join sends it.
type Proof struct {
	Challenge string
	Nonce     string
}

// PuzzleError is a join refused for its proof: ErrProofRequired or
// ErrProofInvalid, with the puzzle to solve.
type PuzzleError struct {
	err    error
	Puzzle Puzzle
}

func (e *PuzzleError) Error() string { return e.err.Error() }
func (e *PuzzleError) Unwrap() error { return e.err }

// puzzle signs a new puzzle of bits for buyer in c's program.
func (c room) puzzle(buyer keys.ID, bits int, now time.Time) Puzzle {
	var salt [8]byte
	_, _ = rand.Read(salt[:]) // never fails (crypto/rand)
	exp := now.Add(powLife).Truncate(time.Millisecond)
	body := "pw1." + c.Program.String() + "." + buyer.String() + "." + strconv.Itoa(bits) + "." +
		strconv.FormatInt(exp.UnixMilli(), 10) + "." + hex.EncodeToString(salt[:])
	return Puzzle{Challenge: body + "." + c.powMAC(body), Bits: bits, ExpiresAt: exp}
}

// powMAC is the challenge body's signature under the room's secret (apart
// from its tickets' by the "pow" prefix).
func (c room) powMAC(body string) string {
	sum := c.sign.sum(nil, []byte("pow\x00"), []byte(body))
	return hex.EncodeToString(sum[:16])
}

// checkProof reports why p does not let buyer join c's room at now ("":
// it does); least is the fewest bits a challenge may ask (the room's setting).
func (c room) checkProof(buyer keys.ID, p Proof, least int, now time.Time) string {
	parts := strings.Split(p.Challenge, ".")
	if len(parts) != 7 || parts[0] != "pw1" {
		return "not a challenge of this waiting room"
	}
	body := p.Challenge[:len(p.Challenge)-len(parts[6])-1]
	if !hmac.Equal([]byte(parts[6]), []byte(c.powMAC(body))) {
		return "not a challenge of this waiting room"
	}
	if parts[1] != c.Program.String() || parts[2] != buyer.String() {
		return "the challenge was given to another buyer or program"
	}
	n, err := strconv.Atoi(parts[3])
	if err != nil || n < least {
		return "the challenge is easier than this waiting room asks now"
	}
	exp, err := strconv.ParseInt(parts[4], 10, 64)
	if err != nil || now.UnixMilli() > exp {
		return "the challenge has expired"
	}
	if p.Nonce == "" || utf8.RuneCountInString(p.Nonce) > maxNonce {
		return "the nonce must be 1.." + strconv.Itoa(maxNonce) + " characters"
	}
	if leadingZeros(p.Challenge, p.Nonce) < n {
		return "the nonce does not solve the challenge"
	}
	return ""
}

// leadingZeros is the number of leading zero bits of
// SHA-256(challenge + ":" + nonce).
func leadingZeros(challenge, nonce string) int {
	h := sha256.New()
	h.Write([]byte(challenge))
	h.Write([]byte{':'})
	h.Write([]byte(nonce))
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	z := 0
	for _, b := range sum {
		if b != 0 {
			return z + bits.LeadingZeros8(b)
		}
		z += 8
	}
	return z
}

// Solve finds a nonce for pz by counting: what a client does (the page does
// the same in a web worker). It gives up when ctx is done.
func Solve(ctx context.Context, pz Puzzle) (string, error) {
	for n := uint64(0); ; n++ {
		if n&0xffff == 0 && ctx.Err() != nil {
			return "", ctx.Err()
		}
		nonce := strconv.FormatUint(n, 10)
		if Solves(pz, nonce) {
			return nonce, nil
		}
	}
}

// netMeter counts joins per network over a sliding window of two halves,
// in memory bounded by otter's size limit.
type netMeter struct {
	nets *otter.Cache[string, *netCount]
}

type netCount struct {
	start atomic.Int64 // the current half's start, unix ms
	cur   atomic.Int64
	prev  atomic.Int64
}

func newNetMeter() *netMeter {
	return &netMeter{nets: otter.Must(&otter.Options[string, *netCount]{
		MaximumSize:      100_000,
		ExpiryCalculator: otter.ExpiryAccessing[string, *netCount](2 * netWindow),
	})}
}

// count is network's joins over the last netWindow, as of now.
func (m *netMeter) count(network string, now time.Time) int64 {
	c, ok := m.nets.GetIfPresent(network)
	if !ok {
		return 0
	}
	half := (netWindow / 2).Milliseconds()
	elapsed := now.UnixMilli() - c.start.Load()
	switch {
	case elapsed >= 2*half:
		return 0
	case elapsed >= half:
		return c.cur.Load() // as add counts it when it starts the next half
	}
	return c.cur.Load() + int64(float64(c.prev.Load())*max(1-float64(elapsed)/float64(half), 0))
}

// add counts one join from network at now and returns the network's joins
// over the last netWindow, this one included.
func (m *netMeter) add(network string, now time.Time) int64 {
	c, _ := m.nets.Get(context.Background(), network, otter.LoaderFunc[string, *netCount](
		func(context.Context, string) (*netCount, error) {
			n := &netCount{}
			n.start.Store(now.UnixMilli())
			return n, nil
		}))
	half := (netWindow / 2).Milliseconds()
	ms := now.UnixMilli()
	for {
		s := c.start.Load()
		if ms-s < half {
			break
		}
		if c.start.CompareAndSwap(s, ms) {
			// A new half: the old one's count becomes the previous, or
			// nothing when more than a half passed without a join.
			old := c.cur.Swap(0)
			if ms-s >= 2*half {
				old = 0
			}
			c.prev.Store(old)
			break
		}
	}
	cur := c.cur.Add(1)
	// The previous half weighted by how much of it the window still covers.
	frac := 1 - float64(ms-c.start.Load())/float64(half)
	return cur + int64(float64(c.prev.Load())*max(frac, 0))
}

// powBits is the difficulty of a puzzle for a room asking base bits, given
// its asker's network's joins.
func powBits(base int, joins int64) int {
	return min(base+extraBits(joins), max(base, MaxPowBits))
}

// extraBits is the difficulty a network's joins add: one bit per doubling
// past netFree.
func extraBits(joins int64) int {
	if joins <= netFree {
		return 0
	}
	return min(int(math.Ceil(math.Log2(float64(joins)/netFree))), netMaxExtra)
}

// networkOf is the network a client address counts under: an IPv4 /24, an
// IPv6 /48, or the string itself when it is not an address.
func networkOf(client string) string {
	a, err := netip.ParseAddr(client)
	if err != nil {
		return client
	}
	a = a.Unmap()
	bits := 48
	if a.Is4() {
		bits = 24
	}
	p, _ := a.Prefix(bits)
	return p.String()
}

// Solves reports whether nonce solves pz.
func Solves(pz Puzzle, nonce string) bool { return leadingZeros(pz.Challenge, nonce) >= pz.Bits }

// Package queue keeps a program's waiting room in Redis: each buyer's one
// place in line, the serving counter the pacer moves on, and the spent
// admission tokens. It signs the queue tickets and admission tokens that
// let a replica answer "where am I?" from memory, with no Redis call.
//
// A buyer who joins before the opening gets a place in a random order,
// fixed at the opening (a keyed permutation of the early joins: nobody
// gains by joining first or by joining many times); one who joins after
// it comes after every early buyer, in the order of arrival. A place p is
// admitted once the serving counter reaches p.
package queue

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/lua"
)

// Errors of spending an admission token.
var (
	ErrSpent       = errors.New("queue: admission spent by another request")
	ErrNotAdmitted = errors.New("queue: not admitted yet")
	ErrExpired     = errors.New("queue: admission window passed")
	ErrBadToken    = errors.New("queue: ticket or token not valid for this program")
)

// Place is a buyer's join: Early (before the opening, ordered at random at
// the opening) or not, and N, its number among the joins of its kind
// (from 1).
type Place struct {
	Early bool
	N     int64
}

// State is a line as Redis has it.
type State struct {
	// Early is how many joined before the opening; Opened is false until
	// the first join or pacer step at or after the opening fixes it.
	Early  int64
	Opened bool
	Late   int64 // joins after the opening
	// Serving: every place up to it is admitted.
	Serving   int64
	SoldOut   bool
	Unused    int64 // admitted within the window, token not spent
	Abandoned int64 // admitted before the window, token never spent
}

// Joined is how many buyers are in line (once opened; before, the early
// ones).
func (s State) Joined() int64 { return s.Early + s.Late }

// Store is the waiting rooms' Redis records.
type Store struct {
	rdb                  redis.UniversalClient
	join, advance, spend *redis.Script
}

// New returns a Store on the service's Redis.
func New(rdb redis.UniversalClient) *Store {
	return &Store{rdb: rdb, join: redis.NewScript(lua.QueueJoin), advance: redis.NewScript(lua.QueueAdvance),
		spend: redis.NewScript(lua.QueueSpend)}
}

// Join gives buyer its one place in program's line; again, the same place
// (joined false).
func (s *Store) Join(ctx context.Context, program, buyer keys.ID, now, opens time.Time) (Place, bool, error) {
	k := keys.Queue(program)
	v, err := s.join.Run(ctx, s.rdb, []string{k.Meta(), k.Who()}, buyer.String(), now.UnixMilli(), opens.UnixMilli()).Int64Slice()
	if err != nil {
		return Place{}, false, fmt.Errorf("queue: join: %w", err)
	}
	if len(v) != 3 || (v[0] != lua.OK && v[0] != lua.Already) {
		return Place{}, false, fmt.Errorf("queue: join: answer %v", v)
	}
	return Place{Early: v[1] == 0, N: v[2]}, v[0] == lua.OK, nil
}

// State reads program's line.
func (s *Store) State(ctx context.Context, program keys.ID) (State, error) {
	v, err := s.rdb.HMGet(ctx, keys.Queue(program).Meta(), "pre", "frozen", "post", "serving", "soldout", "unused", "abandoned").Result()
	if err != nil {
		return State{}, fmt.Errorf("queue: state: %w", err)
	}
	n := func(i int) int64 {
		str, _ := v[i].(string)
		x, _ := strconv.ParseInt(str, 10, 64)
		return x
	}
	st := State{Early: n(0), Late: n(2), Serving: n(3), SoldOut: n(4) == 1, Unused: n(5), Abandoned: n(6)}
	if v[1] != nil {
		st.Opened, st.Early = true, n(1)
	}
	return st, nil
}

// Step is what the pacer's step did.
type Step struct {
	Serving, Unused, Abandoned, Joined int64
}

// Advance admits up to most more buyers of program's line, keeping the
// admitted-but-unused at or under limit; soldOut closes the line.
func (s *Store) Advance(ctx context.Context, program keys.ID, now, opens time.Time, most, limit int64, window time.Duration, soldOut bool) (Step, error) {
	k := keys.Queue(program)
	out := 0
	if soldOut {
		out = 1
	}
	v, err := s.advance.Run(ctx, s.rdb, []string{k.Meta(), k.Batches(), k.BatchesByEnd(), k.Spent()},
		now.UnixMilli(), opens.UnixMilli(), max(most, 0), max(limit, 0), window.Milliseconds(), out).Int64Slice()
	if err != nil {
		return Step{}, fmt.Errorf("queue: advance: %w", err)
	}
	if len(v) != 5 || v[0] != lua.OK {
		return Step{}, fmt.Errorf("queue: advance: answer %v", v)
	}
	return Step{Serving: v[1], Unused: v[2], Abandoned: v[3], Joined: v[4]}, nil
}

// Spend spends the admission of position on request (a retry of the same
// request spends it again, harmlessly): ErrSpent when another request
// did, ErrNotAdmitted, ErrExpired when its window has passed.
func (s *Store) Spend(ctx context.Context, program keys.ID, position int64, request keys.ID, now time.Time, window time.Duration) error {
	k := keys.Queue(program)
	v, err := s.spend.Run(ctx, s.rdb, []string{k.Spent(), k.Claims(), k.BatchesByEnd()},
		position, request.String(), now.UnixMilli(), window.Milliseconds()).Int64Slice()
	if err != nil {
		return fmt.Errorf("queue: spend: %w", err)
	}
	switch {
	case len(v) == 0:
		return fmt.Errorf("queue: spend: empty answer")
	case v[0] == lua.OK:
		return nil
	case v[0] == lua.Empty:
		return ErrSpent
	case v[0] == lua.QueueNotAdmitted:
		return ErrNotAdmitted
	case v[0] == lua.QueueExpired:
		return ErrExpired
	}
	return fmt.Errorf("queue: spend: answer %v", v)
}

// Position is a place's position in line (from 1) once the line has
// opened with early joins before it: an early join's is its number
// permuted over the early ones, keyed by secret; a late one comes after
// them all.
func Position(secret []byte, p Place, early int64) int64 {
	if !p.Early {
		return early + p.N
	}
	if early <= 0 || p.N > early {
		return 0 // not opened yet, or not a place of this line
	}
	return 1 + int64(permute(secret, uint64(early), uint64(p.N-1)))
}

// permute is a bijection of [0, n) keyed by secret: a four-round Feistel
// network over the smallest even number of bits that holds n, walked
// again while it lands outside [0, n) (at most a few steps: the domain
// is under four times n).
func permute(secret []byte, n, x uint64) uint64 {
	if n <= 1 {
		return 0
	}
	b := bits.Len64(n - 1)
	if b%2 == 1 {
		b++
	}
	half := uint(b / 2)
	mask := uint64(1)<<half - 1
	for {
		l, r := x>>half, x&mask
		for round := range 4 {
			mac := hmac.New(sha256.New, secret)
			var buf [9]byte
			buf[0] = byte(round)
			binary.BigEndian.PutUint64(buf[1:], r)
			mac.Write(buf[:])
			f := binary.BigEndian.Uint64(mac.Sum(nil)) & mask
			l, r = r, l^f
		}
		x = l<<half | r
		if x < n {
			return x
		}
	}
}

// signed is text and its signature under secret, for tickets and tokens.
func signed(secret []byte, kind, text string) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(kind + "|" + text))
	return text + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil)[:18])
}

// verify returns the fields of a signed text of kind, or ErrBadToken.
func verify(secret []byte, kind, token string, fields int) ([]string, error) {
	i := strings.LastIndexByte(token, '.')
	if i < 0 || len(token) > 512 {
		return nil, ErrBadToken
	}
	want := signed(secret, kind, token[:i])
	if !hmac.Equal([]byte(want), []byte(token)) {
		return nil, ErrBadToken
	}
	f := strings.Split(token[:i], ".")
	if len(f) != fields {
		return nil, ErrBadToken
	}
	return f, nil
}

// Ticket is the signed queue ticket of buyer's place in program's line:
// with it any replica answers where the buyer stands, from memory.
func Ticket(secret []byte, program, buyer keys.ID, p Place) string {
	kind := "late"
	if p.Early {
		kind = "early"
	}
	return signed(secret, "ticket", program.String()+"."+buyer.String()+"."+kind+"."+strconv.FormatInt(p.N, 10))
}

// ParseTicket checks a queue ticket of program and returns its buyer and
// place.
func ParseTicket(secret []byte, program keys.ID, ticket string) (keys.ID, Place, error) {
	f, err := verify(secret, "ticket", ticket, 4)
	if err != nil || f[0] != program.String() || f[2] != "early" && f[2] != "late" {
		return keys.ID{}, Place{}, ErrBadToken
	}
	buyer, err := keys.ParseID(f[1])
	n, nerr := strconv.ParseInt(f[3], 10, 64)
	if err != nil || nerr != nil || n < 1 {
		return keys.ID{}, Place{}, ErrBadToken
	}
	return buyer, Place{Early: f[2] == "early", N: n}, nil
}

// Admission is the signed token that lets buyer, admitted at position of
// program's line, buy: one order spends it.
func Admission(secret []byte, program, buyer keys.ID, position int64) string {
	return signed(secret, "admit", program.String()+"."+buyer.String()+"."+strconv.FormatInt(position, 10))
}

// ParseAdmission checks an admission token of program for buyer and
// returns its position.
func ParseAdmission(secret []byte, program, buyer keys.ID, token string) (int64, error) {
	f, err := verify(secret, "admit", token, 3)
	if err != nil || f[0] != program.String() || f[1] != buyer.String() {
		return 0, ErrBadToken
	}
	pos, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || pos < 1 {
		return 0, ErrBadToken
	}
	return pos, nil
}

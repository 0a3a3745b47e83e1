// Package waitroom is a program's waiting room: buyers join its line (one
// place each), a pacer on one replica at a time admits them in order as
// fast as the rate ceiling and the stock allow, and an admitted buyer's
// token lets one request through the door (Admit, then settle). The line
// lives in Redis (Store), its settings and the facts it is made again from
// in the ledger (Ledger).
//
// The Store keeps each buyer's one place in line, the serving counter the
// pacer moves on, and the spent admission tokens. It signs the queue
// tickets and admission tokens that let a replica answer "where am I?"
// from memory, with no Redis call.
//
// A buyer who joins before the opening gets a place in a random order,
// fixed at the opening (a keyed permutation of the early joins: nobody
// gains by joining first or by joining many times); one who joins after
// it comes after every early buyer, in the order of arrival. A place p is
// admitted once the serving counter reaches p.
package waitroom

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"math/bits"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/lua"
)

// Errors of the line and of spending an admission.
var (
	ErrSpent       = errors.New("waitroom: admission spent by another request")
	ErrNotAdmitted = errors.New("waitroom: not admitted yet")
	ErrExpired     = errors.New("waitroom: admission window passed")
	ErrBadToken    = errors.New("waitroom: ticket or token not valid for this program")
	// ErrLost: Redis has no record of the line (it is new, or Redis lost
	// it): Restore it from the ledger's facts, then try again.
	ErrLost = errors.New("waitroom: the line has no record in Redis")
	// ErrFull: every place of the kind the ledger reserved is given:
	// Reserve more, then join again.
	ErrFull = errors.New("waitroom: the reserved places are all given")
	// ErrMoved: Redis changed under the line (a failover promoted a
	// replica, or the master restarted from its files), so joins it
	// acknowledged may be gone: Resume it, then try again.
	ErrMoved = errors.New("waitroom: the line's Redis history changed")
)

// Place is a buyer's join: Early (before the opening, ordered at random at
// the opening) or not, N, its number among the joins of its kind (from
// 1), and At, when it joined (to the second).
type Place struct {
	Early bool
	N     int64
	At    time.Time
}

func (p Place) kind() int64 {
	if p.Early {
		return 0
	}
	return 1
}

// record is the place as the line's buyer record and a ticket hold it.
func (p Place) record() string {
	return strconv.FormatInt(p.kind(), 10) + ":" + strconv.FormatInt(p.N, 10) + ":" + strconv.FormatInt(p.At.Unix(), 10)
}

// State is a line as Redis has it.
type State struct {
	// Lost: Redis has no record of the line (new, or lost); the rest is
	// zero.
	Lost bool
	// Early is how many joined before the opening; Opened is false until
	// the first join or pacer step at or after the opening fixes it.
	Early  int64
	Opened bool
	Late   int64 // joins after the opening
	// Serving: every place up to it is admitted; those up to Old were
	// admitted longer ago than the window (as of the pacer's last step).
	Serving, Old int64
	SoldOut      bool
	Unused       int64 // admitted within the window, not spent
	Abandoned    int64 // admitted before the window, never spent
	// Perm: how many early places are drawn at random (0: all of them;
	// fewer after a loss before the opening).
	Perm int64
}

// Joined is how many buyers are in line (once opened; before, the early
// ones).
func (s State) Joined() int64 { return s.Early + s.Late }

// Store is the waiting rooms' Redis records.
type Store struct {
	rdb                                                           redis.UniversalClient
	join, advance, spend, settle, reserve, renew, respend, resume *redis.Script
}

// NewStore returns a Store on the service's Redis.
func NewStore(rdb redis.UniversalClient) *Store {
	return &Store{rdb: rdb, join: redis.NewScript(lua.QueueJoin), advance: redis.NewScript(lua.QueueAdvance),
		spend: redis.NewScript(lua.QueueSpend), settle: redis.NewScript(lua.QueueSettle),
		reserve: redis.NewScript(lua.QueueReserve), renew: redis.NewScript(lua.QueueRestore), respend: redis.NewScript(lua.QueueRespend),
		resume: redis.NewScript(lua.QueueResume)}
}

// Join gives buyer its one place in the line of program's room; again, the
// same place (joined false). had is the place of a ticket the buyer presents (nil:
// none): a buyer whose record Redis lost keeps it. ErrFull (with the kind
// of place wanted in Place.Early) or ErrLost: see them.
func (s *Store) Join(ctx context.Context, program, room, buyer keys.ID, now, opens time.Time, had *Place) (Place, bool, error) {
	k := keys.Queue(program)
	rec := ""
	if had != nil {
		rec = had.record()
	}
	v, err := s.join.Run(ctx, s.rdb, []string{k.Meta(), k.Who()}, buyer.String(), now.UnixMilli(), opens.UnixMilli(), rec, room.String()).Int64Slice()
	if err != nil {
		return Place{}, false, fmt.Errorf("waitroom: join: %w", err)
	}
	switch {
	case len(v) == 1 && v[0] == lua.QueueLost:
		return Place{}, false, ErrLost
	case len(v) == 1 && v[0] == lua.QueueMoved:
		return Place{}, false, ErrMoved
	case len(v) == 2 && v[0] == lua.QueueFull:
		return Place{Early: v[1] == 0}, false, ErrFull
	case len(v) != 4 || (v[0] != lua.OK && v[0] != lua.Already):
		return Place{}, false, fmt.Errorf("waitroom: join: answer %v", v)
	}
	return Place{Early: v[1] == 0, N: v[2], At: time.Unix(v[3], 0)}, v[0] == lua.OK, nil
}

// Reserve lets program's line hand out places of a kind (early or late)
// up to upTo, a count the ledger has reserved for it.
func (s *Store) Reserve(ctx context.Context, program, room keys.ID, early bool, upTo int64) error {
	kind := 1
	if early {
		kind = 0
	}
	v, err := s.reserve.Run(ctx, s.rdb, []string{keys.Queue(program).Meta()}, kind, upTo, room.String()).Int64Slice()
	switch {
	case err != nil:
		return fmt.Errorf("waitroom: reserve: %w", err)
	case len(v) == 1 && v[0] == lua.QueueLost:
		return ErrLost
	case len(v) != 1 || v[0] != lua.OK:
		return fmt.Errorf("waitroom: reserve: answer %v", v)
	}
	return nil
}

// Facts are what the ledger knows of a line, to make its record again.
type Facts struct {
	// Pre and Post are the early and late places the ledger ever reserved:
	// the restored line hands out places after them.
	Pre, Post int64
	// Opened, with its early count Early, once the ledger saw the opening.
	Opened bool
	Early  int64
	// Serving is the serving counter the ledger last saw; Old the last
	// place it saw admitted longer ago than the window.
	Serving, Old int64
	// GapLo..GapHi are late positions that may or may not have been given.
	GapLo, GapHi int64
	// Perm, for a line lost before its opening: only the first Perm early
	// places are drawn at random (0: all); EGapLo..EGapHi are the early
	// positions after them that may or may not have been given.
	Perm, EGapLo, EGapHi int64
}

// Restore makes the line of program's room from the ledger's facts when
// Redis has none, or another room's (which goes); false when it has this
// room's (nothing changed). Put the spent admissions back next (Respend).
func (s *Store) Restore(ctx context.Context, program, room keys.ID, f Facts, now time.Time, window time.Duration) (bool, error) {
	k := keys.Queue(program)
	opened := 0
	if f.Opened {
		opened = 1
	}
	v, err := s.renew.Run(ctx, s.rdb, []string{k.Meta(), k.Who(), k.Batches(), k.BatchesByEnd(), k.Spent(), k.Claims(), k.Flights(), k.Pending()},
		room.String(), f.Pre, opened, f.Early, f.Post, f.Serving, min(f.Old, f.Serving), f.GapLo, f.GapHi, now.UnixMilli(),
		window.Milliseconds(), f.Perm, f.EGapLo, f.EGapHi).Int64Slice()
	switch {
	case err != nil:
		return false, fmt.Errorf("waitroom: restore: %w", err)
	case len(v) != 1 || (v[0] != lua.OK && v[0] != lua.Already):
		return false, fmt.Errorf("waitroom: restore: answer %v", v)
	}
	return v[0] == lua.OK, nil
}

// Resume fences the line of program's room after Redis changed under it
// (ErrMoved): every place the ledger reserved (preCap early, postCap late)
// counts as given. It returns the early joins the line had and whether it
// had opened (fenced false: it was fenced already); ErrLost: restore it
// instead.
func (s *Store) Resume(ctx context.Context, program, room keys.ID, preCap, postCap int64) (early int64, opened, fenced bool, err error) {
	v, err := s.resume.Run(ctx, s.rdb, []string{keys.Queue(program).Meta()}, room.String(), preCap, postCap).Int64Slice()
	switch {
	case err != nil:
		return 0, false, false, fmt.Errorf("waitroom: resume: %w", err)
	case len(v) == 1 && v[0] == lua.QueueLost:
		return 0, false, false, ErrLost
	case len(v) == 1 && v[0] == lua.Already:
		return 0, false, false, nil
	case len(v) != 3 || v[0] != lua.OK:
		return 0, false, false, fmt.Errorf("waitroom: resume: answer %v", v)
	}
	return v[1], v[2] == 1, true, nil
}

// Spent is an admission spent, as Respend puts it back.
type Spent struct {
	Buyer    keys.ID
	Position int64
	Request  keys.ID
}

// Respend puts admissions spent back into program's restored line (a
// buyer Redis has a spend of keeps it).
func (s *Store) Respend(ctx context.Context, program keys.ID, spent []Spent) error {
	k := keys.Queue(program)
	for len(spent) > 0 {
		chunk := spent[:min(len(spent), 300)]
		spent = spent[len(chunk):]
		args := make([]any, 0, 3*len(chunk))
		for _, sp := range chunk {
			args = append(args, sp.Buyer.String(), sp.Position, sp.Request.String())
		}
		v, err := s.respend.Run(ctx, s.rdb, []string{k.Spent(), k.Claims()}, args...).Int64Slice()
		switch {
		case err != nil:
			return fmt.Errorf("waitroom: respend: %w", err)
		case len(v) != 2 || v[0] != lua.OK:
			return fmt.Errorf("waitroom: respend: answer %v", v)
		}
	}
	return nil
}

// State reads the line of program's room (Lost when Redis has none, or
// another room's).
func (s *Store) State(ctx context.Context, program, room keys.ID) (State, error) {
	v, err := s.rdb.HMGet(ctx, keys.Queue(program).Meta(), "line", "pre", "frozen", "post", "serving", "soldout", "unused", "abandoned", "old",
		"perm").Result()
	if err != nil {
		return State{}, fmt.Errorf("waitroom: state: %w", err)
	}
	if line, _ := v[0].(string); line != room.String() {
		return State{Lost: true}, nil
	}
	n := func(i int) int64 {
		str, _ := v[i].(string)
		x, _ := strconv.ParseInt(str, 10, 64)
		return x
	}
	st := State{Early: n(1), Late: n(3), Serving: n(4), SoldOut: n(5) == 1, Unused: n(6), Abandoned: n(7), Old: n(8), Perm: n(9)}
	if v[2] != nil {
		st.Opened, st.Early = true, n(2)
	}
	return st, nil
}

// Step is what the pacer's step did, and the line's counts after it.
type Step struct {
	Serving, Unused, Abandoned, Joined int64
	Opened                             bool
	Early, Late                        int64
	// Old is the last place admitted longer ago than the window.
	Old int64
	// Cohorts: the buyers admitted within the window at least an eighth,
	// a quarter and half of it ago, and how many of them bought.
	Cohorts [3]Cohort
}

// Cohort is a group of admitted buyers and how many of them bought.
type Cohort struct{ Size, Bought int64 }

// Advance admits up to most more buyers of program's line, keeping the
// admitted-but-unused (counted as at least floor) at or under limit;
// soldOut closes the line. ErrLost: see it.
func (s *Store) Advance(ctx context.Context, program, room keys.ID, now, opens time.Time, most, limit, floor int64, window time.Duration, soldOut bool) (Step, error) {
	k := keys.Queue(program)
	out := 0
	if soldOut {
		out = 1
	}
	v, err := s.advance.Run(ctx, s.rdb, []string{k.Meta(), k.Batches(), k.BatchesByEnd(), k.Spent(), k.Pending()},
		now.UnixMilli(), opens.UnixMilli(), max(most, 0), max(limit, 0), window.Milliseconds(), out, room.String(), max(floor, 0)).Int64Slice()
	switch {
	case err != nil:
		return Step{}, fmt.Errorf("waitroom: advance: %w", err)
	case len(v) == 1 && v[0] == lua.QueueLost:
		return Step{}, ErrLost
	case len(v) == 1 && v[0] == lua.QueueMoved:
		return Step{}, ErrMoved
	case len(v) != 9+2*len(Step{}.Cohorts) || v[0] != lua.OK:
		return Step{}, fmt.Errorf("waitroom: advance: answer %v", v)
	}
	st := Step{Serving: v[1], Unused: v[2], Abandoned: v[3], Joined: v[4], Opened: v[5] == 1, Early: v[6], Late: v[7], Old: v[8]}
	for i := range st.Cohorts {
		st.Cohorts[i] = Cohort{Size: v[9+2*i], Bought: v[10+2*i]}
	}
	return st, nil
}

// Spend spends buyer's admission, at position, on request (a retry of the
// same request spends it again, harmlessly): ErrSpent when another
// request did, ErrNotAdmitted, ErrExpired when its window has passed,
// ErrLost (restore the line, then spend again).
// first is true when this call spent it, with admitted the time the
// position was admitted.
func (s *Store) Spend(ctx context.Context, program, room keys.ID, position int64, buyer, request keys.ID, now time.Time, window time.Duration) (admitted time.Time, first bool, err error) {
	k := keys.Queue(program)
	v, err := s.spend.Run(ctx, s.rdb, []string{k.Spent(), k.Claims(), k.BatchesByEnd(), k.Meta(), k.Flights(), k.Pending()},
		position, buyer.String(), request.String(), now.UnixMilli(), window.Milliseconds(), room.String()).Int64Slice()
	if err != nil {
		return time.Time{}, false, fmt.Errorf("waitroom: spend: %w", err)
	}
	switch {
	case len(v) == 2 && v[0] == lua.OK:
		return time.UnixMilli(v[1]), true, nil
	case len(v) == 2 && v[0] == lua.Already:
		return time.Time{}, false, nil
	case len(v) == 1 && v[0] == lua.Empty:
		return time.Time{}, false, ErrSpent
	case len(v) == 1 && v[0] == lua.QueueNotAdmitted:
		return time.Time{}, false, ErrNotAdmitted
	case len(v) == 1 && v[0] == lua.QueueExpired:
		return time.Time{}, false, ErrExpired
	case len(v) == 1 && v[0] == lua.QueueLost:
		return time.Time{}, false, ErrLost
	}
	return time.Time{}, false, fmt.Errorf("waitroom: spend: answer %v", v)
}

// Outcome is how a request that spent an admission ended.
type Outcome int

// Outcomes of Settle.
const (
	Refused   Outcome = iota // refused having moved nothing: give it back
	Committed                // it stays spent
	Unknown                  // a failure: the client retries the request
	// Replayed: the request had committed before (a retry); Rooms.Admit's
	// settle tells which of the two below it is. Settle takes it as
	// Committed.
	Replayed
	// replayedBefore: a replay of a request that committed before this
	// admission was spent: no copy of it can buy with the admission.
	// Settle takes it as Refused.
	replayedBefore
)

// Settle ends request's use of buyer's admission. The admission goes back
// (true) only when the last copy of the request in flight ends Refused and
// none committed. ErrLost: Redis has no spend of the buyer's (the line
// was lost since): the ledger's record decides.
func (s *Store) Settle(ctx context.Context, program, buyer, request keys.ID, how Outcome) (bool, error) {
	k := keys.Queue(program)
	script := how
	switch how {
	case Replayed:
		script = Committed
	case replayedBefore:
		script = Refused
	}
	v, err := s.settle.Run(ctx, s.rdb, []string{k.Spent(), k.Claims(), k.Flights(), k.Pending()}, buyer.String(), request.String(), int(script)).Int64Slice()
	switch {
	case err != nil:
		return false, fmt.Errorf("waitroom: settle: %w", err)
	case len(v) == 1 && v[0] == lua.QueueUnclaimed:
		return false, ErrLost
	case len(v) != 1 || (v[0] != lua.OK && v[0] != lua.Empty):
		return false, fmt.Errorf("waitroom: settle: answer %v", v)
	}
	return v[0] == lua.OK, nil
}

// Signer signs and checks a waiting room's tickets and admission tokens,
// and draws its early places, under the room's secret. Its keyed hashes are
// pooled: a check costs no key schedule and little garbage. Safe for
// concurrent use.
type Signer struct{ macs sync.Pool }

// NewSigner returns the Signer of secret.
func NewSigner(secret []byte) *Signer {
	key := bytes.Clone(secret)
	s := &Signer{}
	s.macs.New = func() any { return hmac.New(sha256.New, key) }
	return s
}

// sum is the keyed hash of the parts, written one after another.
func (s *Signer) sum(dst []byte, parts ...[]byte) []byte {
	m := s.macs.Get().(hash.Hash)
	m.Reset()
	for _, p := range parts {
		m.Write(p)
	}
	dst = m.Sum(dst)
	s.macs.Put(m)
	return dst
}

// Position is a place's position in line (from 1) once the line has
// opened with early joins before it: an early join's is its number
// permuted over the first perm early ones (all of them when perm is 0),
// keyed by the secret, or its number past those; a late one comes after
// them all.
func (s *Signer) Position(p Place, early, perm int64) int64 {
	if !p.Early {
		return early + p.N
	}
	if early <= 0 || p.N > early {
		return 0 // not opened yet, or not a place of this line
	}
	if perm <= 0 || perm > early {
		perm = early
	}
	if p.N > perm {
		return p.N // joined when the line was made again before its opening
	}
	return 1 + int64(s.permute(uint64(perm), uint64(p.N-1)))
}

// permute is a bijection of [0, n) keyed by the secret: a four-round
// Feistel network over the smallest even number of bits that holds n,
// walked again while it lands outside [0, n) (at most a few steps: the
// domain is under four times n).
func (s *Signer) permute(n, x uint64) uint64 {
	if n <= 1 {
		return 0
	}
	b := bits.Len64(n - 1)
	if b%2 == 1 {
		b++
	}
	half := uint(b / 2)
	mask := uint64(1)<<half - 1
	var sum [sha256.Size]byte
	for {
		l, r := x>>half, x&mask
		for round := range 4 {
			var buf [9]byte
			buf[0] = byte(round)
			binary.BigEndian.PutUint64(buf[1:], r)
			f := binary.BigEndian.Uint64(s.sum(sum[:0], buf[:])) & mask
			l, r = r, l^f
		}
		x = l<<half | r
		if x < n {
			return x
		}
	}
}

// sigLen is the bytes of a signature kept (base64: 24 characters).
const sigLen = 18

// signed is text and its signature, for tickets and tokens of kind.
func (s *Signer) signed(kind, text string) string {
	var sum [sha256.Size]byte
	mac := s.sum(sum[:0], []byte(kind), []byte{'|'}, []byte(text))
	return text + "." + base64.RawURLEncoding.EncodeToString(mac[:sigLen])
}

// verify returns the fields of a signed text of kind, or ErrBadToken.
func (s *Signer) verify(kind, token string, fields int) ([]string, error) {
	i := strings.LastIndexByte(token, '.')
	if i < 0 || len(token) > 512 || len(token)-i-1 != base64.RawURLEncoding.EncodedLen(sigLen) {
		return nil, ErrBadToken
	}
	var got [sigLen]byte
	if n, err := base64.RawURLEncoding.Decode(got[:], []byte(token[i+1:])); err != nil || n != sigLen {
		return nil, ErrBadToken
	}
	var sum [sha256.Size]byte
	want := s.sum(sum[:0], []byte(kind), []byte{'|'}, []byte(token[:i]))
	if !hmac.Equal(want[:sigLen], got[:]) {
		return nil, ErrBadToken
	}
	f := strings.SplitN(token[:i], ".", fields+1)
	if len(f) != fields {
		return nil, ErrBadToken
	}
	return f, nil
}

// Ticket is the signed queue ticket of buyer's place in program's line:
// with it any replica answers where the buyer stands, from memory.
func (s *Signer) Ticket(program, buyer keys.ID, p Place) string {
	kind := "late"
	if p.Early {
		kind = "early"
	}
	return s.signed("ticket", program.String()+"."+buyer.String()+"."+kind+"."+strconv.FormatInt(p.N, 10)+"."+
		strconv.FormatInt(p.At.Unix(), 10))
}

// ParseTicket checks a queue ticket of program and returns its buyer and
// place.
func (s *Signer) ParseTicket(program keys.ID, ticket string) (keys.ID, Place, error) {
	f, err := s.verify("ticket", ticket, 5)
	if err != nil || f[0] != program.String() || f[2] != "early" && f[2] != "late" {
		return keys.ID{}, Place{}, ErrBadToken
	}
	buyer, err := keys.ParseID(f[1])
	n, nerr := strconv.ParseInt(f[3], 10, 64)
	at, aerr := strconv.ParseInt(f[4], 10, 64)
	if err != nil || nerr != nil || aerr != nil || n < 1 || n > maxPlace || at < 0 || at > maxUnix {
		return keys.ID{}, Place{}, ErrBadToken
	}
	return buyer, Place{Early: f[2] == "early", N: n, At: time.Unix(at, 0)}, nil
}

// Bounds of what a signed text may carry (the scripts' own bounds).
const (
	maxPlace = 999_999_999_999_999
	maxUnix  = 999_999_999_999
)

// Admission is the signed token that lets buyer, admitted at position of
// program's line (having joined at joined), buy: one order spends it.
func (s *Signer) Admission(program, buyer keys.ID, position int64, joined time.Time) string {
	return s.signed("admit", program.String()+"."+buyer.String()+"."+strconv.FormatInt(position, 10)+"."+
		strconv.FormatInt(joined.Unix(), 10))
}

// ParseAdmission checks an admission token of program for buyer and
// returns its position and when the buyer joined.
func (s *Signer) ParseAdmission(program, buyer keys.ID, token string) (int64, time.Time, error) {
	f, err := s.verify("admit", token, 4)
	if err != nil || f[0] != program.String() || f[1] != buyer.String() {
		return 0, time.Time{}, ErrBadToken
	}
	pos, err := strconv.ParseInt(f[2], 10, 64)
	at, aerr := strconv.ParseInt(f[3], 10, 64)
	if err != nil || aerr != nil || pos < 1 || pos > maxPlace || at < 0 || at > maxUnix {
		return 0, time.Time{}, ErrBadToken
	}
	return pos, time.Unix(at, 0), nil
}

// Position, Ticket, ParseTicket, Admission and ParseAdmission of a
// one-off Signer of secret (a caller with many checks keeps its Signer).

func Position(secret []byte, p Place, early int64) int64 {
	return NewSigner(secret).Position(p, early, 0)
}

func Ticket(secret []byte, program, buyer keys.ID, p Place) string {
	return NewSigner(secret).Ticket(program, buyer, p)
}

func ParseTicket(secret []byte, program keys.ID, ticket string) (keys.ID, Place, error) {
	return NewSigner(secret).ParseTicket(program, ticket)
}

func Admission(secret []byte, program, buyer keys.ID, position int64, joined time.Time) string {
	return NewSigner(secret).Admission(program, buyer, position, joined)
}

func ParseAdmission(secret []byte, program, buyer keys.ID, token string) (int64, time.Time, error) {
	return NewSigner(secret).ParseAdmission(program, buyer, token)
}

// Package shard runs a SKU's stock on Redis Cluster: the stock is split over
// N shards, each a hash in its own slot, and every change is one Lua call on
// one shard. Package keys names the keys; package lua holds the scripts.
package shard

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/breaker"
	"github.com/stockgate/stockgate/internal/opt"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/lua"
	"github.com/stockgate/stockgate/stock"
)

// errStranded marks a failed Deduct whose partial take could not be given
// back: stock moved, so the call did run.
var errStranded = errors.New("shard: partial take not given back")

// NotRun reports whether err shows that no script of the call took effect,
// so the request may safely go another way (the ledger) without a lookup:
// no connection could be made or borrowed, the node's breaker refused it
// (breaker.ErrOpen), the client is closed, or Redis
// answered with an error reply (CLUSTERDOWN, TRYAGAIN, LOADING, MOVED past
// the redirect limit) instead of running the script. A timeout or a broken
// connection after the command was written is not such an error: the
// script may have run, and only the request's deduction record can tell.
func NotRun(err error) bool {
	if err == nil || errors.Is(err, errStranded) {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	if errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed) || errors.Is(err, breaker.ErrOpen) {
		return true
	}
	var reply redis.Error
	return errors.As(err, &reply)
}

// Failed reports whether err is Redis failing rather than answering: a
// network or timeout error, a broken or closed connection, an exhausted
// pool, an error reply (CLUSTERDOWN, LOADING, …) or a script reply the Go
// side did not expect. Everything else a gate call returns (sold out, not
// seeded, fenced, a per-buyer limit, seats taken, bad input) is an answer
// from a working Redis. The breaker counts only failures.
func Failed(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	var reply redis.Error
	return errors.As(err, &ne) || errors.As(err, &reply) || errors.Is(err, ErrScript) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed) || errors.Is(err, errStranded)
}

// ErrScript reports a script answer the Go side did not expect: a bug or a
// server that is not the one we think, never a stock outcome.
var ErrScript = errors.New("shard: unexpected script reply")

// EmptyShards remembers shards recently found empty so a purchase can skip
// them without a round trip. Package cache provides one; nil remembers
// nothing.
type EmptyShards interface {
	IsEmpty(sku stock.SKU, n, i int) bool
	MarkEmpty(sku stock.SKU, n, i int)
	MarkStocked(sku stock.SKU, n, i int)
}

// Options configures a Store.
type Options struct {
	// Redis runs the scripts: a *redis.ClusterClient in production; any
	// redis.Scripter works. Required.
	Redis redis.Scripter
	// RecordTTL is how long a deduction record lives, and so how long a
	// re-sent deduct is recognised and a restore accepted. Default 24h;
	// at least MinRecordTTL.
	RecordTTL time.Duration
	// Empty is the known-empty shard memory. Optional.
	Empty EmptyShards
}

// Store is the Redis side of the stock.
type Store struct {
	rdb       redis.Scripter
	recordTTL string // milliseconds, as the scripts take it
	empty     EmptyShards
	seed      *redis.Script
	deduct    *redis.Script
	restore   *redis.Script
	refill    *redis.Script
	read      *redis.Script
	fence     *redis.Script
	quota     *redis.Script
	unquota   *redis.Script
	budget    *redis.Script
}

// MinRecordTTL is the shortest RecordTTL: a record must outlive a client's
// retries of its request.
const MinRecordTTL = time.Minute

// DefaultOptions are the settings a zero field takes.
func DefaultOptions() Options { return Options{RecordTTL: 24 * time.Hour} }

// Validate reports the first field that cannot work (an *opt.Error).
func (o Options) Validate() error {
	if o.RecordTTL != 0 && o.RecordTTL < MinRecordTTL {
		return opt.Bad("RecordTTL", "must be at least "+MinRecordTTL.String())
	}
	return nil
}

// New validates opts and returns a Store.
func New(opts Options) (*Store, error) {
	if opts.Redis == nil {
		return nil, errors.New("shard: Options.Redis is required")
	}
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("shard: %w", err)
	}
	opt.Fill(&opts.RecordTTL, DefaultOptions().RecordTTL)
	return &Store{
		rdb:       opts.Redis,
		recordTTL: fmt.Sprint(opts.RecordTTL.Milliseconds()),
		empty:     opts.Empty,
		seed:      redis.NewScript(lua.Seed),
		deduct:    redis.NewScript(lua.Deduct),
		restore:   redis.NewScript(lua.Restore),
		refill:    redis.NewScript(lua.Refill),
		read:      redis.NewScript(lua.Read),
		fence:     redis.NewScript(lua.Fence),
		quota:     redis.NewScript(lua.Quota),
		unquota:   redis.NewScript(lua.Unquota),
		budget:    redis.NewScript(lua.Budget),
	}, nil
}

// Part is the stock one request took from one shard.
type Part struct {
	Shards int   `json:"shards"` // the SKU's shard count when it was taken
	Shard  int   `json:"shard"`
	Taken  int64 `json:"taken"`
	Gen    int64 `json:"gen"`   // identifies the deduction for restore
	Epoch  int64 `json:"epoch"` // the shard's gate epoch when it was taken
}

// EncodeParts is the gate record of a deduction, as the ledger stores it
// (opaque to everyone but this package).
func EncodeParts(parts []Part) string {
	b, _ := json.Marshal(parts) // a slice of plain structs: cannot fail
	return string(b)
}

// DecodeParts reads a gate record written by EncodeParts.
func DecodeParts(record string) ([]Part, error) {
	var parts []Part
	if err := json.Unmarshal([]byte(record), &parts); err != nil {
		return nil, fmt.Errorf("shard: gate record: %w", err)
	}
	return parts, nil
}

// Epoch is the gate epoch the deduction was taken under, and false when
// its parts disagree (a shard was re-seeded part-way through: the ledger
// must refuse it as stale).
func (d Deduction) Epoch() (int64, bool) {
	if len(d.Parts) == 0 {
		return 0, false
	}
	e := d.Parts[0].Epoch
	for _, p := range d.Parts[1:] {
		if p.Epoch != e {
			return e, false
		}
	}
	return e, true
}

// Request asks for Quantity units of a SKU for one request id.
type Request struct {
	SKU         stock.SKU
	Shards      int     // the SKU's shard count, >= 1
	RequestID   keys.ID // the same id on a retry
	Quantity    int64   // 1 <= Quantity <= MaxQuantity
	MaxQuantity int64   // the SKU's per-order maximum; the script checks it too
	// Holder names the attempt (1 to 64 bytes, not AllHolders; empty: one
	// anonymous holder). An attempt that finds another's deduction of the
	// request (Deduction.Replayed) holds it too, and Restore gives it back
	// only once every holder has let go of it: any one of them may be the
	// attempt whose commit stands on it.
	Holder string
}

// AllHolders, as Restore's holder, gives a deduction back whoever holds it.
const AllHolders = "*"

// holder is r's holder as the scripts take it.
func (r Request) holder() string {
	if r.Holder == "" {
		return "_"
	}
	return r.Holder
}

func (r Request) validate() error {
	if err := present(r.SKU, r.RequestID); err != nil {
		return err
	}
	if r.Shards < 1 || r.Shards > stock.MaxShards {
		return fmt.Errorf("%w: shards %d", stock.ErrInvalid, r.Shards)
	}
	if len(r.Holder) > 64 || r.Holder == AllHolders {
		return fmt.Errorf("%w: holder %q", stock.ErrInvalid, r.Holder)
	}
	if r.MaxQuantity < 1 || r.Quantity < 1 || r.Quantity > r.MaxQuantity {
		return fmt.Errorf("%w: quantity %d not in 1..%d", stock.ErrInvalid, r.Quantity, r.MaxQuantity)
	}
	return nil
}

// Deduction is what a successful Deduct took.
type Deduction struct {
	Parts []Part
	// Replayed means every part was taken by an earlier call with the same
	// request id (a retry or a re-send): nothing moved in this call.
	Replayed bool
	// Probes is how many shard scripts the call ran.
	Probes int
	// Left is, on stock.ErrSoldOut, the units the call saw across the
	// shards (shards known to be empty count 0): 0 means the SKU is empty,
	// more means there is stock, just not enough for this quantity.
	Left int64
	// GaveBack: units this call took went back before it answered (an
	// assembly from several shards that fell short, or failed part-way).
	// A replica that found the SKU empty meanwhile must be told (sale's
	// restock notice): for a moment the units were out.
	GaveBack bool
}

// Start is the shard a request id begins at. It depends on the id alone, so
// a retry of the same request meets its own deduction record first.
func Start(requestID keys.ID, shards int) int {
	return int(crc32.ChecksumIEEE([]byte(requestID.String())) % uint32(shards))
}

// Deduct takes r.Quantity units for r.RequestID, all or nothing. It tries
// whole takes first, starting at Start and skipping shards known to be
// empty; when no single shard has enough but several together might, it
// assembles the quantity from several shards and gives everything back if
// that falls short. It returns stock.ErrSoldOut when the SKU cannot supply
// the quantity and stock.ErrNotSeeded when a shard has no stock in Redis.
func (s *Store) Deduct(ctx context.Context, r Request) (Deduction, error) {
	if err := r.validate(); err != nil {
		return Deduction{}, err
	}
	x := deducting{s: s, r: r, seen: make([]int64, r.Shards)} // avail per shard as last seen; -1 unknown, unreachable
	for i := range x.seen {
		x.seen[i] = -1
	}
	start := Start(r.RequestID, r.Shards)
	var skipped []int
	for j := range r.Shards {
		i := (start + j) % r.Shards
		// The start shard is always asked: it is where a retry finds its record.
		// Its avail stays unknown (-1): counted as 0, but an assembly still
		// asks it, where a record or a unit the hint missed may be.
		if j > 0 && s.empty != nil && s.empty.IsEmpty(r.SKU, r.Shards, i) {
			skipped = append(skipped, i)
			continue
		}
		if done, err := x.probe(ctx, i); done {
			return x.d, err
		}
	}
	if len(skipped) > 0 && shortOf(x.seen, r.Quantity) {
		// A verdict of sold out rests on what Redis says, never on a hint:
		// stock may have come back to a skipped shard on another replica's
		// watch, or another copy of this request may have taken its units
		// there (its record answers Already), and this replica would answer
		// sold out to a buyer whose request is being sold. Only the short
		// outcome pays for these probes; the SKU's sold-out flag then spares
		// the requests after it.
		for _, i := range skipped {
			if done, err := x.probe(ctx, i); done {
				return x.d, err
			}
		}
	}
	return x.short(ctx)
}

// deducting is one Deduct under way: the request, the deduction so far,
// and what it has seen of the shards.
type deducting struct {
	s         *Store
	r         Request
	d         Deduction
	seen      []int64 // avail per shard as last seen; -1 unknown, unreachable
	unreached error   // the first shard that could not be reached
}

// probe asks shard i for a whole take; done says x.d (and err) is the
// answer.
func (x *deducting) probe(ctx context.Context, i int) (done bool, err error) {
	r := x.r
	res, err := x.s.deductOne(ctx, r, i, r.Quantity, r.Quantity)
	x.d.Probes++
	if err != nil && NotRun(err) && r.Shards > 1 {
		// This shard's master cannot be reached (its breaker is open, or
		// no connection): nothing ran there, so try the others. Should
		// none have enough, the call reports this error, and the take
		// goes to the ledger rather than answer sold out. A retry whose
		// first attempt's record is on the unreachable start shard may
		// deduct a second time elsewhere: the ledger commits the request
		// once, and the extra units stay out of Redis until the
		// duplicate's give-back or the drift check.
		x.seen[i] = unreachable
		x.unreached = cmp.Or(x.unreached, err)
		return false, nil
	}
	if err != nil {
		return true, err
	}
	switch res.code {
	case lua.OK, lua.Already:
		x.d.Parts = []Part{{Shards: r.Shards, Shard: i, Taken: res.taken, Gen: res.gen, Epoch: res.epoch}}
		x.d.Replayed = res.code == lua.Already
		if res.code == lua.Already && res.taken < r.Quantity {
			// An earlier attempt assembled the quantity from several
			// shards; collect its other parts.
			x.d, err = x.s.assemble(ctx, r, x.d, x.seen)
			return true, err
		}
		if res.code == lua.OK && res.avail == 0 {
			x.s.markEmpty(r, i)
		}
		return true, nil
	case lua.Empty:
		x.seen[i] = res.avail
		if res.avail == 0 {
			x.s.markEmpty(r, i)
		}
	}
	return false, nil
}

// short answers a Deduct no single shard could take whole: sold out, the
// unreachable shard's error, or the quantity assembled from several.
func (x *deducting) short(ctx context.Context) (Deduction, error) {
	var sum int64
	for _, v := range x.seen {
		if v > 0 {
			sum += v
		}
	}
	if x.unreached != nil && sum < x.r.Quantity {
		return x.d, x.unreached
	}
	if x.r.Quantity == 1 || sum < x.r.Quantity {
		x.d.Left = sum
		return x.d, stock.ErrSoldOut
	}
	d, err := x.s.assemble(ctx, x.r, x.d, x.seen)
	if errors.Is(err, stock.ErrSoldOut) && x.unreached != nil {
		return d, x.unreached
	}
	return d, err
}

// shortOf reports whether the shards as seen cannot supply q: no single
// shard has q (a whole take would have been made), or all of them together
// have less.
func shortOf(seen []int64, q int64) bool {
	var sum int64
	for _, v := range seen {
		if v > 0 {
			sum += v
		}
	}
	return q == 1 || sum < q
}

// unreachable marks, among the shards Deduct has seen, one whose master
// could not be reached.
const unreachable = -2

// assemble takes what each non-empty shard has until the quantity is met,
// then gives back what it took if the total falls short. Parts already in d
// count toward the quantity. Takes never wait on each other, so assembling
// purchases cannot deadlock; a shortfall is returned, never kept.
func (s *Store) assemble(ctx context.Context, r Request, d Deduction, seen []int64) (Deduction, error) {
	have := int64(0)
	inD := make(map[int]bool)
	for _, p := range d.Parts {
		have += p.Taken
		inD[p.Shard] = true
	}
	var fresh []Part
	start := Start(r.RequestID, r.Shards)
	// Collecting an earlier attempt's parts, the shards never asked (hinted
	// empty, or not reached) go first: one may hold its record, while a
	// shard that answered Empty holds none, and a fresh take there would
	// take for the request twice. A new take asks the shards seen stocked
	// first, and those hinted empty only if it is still short.
	replay := len(d.Parts) > 0
	for round := range 2 {
		for j := 0; j < r.Shards && have < r.Quantity; j++ {
			i := (start + j) % r.Shards
			asked := seen[i] != -1
			if inD[i] || seen[i] == 0 || seen[i] == unreachable || (round == 0) != (asked != replay) {
				continue
			}
			res, err := s.deductOne(ctx, r, i, r.Quantity-have, 1)
			d.Probes++
			if err != nil {
				if _, rerr := s.Restore(ctx, r.SKU, r.RequestID, r.holder(), d.Parts); rerr != nil {
					// Units stay taken in Redis until a re-seed: say the
					// outcome is unknown, not that nothing ran. Some parts
					// may have gone back before the failure.
					d.GaveBack = len(fresh) > 0
					return d, errors.Join(err, fmt.Errorf("%w: %w", errStranded, rerr))
				}
				d.GaveBack = len(fresh) > 0
				return d, err
			}
			switch res.code {
			case lua.OK, lua.Already:
				p := Part{Shards: r.Shards, Shard: i, Taken: res.taken, Gen: res.gen, Epoch: res.epoch}
				d.Parts = append(d.Parts, p)
				inD[i] = true
				have += res.taken
				if res.code == lua.OK {
					fresh = append(fresh, p)
					d.Replayed = false
					if res.avail == 0 {
						s.markEmpty(r, i)
					}
				}
			case lua.Empty:
				seen[i] = 0
				s.markEmpty(r, i)
			}
		}
	}
	if have < r.Quantity {
		// Every part this call took or found goes back: a found one only
		// counts one holder fewer (another attempt's, it stays taken).
		if _, err := s.Restore(ctx, r.SKU, r.RequestID, r.holder(), d.Parts); err != nil {
			// Some parts may have gone back before the failure: whoever
			// found the SKU empty meanwhile hears so (a notice too many
			// costs a re-check; one too few, a false sold-out).
			d.GaveBack = len(fresh) > 0
			return d, fmt.Errorf("give back partial take: %w", err)
		}
		return Deduction{Probes: d.Probes, Left: have, GaveBack: len(fresh) > 0}, stock.ErrSoldOut
	}
	if len(fresh) == 0 {
		d.Replayed = true
	}
	return d, nil
}

func (s *Store) markEmpty(r Request, i int) {
	if s.empty != nil {
		s.empty.MarkEmpty(r.SKU, r.Shards, i)
	}
}

type deductReply struct{ code, taken, avail, gen, epoch int64 }

func (s *Store) deductOne(ctx context.Context, r Request, i int, q, min int64) (deductReply, error) {
	k := keys.Shard(r.SKU.Program, r.SKU.Ticket, i, r.Shards)
	v, err := s.deduct.Run(ctx, s.rdb, []string{k.Stock(), k.Deduction(r.RequestID)},
		q, min, r.MaxQuantity, s.recordTTL, r.holder()).Int64Slice()
	if err != nil {
		return deductReply{}, fmt.Errorf("deduct shard %d: %w", i, err)
	}
	if len(v) != 5 {
		return deductReply{}, fmt.Errorf("deduct shard %d: %w: %v", i, ErrScript, v)
	}
	res := deductReply{v[0], v[1], v[2], v[3], v[4]}
	switch res.code {
	case lua.OK, lua.Already, lua.Empty:
		return res, nil
	case lua.NotSeeded:
		return res, fmt.Errorf("deduct shard %d: %w", i, stock.ErrNotSeeded)
	case lua.Fenced:
		return res, fmt.Errorf("deduct shard %d: %w", i, stock.ErrFenced)
	case lua.BadArg:
		return res, fmt.Errorf("deduct shard %d: %w: script refused arguments", i, stock.ErrInvalid)
	}
	return res, fmt.Errorf("deduct shard %d: %w: code %d", i, ErrScript, res.code)
}

// Split divides remaining units over n shards as evenly as possible.
func Split(remaining int64, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = remaining / int64(n)
		if int64(i) < remaining%int64(n) {
			out[i]++
		}
	}
	return out
}

// Seed writes the SKU's shards from the ledger's remaining stock, split
// evenly, at the ledger's gate epoch. With overwrite it replaces live
// shards (a re-seed: records and give-backs of other epochs are ignored
// from then on); without it only absent shards are written, so concurrent
// seeders cannot clobber live stock.
func (s *Store) Seed(ctx context.Context, sku stock.SKU, n int, remaining, epoch int64, overwrite bool) error {
	if err := present(sku); err != nil {
		return err
	}
	if n < 1 || n > stock.MaxShards || remaining < 0 || epoch < 0 {
		return fmt.Errorf("%w: seed %d units over %d shards", stock.ErrInvalid, remaining, n)
	}
	mode := "0"
	if overwrite {
		mode = "1"
	}
	for i, units := range Split(remaining, n) {
		k := keys.Shard(sku.Program, sku.Ticket, i, n)
		v, err := s.seed.Run(ctx, s.rdb, []string{k.Stock()}, units, units, mode, epoch).Int64Slice()
		if err != nil {
			return fmt.Errorf("seed shard %d: %w", i, err)
		}
		if len(v) != 2 || (v[0] != lua.OK && v[0] != lua.Exists) {
			return fmt.Errorf("seed shard %d: %w: %v", i, ErrScript, v)
		}
		if s.empty != nil && v[0] == lua.OK {
			if units > 0 {
				s.empty.MarkStocked(sku, n, i)
			} else {
				s.empty.MarkEmpty(sku, n, i)
			}
		}
	}
	return nil
}

// Fence closes (closed=true) or reopens every shard of a SKU to
// deductions. A re-seed closes the gate, rebuilds the shards from the ledger,
// and only then reopens it, so no shard serves a mix of old and new stock.
func (s *Store) Fence(ctx context.Context, sku stock.SKU, n int, closed bool) error {
	if err := present(sku); err != nil {
		return err
	}
	if n < 1 || n > stock.MaxShards {
		return fmt.Errorf("%w: shards %d", stock.ErrInvalid, n)
	}
	mode := "0"
	if closed {
		mode = "1"
	}
	for i := range n {
		k := keys.Shard(sku.Program, sku.Ticket, i, n)
		v, err := s.fence.Run(ctx, s.rdb, []string{k.Stock()}, mode).Int64Slice()
		if err != nil {
			return fmt.Errorf("fence shard %d: %w", i, err)
		}
		if len(v) != 1 || v[0] != lua.OK {
			return fmt.Errorf("fence shard %d: %w: %v", i, ErrScript, v)
		}
	}
	return nil
}

// ShardStock is one shard's state in Redis.
type ShardStock struct {
	Seeded bool
	Fenced bool
	Avail  int64
	Allot  int64
	Epoch  int64
}

// Read returns every shard's state.
func (s *Store) Read(ctx context.Context, sku stock.SKU, n int) ([]ShardStock, error) {
	if err := present(sku); err != nil {
		return nil, err
	}
	if n < 1 || n > stock.MaxShards {
		return nil, fmt.Errorf("%w: shards %d", stock.ErrInvalid, n)
	}
	out := make([]ShardStock, n)
	for i := range n {
		k := keys.Shard(sku.Program, sku.Ticket, i, n)
		v, err := s.read.Run(ctx, s.rdb, []string{k.Stock()}).Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("read shard %d: %w", i, err)
		}
		if len(v) != 5 {
			return nil, fmt.Errorf("read shard %d: %w: %v", i, ErrScript, v)
		}
		out[i] = ShardStock{Seeded: v[0] == lua.OK, Avail: v[1], Allot: v[2], Epoch: v[3], Fenced: v[4] == 1}
	}
	return out, nil
}

// Remaining is the sum of the shards' available stock and whether every
// shard is seeded.
func (s *Store) Remaining(ctx context.Context, sku stock.SKU, n int) (int64, bool, error) {
	shards, err := s.Read(ctx, sku, n)
	if err != nil {
		return 0, false, err
	}
	var sum int64
	seeded := true
	for _, sh := range shards {
		sum += sh.Avail
		seeded = seeded && sh.Seeded
	}
	return sum, seeded, nil
}

// present refuses a SKU or id that is missing: every id was parsed at the
// edge, so a zero one here is a caller's bug, answered as bad input.
func present(sku stock.SKU, ids ...keys.ID) error {
	if sku.Program.IsZero() || sku.Ticket.IsZero() {
		return fmt.Errorf("%w: missing sku", stock.ErrInvalid)
	}
	for _, id := range ids {
		if id.IsZero() {
			return fmt.Errorf("%w: missing id", stock.ErrInvalid)
		}
	}
	return nil
}

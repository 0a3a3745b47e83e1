package shard_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/shard"
	"github.com/stockgate/stockgate/shard/shardmem"
	"github.com/stockgate/stockgate/stock"
)

// TestContractMemoryAnswersAsRedis holds package shardmem, the unit
// tier's gate, to the scripts on a real Redis Cluster: random sequences
// of every Gate operation (seeds and re-seeds, fences, deductions by
// several holders, restores, refills across epochs, caps, hold budgets),
// each run on a Store over Redis and on a Store over shardmem, must answer
// alike at every step, and leave every shard alike. A script changed
// without its port fails here, with the step that told them apart.
func TestContractMemoryAnswersAsRedis(t *testing.T) {
	onRedis, rdb := newStore(t)
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			mem := shardmem.New()
			onMemory, err := shard.New(shard.Options{Redis: mem})
			if err != nil {
				t.Fatal(err)
			}
			c := &contract{rnd: rand.New(rand.NewPCG(seed, 42)), program: keys.MustID(testenv.ID(t, "ct")), epochs: map[int]int64{}}
			ctx := context.Background()
			for step := range 150 {
				op, name := c.next()
				a, b := op(ctx, onRedis), op(ctx, onMemory)
				if a != b {
					t.Fatalf("step %d, %s:\n  redis:  %s\n  memory: %s", step, name, a, b)
				}
			}
			for i := range c.layouts() {
				op, name := c.read(i)
				if a, b := op(ctx, onRedis), op(ctx, onMemory); a != b {
					t.Fatalf("at the end, %s:\n  redis:  %s\n  memory: %s", name, a, b)
				}
			}
			c.compareKept(t, rdb, mem)
		})
	}
}

// compareKept compares what the scripts keep beside the stock, which the
// Store's answers do not all show: every deduction and refill record, the
// buyers' cap counts and the hold budgets' counts and entries.
func (c *contract) compareKept(t *testing.T, rdb *redis.ClusterClient, mem *shardmem.Scripter) {
	t.Helper()
	ctx := context.Background()
	var hashes, zsets, strs []string
	for i, l := range contractLayouts {
		for n := range l.shards {
			k := keys.Shard(c.program, keys.MustID(l.ticket), n, l.shards)
			for r := range 8 {
				hashes = append(hashes, k.Deduction(keys.MustID(fmt.Sprintf("r%d", r))))
			}
			for r := range 5 {
				strs = append(strs, k.Refill(keys.MustID(fmt.Sprintf("ret%d", r))))
			}
		}
		for b := range 3 {
			buyer := keys.MustID(fmt.Sprintf("b%d", b))
			hashes = append(hashes, keys.Quota(c.program, c.sku(i).Ticket, buyer), keys.Quota(c.program, keys.ID{}, buyer))
		}
	}
	for _, id := range []struct{ kind, name string }{{"b", "b0"}, {"b", "b1"}, {"b", "b2"}, {"d", "d0"}, {"d", "d1"}} {
		entries, counts := keys.HoldBudget(c.program, id.kind, id.name)
		zsets, hashes = append(zsets, entries), append(hashes, counts)
	}
	for _, k := range hashes {
		got, err := rdb.HGetAll(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if want := mem.Hash(k); fmt.Sprint(got) != fmt.Sprint(want) && len(got)+len(want) > 0 {
			t.Fatalf("at the end, %s:\n  redis:  %v\n  memory: %v", k, got, want)
		}
	}
	for _, k := range strs {
		got, err := rdb.Get(ctx, k).Result()
		if errors.Is(err, redis.Nil) {
			got, err = "(none)", nil
		}
		want, merr := mem.Get(ctx, k).Result()
		if errors.Is(merr, redis.Nil) {
			want = "(none)"
		}
		if err != nil || got != want {
			t.Fatalf("at the end, %s:\n  redis:  %q, %v\n  memory: %q", k, got, err, want)
		}
	}
	for _, k := range zsets {
		got, err := rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		redisSet := map[string]float64{}
		for _, z := range got {
			redisSet[z.Member.(string)] = z.Score
		}
		if want := mem.ZSet(k); fmt.Sprint(redisSet) != fmt.Sprint(want) && len(redisSet)+len(want) > 0 {
			t.Fatalf("at the end, %s:\n  redis:  %v\n  memory: %v", k, redisSet, want)
		}
	}
}

// contract draws the operations: a few SKU layouts (one ticket at two
// shard counts, as a resize leaves it), and small pools of request ids,
// holders, returns, buyers, keys and hold entries, so that operations
// meet each other's records.
type contract struct {
	rnd     *rand.Rand
	program keys.ID
	epochs  map[int]int64 // the last epoch seeded per layout
	made    []made        // deductions answered so far
}

type made struct {
	layout  int
	request keys.ID
	holder  string
	parts   []shard.Part
}

type layout struct {
	ticket string
	shards int
}

var contractLayouts = []layout{{"a", 1}, {"b", 3}, {"b", 4}}

func (c *contract) layouts() []layout { return contractLayouts }

func (c *contract) sku(i int) stock.SKU {
	return stock.SKU{Program: c.program, Ticket: keys.MustID(contractLayouts[i].ticket)}
}

func (c *contract) pick(prefix string, n int) keys.ID {
	return keys.MustID(fmt.Sprintf("%s%d", prefix, c.rnd.IntN(n)))
}

// op runs one operation on a Store and tells what it answered.
type op func(ctx context.Context, s *shard.Store) string

func answer(v any, err error) string {
	if err != nil {
		return fmt.Sprintf("%+v, error %q", v, err)
	}
	return fmt.Sprintf("%+v", v)
}

func (c *contract) read(i int) (op, string) {
	sku, n := c.sku(i), contractLayouts[i].shards
	return func(ctx context.Context, s *shard.Store) string {
		return answer(s.Read(ctx, sku, n))
	}, fmt.Sprintf("Read(%v/%d)", sku, n)
}

func (c *contract) next() (op, string) {
	i := c.rnd.IntN(len(contractLayouts))
	sku, n := c.sku(i), contractLayouts[i].shards
	switch w := c.rnd.IntN(100); {
	case w < 8:
		return c.seed(i)
	case w < 12:
		closed := c.rnd.IntN(3) == 0
		return func(ctx context.Context, s *shard.Store) string { return answer(nil, s.Fence(ctx, sku, n, closed)) },
			fmt.Sprintf("Fence(%v/%d, %v)", sku, n, closed)
	case w < 40:
		return c.deduct(i)
	case w < 52:
		return c.restore()
	case w < 60:
		ret, epoch, q := c.pick("ret", 5), max(c.epochs[i]+int64(c.rnd.IntN(3))-1, 0), int64(c.rnd.IntN(3)+1)
		return func(ctx context.Context, s *shard.Store) string { return answer(s.Refill(ctx, sku, n, ret, epoch, q)) },
			fmt.Sprintf("Refill(%v/%d, %v, epoch %d, %d)", sku, n, ret, epoch, q)
	case w < 66:
		return c.read(i)
	case w < 80:
		return c.quota(sku)
	}
	return c.budget()
}

func (c *contract) seed(i int) (op, string) {
	sku, n := c.sku(i), contractLayouts[i].shards
	epoch := c.epochs[i] + int64(c.rnd.IntN(2))
	c.epochs[i] = epoch
	units, overwrite := int64(c.rnd.IntN(13)), c.rnd.IntN(3) > 0
	return func(ctx context.Context, s *shard.Store) string {
			return answer(nil, s.Seed(ctx, sku, n, units, epoch, overwrite))
		},
		fmt.Sprintf("Seed(%v/%d, %d units, epoch %d, overwrite %v)", sku, n, units, epoch, overwrite)
}

func (c *contract) deduct(i int) (op, string) {
	r := shard.Request{SKU: c.sku(i), Shards: contractLayouts[i].shards, RequestID: c.pick("r", 8),
		Quantity: int64(c.rnd.IntN(4) + 1), MaxQuantity: 4, Holder: []string{"", "h1", "h2"}[c.rnd.IntN(3)]}
	return func(ctx context.Context, s *shard.Store) string {
		d, err := s.Deduct(ctx, r)
		if err == nil {
			c.remember(i, r, d)
		}
		return answer(d, err)
	}, fmt.Sprintf("Deduct(%+v)", r)
}

// remember keeps a deduction once (both Stores answer it).
func (c *contract) remember(i int, r shard.Request, d shard.Deduction) {
	m := made{layout: i, request: r.RequestID, holder: r.Holder, parts: d.Parts}
	if n := len(c.made); n > 0 && fmt.Sprint(c.made[n-1]) == fmt.Sprint(m) {
		return
	}
	c.made = append(c.made, m)
}

func (c *contract) restore() (op, string) {
	if len(c.made) == 0 || c.rnd.IntN(5) == 0 {
		// A part nobody took, or of another generation.
		i := c.rnd.IntN(len(contractLayouts))
		sku, n := c.sku(i), contractLayouts[i].shards
		p := shard.Part{Shards: n, Shard: c.rnd.IntN(n), Taken: 1, Gen: int64(c.rnd.IntN(3) + 1)}
		req := c.pick("r", 8)
		return func(ctx context.Context, s *shard.Store) string { return answer(s.RestorePart(ctx, sku, req, "h1", p)) },
			fmt.Sprintf("RestorePart(%v, %v, %+v)", sku, req, p)
	}
	m := c.made[c.rnd.IntN(len(c.made))]
	holder := []string{m.holder, shard.AllHolders, "h2"}[c.rnd.IntN(3)]
	sku := c.sku(m.layout)
	return func(ctx context.Context, s *shard.Store) string {
		return answer(s.Restore(ctx, sku, m.request, holder, m.parts))
	}, fmt.Sprintf("Restore(%v, %v, %q, %+v)", sku, m.request, holder, m.parts)
}

func (c *contract) quota(sku stock.SKU) (op, string) {
	if c.rnd.IntN(4) == 0 {
		sku.Ticket = keys.ID{} // the program-wide cap
	}
	buyer, req := c.pick("b", 3), c.pick("r", 8)
	if c.rnd.IntN(3) == 0 {
		key := keys.ID{}
		if c.rnd.IntN(2) == 0 {
			key = c.pick("k", 4)
		}
		return func(ctx context.Context, s *shard.Store) string {
				return answer(nil, s.ReleaseQuota(ctx, sku, buyer, req, key))
			},
			fmt.Sprintf("ReleaseQuota(%v, %v, %v, %v)", sku, buyer, req, key)
	}
	key, q, limit := c.pick("k", 4), int64(c.rnd.IntN(3)+1), int64(c.rnd.IntN(6)+1)
	return func(ctx context.Context, s *shard.Store) string {
		return answer(s.TakeQuota(ctx, sku, buyer, req, key, q, limit))
	}, fmt.Sprintf("TakeQuota(%v, %v, %v, %v, %d, cap %d)", sku, buyer, req, key, q, limit)
}

// budget draws a hold budget's take, end or extension. Expiries are now
// (past by the time either Store runs it) or an hour or more either side,
// so the two Stores, a few milliseconds apart, see the same entries due.
func (c *contract) budget() (op, string) {
	b := shard.Budget{Program: c.program, Buyer: c.pick("b", 3)}
	if c.rnd.IntN(3) == 0 {
		b = shard.Budget{Program: c.program, Device: fmt.Sprintf("d%d", c.rnd.IntN(2))}
	}
	entry := c.pick("e", 6)
	at := time.Now().Add(time.Duration(c.rnd.IntN(4)-1) * time.Hour)
	switch c.rnd.IntN(4) {
	case 0:
		return func(ctx context.Context, s *shard.Store) string { return answer(s.EndBudget(ctx, b, entry)) },
			fmt.Sprintf("EndBudget(%+v, %v)", b, entry)
	case 1:
		return func(ctx context.Context, s *shard.Store) string { return answer(s.ExtendBudget(ctx, b, entry, at)) },
			fmt.Sprintf("ExtendBudget(%+v, %v, %v)", b, entry, at)
	}
	q, limit, device := int64(c.rnd.IntN(3)+1), int64(c.rnd.IntN(7)), []string{"", "d0"}[c.rnd.IntN(2)]
	return func(ctx context.Context, s *shard.Store) string {
		fresh, under, err := s.TakeBudget(ctx, b, entry, q, limit, at, device)
		return answer([]any{fresh, under}, err)
	}, fmt.Sprintf("TakeBudget(%+v, %v, %d, budget %d, %v, %q)", b, entry, q, limit, at, device)
}

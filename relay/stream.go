package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/internal/opt"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lua"
	"github.com/stockgate/stockgate/tracing"
)

// Redis Streams were chosen over Kafka for platforms that run a broker:
// stockgate already needs a Redis Cluster, its operator runs it, go-redis
// is already linked, and consumer groups (XREADGROUP, XACK) give their
// consumers at-least-once reads with no second system to operate.

// StreamOptions configures a Redis Streams sink.
type StreamOptions struct {
	Name string // the sink's name; default "stream"
	// Redis is the service's cluster client (required); a plain client
	// also fits (tests), without the wait for replicas.
	Redis redis.UniversalClient
	// Prefix begins each partition's stream key: Prefix + "{NN}" (the
	// partition as the hash tag, so the 64 streams spread over the
	// masters). Default "stockgate:events:".
	Prefix string
	// MaxLen trims each stream to about this many entries (XADD MAXLEN ~);
	// 0 keeps every entry.
	MaxLen int64
	// SeenFor is how long an event's marker keeps a redelivery of it out
	// of the stream. Default 7 days.
	SeenFor time.Duration
	// ReplicaWait bounds the wait for a replica to have an added entry
	// (WAIT) before the attempt counts as failed. Default 1s.
	ReplicaWait time.Duration
}

// Validate reports the first field that cannot work (an *opt.Error).
func (o StreamOptions) Validate() error {
	switch {
	case o.Redis == nil:
		return opt.Bad("Redis", "is required")
	case strings.ContainsAny(o.Prefix, "{}"):
		return opt.Bad("Prefix", "may not hold { or }: the partition is the key's hash tag")
	case o.MaxLen < 0:
		return opt.Bad("MaxLen", "must be 0 (no trimming) or more")
	case o.SeenFor < 0 || o.SeenFor > 0 && o.SeenFor < time.Second || o.ReplicaWait < 0:
		return opt.Bad("SeenFor", "durations must be positive (SeenFor at least 1s)")
	}
	return nil
}

// Stream delivers each event as an entry of its partition's stream
// (fields id, type and event, the JSON a webhook carries), in delivery
// order: the partition's seq order, a dead letter sent again coming late
// as it does to a webhook. A marker per event, set in the same script as
// the XADD, keeps a redelivery (an answer lost, a relay that died before
// its cursor moved) out of the stream: one entry per event. On a cluster
// the add counts as delivered only once a replica of the stream's master
// has it (WAIT), when the master has any: a failover cannot then lose an
// event the ledger calls delivered.
type Stream struct {
	name     string
	redis    redis.UniversalClient
	prefix   string
	maxLen   int64
	seenFor  time.Duration
	waitFor  time.Duration
	script   *redis.Script
	replicas replicaCounts
}

// NewStream returns a Redis Streams sink.
func NewStream(o StreamOptions) (*Stream, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("relay: stream: %w", err)
	}
	if o.Prefix == "" {
		o.Prefix = "stockgate:events:"
	}
	if o.Name == "" {
		o.Name = "stream"
	}
	opt.Fill(&o.SeenFor, 7*24*time.Hour)
	opt.Fill(&o.ReplicaWait, time.Second)
	return &Stream{name: o.Name, redis: o.Redis, prefix: o.Prefix, maxLen: o.MaxLen, seenFor: o.SeenFor,
		waitFor: o.ReplicaWait, script: redis.NewScript(lua.StreamAdd)}, nil
}

// Name is the sink's name.
func (s *Stream) Name() string { return s.name }

// Key is the stream of a partition.
func (s *Stream) Key(partition int) string { return keys.EventStream(s.prefix, partition) }

// Deliver adds e to its partition's stream, once. With tracing on, each
// attempt is a span of the trace of the request whose change wrote e (as
// a webhook delivery is), and the entry carries that span's traceparent
// as its field traceparent, so a consumer's work joins the purchase's
// trace.
func (s *Stream) Deliver(ctx context.Context, e ledger.Event) (err error) {
	ctx, span := deliverySpan(ctx, "stream.deliver", s.name, e)
	defer func() { tracing.End(span, err) }()
	body, err := json.Marshal(e.Wire())
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	ks := []string{s.Key(e.Partition), keys.EventSeen(s.prefix, e.Partition, e.ID)}
	args := []any{e.ID.String(), e.Type, string(body), s.maxLen, int64(s.seenFor / time.Second), tracing.Traceparent(ctx)}
	c, ok := s.redis.(*redis.ClusterClient)
	if !ok {
		return s.reply(s.script.Run(ctx, s.redis, ks, args...), nil)
	}
	// A master with no replica has nothing to wait for: WAIT would block
	// for its whole timeout there and then answer 0. The layout is the
	// cluster's as read in the last few seconds.
	slot := int64(keys.KeySlot(ks[0]))
	// A layout that cannot be read (the node asked is down, mid-failover)
	// is taken to have replicas: the add waits for one, as it must where
	// one may be promoted.
	if replicas, err := s.replicas.of(ctx, c, slot); err == nil && replicas == 0 {
		return s.reply(s.script.Run(ctx, c, ks, args...), nil)
	}
	// The script and the WAIT on one connection of the stream's master:
	// WAIT counts the writes of its own connection.
	node, err := c.MasterForKey(ctx, ks[0])
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	wait := replicaWait(ctx, s.waitFor, node.Options().ReadTimeout)
	var added *redis.Cmd
	var acked *redis.Cmd
	_, err = node.Pipelined(ctx, func(p redis.Pipeliner) error {
		added = s.script.Eval(ctx, p, ks, args...)
		acked = p.Do(ctx, "WAIT", 1, max(wait.Milliseconds(), 1))
		return nil
	})
	if err := s.reply(added, err); err != nil {
		return err
	}
	if n, err := acked.Int64(); err == nil && n >= 1 {
		return nil
	}
	return fmt.Errorf("stream: no replica of the stream's master has the entry within %v", wait)
}

// replicaWait is how long the WAIT after an add may block: at most the
// sink's ReplicaWait, a third of what is left of the attempt (room for the
// attempt after it), and three quarters of the client's read timeout. The
// client reads a pipeline's answers under its read timeout whatever the
// commands in it are, so a longer WAIT fails as an i/o timeout (and counts
// against the master's breaker) where it should answer how many replicas
// have the entry.
func replicaWait(ctx context.Context, want, readTimeout time.Duration) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		want = min(want, time.Until(d)/3)
	}
	switch {
	case readTimeout == 0:
		readTimeout = 3 * time.Second // go-redis's default
	case readTimeout < 0:
		return want // no read deadline
	}
	return min(want, readTimeout*3/4)
}

// reply reads the script's answer.
func (s *Stream) reply(cmd *redis.Cmd, err error) error {
	if err == nil {
		err = cmd.Err()
	}
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	v, err := cmd.Slice()
	if err != nil || len(v) == 0 {
		return fmt.Errorf("stream: answer %v: %v", v, err)
	}
	switch code, _ := v[0].(int64); code {
	case lua.OK, lua.Already:
		return nil
	default:
		return fmt.Errorf("stream: script answered %d", code)
	}
}

// replicaCounts remembers, for a few seconds, the cluster's layout: which
// master serves a slot and how many replicas follow it. The count takes
// every replica the cluster knows, connected or not (CLUSTER SLOTS leaves
// out one whose link is down, the very one a failover may promote): an
// entry counts as delivered only once a replica has it, or when its
// master has none.
type replicaCounts struct {
	mu    sync.Mutex
	at    time.Time
	nodes string // CLUSTER NODES
}

func (r *replicaCounts) of(ctx context.Context, c *redis.ClusterClient, slot int64) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.at) > 5*time.Second {
		nodes, err := c.ClusterNodes(ctx).Result()
		if err != nil {
			return 0, err
		}
		r.nodes, r.at = nodes, time.Now()
	}
	return replicasOf(r.nodes, slot)
}

// replicasOf counts, in a CLUSTER NODES answer, the replicas of the
// master that serves slot.
func replicasOf(nodes string, slot int64) (int, error) {
	lines := strings.Split(strings.TrimSpace(nodes), "\n")
	master := ""
	for _, line := range lines {
		f := strings.Fields(line)
		// Flags are whole words: "nofailover" is no "fail".
		if len(f) < 8 {
			continue
		}
		if flags := strings.Split(f[2], ","); !slices.Contains(flags, "master") || slices.Contains(flags, "fail") {
			continue
		}
		for _, r := range f[8:] {
			lo, hi, found := strings.Cut(r, "-")
			if !found {
				hi = lo
			}
			a, aerr := strconv.ParseInt(lo, 10, 64)
			b, berr := strconv.ParseInt(hi, 10, 64)
			if aerr == nil && berr == nil && a <= slot && slot <= b {
				master = f[0]
			}
		}
	}
	if master == "" {
		return 0, fmt.Errorf("slot %d has no master in the cluster's layout", slot)
	}
	n := 0
	for _, line := range lines {
		if f := strings.Fields(line); len(f) >= 4 && f[3] == master {
			n++
		}
	}
	return n, nil
}

package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/internal/opt"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
)

// Redis Streams were chosen over Kafka for platforms that run a broker:
// stockgate already needs a Redis Cluster, its operator runs it, go-redis
// is already linked, and consumer groups (XREADGROUP, XACK) give their
// consumers at-least-once reads with no second system to operate.

// streamAdder is the Redis a stream sink needs: a plain client and a
// cluster client both fit.
type streamAdder interface {
	XAdd(ctx context.Context, a *redis.XAddArgs) *redis.StringCmd
	XRange(ctx context.Context, stream, start, stop string) *redis.XMessageSliceCmd
}

// StreamOptions configures a Redis Streams sink.
type StreamOptions struct {
	Name  string      // the sink's name; default "stream"
	Redis streamAdder // required
	// Prefix begins each partition's stream key: Prefix + "{NN}" (the
	// partition as the hash tag, so the 64 streams spread over the
	// masters). Default "stockgate:events:".
	Prefix string
	// MaxLen trims each stream to about this many entries (XADD MAXLEN ~);
	// 0 keeps every entry.
	MaxLen int64
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
	}
	return nil
}

// Stream delivers each event as an entry of its partition's stream, with
// the entry ID "<seq>-1": seqs only grow within a partition, so the
// stream keeps their order, and a redelivery (after a crash between the
// XADD and the cursor's advance) is refused by Redis as not above the
// stream's top entry, and counted as delivered. An event redelivered
// from the dead letters, with later ones in the stream already, is added
// under an ID Redis picks: late, as a dead letter is.
type Stream struct {
	name   string
	redis  streamAdder
	prefix string
	maxLen int64
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
	return &Stream{name: o.Name, redis: o.Redis, prefix: o.Prefix, maxLen: o.MaxLen}, nil
}

// Name is the sink's name.
func (s *Stream) Name() string { return s.name }

// Key is the stream of a partition.
func (s *Stream) Key(partition int) string { return fmt.Sprintf("%s{%02d}", s.prefix, partition) }

// EntryID is the stream entry ID of an event.
func EntryID(e ledger.Event) string { return fmt.Sprintf("%d-1", e.Seq) }

// Deliver adds e to its partition's stream: fields id, type and event
// (the JSON a webhook carries).
func (s *Stream) Deliver(ctx context.Context, e ledger.Event) error {
	body, err := json.Marshal(sale.EventOf(e).Wire())
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	key, id := s.Key(e.Partition), EntryID(e)
	add := func(id string) error {
		return s.redis.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: id, MaxLen: s.maxLen, Approx: s.maxLen > 0,
			Values: []any{"id", e.ID.String(), "type", e.Type, "event", string(body)}}).Err()
	}
	err = add(id)
	// Redis answers this one only as text.
	if err != nil && strings.Contains(err.Error(), "equal or smaller than the target stream top item") {
		got, rerr := s.redis.XRange(ctx, key, id, id).Result()
		switch {
		case rerr != nil:
			err = rerr
		case len(got) > 0:
			return nil // there already
		default:
			err = add("*")
		}
	}
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	return nil
}

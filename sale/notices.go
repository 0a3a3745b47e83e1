package sale

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/stock"
)

// Restock notices: when stock comes back to a SKU's gate (a return refilled,
// a rebuild), the replica that did it publishes the SKU, and every replica
// forgets its sold-out flag, unseals its committed-key set and drops its
// cached stock read and settings for it. Without them another replica keeps
// answering from memory until its flag's next re-check (up to 2 x the
// sold-out TTL): a false sold-out for new buyers, and a 409 for a retry of a
// sale of the returned units. A lost notice costs only that bounded wait.

// noticeChannel is the Redis pub/sub channel of restock notices (classic
// pub/sub: a publish reaches subscribers on every node of the cluster).
const noticeChannel = "sg:notices:restocked"

// Notifier is the part of the Redis client notices use.
type Notifier interface {
	Publish(ctx context.Context, channel string, message any) *redis.IntCmd
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// notifyRestocked tells every replica that sku's gate has stock again.
// Best effort: a notice that is lost is made up for by the flags' TTL.
func (s *Service) notifyRestocked(ctx context.Context, sku stock.SKU) {
	s.wakeRoom(sku.Program)
	if s.opts.Notifier == nil {
		return
	}
	if err := s.opts.Notifier.Publish(ctx, noticeChannel, sku.String()).Err(); err != nil {
		s.log.WarnContext(ctx, "publish restock notice", "sku", sku.String(), "err", err)
	}
}

// RunNotices applies other replicas' restock notices (and this one's own)
// until ctx is done. Without a Notifier it returns at once.
func (s *Service) RunNotices(ctx context.Context) {
	if s.opts.Notifier == nil {
		return
	}
	sub := s.opts.Notifier.Subscribe(ctx, noticeChannel)
	defer sub.Close()
	ch := sub.Channel() // go-redis re-subscribes by itself after a broken connection
	for {
		select {
		case <-ctx.Done():
			return
		case msg, ok := <-ch:
			if !ok {
				return
			}
			// Another replica's message: parsed like any input.
			program, ticket, _ := strings.Cut(msg.Payload, "/")
			sku, err := stock.ParseStored(program, ticket)
			if err != nil {
				continue
			}
			s.forgetClosed(sku)
		}
	}
}

// forgetClosed drops what this replica remembers of a SKU being closed.
func (s *Service) forgetClosed(sku stock.SKU) {
	s.cache.ClearSoldOut(sku)
	s.replays.unseal(sku)
	s.stock.Invalidate(sku)
	s.settings.Invalidate(sku)
	s.wakeRoom(sku.Program)
}

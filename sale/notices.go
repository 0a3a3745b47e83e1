package sale

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// Restock notices: when stock comes back to a SKU's gate (a return refilled,
// a rebuild), the replica that did it publishes the SKU, and every replica
// forgets its sold-out flag, unseals its committed-key set and drops its
// cached stock read and settings for it. Without them another replica keeps
// answering from memory until its flag's next re-check: a false sold-out
// for new buyers, and a 409 for a retry of a sale of the returned units.
// While a replica hears the notices its flags wait for one (up to the
// cache's NoticeMaxAge, the bound when a publish was lost); while it may
// not, up to 2 x the sold-out TTL (see RunNotices).

// noticeChannel is the Redis pub/sub channel of restock notices (classic
// pub/sub: a publish reaches subscribers on every node of the cluster).
const noticeChannel = "sg:notices:restocked"

// backChannel carries the lighter notice of units that were out of the
// gate for a moment and are back (a refused take given back, a short
// assembly): nothing about the SKU changed but its stock, so its settings
// stay. Dropping them would send every purchase of a SKU whose ledger is
// cut off to read them from that ledger, and refuse it at the door.
const backChannel = "sg:notices:back"

// settingsChannel carries settings an admin changed that the restock
// notices do not: "program <id>" (its caps and hold budgets) and "seats
// <program>/<ticket>" (a seat map grew). Every replica drops its cached
// copy rather than serve the old one for SettingsTTL: holds taken
// meanwhile under a budget it did not yet know were never counted against
// it (helper-70 #2), and new seats were refused (#7).
const settingsChannel = "sg:notices:settings"

// Notifier is the part of the Redis client notices use.
type Notifier interface {
	Publish(ctx context.Context, channel string, message any) *redis.IntCmd
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// notifyRestocked tells every replica that sku's gate has stock again.
// A notice whose publish fails is sent again with the next change notices
// (publishChanges) until one goes through; until then the flags' max age
// bounds it. One lost on a subscriber's broken connection is made up for
// by its Distrust.
func (s *Service) notifyRestocked(ctx context.Context, sku stock.SKU) {
	s.publishNotice(ctx, noticeChannel, sku)
}

// notifyBack tells every replica that units of sku taken for a moment are
// back in its gate (see backChannel). This replica's room wakes at once;
// the publish goes from s.backs, one per SKU however many give-backs
// marked it meanwhile: the takes a ledger refused together at the end of
// its outage give their units back together, and a publish each (a
// message every Redis node relays) held their answers past the work
// timeout waiting for a Redis connection. A failed publish is owed as a
// full restock notice.
func (s *Service) notifyBack(ctx context.Context, sku stock.SKU) {
	s.wakeRoom(sku.Program)
	if s.opts.Notifier == nil {
		return
	}
	s.backs.mu.Lock()
	closed := s.backs.closed.Load()
	if !closed {
		s.backs.due.mark(sku)
		if !s.backs.running {
			s.backs.running = true
			s.backs.wg.Go(func() { s.publishBacks(context.WithoutCancel(ctx)) }) // owned by s.backs: Close waits
		}
	}
	s.backs.mu.Unlock()
	if closed {
		// Close sent the rest: a request still running as it stops sends
		// its own, as before.
		s.publish(ctx, backChannel, sku)
	}
}

// backNotices are the back notices due and their publisher: at most one
// goroutine, running while notices are due (none at rest).
type backNotices struct {
	due     changes
	mu      sync.Mutex
	running bool        // a publisher is under way
	closed  atomic.Bool // Close began: none starts, and the one under way stops
	wg      sync.WaitGroup
}

// backsAtOnce bounds the back notices published at once: one node that
// does not answer holds only its own SKUs' notices for a Redis timeout.
const backsAtOnce = 8

// publishBacks publishes the back notices due until none is, or Close
// began (closeBacks sends the rest).
func (s *Service) publishBacks(ctx context.Context) {
	for {
		skus := s.backs.due.drain()
		if len(skus) == 0 {
			s.backs.mu.Lock()
			// Marked after the drain and before this lock: their callers
			// found running set and left them to this loop.
			if skus = s.backs.due.drain(); len(skus) == 0 {
				s.backs.running = false
				s.backs.mu.Unlock()
				return
			}
			s.backs.mu.Unlock()
		}
		// A round at a time: what is marked while it runs goes in the
		// next, once per SKU.
		s.publishAll(ctx, skus, func(sku stock.SKU) bool {
			if s.backs.closed.Load() {
				s.backs.due.mark(sku) // closeBacks sends it
				return false
			}
			return true
		})
		if s.backs.closed.Load() {
			return
		}
	}
}

// publishAll publishes a back notice of each of skus that send allows,
// backsAtOnce at a time, each within a Redis timeout of ctx.
func (s *Service) publishAll(ctx context.Context, skus []stock.SKU, send func(stock.SKU) bool) {
	sem := make(chan struct{}, backsAtOnce)
	var wg sync.WaitGroup
	for _, sku := range skus {
		if !send(sku) {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			pctx, cancel := context.WithTimeout(ctx, s.opts.RedisTimeout)
			defer cancel()
			s.publish(pctx, backChannel, sku)
		})
	}
	wg.Wait()
}

// closeBacks stops the publisher and sends what is left, within ctx.
func (s *Service) closeBacks(ctx context.Context) {
	s.backs.mu.Lock()
	s.backs.closed.Store(true)
	s.backs.mu.Unlock()
	s.backs.wg.Wait()
	s.publishAll(ctx, s.backs.due.drain(), func(stock.SKU) bool { return true })
}

// publishNotice wakes this replica's room and publishes sku on channel; a
// failed publish is owed as a full restock notice.
func (s *Service) publishNotice(ctx context.Context, channel string, sku stock.SKU) {
	s.wakeRoom(sku.Program)
	if s.opts.Notifier == nil {
		return
	}
	s.publish(ctx, channel, sku)
}

// publish publishes sku on channel; a failed publish is owed as a full
// restock notice.
func (s *Service) publish(ctx context.Context, channel string, sku stock.SKU) {
	if err := s.opts.Notifier.Publish(ctx, channel, sku.String()).Err(); err != nil {
		s.restocksOwed.mark(sku)
		if ok, left := s.logs.Allow("restock notice", time.Now()); ok {
			s.log.WarnContext(ctx, "publish notice; a restock notice is sent again with the next change notices", "channel", channel, "sku", sku.String(), "err", err, "left_out", left)
		}
	}
}

// notifySettings tells every replica that what names changed ("program
// <id>" or "seats <sku>"). A failed publish is logged: the caches'
// SettingsTTL bounds it.
func (s *Service) notifySettings(ctx context.Context, what string) {
	if s.opts.Notifier == nil {
		return
	}
	if err := s.opts.Notifier.Publish(ctx, settingsChannel, what).Err(); err != nil {
		s.log.WarnContext(ctx, "publish settings notice; other replicas keep the old settings up to the settings TTL", "what", what, "err", err)
	}
}

// applySettings drops what a settings notice names (another replica's
// message: parsed like any input).
func (s *Service) applySettings(payload string) {
	kind, name, _ := strings.Cut(payload, " ")
	switch kind {
	case "program":
		if id, err := keys.ParseID(name); err == nil {
			s.programs.Invalidate(id)
		}
	case "seats":
		program, ticket, _ := strings.Cut(name, "/")
		if sku, err := stock.ParseStored(program, ticket); err == nil {
			s.seatMaps.Invalidate(sku)
			s.settings.Invalidate(sku)
		}
	}
}

// noticeBeat is how long the notices' connection may stay silent before
// it is pinged; a ping unanswered for noticeDeaf beats counts it broken
// (a busy replica may read its pong late; a false alarm costs a re-check
// per SKU, not a false answer).
const (
	noticeBeat = time.Second
	noticeDeaf = 3
)

// RunNotices applies other replicas' restock notices (and this one's own)
// until ctx is done. Without a Notifier it returns at once.
//
// While its subscription is confirmed and answers, the replica's sold-out
// flags stand until a notice (cache.Cache.Trust): a sold-out storm costs
// no Redis call per TTL. Any sign that a notice may have been missed (an
// error, a ping unanswered) makes them TTL-bound again until the
// subscription is confirmed anew (Distrust), and a flag from before that
// is never trusted again.
func (s *Service) RunNotices(ctx context.Context) {
	if s.opts.Notifier == nil {
		return
	}
	defer s.cache.Distrust()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.publishChanges(ctx) })
	for ctx.Err() == nil {
		s.listen(ctx)
		s.cache.Distrust()
		// Before subscribing anew: a Redis that is down is not asked in a
		// tight loop.
		t := time.NewTimer(noticeBeat / 4)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// listen holds one subscription until it fails or ctx is done.
func (s *Service) listen(ctx context.Context) {
	channels := []string{noticeChannel, backChannel, changeChannel, settingsChannel}
	sub := s.opts.Notifier.Subscribe(ctx, channels...)
	defer sub.Close()
	// A read waits up to a beat and does not watch ctx: closing the
	// subscription ends it at once.
	defer context.AfterFunc(ctx, func() { _ = sub.Close() })()
	silent := 0 // beats since anything was heard
	for {
		msg, err := sub.ReceiveTimeout(ctx, noticeBeat)
		var ne net.Error
		switch {
		case ctx.Err() != nil:
			return
		case errors.As(err, &ne) && ne.Timeout() && silent+1 < noticeDeaf:
			// Silence: a live connection answers a ping.
			if silent++; silent == 1 {
				if err := sub.Ping(ctx); err != nil {
					return
				}
			}
			continue
		case err != nil:
			// Broken, or a ping unanswered (a connection that died without
			// a word): notices may be lost from here on.
			if !errors.As(err, &ne) || !ne.Timeout() {
				s.log.WarnContext(ctx, "restock notices: subscription lost; sold-out flags live their TTL until it is back", "err", err)
			}
			return
		}
		silent = 0
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && m.Count == len(channels) {
				s.cache.Trust() // every notice from here on reaches this loop
			}
		case *redis.Message:
			switch m.Channel {
			case changeChannel:
				s.applyChanges(m.Payload)
				continue
			case settingsChannel:
				s.applySettings(m.Payload)
				continue
			}
			// Another replica's message: parsed like any input.
			program, ticket, _ := strings.Cut(m.Payload, "/")
			sku, err := stock.ParseStored(program, ticket)
			if err != nil {
				continue
			}
			if m.Channel == backChannel {
				s.forgetSoldOut(sku)
				continue
			}
			s.forgetClosed(sku)
		}
	}
}

// forgetClosed drops what this replica remembers of a SKU being closed.
func (s *Service) forgetClosed(sku stock.SKU) {
	s.forgetSoldOut(sku)
	s.settings.Invalidate(sku)
}

// forgetSoldOut drops what this replica remembers of a SKU's gate being
// empty: its stock may be sold again.
func (s *Service) forgetSoldOut(sku stock.SKU) {
	s.cache.Forget(sku)
	s.replays.unseal(sku, true)
	s.stock.Invalidate(sku)
	s.wakeRoom(sku.Program)
}

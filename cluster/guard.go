package cluster

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/breaker"
)

// Guard runs every command the client sends to a node (single, pipelined
// or a script's EVALSHA and its EVAL fallback) through that node's
// breaker in set, so a failing master opens only its own: calls for its
// slots are refused at once (an error matching breaker.ErrOpen, nothing
// sent) while the other masters serve. The node is the address the
// client dials, so the breakers follow the slot map through failovers
// and reshards as the client does: a promoted replica is a node of its
// own, closed. Call Guard before the client's first command; set's
// Options.IsOutcome should be NodeAnswered.
func Guard(c *redis.ClusterClient, set *breaker.Set) {
	c.OnNewNode(func(rdb *redis.Client) {
		node := rdb.Options().Addr
		b, err := set.Node(node)
		if err != nil {
			return // a Set validated at NewSet makes every node's; unguarded otherwise
		}
		rdb.AddHook(guard{b: b, node: node})
	})
}

// guard is the hook of one node: its breaker, looked up once.
type guard struct {
	b    *breaker.Breaker
	node string
}

func (g guard) DialHook(next redis.DialHook) redis.DialHook { return next }

// guarded marks a context whose call is inside its node's breaker
// already: the handshake of a connection the call opens (HELLO, AUTH,
// CLIENT SETINFO) runs through the node's hooks with the call's context,
// and must not take a second place in a half-open breaker (it would be
// refused while the call holds the probe, and fail the call).
type guarded struct{}

// inside runs next through the node's breaker, unless ctx is inside it.
func (g guard) inside(ctx context.Context, next func(ctx context.Context) error) error {
	if ctx.Value(guarded{}) == g.node {
		return next(ctx)
	}
	return g.b.Do(context.WithValue(ctx, guarded{}, g.node), next)
}

func (g guard) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := g.inside(ctx, func(ctx context.Context) error { return next(ctx, cmd) })
		if err != nil && cmd.Err() == nil {
			cmd.SetErr(err) // refused unsent: the command carries why
		}
		return err
	}
}

func (g guard) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := g.inside(ctx, func(ctx context.Context) error {
			if err := next(ctx, cmds); err != nil {
				return err
			}
			// A pipeline answers per command: the first failure among
			// them says whether the node is failing.
			for _, c := range cmds {
				if err := c.Err(); err != nil && !NodeAnswered(err) {
					return err
				}
			}
			return nil
		})
		if errors.Is(err, breaker.ErrOpen) {
			for _, c := range cmds {
				c.SetErr(err)
			}
		}
		return err
	}
}

// NodeAnswered reports errors that are a node's answers, not the node
// failing: redis.Nil and error replies such as NOSCRIPT (a script's
// EVALSHA before its EVAL), MOVED and ASK (the slot map moved), TRYAGAIN
// (a multi-key call mid-reshard), READONLY, WRONGTYPE. A node fails when
// it cannot be reached or does not answer in time (dial, timeout, reset,
// EOF, no pooled connection), or answers that it cannot serve:
// CLUSTERDOWN, LOADING, MASTERDOWN, BUSY (a script stuck).
func NodeAnswered(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed) {
		return false
	}
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false // not a reply: something went wrong on the way
	}
	msg := reply.Error()
	for _, p := range []string{"CLUSTERDOWN", "LOADING", "MASTERDOWN", "BUSY "} {
		if strings.HasPrefix(msg, p) {
			return false
		}
	}
	return true
}

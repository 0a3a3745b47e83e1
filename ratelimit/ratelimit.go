// Package ratelimit keeps each client's request budget in Redis, so every
// replica behind a load balancer draws on one budget per client: GCRA, as
// github.com/go-redis/redis_rate implements it (one script call per
// request, the budget one key that expires when the client goes quiet).
//
// The gateway asks it first and, when Redis cannot answer in time, falls
// back to the replica's own limiter (see gateway.Options.SharedLimit).
package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// Shared is a per-client rate limit whose budgets live in Redis.
type Shared struct {
	l       *redis_rate.Limiter
	timeout time.Duration
	prefix  string
}

// Options say where the budgets live.
type Options struct {
	// Redis is the replica's cluster client (with its breakers: when
	// Redis is out, calls fail fast and the replica's own limiter
	// decides). Required.
	Redis redis.UniversalClient
	// Timeout bounds one budget call: a slower Redis leaves the request
	// to the replica's own limiter rather than holding it up. Default
	// DefaultTimeout.
	Timeout time.Duration
	// Scope keeps apart the budgets of services (or tests) sharing one
	// Redis: every replica of one service must use the same. Default "".
	Scope string
}

// DefaultTimeout is Options.Timeout's default.
const DefaultTimeout = 50 * time.Millisecond

// Validate reports the first bad setting.
func (o Options) Validate() error {
	switch {
	case o.Redis == nil:
		return errors.New("ratelimit: Options.Redis is required")
	case o.Timeout < 0:
		return fmt.Errorf("ratelimit: Timeout %v must not be negative", o.Timeout)
	}
	return nil
}

// New returns a Shared limit as o says.
func New(o Options) (*Shared, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	// Among the service's keys (redis_rate puts "rate:" before them).
	prefix := "sg:client:"
	if o.Scope != "" {
		prefix += o.Scope + ":"
	}
	return &Shared{l: redis_rate.NewLimiter(o.Redis), timeout: o.Timeout, prefix: prefix}, nil
}

// Allow spends one request of client's budget of perSec requests a
// second with bursts of burst: ok, or when the client's next request is
// allowed. An error says Redis did not answer; nothing was decided.
func (s *Shared) Allow(ctx context.Context, client string, perSec float64, burst int) (ok bool, retryAfter time.Duration, err error) {
	if perSec <= 0 || burst < 1 {
		return false, 0, fmt.Errorf("ratelimit: rate %v and burst %d must be positive", perSec, burst)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	// GCRA needs only the interval between requests: one per 1/perSec.
	limit := redis_rate.Limit{Rate: 1, Burst: burst, Period: time.Duration(float64(time.Second) / perSec)}
	res, err := s.l.Allow(ctx, s.prefix+client, limit)
	if err != nil {
		return false, 0, fmt.Errorf("ratelimit: %w", err)
	}
	return res.Allowed > 0, max(res.RetryAfter, 0), nil
}

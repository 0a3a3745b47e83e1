package shardmem

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Package lock's calls: a lock is a string key holding its owner's token,
// taken with SET NX PX (SetNX), read with GET (Get), given back and kept
// by lua/unlock.lua and lua/renew.lua. A *Scripter is a lock.Redis.

// SetNX is SET key value NX PX expiration: whether it set the key.
func (s *Scripter) SetNX(ctx context.Context, key string, value any, expiration time.Duration) *redis.BoolCmd {
	if err := ctx.Err(); err != nil {
		return redis.NewBoolResult(false, err)
	}
	v, err := argString(value)
	if err != nil {
		return redis.NewBoolResult(false, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireDue(key)
	if s.exists(key) {
		return redis.NewBoolResult(false, nil)
	}
	s.strs[key] = v
	if expiration > 0 {
		// go-redis sends PX in whole milliseconds, at least 1.
		s.expires[key] = s.now().Add(max(expiration.Truncate(time.Millisecond), time.Millisecond))
	}
	return redis.NewBoolResult(true, nil)
}

// Get is GET key: redis.Nil when there is none.
func (s *Scripter) Get(ctx context.Context, key string) *redis.StringCmd {
	if err := ctx.Err(); err != nil {
		return redis.NewStringResult("", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireDue(key)
	v, ok := s.strs[key]
	if !ok {
		return redis.NewStringResult("", redis.Nil)
	}
	return redis.NewStringResult(v, nil)
}

// unlock is lua/unlock.lua.
func unlock(s *Scripter, k []string, a args) []any {
	token, ok := a.id(0)
	if !ok {
		return []any{int64(-2)}
	}
	if v, held := s.strs[k[0]]; held && v == token {
		s.del(k[0])
		return []any{int64(1)}
	}
	return []any{int64(0)}
}

// renew is lua/renew.lua.
func renew(s *Scripter, k []string, a args) []any {
	ttl, okTTL := a.int(1, 1, 1e12)
	token, ok := a.id(0)
	if !ok || !okTTL {
		return []any{int64(-2)}
	}
	if v, held := s.strs[k[0]]; held && v == token {
		s.pexpire(k[0], ttl)
		return []any{int64(1)}
	}
	return []any{int64(0)}
}

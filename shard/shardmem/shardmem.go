// Package shardmem runs the gate's scripts in this process's memory: the
// stock scripts of package lua (seed, deduct, restore, refill, read,
// fence), the buyer caps' (quota, unquota) and the hold budgets'
// (budget), each a Go port of its Lua, run one at a time and whole, as
// Redis runs a script; and the locks' (SET NX, GET, unlock, renew). A
// *Scripter is a redis.Scripter and a lock.Redis, so
//
//	mem := shardmem.New()
//	gate, _ := shard.New(shard.Options{Redis: mem})
//	locker, _ := lock.New(lock.Options{Redis: mem})
//
// are the sale's Gate and Locker with no server: the unit tier's (make
// test-unit).
//
// It is a fake, and only as good as its contract: shard's tests run the
// same cases, and random operation sequences side by side, on a real
// Redis Cluster and on a Scripter, comparing every answer (make test runs
// both; the unit tier the Scripter alone). A change to a script that is
// not made here fails them.
package shardmem

import (
	"context"
	"crypto/sha1"
	"encoding"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/lua"
)

// Scripter is the keys the scripts keep and the scripts, in memory. The
// zero value is not usable: call New.
type Scripter struct {
	mu      sync.Mutex
	now     func() time.Time
	scripts map[string]script // by the SHA-1 of the Lua source, as EVALSHA names it
	hashes  map[string]map[string]string
	strs    map[string]string
	zsets   map[string]map[string]float64
	expires map[string]time.Time
}

// script is one script's port: it reads KEYS and ARGV as Redis passes
// them (ARGV as strings) and answers as the Lua table would (see reply).
type script func(s *Scripter, keys []string, argv args) []any

var _ redis.Scripter = (*Scripter)(nil)

// New returns an empty Scripter whose keys expire by the wall clock.
func New() *Scripter {
	s := &Scripter{now: time.Now, hashes: map[string]map[string]string{}, strs: map[string]string{},
		zsets: map[string]map[string]float64{}, expires: map[string]time.Time{}, scripts: map[string]script{}}
	for src, run := range map[string]script{
		lua.Seed: seed, lua.Deduct: deduct, lua.Restore: restore, lua.Refill: refill, lua.Read: read,
		lua.Fence: fence, lua.Quota: quota, lua.Unquota: unquota, lua.Budget: budget,
		lua.Unlock: unlock, lua.Renew: renew,
	} {
		s.scripts[sha(src)] = run
	}
	return s
}

func sha(src string) string {
	h := sha1.Sum([]byte(src))
	return hex.EncodeToString(h[:])
}

// replyError is an error reply, as Redis gives it (go-redis tells it
// from a network error by the RedisError method).
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// EvalSha runs the script whose source has SHA-1 hash, or answers
// NOSCRIPT as Redis does for one it does not know.
func (s *Scripter) EvalSha(ctx context.Context, hash string, keys []string, a ...any) *redis.Cmd {
	run, ok := s.scripts[hash]
	if !ok {
		return redis.NewCmdResult(nil, replyError("NOSCRIPT No matching script. Please use EVAL."))
	}
	return s.run(ctx, run, keys, a)
}

// Eval runs src, which must be one of the gate's scripts.
func (s *Scripter) Eval(ctx context.Context, src string, keys []string, a ...any) *redis.Cmd {
	run, ok := s.scripts[sha(src)]
	if !ok {
		return redis.NewCmdResult(nil, replyError("ERR shardmem runs only the gate's scripts"))
	}
	return s.run(ctx, run, keys, a)
}

// EvalRO is Eval (the gate's read-only script, read, writes nothing).
func (s *Scripter) EvalRO(ctx context.Context, src string, keys []string, a ...any) *redis.Cmd {
	return s.Eval(ctx, src, keys, a...)
}

// EvalShaRO is EvalSha.
func (s *Scripter) EvalShaRO(ctx context.Context, hash string, keys []string, a ...any) *redis.Cmd {
	return s.EvalSha(ctx, hash, keys, a...)
}

// ScriptExists reports which hashes name a script this Scripter runs.
func (s *Scripter) ScriptExists(_ context.Context, hashes ...string) *redis.BoolSliceCmd {
	out := make([]bool, len(hashes))
	for i, h := range hashes {
		_, out[i] = s.scripts[h]
	}
	return redis.NewBoolSliceResult(out, nil)
}

// ScriptLoad answers src's hash when it is one of the gate's scripts.
func (s *Scripter) ScriptLoad(_ context.Context, src string) *redis.StringCmd {
	h := sha(src)
	if _, ok := s.scripts[h]; !ok {
		return redis.NewStringResult("", replyError("ERR shardmem runs only the gate's scripts"))
	}
	return redis.NewStringResult(h, nil)
}

func (s *Scripter) run(ctx context.Context, run script, keys []string, a []any) *redis.Cmd {
	if err := ctx.Err(); err != nil {
		return redis.NewCmdResult(nil, err)
	}
	argv := make(args, len(a))
	for i, v := range a {
		str, err := argString(v)
		if err != nil {
			return redis.NewCmdResult(nil, err)
		}
		argv[i] = str
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireDue(keys...)
	return s.answer(run, keys, argv)
}

// answer is the script's reply; a port that fails (too few KEYS, say)
// answers with an error reply, as Redis does for a Lua error.
func (s *Scripter) answer(run script, keys []string, argv args) (cmd *redis.Cmd) {
	defer func() {
		if p := recover(); p != nil {
			cmd = redis.NewCmdResult(nil, replyError(fmt.Sprintf("ERR Error running script: %v", p)))
		}
	}()
	return redis.NewCmdResult(reply(run(s, keys, argv)), nil)
}

// expireDue deletes those of keys whose expiry has passed, as Redis does
// when a command touches one (in whole milliseconds: a key lives through
// the millisecond it expires in).
func (s *Scripter) expireDue(keys ...string) {
	now := s.now().UnixMilli()
	for _, k := range keys {
		if at, ok := s.expires[k]; ok && now > at.UnixMilli() {
			s.del(k)
		}
	}
}

// argString is an argument as go-redis writes it on the wire (its
// proto.Writer's WriteArg), for the types the callers pass and their
// near kin; any other is refused, never guessed.
func argString(v any) (string, error) {
	switch v := v.(type) {
	case nil:
		return "", nil
	case string:
		return v, nil
	case []byte:
		return string(v), nil
	case int:
		return strconv.Itoa(v), nil
	case int8, int16, int32:
		return fmt.Sprint(v), nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case uint, uint8, uint16, uint32, uint64:
		return fmt.Sprint(v), nil
	case float32:
		return strconv.FormatFloat(float64(v), 'f', -1, 32), nil
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), nil
	case bool:
		if v {
			return "1", nil
		}
		return "0", nil
	case time.Duration:
		return strconv.FormatInt(v.Nanoseconds(), 10), nil
	case time.Time:
		return v.Format(time.RFC3339Nano), nil
	case encoding.BinaryMarshaler:
		b, err := v.MarshalBinary()
		return string(b), err
	}
	return "", fmt.Errorf("shardmem: can't marshal %T", v)
}

// reply is a Lua table as Redis answers it: a number becomes an integer
// (truncated), a string stays a string, and the array ends at the first
// nil, as Lua's length does.
func reply(t []any) []any {
	out := make([]any, 0, len(t))
	for _, v := range t {
		switch v := v.(type) {
		case nil:
			return out
		case int64:
			out = append(out, v)
		case float64:
			out = append(out, int64(v))
		case string:
			out = append(out, v)
		default:
			panic(fmt.Sprintf("shardmem: a script answered %T", v))
		}
	}
	return out
}

// args are a script's ARGV; a missing one reads as Lua's nil.
type args []string

func (a args) get(i int) (string, bool) {
	if i < len(a) {
		return a[i], true
	}
	return "", false
}

// int is the prelude's int(ARGV[i], lo, hi): the integer a string of 1
// to 18 decimal digits encodes, if lo <= it <= hi.
func (a args) int(i int, lo, hi int64) (int64, bool) {
	s, ok := a.get(i)
	if !ok || len(s) == 0 || len(s) > 18 {
		return 0, false
	}
	for j := range len(s) {
		if s[j] < '0' || s[j] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n >= lo && n <= hi
}

// id is the prelude's id(ARGV[i]): a string of 1 to 64 bytes.
func (a args) id(i int) (string, bool) {
	s, ok := a.get(i)
	return s, ok && isID(s)
}

func isID(s string) bool { return len(s) > 0 && len(s) <= 64 }

// The keys, as the scripts use them. A hash left without fields, like
// any key deleted, loses its expiry, as in Redis.

func (s *Scripter) del(k string) {
	delete(s.hashes, k)
	delete(s.strs, k)
	delete(s.zsets, k)
	delete(s.expires, k)
}

func (s *Scripter) exists(k string) bool {
	_, h := s.hashes[k]
	_, z := s.zsets[k]
	_, str := s.strs[k]
	return h || z || str
}

// hget is HGET: the field's value and whether it is there.
func (s *Scripter) hget(k, f string) (string, bool) {
	v, ok := s.hashes[k][f]
	return v, ok
}

func (s *Scripter) hset(k string, fv ...string) {
	h := s.hashes[k]
	if h == nil {
		h = map[string]string{}
		s.hashes[k] = h
	}
	for i := 0; i+1 < len(fv); i += 2 {
		h[fv[i]] = fv[i+1]
	}
}

// hsetnx is HSETNX: whether it set the field.
func (s *Scripter) hsetnx(k, f, v string) bool {
	if _, ok := s.hget(k, f); ok {
		return false
	}
	s.hset(k, f, v)
	return true
}

// hdel is HDEL: how many of the fields were there.
func (s *Scripter) hdel(k string, fs ...string) int {
	h := s.hashes[k]
	n := 0
	for _, f := range fs {
		if _, ok := h[f]; ok {
			delete(h, f)
			n++
		}
	}
	if h != nil && len(h) == 0 {
		s.del(k)
	}
	return n
}

// hincrby is HINCRBY of an integer field (absent: 0).
func (s *Scripter) hincrby(k, f string, by int64) int64 {
	v, _ := s.hget(k, f)
	n, _ := strconv.ParseInt(v, 10, 64)
	n += by
	s.hset(k, f, strconv.FormatInt(n, 10))
	return n
}

// pexpire is PEXPIRE: only a key that exists gets an expiry.
func (s *Scripter) pexpire(k string, ms int64) {
	if s.exists(k) {
		s.expires[k] = s.now().Add(time.Duration(ms) * time.Millisecond)
	}
}

// num is Lua's tonumber of a stored integer, and whether there was one.
func num(v string, ok bool) (int64, bool) {
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

// or0 is Lua's `v or '0'` for an HGET or HMGET field.
func or0(v string, ok bool) string {
	if ok {
		return v
	}
	return "0"
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// Hash is a copy of the hash at key (nil when there is none), for the
// contract tests that compare what the scripts keep with Redis's
// HGETALL; nothing else reads the keys from outside.
func (s *Scripter) Hash(key string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireDue(key)
	h, ok := s.hashes[key]
	if !ok {
		return nil
	}
	out := make(map[string]string, len(h))
	for f, v := range h {
		out[f] = v
	}
	return out
}

// ZSet is a copy of the sorted set at key (nil when there is none), as
// Hash.
func (s *Scripter) ZSet(key string) map[string]float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireDue(key)
	z, ok := s.zsets[key]
	if !ok {
		return nil
	}
	out := make(map[string]float64, len(z))
	for m, v := range z {
		out[m] = v
	}
	return out
}

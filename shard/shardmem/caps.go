package shardmem

import (
	"slices"
	"strings"
)

// The counts kept beside the stock: a buyer's units under a ticket's cap
// (lua/quota.lua, lua/unquota.lua) and an identity's held units under its
// hold budget (lua/budget.lua).

// quota is lua/quota.lua.
func quota(s *Scripter, k []string, a args) []any {
	q, okQ := a.int(1, 1, 1e9)
	limit, okCap := a.int(2, 1, 1e9)
	ttl, okTTL := a.int(3, 1000, 1e12)
	req, okReq := a.id(0)
	key, okKey := a.id(4)
	if !okQ || !okCap || !okTTL || !okReq || !okKey {
		return []any{int64(-2), int64(0)}
	}
	used, _ := num(or0(s.hget(k[0], "used")), true)
	if _, ok := s.hget(k[0], "r:"+req); ok {
		return []any{int64(2), used}
	}
	if used+q > limit {
		if _, ok := s.hget(k[0], "k:"+key); ok {
			return []any{int64(3), used}
		}
		return []any{int64(0), used}
	}
	used = s.hincrby(k[0], "used", q)
	s.hset(k[0], "r:"+req, itoa(q))
	s.hsetnx(k[0], "k:"+key, req)
	s.pexpire(k[0], ttl)
	return []any{int64(1), used}
}

// unquota is lua/unquota.lua.
func unquota(s *Scripter, k []string, a args) []any {
	req, okReq := a.id(0)
	key, hasKey := a.get(1)
	if !okReq || !hasKey || (key != "" && !isID(key)) {
		return []any{int64(-2), int64(0)}
	}
	q, counted := num(s.hget(k[0], "r:"+req))
	if !counted {
		return []any{int64(-3), int64(0)}
	}
	s.hdel(k[0], "r:"+req)
	if v, ok := s.hget(k[0], "k:"+key); key != "" && ok && v == req {
		s.hdel(k[0], "k:"+key)
	}
	used := s.hincrby(k[0], "used", -q)
	if used < 0 {
		s.hset(k[0], "used", "0")
		used = 0
	}
	return []any{int64(1), used}
}

// budget is lua/budget.lua: k[0] is the entries' expiries (a sorted set),
// k[1] the counts (a hash).
func budget(s *Scripter, k []string, a args) []any {
	op, _ := a.get(0)
	entry, okEntry := a.id(1)
	now, okNow := a.int(2, 0, 1e15)
	if !okEntry || !okNow {
		return []any{int64(-2), int64(0)}
	}
	// Entries past their expiry leave first, a bounded number per call.
	for _, e := range s.zrangeByScore(k[0], float64(now), 64) {
		if u, _ := num(or0(s.hget(k[1], "u:"+e)), true); u > 0 {
			s.hincrby(k[1], "used", -u)
		}
		s.hdel(k[1], "u:"+e, "d:"+e)
		s.zrem(k[0], e)
	}
	used, _ := num(or0(s.hget(k[1], "used")), true)
	used = max(used, 0)
	if op == "take" {
		return budgetTake(s, k, a, entry, now, used)
	}
	u, counted := num(s.hget(k[1], "u:"+entry))
	if !counted {
		return []any{int64(-3), ""}
	}
	tag, hasTag := s.hget(k[1], "d:"+entry)
	if !hasTag {
		tag = ""
	}
	switch op {
	case "end":
		used = max(used-u, 0)
		s.hset(k[1], "used", itoa(used))
		s.hdel(k[1], "u:"+entry, "d:"+entry)
		s.zrem(k[0], entry)
		budgetKeep(s, k, now)
		return []any{int64(1), tag}
	case "extend":
		exp, ok := a.int(3, 0, 1e15)
		if !ok {
			return []any{int64(-2), int64(0)}
		}
		// later only: a replayed extension's older expiry moves nothing
		if z := s.zsets[k[0]]; z != nil {
			if old, ok := z[entry]; ok && float64(exp) > old {
				z[entry] = float64(exp)
			}
		}
		budgetKeep(s, k, now)
		return []any{int64(1), tag}
	}
	return []any{int64(-2), int64(0)}
}

func budgetTake(s *Scripter, k []string, a args, entry string, now, used int64) []any {
	q, okQ := a.int(3, 1, 1e9)
	limit, okBudget := a.int(4, 0, 1e9)
	exp, okExp := a.int(5, 0, 1e15)
	tag, okTag := a.get(6)
	if !okQ || !okBudget || !okExp || !okTag || len(tag) > 64 {
		return []any{int64(-2), int64(0)}
	}
	if _, ok := s.hget(k[1], "u:"+entry); ok {
		d, hasTag := s.hget(k[1], "d:"+entry)
		if !hasTag {
			d = ""
		}
		return []any{int64(2), used, d}
	}
	if limit > 0 && used+q > limit {
		return []any{int64(0), used}
	}
	used += q
	s.hset(k[1], "used", itoa(used), "u:"+entry, itoa(q), "d:"+entry, tag)
	z := s.zsets[k[0]]
	if z == nil {
		z = map[string]float64{}
		s.zsets[k[0]] = z
	}
	z[entry] = float64(exp)
	budgetKeep(s, k, now)
	return []any{int64(1), used}
}

// budgetKeep is the script's keep(): the keys live a minute past their
// latest entry, and go with the last one.
func budgetKeep(s *Scripter, k []string, now int64) {
	z := s.zsets[k[0]]
	if len(z) == 0 {
		s.del(k[0])
		s.del(k[1])
		return
	}
	last := slices.MaxFunc(zmembers(z), func(x, y zmember) int { return x.compare(y) })
	ttl := max(int64(last.score)-now, 0) + 60000
	s.pexpire(k[0], ttl)
	s.pexpire(k[1], ttl)
}

// zmember is a sorted set's member, ordered as Redis orders them: by
// score, then by the member's bytes.
type zmember struct {
	name  string
	score float64
}

func (x zmember) compare(y zmember) int {
	switch {
	case x.score < y.score:
		return -1
	case x.score > y.score:
		return 1
	}
	return strings.Compare(x.name, y.name)
}

func zmembers(z map[string]float64) []zmember {
	out := make([]zmember, 0, len(z))
	for name, score := range z {
		out = append(out, zmember{name, score})
	}
	return out
}

// zrangeByScore is ZRANGEBYSCORE key -inf hi LIMIT 0 limit.
func (s *Scripter) zrangeByScore(key string, hi float64, limit int) []string {
	ms := zmembers(s.zsets[key])
	slices.SortFunc(ms, zmember.compare)
	var out []string
	for _, m := range ms {
		if m.score > hi || len(out) == limit {
			break
		}
		out = append(out, m.name)
	}
	return out
}

// zrem is ZREM of one member; the set goes with its last member.
func (s *Scripter) zrem(key, member string) {
	z := s.zsets[key]
	delete(z, member)
	if z != nil && len(z) == 0 {
		s.del(key)
	}
}

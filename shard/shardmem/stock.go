package shardmem

import "strconv"

// The stock scripts, each a port of its file in package lua, whose
// comments say what each answer means; the ports keep the Lua's order of
// checks, so a bad argument and a missing key answer as there.

// seed is lua/seed.lua.
func seed(s *Scripter, k []string, a args) []any {
	allot, okAllot := a.int(1, 0, 1e15)
	avail, okAvail := a.int(0, 0, allot)
	epoch, okEpoch := a.int(3, 0, 1e15)
	mode, _ := a.get(2)
	if !okAllot || !okAvail || !okEpoch || (mode != "0" && mode != "1") {
		return []any{int64(-2), int64(0)}
	}
	if _, ok := s.hget(k[0], "avail"); mode == "0" && ok {
		e, _ := num(s.hget(k[0], "epoch"))
		return []any{int64(-5), e}
	}
	s.hset(k[0], "avail", itoa(avail), "allot", itoa(allot), "epoch", itoa(epoch))
	return []any{int64(1), epoch}
}

// deduct is lua/deduct.lua.
func deduct(s *Scripter, k []string, a args) []any {
	bad := []any{int64(-2), int64(0), int64(0), int64(0), int64(0)}
	mx, ok := a.int(2, 1, 1e9)
	q, okQ := a.int(0, 1, mx)
	least, okMin := a.int(1, 1, q)
	_, okTTL := a.int(3, 1000, 1e12)
	ttl, _ := a.get(3)
	holder := "_"
	if h, ok := a.get(4); ok {
		holder = h
	}
	if !ok || !okQ || !okMin || !okTTL || !isID(holder) || holder == "*" {
		return bad
	}
	if f, _ := s.hget(k[0], "fence"); f == "1" {
		return []any{int64(-6), int64(0), int64(0), int64(0), int64(0)}
	}
	shardEpoch := or0(s.hget(k[0], "epoch"))
	epoch, _ := strconv.ParseInt(shardEpoch, 10, 64)

	recQ, hasRec := s.hget(k[1], "q")
	recGen, hasGen := s.hget(k[1], "gen")
	restored, _ := s.hget(k[1], "restored")
	recEpoch, hasEpoch := s.hget(k[1], "epoch")
	if hasRec && restored == "0" && hasEpoch && recEpoch == shardEpoch {
		if _, ok := s.hget(k[1], "n"); !ok {
			s.hset(k[1], "h:-", "1", "n", "1")
		}
		if s.hsetnx(k[1], "h:"+holder, "1") {
			s.hincrby(k[1], "n", 1)
		}
		taken, _ := num(recQ, true)
		gen, _ := num(recGen, hasGen)
		return []any{int64(2), taken, int64(-1), gen, epoch}
	}

	avail, seeded := num(s.hget(k[0], "avail"))
	if !seeded {
		return []any{int64(-1), int64(0), int64(0), int64(0), int64(0)}
	}
	if avail < least {
		return []any{int64(0), int64(0), avail, int64(0), epoch}
	}
	take := min(q, avail)
	avail = s.hincrby(k[0], "avail", -take)
	prev, _ := num(recGen, hasGen)
	gen := prev + 1
	if hasGen {
		s.del(k[1]) // an earlier gen's holders go with it
	}
	s.hset(k[1], "q", itoa(take), "gen", itoa(gen), "epoch", shardEpoch, "restored", "0", "h:"+holder, "1", "n", "1")
	ms, _ := strconv.ParseInt(ttl, 10, 64)
	s.pexpire(k[1], ms)
	return []any{int64(1), take, avail, gen, epoch}
}

// restore is lua/restore.lua.
func restore(s *Scripter, k []string, a args) []any {
	gen, _ := a.get(0)
	if _, ok := a.int(0, 1, 1e15); !ok {
		return []any{int64(-2), int64(0), int64(0)}
	}
	holder := "*"
	if h, ok := a.get(1); ok {
		holder = h
	}
	if !isID(holder) {
		return []any{int64(-2), int64(0), int64(0)}
	}
	recQ, hasRec := s.hget(k[1], "q")
	if recGen, _ := s.hget(k[1], "gen"); !hasRec || recGen != gen {
		return []any{int64(-3), int64(0), int64(0)}
	}
	if r, _ := s.hget(k[1], "restored"); r == "1" {
		return []any{int64(2), int64(0), int64(0)}
	}
	if holder != "*" {
		n, _ := num(s.hget(k[1], "n")) // none: a record from before holders were kept
		if s.hdel(k[1], "h:"+holder) == 1 {
			n = s.hincrby(k[1], "n", -1)
		}
		if n > 0 {
			return []any{int64(3), int64(0), int64(0)}
		}
	}
	recEpoch, hasEpoch := s.hget(k[1], "epoch")
	s.hset(k[1], "restored", "1")

	avail, seeded := num(s.hget(k[0], "avail"))
	if !seeded {
		return []any{int64(-1), int64(0), int64(0)}
	}
	if or0(s.hget(k[0], "epoch")) != recEpoch || !hasEpoch {
		return []any{int64(-4), int64(0), avail}
	}
	q, _ := num(recQ, true)
	allot, _ := num(s.hget(k[0], "allot"))
	back := min(q, allot-avail)
	if back > 0 {
		avail = s.hincrby(k[0], "avail", back)
	} else {
		back = 0
	}
	return []any{int64(1), back, avail}
}

// refill is lua/refill.lua.
func refill(s *Scripter, k []string, a args) []any {
	epoch, okEpoch := a.int(0, 0, 1e15)
	q, okQ := a.int(1, 1, 1e9)
	ttl, okTTL := a.int(2, 1000, 1e12)
	if !okEpoch || !okQ || !okTTL {
		return []any{int64(-2), int64(0)}
	}
	if s.exists(k[1]) {
		return []any{int64(2), int64(0)}
	}
	avail, seeded := num(s.hget(k[0], "avail"))
	if _, fenced := s.hget(k[0], "fence"); !seeded && fenced {
		return []any{int64(4), int64(0)} // a rebuild under way
	}
	if !seeded {
		return []any{int64(-1), int64(0)}
	}
	at, _ := num(or0(s.hget(k[0], "epoch")), true)
	switch {
	case at > epoch:
		return []any{int64(3), avail}
	case at < epoch:
		return []any{int64(4), avail}
	}
	s.hincrby(k[0], "allot", q)
	avail = s.hincrby(k[0], "avail", q)
	s.strs[k[1]] = itoa(q)
	s.pexpire(k[1], ttl)
	return []any{int64(1), avail}
}

// fence is lua/fence.lua.
func fence(s *Scripter, k []string, a args) []any {
	switch mode, _ := a.get(0); mode {
	case "1":
		s.hset(k[0], "fence", "1")
	case "0":
		s.hdel(k[0], "fence")
	default:
		return []any{int64(-2)}
	}
	return []any{int64(1)}
}

// read is lua/read.lua. An allotment that is not there ends the answer
// early, as the Lua table's nil does.
func read(s *Scripter, k []string, _ args) []any {
	fenced := int64(0)
	if f, _ := s.hget(k[0], "fence"); f == "1" {
		fenced = 1
	}
	avail, seeded := num(s.hget(k[0], "avail"))
	if !seeded {
		return []any{int64(-1), int64(0), int64(0), int64(0), fenced}
	}
	var allot any
	if v, ok := num(s.hget(k[0], "allot")); ok {
		allot = v
	}
	epoch, _ := num(or0(s.hget(k[0], "epoch")), true)
	return []any{int64(1), avail, allot, epoch, fenced}
}

-- queue_advance: the pacer's step: admit the next buyers of the line as
-- far as the rate and the stock allow.
--
-- KEYS[1]  the line's counters (hash)
-- KEYS[2]  batches by time (zset: score the advance's time, member its
--          end position)
-- KEYS[3]  batches by end position (zset: score the end position, member
--          "end:time")
-- KEYS[4]  spent admissions (zset: score the position)
-- KEYS[5]  spent admissions whose request has not committed yet (zset:
--          score the position; see queue_spend)
-- ARGV[1]  now, Unix ms
-- ARGV[2]  opening time, Unix ms
-- ARGV[3]  most to admit in this step (the rate's share)
-- ARGV[4]  how many admitted buyers who have not bought may exist now
--          (the tickets left times the factor)
-- ARGV[5]  the admission window, ms
-- ARGV[6]  1 when nothing is left to sell (the line closes), else 0
-- ARGV[7]  the room's id
-- ARGV[8]  admitted-but-unused to count at least (the pacer's last step's:
--          see the pacer)
--
-- Admitted-but-unused are the buyers admitted within the window who have
-- not bought with their admission: never spent, or spent by a request
-- that has not committed (its ticket is not sold in the ledger yet, so the
-- stock the pacer read still counts it as left); buyers admitted before
-- the window who never spent it have abandoned. The positions a restore could not tell given
-- or not (egaplo..egaphi early, gaplo..gaphi late) are admitted at once
-- when the line reaches them and count in neither.
--
-- Returns {1, serving, unused, abandoned, joined, opened, early, late,
-- old, then a size and a bought for each of three cohorts} (opened 1 once
-- the early count is fixed; old the last position admitted before the
-- window; a cohort: the buyers admitted within the window at least an
-- eighth, a quarter and half of it ago, and how many of them bought); {-1} the line's record is missing or
-- another room's (restore it first); {-8} Redis changed under the line
-- (fence it first: queue_resume); -2 bad argument.
local now, opens = int(ARGV[1], 0, 1e15), int(ARGV[2], 0, 1e15)
local most, cap = int(ARGV[3], 0, 1e12), int(ARGV[4], 0, 1e15)
local window, soldout = int(ARGV[5], 1, 1e12), int(ARGV[6], 0, 1)
local floor = int(ARGV[8], 0, 1e15)
if not now or not opens or not most or not cap or not window or not soldout or not id(ARGV[7]) or not floor then return {-2} end
local lh = redis.call('HMGET', KEYS[1], 'line', 'hist')
if lh[1] ~= ARGV[7] then return {-1} end
if lh[2] ~= string.match(redis.call('INFO', 'replication'), 'master_replid:(%w+)') then return {-8} end
local frozen = redis.call('HGET', KEYS[1], 'frozen')
if not frozen and now >= opens then
  frozen = redis.call('HGET', KEYS[1], 'pre') or '0'
  redis.call('HSET', KEYS[1], 'frozen', frozen)
end
local late = tonumber(redis.call('HGET', KEYS[1], 'post') or 0)
local early = tonumber(frozen or redis.call('HGET', KEYS[1], 'pre') or 0)
local joined = early + late
local serving = tonumber(redis.call('HGET', KEYS[1], 'serving') or 0)
-- Positions outside the admitted-unused count (unless spent): the gaps a
-- restore could not tell given or not, early and late.
local g = redis.call('HMGET', KEYS[1], 'egaplo', 'egaphi', 'gaplo', 'gaphi')
local outside = {}
for i = 1, 3, 2 do
  local lo, hi = tonumber(g[i] or 0), tonumber(g[i + 1] or -1)
  if lo > 0 and hi >= lo then outside[#outside + 1] = {lo, hi} end
end
-- gap(a, b): how many positions outside the count lie in (a, b].
local function gap(a, b)
  local n = 0
  for _, r in ipairs(outside) do
    local lo, hi = math.max(a + 1, r[1]), math.min(b, r[2])
    if hi >= lo then n = n + hi - lo + 1 end
  end
  return n
end
-- count(z, a, b): the members of z at positions in (a, b], outside
-- excluded.
local function count(z, a, b)
  local n = redis.call('ZCOUNT', z, '(' .. a, b)
  for _, r in ipairs(outside) do
    local lo, hi = math.max(a + 1, r[1]), math.min(b, r[2])
    if hi >= lo then n = n - redis.call('ZCOUNT', z, lo, hi) end
  end
  return n
end
local function spent(a, b) return count(KEYS[4], a, b) - count(KEYS[5], a, b) end
local before = now - window
local last = redis.call('ZREVRANGEBYSCORE', KEYS[2], before, '-inf', 'LIMIT', 0, 1)
local old = 0
if #last > 0 then old = tonumber(last[1]) end
-- Never fewer than the line said before: a pacer's step whose clock read
-- came before a restore (or another replica's clock, behind) found no
-- batch old enough and read 0, and an expired buyer checked as admitted.
old = math.max(old, tonumber(redis.call('HGET', KEYS[1], 'old') or 0))
local unused = serving - old - gap(old, serving) - spent(old, 1e15)
local abandoned = old - gap(0, old) - count(KEYS[4], 0, old)
redis.call('HSET', KEYS[1], 'soldout', soldout)
if frozen and soldout == 0 then
  -- Admit up to `need` places outside the gaps; a gap the line reaches
  -- is admitted whole and costs nothing.
  local need = math.min(most, cap - math.max(unused, floor))
  local to = serving
  while to < joined do
    local jumped = false
    for _, r in ipairs(outside) do
      if to + 1 == r[1] then to, jumped = r[2], true end
    end
    if not jumped then
      if need <= 0 then break end
      local stop = joined
      for _, r in ipairs(outside) do
        if r[1] > to then stop = math.min(stop, r[1] - 1) end
      end
      local n = math.min(need, stop - to)
      to, need = to + n, need - n
    end
  end
  to = math.min(to, joined)
  if to > serving then
    unused = unused + (to - serving) - gap(serving, to)
    serving = to
    redis.call('HSET', KEYS[1], 'serving', serving)
    redis.call('ZADD', KEYS[2], now, serving)
    redis.call('ZADD', KEYS[3], serving, serving .. ':' .. now)
  end
end
-- Keep the batches of the window and the last one before it.
local older = redis.call('ZCOUNT', KEYS[2], '-inf', before)
if older > 1 then
  local gone = redis.call('ZRANGE', KEYS[2], 0, older - 2)
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, older - 2)
  for _, e in ipairs(gone) do
    redis.call('ZREMRANGEBYSCORE', KEYS[3], e, e)
  end
end
redis.call('HSET', KEYS[1], 'unused', unused, 'abandoned', abandoned, 'old', old)
local opened = 0
if frozen then opened = 1 end
local out = {1, serving, unused, abandoned, joined, opened, early, late, old}
-- The cohorts: who was admitted long enough ago to have bought by now,
-- if they buy, shows the line's latest conversion sooner than the
-- walk-aways do (a walk-away is known only when its window ends).
for _, part in ipairs({8, 4, 2}) do
  local at = redis.call('ZREVRANGEBYSCORE', KEYS[2], now - math.floor(window / part), '-inf', 'LIMIT', 0, 1)
  local to = old
  if #at > 0 then to = math.max(tonumber(at[1]), old) end
  out[#out + 1] = to - old - gap(old, to)
  out[#out + 1] = spent(old, to)
end
return out

-- budget: the units one identity (a buyer, or a device or payment
-- fingerprint) holds at once across a program, under its hold budget.
-- Each hold is an entry that leaves by itself at its expiry (plus a
-- grace), so an end the replica could not report (it died between the
-- ledger and Redis) over-counts at most until the hold would have expired.
--
-- KEYS[1]  sorted set: entry id -> expiry (ms)
-- KEYS[2]  hash {used, u:<id> = units, d:<id> = the device tag it was
--          also counted under ("" for none)}; same slot as KEYS[1]
-- ARGV[1]  'take' | 'end' | 'extend'
-- ARGV[2]  entry id (the hold's gate request id)
-- ARGV[3]  now (ms)
-- take:    ARGV[4] units (>= 1), ARGV[5] budget (0: count only),
--          ARGV[6] expiry (ms), ARGV[7] device tag ("" for none)
-- extend:  ARGV[4] new expiry (ms); an earlier one moves nothing
--
-- Returns {code, used or tag}:
--   take    1 counted (used: the new total), 2 counted before (a retry;
--           nothing changed; a third element: the device tag it was
--           counted under), 0 over the budget (nothing changed)
--   end     1 ended (tag: the device tag to end it under too), -3 no entry
--   extend  1 moved (tag as for end), -3 no entry
--  -2  bad argument
local op, entry = ARGV[1], ARGV[2]
local now = int(ARGV[3], 0, 1e15)
if not id(entry) or not now then return {-2, 0} end

-- Entries past their expiry leave first, a bounded number per call.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 64)
for _, e in ipairs(due) do
  local u = tonumber(redis.call('HGET', KEYS[2], 'u:' .. e) or '0')
  if u > 0 then redis.call('HINCRBY', KEYS[2], 'used', -u) end
  redis.call('HDEL', KEYS[2], 'u:' .. e, 'd:' .. e)
  redis.call('ZREM', KEYS[1], e)
end
local used = tonumber(redis.call('HGET', KEYS[2], 'used') or '0')
if used < 0 then used = 0 end

-- The keys live a minute past their latest entry.
local function keep()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', KEYS[1], KEYS[2])
    return
  end
  local ttl = math.max(tonumber(last[2]) - now, 0) + 60000
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
end

if op == 'take' then
  local q = int(ARGV[4], 1, 1e9)
  local budget = int(ARGV[5], 0, 1e9)
  local exp = int(ARGV[6], 0, 1e15)
  local tag = ARGV[7]
  if not q or not budget or not exp or type(tag) ~= 'string' or #tag > 64 then return {-2, 0} end
  if redis.call('HEXISTS', KEYS[2], 'u:' .. entry) == 1 then
    return {2, used, redis.call('HGET', KEYS[2], 'd:' .. entry) or ''}
  end
  if budget > 0 and used + q > budget then return {0, used} end
  used = used + q
  redis.call('HSET', KEYS[2], 'used', used, 'u:' .. entry, q, 'd:' .. entry, tag)
  redis.call('ZADD', KEYS[1], exp, entry)
  keep()
  return {1, used}
end

local u = redis.call('HGET', KEYS[2], 'u:' .. entry)
if not u then return {-3, ''} end
local tag = redis.call('HGET', KEYS[2], 'd:' .. entry) or ''
if op == 'end' then
  used = math.max(used - tonumber(u), 0)
  redis.call('HSET', KEYS[2], 'used', used)
  redis.call('HDEL', KEYS[2], 'u:' .. entry, 'd:' .. entry)
  redis.call('ZREM', KEYS[1], entry)
  keep()
  return {1, tag}
elseif op == 'extend' then
  local exp = int(ARGV[4], 0, 1e15)
  if not exp then return {-2, 0} end
  redis.call('ZADD', KEYS[1], 'XX', 'GT', exp, entry) -- later only: a replayed extension's older expiry moves nothing
  keep()
  return {1, tag}
end
return {-2, 0}

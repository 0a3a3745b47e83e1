-- restore: give one deduction back to its shard, once, never above the
-- shard's allotment, when no attempt holds it any more.
--
-- KEYS[1]  shard stock hash {avail, allot, epoch, fence}
-- KEYS[2]  deduction record {q, gen, epoch, restored, n, h:<holder>...}
-- ARGV[1]  gen of the deduction being given back (integer >= 1)
-- ARGV[2]  optional: the holder letting go (see deduct.lua); the units go
--          back once no holder is left. "*" or absent: back whoever holds
--          it (the request committed on other units, or no attempt may
--          still commit it). Letting go twice is letting go once.
--
-- Returns {code, restored, avail}:
--   1  restored units are back; avail is the shard's new level
--   2  this deduction was restored before; nothing moved
--   3  another attempt still holds it (a copy of the request that may
--      commit on it): this holder let go, nothing moved
--  -3  no such deduction here (never made, expired, or a different gen);
--      nothing moved. A restore can only follow a deduct.
--  -4  the deduction predates the shard's last seed, whose ledger facts
--      already count it; marked restored, nothing moved
--  -1  the shard is not seeded (Redis lost it); a re-seed from the ledger
--      will count the units; marked restored, nothing moved
--  -2  bad argument; nothing moved
if not int(ARGV[1], 1, 1e15) then return {-2, 0, 0} end
local holder = ARGV[2] or '*'
if not id(holder) then return {-2, 0, 0} end

local rec = redis.call('HMGET', KEYS[2], 'q', 'gen', 'epoch', 'restored', 'n')
if not rec[1] or rec[2] ~= ARGV[1] then return {-3, 0, 0} end
if rec[4] == '1' then return {2, 0, 0} end
if holder ~= '*' then
  local n = tonumber(rec[5]) or 0 -- none: a record from before holders were kept
  if redis.call('HDEL', KEYS[2], 'h:' .. holder) == 1 then
    n = redis.call('HINCRBY', KEYS[2], 'n', -1)
  end
  if n > 0 then return {3, 0, 0} end
end
redis.call('HSET', KEYS[2], 'restored', '1')

local s = redis.call('HMGET', KEYS[1], 'avail', 'allot', 'epoch')
if not s[1] then return {-1, 0, 0} end
if (s[3] or '0') ~= rec[3] then return {-4, 0, tonumber(s[1])} end

local avail = tonumber(s[1])
local back = math.min(tonumber(rec[1]), tonumber(s[2]) - avail)
if back > 0 then
  avail = redis.call('HINCRBY', KEYS[1], 'avail', back)
else
  back = 0
end
return {1, back, avail}

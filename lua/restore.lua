-- restore: give one deduction back to its shard, once, never above the
-- shard's allotment.
--
-- KEYS[1]  shard stock hash {avail, allot, epoch, fence}
-- KEYS[2]  deduction record {q, gen, epoch, restored}
-- ARGV[1]  gen of the deduction being given back (integer >= 1)
--
-- Returns {code, restored, avail}:
--   1  restored units are back; avail is the shard's new level
--   2  this deduction was restored before; nothing moved
--  -3  no such deduction here (never made, expired, or a different gen);
--      nothing moved. A restore can only follow a deduct.
--  -4  the deduction predates the shard's last seed, whose ledger facts
--      already count it; marked restored, nothing moved
--  -1  the shard is not seeded (Redis lost it); a re-seed from the ledger
--      will count the units; marked restored, nothing moved
--  -2  bad argument; nothing moved
if not int(ARGV[1], 1, 1e15) then return {-2, 0, 0} end

local rec = redis.call('HMGET', KEYS[2], 'q', 'gen', 'epoch', 'restored')
if not rec[1] or rec[2] ~= ARGV[1] then return {-3, 0, 0} end
if rec[4] == '1' then return {2, 0, 0} end
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

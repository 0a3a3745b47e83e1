-- unquota: take a request's units off a buyer's count, once (its hold was
-- cancelled or expired, its order refunded, or its purchase refused).
--
-- KEYS[1]  the buyer's quota hash (see quota.lua)
-- ARGV[1]  request id
-- ARGV[2]  key id of a refused request, whose k: entry goes too (if it
--          still names this request); "" for stock that came back, whose
--          request stays known
--
-- Returns {code, used}:
--   1  released; used is the buyer's new total (never below 0)
--  -3  no such request counted here (never, released before, or expired)
--  -2  bad argument
if not id(ARGV[1]) or (ARGV[2] ~= '' and not id(ARGV[2])) then return {-2, 0} end
local q = redis.call('HGET', KEYS[1], 'r:' .. ARGV[1])
if not q then return {-3, 0} end
redis.call('HDEL', KEYS[1], 'r:' .. ARGV[1])
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'k:' .. ARGV[2]) == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'k:' .. ARGV[2])
end
local used = redis.call('HINCRBY', KEYS[1], 'used', -tonumber(q))
if used < 0 then
  redis.call('HSET', KEYS[1], 'used', 0)
  used = 0
end
return {1, used}

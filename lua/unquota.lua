-- unquota: take a request's units off a buyer's count, once (its hold was
-- cancelled or expired, its order refunded, or its purchase refused).
--
-- KEYS[1]  the buyer's quota hash {used, r:<request id> = units}
-- ARGV[1]  request id
--
-- Returns {code, used}:
--   1  released; used is the buyer's new total (never below 0)
--  -3  no such request counted here (never, released before, or expired)
--  -2  bad argument
if not id(ARGV[1]) then return {-2, 0} end
local q = redis.call('HGET', KEYS[1], 'r:' .. ARGV[1])
if not q then return {-3, 0} end
redis.call('HDEL', KEYS[1], 'r:' .. ARGV[1])
local used = redis.call('HINCRBY', KEYS[1], 'used', -tonumber(q))
if used < 0 then
  redis.call('HSET', KEYS[1], 'used', 0)
  used = 0
end
return {1, used}

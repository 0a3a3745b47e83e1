-- queue_release: give a buyer's admission back from a request that was
-- refused and moved nothing (a seat taken, a ticket sold out, a wrong
-- code), so the buyer may buy with it again within its window.
--
-- KEYS[1]  spent admissions (zset: member the buyer)
-- KEYS[2]  buyer -> the request that spent its admission (hash)
-- ARGV[1]  buyer id
-- ARGV[2]  request id
--
-- Returns {1} given back; {0} not spent by this request (nothing
-- changed); -2 bad argument.
if not id(ARGV[1]) or not id(ARGV[2]) then return {-2} end
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return {0} end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
return {1}

-- queue_settle: a request that spent a buyer's admission is done with it.
--
-- KEYS[1]  spent admissions (zset: member the buyer)
-- KEYS[2]  buyer -> the request that spent its admission (hash)
-- KEYS[3]  buyer -> copies of that request in flight, and "buyer:done"
--          once one committed (hash)
-- KEYS[4]  spent admissions whose request has not committed yet (zset;
--          see queue_spend)
-- ARGV[1]  buyer id
-- ARGV[2]  request id
-- ARGV[3]  how it ended: 1 committed (the admission stays spent), 0
--          refused having moved nothing, 2 not known (a failure: the
--          client retries the request)
--
-- The admission goes back only when the last copy of the request in flight
-- (a retry on another replica, a copy sent twice) ends refused and none
-- committed: a copy refused while another commits gives nothing back.
--
-- Returns {1} given back; {0} kept (spent by another request, committed,
-- or another copy still in flight); {3} Redis has no spend of this buyer's
-- (the line was lost since): the ledger's record decides; -2 bad argument.
local outcome = int(ARGV[3], 0, 2)
if not id(ARGV[1]) or not id(ARGV[2]) or not outcome then return {-2} end
local had = redis.call('HGET', KEYS[2], ARGV[1])
if not had then return {3} end
if had ~= ARGV[2] then return {0} end
local left = redis.call('HINCRBY', KEYS[3], ARGV[1], -1)
if outcome == 1 then
  redis.call('HSET', KEYS[3], ARGV[1] .. ':done', 1)
  redis.call('ZREM', KEYS[4], ARGV[1])
  return {0}
end
if outcome == 2 or left > 0 or redis.call('HEXISTS', KEYS[3], ARGV[1] .. ':done') == 1 then return {0} end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
return {1}

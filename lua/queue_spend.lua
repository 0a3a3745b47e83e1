-- queue_spend: spend a buyer's admission on one request.
--
-- KEYS[1]  spent admissions (zset: member the buyer, score its position)
-- KEYS[2]  buyer -> the request that spent its admission (hash)
-- KEYS[3]  batches by end position (zset: score the end position, member
--          "end:time")
-- KEYS[4]  the line's counters (hash)
-- KEYS[5]  buyer -> copies of the spending request in flight (hash; see
--          queue_settle)
-- KEYS[6]  spent admissions whose request has not committed yet (zset:
--          member the buyer, score its position; queue_settle takes it
--          out)
-- ARGV[1]  position admitted
-- ARGV[2]  buyer id
-- ARGV[3]  request id (the same request may spend it again: a retry)
-- ARGV[4]  now, Unix ms
-- ARGV[5]  the admission window, ms
-- ARGV[6]  the room's id
--
-- One admission per buyer: a buyer Redis lost and who joined again, so
-- holds two places, still spends one.
--
-- Returns {1, at} spent by this request now (at: when the position was
-- admitted, Unix ms); {2, 0} spent by this request before; {0} spent by
-- another request; {4} not admitted yet; {3} admitted longer ago than the
-- window (expired); {-1} the line's record is missing or another room's
-- (restore it, then spend again); -2 bad argument.
local pos, now, window = int(ARGV[1], 1, 1e15), int(ARGV[4], 0, 1e15), int(ARGV[5], 1, 1e12)
if not pos or not id(ARGV[2]) or not id(ARGV[3]) or not now or not window or not id(ARGV[6]) then return {-2} end
if redis.call('HGET', KEYS[4], 'line') ~= ARGV[6] then return {-1} end
local had = redis.call('HGET', KEYS[2], ARGV[2])
if had then
  if had ~= ARGV[3] then return {0} end
  redis.call('HINCRBY', KEYS[5], ARGV[2], 1)
  return {2, 0}
end
-- The places the line counts as expired stay so, whatever this clock says.
if pos <= tonumber(redis.call('HGET', KEYS[4], 'old') or 0) then return {3} end
local batch = redis.call('ZRANGEBYSCORE', KEYS[3], pos, '+inf', 'LIMIT', 0, 1)
if #batch == 0 then return {4} end
local at = tonumber(string.match(batch[1], ':(%d+)$'))
if now > at + window then return {3} end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[1], pos, ARGV[2])
redis.call('ZADD', KEYS[6], pos, ARGV[2])
redis.call('HINCRBY', KEYS[5], ARGV[2], 1)
return {1, at}

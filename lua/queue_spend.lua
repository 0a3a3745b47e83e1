-- queue_spend: spend an admitted position's token on one request.
--
-- KEYS[1]  spent positions (zset: score the position)
-- KEYS[2]  position -> the request that spent it (hash)
-- KEYS[3]  batches by end position (zset: score the end position, member
--          "end:time")
-- ARGV[1]  position
-- ARGV[2]  request id (the same request may spend it again: a retry)
-- ARGV[3]  now, Unix ms
-- ARGV[4]  the admission window, ms
--
-- Returns {1} spent by this request (now or before); {0} spent by another
-- request; {4} not admitted yet; {3} admitted longer ago than the window
-- (expired); -2 bad argument.
local pos, now, window = int(ARGV[1], 1, 1e15), int(ARGV[3], 0, 1e15), int(ARGV[4], 1, 1e12)
if not pos or not id(ARGV[2]) or not now or not window then return {-2} end
local had = redis.call('HGET', KEYS[2], pos)
if had then
  if had == ARGV[2] then return {1} end
  return {0}
end
local batch = redis.call('ZRANGEBYSCORE', KEYS[3], pos, '+inf', 'LIMIT', 0, 1)
if #batch == 0 then return {4} end
local at = tonumber(string.match(batch[1], ':(%d+)$'))
if now > at + window then return {3} end
redis.call('HSET', KEYS[2], pos, ARGV[2])
redis.call('ZADD', KEYS[1], pos, pos)
return {1}

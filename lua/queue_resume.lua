-- queue_resume: fence a room's line after Redis changed under it (a
-- failover promoted a replica that may not have every join the old master
-- acknowledged, or the master restarted from its files): every place the
-- ledger reserved counts as given, so none is given twice.
--
-- KEYS[1]  the line's counters (hash)
-- ARGV[1]  the room's id
-- ARGV[2]  early places the ledger reserved
-- ARGV[3]  late places the ledger reserved
--
-- The places past the line's counts up to the reservations may or may not
-- have been given: they become a gap (admitted at once when the line
-- reaches them, outside the admitted-unused count). The line then belongs
-- to this master's history (its replication id).
--
-- Before the opening, the early joins this master has stay drawn at random
-- (perm) and the early places reserved after them keep their order.
--
-- Returns {1, early, opened}: fenced, with the early joins this master had
-- and 1 if the line had opened; {2} the line was this history's already;
-- {-1} the line is missing or another room's (restore it instead); -2 bad
-- argument.
local precap, postcap = int(ARGV[2], 0, 1e15), int(ARGV[3], 0, 1e15)
if not id(ARGV[1]) or not precap or not postcap then return {-2} end
local m = redis.call('HMGET', KEYS[1], 'line', 'hist', 'frozen', 'pre', 'post')
if m[1] ~= ARGV[1] then return {-1} end
local hist = string.match(redis.call('INFO', 'replication'), 'master_replid:(%w+)')
if m[2] == hist then return {2} end
local pre, post = tonumber(m[4] or 0), tonumber(m[5] or 0)
local early, opened = pre, 0
if m[3] then
  opened = 1
  local frozen = tonumber(m[3])
  if postcap > post then
    redis.call('HSET', KEYS[1], 'post', postcap, 'gaplo', frozen + post + 1, 'gaphi', frozen + postcap)
    post = postcap
  end
elseif precap > pre then
  redis.call('HSET', KEYS[1], 'pre', precap, 'egaplo', pre + 1, 'egaphi', precap)
  if not redis.call('HGET', KEYS[1], 'perm') then redis.call('HSET', KEYS[1], 'perm', math.max(pre, 1)) end
  pre = precap
end
redis.call('HSET', KEYS[1], 'precap', math.max(pre, precap), 'postcap', math.max(post, postcap), 'hist', hist)
return {1, early, opened}

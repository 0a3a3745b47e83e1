-- queue_restore: make a room's line from the ledger's facts, when Redis
-- has none (a new room, or a line Redis lost) or has another room's (the
-- waiting room was turned off and on again: that line goes).
--
-- KEYS[1]  the line's counters (hash)
-- KEYS[2]  buyer -> place (hash)
-- KEYS[3]  batches by time (zset)
-- KEYS[4]  batches by end position (zset)
-- KEYS[5]  spent admissions (zset)
-- KEYS[6]  buyer -> the request that spent its admission (hash)
-- KEYS[7]  buyer -> copies of the spending request in flight (hash)
-- KEYS[8]  spent admissions whose request has not committed yet (zset)
-- ARGV[1]  the room's id
-- ARGV[2]  early places the ledger ever reserved (pre, and its cap)
-- ARGV[3]  1 when the line had opened (ARGV[4] is its early count), else 0
-- ARGV[4]  the early count fixed at the opening
-- ARGV[5]  late places the ledger ever reserved (post, and its cap)
-- ARGV[6]  the serving counter the ledger last saw
-- ARGV[7]  the last place the ledger saw admitted longer ago than the
--          window: those up to it stay expired
-- ARGV[8]  ARGV[9]  the positions that may or may not have been given
--          (the late places reserved after the ledger last saw the line):
--          admitted at once when the line reaches them, outside the
--          admitted-unused count; 0 0 for none
-- ARGV[10] now, Unix ms: the admissions after ARGV[7] get a new window
-- ARGV[11] the admission window, ms
-- ARGV[12] how many early places are drawn at random (the early joins the
--          ledger saw; those after them keep their arrival order): 0 all
-- ARGV[13] ARGV[14]  the early positions that may or may not have been
--          given (after the drawn ones): as ARGV[8] ARGV[9]
--
-- Every count starts at what the ledger reserved, so no place is given
-- twice; a buyer whose record was lost keeps its place by its ticket. The
-- spent admissions are put back from the ledger next (queue_respend).
--
-- Returns {1} made; {2} the line is this room's already (nothing
-- changed); -2 bad argument.
local pre, opened, frozen = int(ARGV[2], 0, 1e15), int(ARGV[3], 0, 1), int(ARGV[4], 0, 1e15)
local post, serving, old = int(ARGV[5], 0, 1e15), int(ARGV[6], 0, 1e15), int(ARGV[7], 0, 1e15)
local gaplo, gaphi, now = int(ARGV[8], 0, 1e15), int(ARGV[9], 0, 1e15), int(ARGV[10], 0, 1e15)
local window, perm = int(ARGV[11], 1, 1e12), int(ARGV[12], 0, 1e15)
local egaplo, egaphi = int(ARGV[13], 0, 1e15), int(ARGV[14], 0, 1e15)
if not id(ARGV[1]) or not pre or not opened or not frozen or not post or not serving or not old or not gaplo or not gaphi
  or not now or not window or old > serving or not perm or not egaplo or not egaphi then
  return {-2}
end
if redis.call('HGET', KEYS[1], 'line') == ARGV[1] then return {2} end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
-- 'old' too: a check reads it (the places whose window passed) before the
-- pacer's next step would set it, and without it an expired place read as
-- admitted until then.
redis.call('HSET', KEYS[1], 'line', ARGV[1], 'pre', pre, 'precap', pre, 'post', post, 'postcap', post, 'serving', serving,
  'old', old, 'hist', string.match(redis.call('INFO', 'replication'), 'master_replid:(%w+)'))
if opened == 1 then redis.call('HSET', KEYS[1], 'frozen', frozen) end
if gaplo > 0 and gaphi >= gaplo then redis.call('HSET', KEYS[1], 'gaplo', gaplo, 'gaphi', gaphi) end
if egaplo > 0 and egaphi >= egaplo then redis.call('HSET', KEYS[1], 'egaplo', egaplo, 'egaphi', egaphi) end
if perm > 0 then redis.call('HSET', KEYS[1], 'perm', perm) end
if old > 0 then
  -- Their window had passed: admitted at the epoch, so a replica whose
  -- clock is behind this one's still finds them expired.
  local at = 0
  redis.call('ZADD', KEYS[3], at, old)
  redis.call('ZADD', KEYS[4], old, old .. ':' .. at)
end
if serving > old then
  redis.call('ZADD', KEYS[3], now, serving)
  redis.call('ZADD', KEYS[4], serving, serving .. ':' .. now)
end
return {1}

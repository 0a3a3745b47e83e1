-- queue_restore: make a line's record from the ledger's facts, when Redis
-- has none (a new line, or one Redis lost).
--
-- KEYS[1]  the line's counters (hash)
-- KEYS[2]  batches by time (zset)
-- KEYS[3]  batches by end position (zset)
-- ARGV[1]  early places the ledger ever reserved (pre, and its cap)
-- ARGV[2]  1 when the line had opened (ARGV[3] is its early count), else 0
-- ARGV[3]  the early count fixed at the opening
-- ARGV[4]  late places the ledger ever reserved (post, and its cap)
-- ARGV[5]  the serving counter the ledger last saw
-- ARGV[6]  ARGV[7]  the positions that may or may not have been given
--          (the late places reserved after the ledger last saw the line):
--          admitted at once when the line reaches them, outside the
--          admitted-unused count; 0 0 for none
-- ARGV[8]  now, Unix ms: the restored admissions' window starts again
--
-- Every count starts at what the ledger reserved, so no place is given
-- twice; a buyer whose record was lost keeps its place by its ticket.
--
-- Returns {1} restored; {2} the line has a record (nothing changed); -2
-- bad argument.
local pre, opened, frozen = int(ARGV[1], 0, 1e15), int(ARGV[2], 0, 1), int(ARGV[3], 0, 1e15)
local post, serving = int(ARGV[4], 0, 1e15), int(ARGV[5], 0, 1e15)
local gaplo, gaphi, now = int(ARGV[6], 0, 1e15), int(ARGV[7], 0, 1e15), int(ARGV[8], 0, 1e15)
if not pre or not opened or not frozen or not post or not serving or not gaplo or not gaphi or not now then
  return {-2}
end
if redis.call('HGET', KEYS[1], 'line') then return {2} end
redis.call('HSET', KEYS[1], 'line', 1, 'pre', pre, 'precap', pre, 'post', post, 'postcap', post, 'serving', serving)
if opened == 1 then redis.call('HSET', KEYS[1], 'frozen', frozen) end
if gaplo > 0 and gaphi >= gaplo then redis.call('HSET', KEYS[1], 'gaplo', gaplo, 'gaphi', gaphi) end
if serving > 0 then
  -- Whether they spent their admissions was lost: they count as neither
  -- unused nor abandoned.
  redis.call('HSET', KEYS[1], 'forgot', serving)
  redis.call('ZADD', KEYS[2], now, serving)
  redis.call('ZADD', KEYS[3], serving, serving .. ':' .. now)
end
return {1}

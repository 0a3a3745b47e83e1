-- read: one shard's stock.
--
-- KEYS[1]  shard stock hash {avail, allot, epoch, fence}
--
-- Returns {code, avail, allot, epoch, fenced}:
--   1  the shard's values; fenced is 1 while a re-seed holds the shard closed
--  -1  the shard is not seeded (it may still be fenced)
local s = redis.call('HMGET', KEYS[1], 'avail', 'allot', 'epoch', 'fence')
local fenced = (s[4] == '1') and 1 or 0
if not s[1] then return {-1, 0, 0, 0, fenced} end
return {1, tonumber(s[1]), tonumber(s[2]), tonumber(s[3]) or 0, fenced}

-- read: one shard's stock.
--
-- KEYS[1]  shard stock hash {avail, allot, epoch}
--
-- Returns {code, avail, allot, epoch}:
--   1  the shard's values
--  -1  the shard is not seeded
local s = redis.call('HMGET', KEYS[1], 'avail', 'allot', 'epoch')
if not s[1] then return {-1, 0, 0, 0} end
return {1, tonumber(s[1]), tonumber(s[2]), tonumber(s[3]) or 0}

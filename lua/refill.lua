-- refill: add units the ledger took back (a cancelled or expired hold, a
-- refund) to one shard, once per return, and only into the gate of the
-- epoch the return belongs to. The ledger stamps each return with the gate
-- epoch current when it committed: a gate rebuilt after that read facts
-- that already count the units, and a gate not yet rebuilt to that epoch
-- will be, from facts that do not.
--
-- KEYS[1]  shard stock hash {avail, allot, epoch, fence}
-- KEYS[2]  refill record of this return on this shard
-- ARGV[1]  the return's gate epoch (integer >= 0)
-- ARGV[2]  units (integer >= 1)
-- ARGV[3]  record lifetime in milliseconds (integer >= 1000)
--
-- Returns {code, avail}:
--   1  added; avail and allot went up by the units (the allotment grows:
--      these units were not in the facts the shard was seeded from)
--   2  this return was added before; nothing moved
--   3  the shard is at a later epoch, whose facts count the units;
--      nothing moved, nothing left to do
--   4  the shard is at an earlier epoch (its rebuild has not written it
--      yet), or fenced and not yet written (a rebuild under way, whose
--      facts may predate the return); nothing moved; try again later
--  -1  the shard is not seeded and no rebuild is under way (Redis lost
--      it): the rebuild that seeds it reads facts that count the units;
--      nothing moved, nothing left to do
--  -2  bad argument; nothing moved

local epoch = int(ARGV[1], 0, 1e15)
local q = int(ARGV[2], 1, 1e9)
local ttl = int(ARGV[3], 1000, 1e12)
if not epoch or not q or not ttl then return {-2, 0} end

if redis.call('EXISTS', KEYS[2]) == 1 then return {2, 0} end
local s = redis.call('HMGET', KEYS[1], 'avail', 'epoch', 'fence')
if not s[1] and s[3] then return {4, 0} end
if not s[1] then return {-1, 0} end
local at = tonumber(s[2] or '0')
if at > epoch then return {3, tonumber(s[1])} end
if at < epoch then return {4, tonumber(s[1])} end
redis.call('HINCRBY', KEYS[1], 'allot', q)
local avail = redis.call('HINCRBY', KEYS[1], 'avail', q)
redis.call('SET', KEYS[2], q, 'PX', ttl)
return {1, avail}

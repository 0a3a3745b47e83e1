-- deduct: take between ARGV[2] and ARGV[1] units from one shard, once per
-- request id.
--
-- KEYS[1]  shard stock hash {avail, allot, epoch, fence}
-- KEYS[2]  deduction record of this request on this shard {q, gen, epoch,
--          restored, n, h:<holder>...}: a field per attempt holding the
--          deduction (the one that made it, and each that found it since),
--          n of them
-- ARGV[1]  quantity wanted (integer, 1 <= q <= ARGV[3])
-- ARGV[2]  least quantity worth taking (integer, 1 <= min <= q): q for an
--          exact take, 1 when a purchase is being assembled from several shards
-- ARGV[3]  the largest quantity one request may ask for
-- ARGV[4]  record lifetime in milliseconds (integer >= 1000)
-- ARGV[5]  optional: the attempt's holder id (1 to 64 bytes, not "*");
--          absent, one anonymous holder "_"
--
-- Returns {code, taken, avail, gen, epoch}; epoch is the shard's gate
-- epoch, which the ledger commit of a take must match:
--   1  taken units moved; avail is what the shard has left; gen identifies
--      this deduction for restore
--   2  this request already deducted here, since the shard's last seed, and
--      was not restored: nothing moved now; taken and gen are the earlier
--      deduction's. A client's or the Redis client's re-send lands here. A
--      record from before the last seed does not count: the seed was built
--      from ledger facts that do not include it, so the request takes anew.
--      The finder becomes a holder (once, however often it asks): the
--      deduction goes back only when every holder has let go of it
--      (restore.lua), since any one of them may be the attempt whose commit
--      stands on it. A record from before holders were kept (no n) gets
--      "h:-" for its unknown maker. (HLEN would count the holders, but the
--      documented ACL user may not run it.)
--   0  fewer than min units left (avail says how many); nothing moved
--  -1  the shard is not seeded; nothing moved
--  -2  bad argument; nothing moved
--  -6  the shard is fenced: a re-seed is rebuilding it from the ledger;
--      nothing moved

local max = int(ARGV[3], 1, 1e9)
local q = max and int(ARGV[1], 1, max)
local min = q and int(ARGV[2], 1, q)
local ttl = int(ARGV[4], 1000, 1e12)
local holder = ARGV[5] or '_'
if not min or not ttl or not id(holder) or holder == '*' then return {-2, 0, 0, 0, 0} end

local s = redis.call('HMGET', KEYS[1], 'avail', 'epoch', 'fence')
if s[3] == '1' then return {-6, 0, 0, 0, 0} end
local epoch = tonumber(s[2] or '0')

local rec = redis.call('HMGET', KEYS[2], 'q', 'gen', 'restored', 'epoch', 'n')
if rec[1] and rec[3] == '0' and rec[4] == (s[2] or '0') then
  if not rec[5] then redis.call('HSET', KEYS[2], 'h:-', 1, 'n', 1) end
  if redis.call('HSETNX', KEYS[2], 'h:' .. holder, 1) == 1 then
    redis.call('HINCRBY', KEYS[2], 'n', 1)
  end
  return {2, tonumber(rec[1]), -1, tonumber(rec[2]), epoch}
end

if not s[1] then return {-1, 0, 0, 0, 0} end
local avail = tonumber(s[1])
if avail < min then return {0, 0, avail, 0, epoch} end

local take = math.min(q, avail)
avail = redis.call('HINCRBY', KEYS[1], 'avail', -take)
-- A request restored earlier (its ledger commit was refused) may try again;
-- gen tells the two attempts apart so a late restore of the first cannot
-- give back the second.
local gen = (tonumber(rec[2]) or 0) + 1
if rec[2] then redis.call('DEL', KEYS[2]) end -- an earlier gen's holders go with it
redis.call('HSET', KEYS[2], 'q', take, 'gen', gen, 'epoch', s[2] or '0', 'restored', '0', 'h:' .. holder, 1, 'n', 1)
redis.call('PEXPIRE', KEYS[2], ttl)
return {1, take, avail, gen, epoch}

-- quota: count a request's units against one buyer's cap on one SKU, once
-- per request id.
--
-- KEYS[1]  the buyer's quota hash {used, r:<request id> = units}
-- ARGV[1]  request id
-- ARGV[2]  units wanted (integer >= 1)
-- ARGV[3]  the cap (integer >= 1)
-- ARGV[4]  lifetime of the hash in milliseconds (integer >= 1000)
--
-- Returns {code, used}:
--   1  counted; used is the buyer's new total
--   2  this request was counted before; nothing changed
--   0  the cap would be passed; nothing changed
--  -2  bad argument
local q = int(ARGV[2], 1, 1e9)
local cap = int(ARGV[3], 1, 1e9)
local ttl = int(ARGV[4], 1000, 1e12)
if not q or not cap or not ttl or not id(ARGV[1]) then return {-2, 0} end

local used = tonumber(redis.call('HGET', KEYS[1], 'used') or '0')
if redis.call('HEXISTS', KEYS[1], 'r:' .. ARGV[1]) == 1 then return {2, used} end
if used + q > cap then return {0, used} end
used = redis.call('HINCRBY', KEYS[1], 'used', q)
redis.call('HSET', KEYS[1], 'r:' .. ARGV[1], q)
redis.call('PEXPIRE', KEYS[1], ttl)
return {1, used}

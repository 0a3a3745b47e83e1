-- quota: count a request's units against one buyer's cap on one SKU, once
-- per request id.
--
-- KEYS[1]  the buyer's quota hash {used, r:<request id> = units,
--          k:<key id> = request id}
-- ARGV[1]  request id
-- ARGV[2]  units wanted (integer >= 1)
-- ARGV[3]  the cap (integer >= 1)
-- ARGV[4]  lifetime of the hash in milliseconds (integer >= 1000)
-- ARGV[5]  key id: the client's key within its scope (one key may name
--          several request ids, one per fingerprint)
--
-- A counted request leaves k:<key id>, kept when its stock comes back (a
-- refund, a cancel) and dropped when the request was refused: a refusal at
-- the cap for a key found there may be a retry of a committed request (or
-- a reuse of its key), which the caller looks up; any other refusal needs
-- no lookup.
--
-- Returns {code, used}:
--   1  counted; used is the buyer's new total
--   2  this request was counted before; nothing changed
--   0  the cap would be passed; nothing changed
--   3  the cap would be passed, and the key was counted before
--  -2  bad argument
local q = int(ARGV[2], 1, 1e9)
local cap = int(ARGV[3], 1, 1e9)
local ttl = int(ARGV[4], 1000, 1e12)
if not q or not cap or not ttl or not id(ARGV[1]) or not id(ARGV[5]) then return {-2, 0} end

local used = tonumber(redis.call('HGET', KEYS[1], 'used') or '0')
if redis.call('HEXISTS', KEYS[1], 'r:' .. ARGV[1]) == 1 then return {2, used} end
if used + q > cap then
  if redis.call('HEXISTS', KEYS[1], 'k:' .. ARGV[5]) == 1 then return {3, used} end
  return {0, used}
end
used = redis.call('HINCRBY', KEYS[1], 'used', q)
redis.call('HSET', KEYS[1], 'r:' .. ARGV[1], q)
-- The first request counted under a key keeps the mark: a later one with
-- another fingerprint (a reuse, refused by the ledger) must not take it.
redis.call('HSETNX', KEYS[1], 'k:' .. ARGV[5], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
return {1, used}

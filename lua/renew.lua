-- renew: extend a coordination lock only if this owner still holds it.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the owner's token
-- ARGV[2]  new lifetime in milliseconds
--
-- Returns {code}: 1 extended; 0 the lock is no longer this owner's; -2 bad
-- argument.
local ttl = int(ARGV[2], 1, 1e12)
if not id(ARGV[1]) or not ttl then return {-2} end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1}
end
return {0}

-- renew: extend a coordination lock only if this owner still holds it.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the owner's token
-- ARGV[2]  new lifetime in milliseconds
--
-- Returns 1 when extended, 0 when the lock is no longer this owner's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0

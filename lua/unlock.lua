-- unlock: release a coordination lock only if this owner still holds it.
--
-- KEYS[1]  the lock key (a string holding the owner's random token)
-- ARGV[1]  the owner's token
--
-- Returns {code}: 1 released; 0 the lock is gone or held by another owner
-- (it expired and was taken): a late unlock never frees someone else's
-- lock; -2 bad argument.
if not id(ARGV[1]) then return {-2} end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return {1}
end
return {0}

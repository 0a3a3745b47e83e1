-- fence: close or reopen one shard to deductions while a re-seed rebuilds
-- it from the ledger. Restores still run on a fenced shard: the epoch that
-- the seed moves on decides whether they count.
--
-- KEYS[1]  shard stock hash {avail, allot, epoch, fence}
-- ARGV[1]  "1" to close, "0" to reopen
--
-- Returns {code}:
--   1  done (closing an absent shard creates a hash holding only the fence,
--      which deduct reports as fenced and read as not seeded)
--  -2  bad argument; nothing changed
if ARGV[1] == '1' then
  redis.call('HSET', KEYS[1], 'fence', '1')
elseif ARGV[1] == '0' then
  redis.call('HDEL', KEYS[1], 'fence')
else
  return {-2}
end
return {1}

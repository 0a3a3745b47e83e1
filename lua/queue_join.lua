-- queue_join: give a buyer its one place in a program's waiting room.
--
-- KEYS[1]  the line's counters (hash: pre, post, frozen, ...)
-- KEYS[2]  buyer -> "kind:n"
-- ARGV[1]  buyer id
-- ARGV[2]  now, Unix ms (the gateway's clock)
-- ARGV[3]  opening time, Unix ms
--
-- Before opening, joins are counted in "pre" and ordered at random when
-- the line opens (kind 0); the first join or advance at or after opening
-- freezes the pre count ("frozen"), and later joins come after every pre
-- join in the order they come (kind 1). Once frozen, a join is kind 1
-- whatever the caller's clock says, so no two buyers share a place.
--
-- Returns {code, kind, n}: 1 joined now, 2 joined before (its place as it
-- was); -2 bad argument.
if not id(ARGV[1]) then return {-2} end
local now, opens = int(ARGV[2], 0, 1e15), int(ARGV[3], 0, 1e15)
if not now or not opens then return {-2} end
local had = redis.call('HGET', KEYS[2], ARGV[1])
if had then
  local k, n = string.match(had, '^(%d):(%d+)$')
  return {2, tonumber(k), tonumber(n)}
end
local frozen = redis.call('HGET', KEYS[1], 'frozen')
if not frozen and now >= opens then
  frozen = redis.call('HGET', KEYS[1], 'pre') or '0'
  redis.call('HSET', KEYS[1], 'frozen', frozen)
end
local kind, n
if frozen then
  kind, n = 1, redis.call('HINCRBY', KEYS[1], 'post', 1)
else
  kind, n = 0, redis.call('HINCRBY', KEYS[1], 'pre', 1)
end
redis.call('HSET', KEYS[2], ARGV[1], kind .. ':' .. n)
return {1, kind, n}

-- queue_join: give a buyer its one place in a program's waiting room.
--
-- KEYS[1]  the line's counters (hash: line, pre, precap, post, postcap,
--          frozen, ...)
-- KEYS[2]  buyer -> "kind:n:t" (t: when it joined, Unix seconds)
-- ARGV[1]  buyer id
-- ARGV[2]  now, Unix ms (the gateway's clock)
-- ARGV[3]  opening time, Unix ms
-- ARGV[4]  "" or the place "kind:n:t" of the buyer's signed ticket
--          (checked by the caller): a buyer whose record Redis lost keeps
--          its place
-- ARGV[5]  the room's id: a line of another room (turned off and on
--          again since) is no line of this one
--
-- Before opening, joins are counted in "pre" and ordered at random when
-- the line opens (kind 0); the first join or advance at or after opening
-- freezes the pre count ("frozen"), and later joins come after every pre
-- join in the order they come (kind 1). Once frozen, a join is kind 1
-- whatever the caller's clock says, so no two buyers share a place.
--
-- Places are handed out only up to what the ledger has reserved (precap,
-- postcap): after a loss of the line, the restore starts past every place
-- the ledger ever reserved, so no place is given twice.
--
-- Returns {code, kind, n, t}: 1 joined now, 2 joined before (its place as
-- it was); {-1} the line's record is missing (never made, Redis lost it,
-- or it is another room's): restore it from the ledger, then join again;
-- {-8} Redis changed under the line (a failover or restart: this master's
-- replication history is not the line's): fence it (queue_resume), then
-- join again; {5, kind} the places of
-- that kind reserved are all given: reserve more, then join again; -2 bad
-- argument.
if not id(ARGV[1]) then return {-2} end
local now, opens = int(ARGV[2], 0, 1e15), int(ARGV[3], 0, 1e15)
if not now or not opens or type(ARGV[4]) ~= 'string' or not id(ARGV[5]) then return {-2} end
local m = redis.call('HMGET', KEYS[1], 'line', 'frozen', 'pre', 'precap', 'post', 'postcap', 'hist')
if m[1] ~= ARGV[5] then return {-1} end
if m[7] ~= string.match(redis.call('INFO', 'replication'), 'master_replid:(%w+)') then return {-8} end
local had = redis.call('HGET', KEYS[2], ARGV[1])
if had then
  local k, n, t = string.match(had, '^(%d):(%d+):(%d+)$')
  return {2, tonumber(k), tonumber(n), tonumber(t)}
end
if ARGV[4] ~= '' then
  local k, n, t = string.match(ARGV[4], '^([01]):(%d+):(%d+)$')
  if not k or #n > 15 or #t > 12 then return {-2} end
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
  return {2, tonumber(k), tonumber(n), tonumber(t)}
end
local frozen = m[2]
if not frozen and now >= opens then
  frozen = m[3] or '0'
  redis.call('HSET', KEYS[1], 'frozen', frozen)
end
local kind, count, n, cap = 0, 'pre', m[3], m[4]
if frozen then kind, count, n, cap = 1, 'post', m[5], m[6] end
if tonumber(n or 0) >= tonumber(cap or 0) then return {5, kind} end
n = redis.call('HINCRBY', KEYS[1], count, 1)
local t = math.floor(now / 1000)
redis.call('HSET', KEYS[2], ARGV[1], kind .. ':' .. n .. ':' .. t)
return {1, kind, n, t}

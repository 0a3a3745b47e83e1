-- queue_reserve: let a line hand out places up to what the ledger has
-- reserved for it.
--
-- KEYS[1]  the line's counters (hash)
-- ARGV[1]  kind: 0 early places, 1 late places
-- ARGV[2]  the ledger's reserved count of that kind
-- ARGV[3]  the room's id
--
-- The cap only grows: two replicas reserving at once both fit, and every
-- cap Redis has is one the ledger committed.
--
-- Returns {1}; {-1} the line's record is missing or another room's
-- (restore it first); -2
-- bad argument.
local kind, cap = int(ARGV[1], 0, 1), int(ARGV[2], 0, 1e15)
if not kind or not cap or not id(ARGV[3]) then return {-2} end
if redis.call('HGET', KEYS[1], 'line') ~= ARGV[3] then return {-1} end
local field = 'precap'
if kind == 1 then field = 'postcap' end
if cap > tonumber(redis.call('HGET', KEYS[1], field) or 0) then
  redis.call('HSET', KEYS[1], field, cap)
end
return {1}

-- seats_hold: hold the given seats of one section for one hold, all or
-- nothing.
--
-- KEYS[1]  the section's seat hash {seat id -> "" free | hold id | "S:" hold id sold}
-- ARGV[1]  the hold id
-- ARGV[2…] seat ids (distinct; the caller checks)
--
-- Returns {code, seat…}:
--   1  every seat is now held by this hold (or already was: a retry)
--   0  nothing changed; the seats listed are held or sold by others
--  -3  nothing changed; the seats listed are not in the section's map
--  -2  bad argument
local hold = id(ARGV[1])
if #ARGV < 2 or not hold then return {-2} end
local unknown, taken = {}, {}
for i = 2, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  if not v then
    unknown[#unknown + 1] = ARGV[i]
  elseif v ~= '' and v ~= hold then
    taken[#taken + 1] = ARGV[i]
  end
end
if #unknown > 0 then
  table.insert(unknown, 1, -3)
  return unknown
end
if #taken > 0 then
  table.insert(taken, 1, 0)
  return taken
end
for i = 2, #ARGV do
  redis.call('HSET', KEYS[1], ARGV[i], hold)
end
return {1}

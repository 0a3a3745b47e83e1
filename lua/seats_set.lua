-- seats_set: move seats of one section from one state to another, only
-- where they are in the expected state: release a hold's seats (owner-
-- checked: only seats this hold holds are freed), sell them on confirm, or
-- load a map (only absent seats are added, free).
--
-- KEYS[1]  the section's seat hash
-- ARGV[1]  the state a seat must be in to change: a hold id, "S:" hold id,
--          "" (free), or "-" (absent: loading the map)
-- ARGV[2]  the state to set: a hold id, "S:" hold id, or "" (free)
-- ARGV[3…] seat ids
--
-- Returns {1, changed}: how many seats changed. Seats in any other state
-- are left alone, so a release by another hold's id frees nothing.
local from, to, n = ARGV[1], ARGV[2], 0
for i = 3, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  if (from == '-' and not v) or (v and v == from) then
    redis.call('HSET', KEYS[1], ARGV[i], to)
    n = n + 1
  end
end
return {1, n}

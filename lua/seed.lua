-- seed: set one shard's stock from ledger facts.
--
-- KEYS[1]  shard stock hash {avail, allot, epoch, fence}; the fence is left
--          as it is, so a fenced re-seed stays closed until it reopens
-- ARGV[1]  units available now (integer, 0 <= avail <= allot)
-- ARGV[2]  allotment: the most this shard may ever hold (integer >= 0)
-- ARGV[3]  "1" to overwrite a live shard (re-seed); "0" to seed only if absent
-- ARGV[4]  the gate epoch of the ledger facts (integer >= 0): deductions
--          report it, so the ledger commits them only while it is still at
--          that epoch; deduction records and give-backs of other epochs
--          are ignored, as the ledger facts already count them
--
-- Returns {code, epoch}:
--   1  seeded at epoch ARGV[4]
--  -5  the shard exists and ARGV[3] was "0"; nothing changed
--  -2  bad argument; nothing changed

local allot = int(ARGV[2], 0, 1e15)
local avail = allot and int(ARGV[1], 0, allot)
local epoch = int(ARGV[4], 0, 1e15)
if not avail or not epoch or (ARGV[3] ~= '0' and ARGV[3] ~= '1') then return {-2, 0} end

if ARGV[3] == '0' and redis.call('HEXISTS', KEYS[1], 'avail') == 1 then
  return {-5, tonumber(redis.call('HGET', KEYS[1], 'epoch')) or 0}
end
redis.call('HSET', KEYS[1], 'avail', avail, 'allot', allot, 'epoch', epoch)
return {1, epoch}

-- queue_respend: put admissions the ledger says were spent back into a
-- restored line, so the admitted-unused count sees them and no buyer
-- spends twice.
--
-- KEYS[1]  spent admissions (zset: member the buyer, score its position)
-- KEYS[2]  buyer -> the request that spent its admission (hash)
-- ARGV     triples: buyer id, position, request id
--
-- A buyer whose admission Redis already records keeps that record.
--
-- Returns {1, n} with n the admissions put back; -2 bad argument.
if #ARGV % 3 ~= 0 then return {-2} end
local n = 0
for i = 1, #ARGV, 3 do
  local pos = int(ARGV[i + 1], 1, 1e15)
  if not id(ARGV[i]) or not pos or not id(ARGV[i + 2]) then return {-2} end
  if redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 2]) == 1 then
    redis.call('ZADD', KEYS[1], pos, ARGV[i])
    n = n + 1
  end
end
return {1, n}

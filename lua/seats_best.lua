-- seats_best: hold the best q adjacent free seats of one section for one
-- hold: the same row, consecutive numbers, in the front-most row that has
-- them (rows in natural order: 2 before 10, Z before AA), and where
-- possible without leaving a single free seat stranded beside them.
--
-- KEYS[1]  the section's seat hash {seat id -> "" | hold id | "S:" hold id}
-- KEYS[2]  the section's layout {seat id -> "row|number"}
-- ARGV[1]  the hold id
-- ARGV[2]  q, the number of seats (1..64)
--
-- Returns {code, seat…}:
--   1  these seats are now held by this hold
--   2  this hold already held q seats here (a retry): those seats
--   0  no q adjacent free seats; nothing changed
--  -2  bad argument
local hold = id(ARGV[1])
local q = int(ARGV[2], 1, 64)
if not hold or not q then return {-2} end

local states = redis.call('HGETALL', KEYS[1])
local state, mine = {}, {}
for i = 1, #states, 2 do
  state[states[i]] = states[i + 1]
  if states[i + 1] == hold then mine[#mine + 1] = states[i] end
end
if #mine == q then
  table.sort(mine)
  table.insert(mine, 1, 2)
  return mine
end

local layout = redis.call('HGETALL', KEYS[2])
local rows, names = {}, {}
for i = 1, #layout, 2 do
  local id = layout[i]
  local row, num = string.match(layout[i + 1], '^(.*)|(%d+)$')
  if row then
    if not rows[row] then rows[row] = {}; names[#names + 1] = row end
    table.insert(rows[row], {n = tonumber(num), id = id})
  end
end
-- Rows in their natural order: a shorter label first, then alphabetical,
-- so row 2 comes before row 10 and Z before AA (the Go side's rowLess).
table.sort(names, function(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end)

-- The best run is the least (orphan, row rank, position) compared in that
-- order, as the Go side's bestAdjacent walks them; one packed number
-- (orphan * 10^6 + rank * 1000 + position) let a row past 1000 seats, or
-- past 1000 rows, spill into the next field (helper-46).
local function better(a, b)
  if not b then return true end
  if a.orphan ~= b.orphan then return a.orphan < b.orphan end
  if a.r ~= b.r then return a.r < b.r end
  return a.from < b.from
end

local best
for r, row in ipairs(names) do
  local seats = rows[row]
  table.sort(seats, function(a, b) return a.n < b.n end)
  local i = 1
  while i <= #seats do
    -- a run of free, consecutively numbered seats
    if state[seats[i].id] == '' then
      local j = i
      while j < #seats and state[seats[j + 1].id] == '' and seats[j + 1].n == seats[j].n + 1 do j = j + 1 end
      local len = j - i + 1
      if len >= q then
        -- take the run's left end, or its right end: leftover len - q either way
        local run = {orphan = (len - q == 1) and 1 or 0, r = r, row = row, from = i}
        if better(run, best) then best = run end
      end
      i = j + 1
    else
      i = i + 1
    end
  end
end
if not best then return {0} end
local seats, out = rows[best.row], {1}
for k = best.from, best.from + q - 1 do
  redis.call('HSET', KEYS[1], seats[k].id, hold)
  out[#out + 1] = seats[k].id
end
return out

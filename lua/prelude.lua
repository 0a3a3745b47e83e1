-- prelude: put in front of every script (package lua does it), so every
-- script reads its arguments by the same rules.
--
-- int(s, lo, hi) is the integer s encodes, or nil unless s is 1 to 18
-- decimal digits (no sign, point, exponent or space) with lo <= value <= hi.
-- A caller's bug can therefore never move stock by a fraction, a negative
-- or a huge amount: the script answers -2 (bad argument) and moves nothing.
local function int(s, lo, hi)
  if type(s) ~= 'string' or #s > 18 or not string.match(s, '^%d+$') then return nil end
  local n = tonumber(s)
  if n < lo or n > hi then return nil end
  return n
end

-- id(s) is s if it is a non-empty string of at most 64 bytes, else nil.
local function id(s)
  if type(s) ~= 'string' or #s == 0 or #s > 64 then return nil end
  return s
end

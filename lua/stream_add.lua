-- stream_add: add an event to its partition's stream, once per event id.
--
-- KEYS[1]  the partition's stream
-- KEYS[2]  the event's marker (same hash tag): set while the event is in
--          the stream, so a redelivery (a lost answer, a crash before the
--          relay's cursor moved, a dead letter sent again) adds nothing
-- ARGV[1]  event id
-- ARGV[2]  event type
-- ARGV[3]  the event as JSON
-- ARGV[4]  MAXLEN ~ to trim the stream to (0: no trimming)
-- ARGV[5]  the marker's life in seconds
-- ARGV[6]  the delivery span's W3C traceparent, as the entry's field
--          traceparent ('' or absent: no such field)
--
-- Returns {1, entry id} added; {2, ''} added before: the marker's life is
-- renewed, a write of its own, so that a WAIT after this call also waits
-- for the first add to reach the replicas; {-2} bad argument.
local maxlen, ttl = int(ARGV[4], 0, 1e12), int(ARGV[5], 1, 1e9)
local tp = ARGV[6] or ''
if not id(ARGV[1]) or not maxlen or not ttl or type(ARGV[2]) ~= 'string' or type(ARGV[3]) ~= 'string' or #tp > 64 then
  return {-2}
end
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ttl) then
  redis.call('EXPIRE', KEYS[2], ttl)
  return {2, ''}
end
local args = {KEYS[1]}
if maxlen > 0 then
  args[#args + 1], args[#args + 2], args[#args + 3] = 'MAXLEN', '~', maxlen
end
for _, v in ipairs({'*', 'id', ARGV[1], 'type', ARGV[2], 'event', ARGV[3]}) do
  args[#args + 1] = v
end
if tp ~= '' then
  args[#args + 1], args[#args + 2] = 'traceparent', tp
end
return {1, redis.call('XADD', unpack(args))}

-- KEYS: stream, delayed zset, delayed data hash.
-- ARGV: group, consumer, id, count, delete (1/0), delay ms, new delayed id, headers, body, maxlen.
-- Adds the new entry (to the stream, or the delayed set) and acks the old delivery in one
-- step; a delivery this consumer no longer owns is left alone (its new owner handles it).
if not owned(KEYS[1], ARGV[1], ARGV[3], ARGV[2], ARGV[4]) then return 0 end
if tonumber(ARGV[6]) > 0 then
  add_delayed(KEYS[2], KEYS[3], ARGV[6], ARGV[7], ARGV[8] .. '\n' .. ARGV[9])
else
  xadd(KEYS[1], ARGV[10], ARGV[9], ARGV[8])
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
if ARGV[5] == '1' then redis.call('XDEL', KEYS[1], ARGV[3]) end
return 1

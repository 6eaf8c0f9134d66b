-- KEYS: stream. ARGV: group, consumer, id, count.
-- Resets the idle time of an owned delivery without counting a new delivery.
if not owned(KEYS[1], ARGV[1], ARGV[3], ARGV[2], ARGV[4]) then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
return 1

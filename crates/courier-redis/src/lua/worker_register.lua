-- ARGV: id, record JSON without times. Registers (or replaces) the record; clears its stop flag.
local now = now_ms()
redis.call('HSET', KEYS[1], ARGV[1], with_times(ARGV[2], now, now))
redis.call('SREM', KEYS[2], ARGV[1])
return now

-- ARGV: id, record JSON without times. Refreshes the heartbeat and counts, keeping the start
-- time; registers the record again when it was gone. Returns {stop requested, registered again}.
-- The stop flag lives in its own set, so a heartbeat never overwrites a request.
local now = now_ms()
local started = nil
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  started = field(old, 'started_at_ms')
end
local again = 0
if not started then
  started = now
  again = 1
  redis.call('SREM', KEYS[2], ARGV[1])
end
redis.call('HSET', KEYS[1], ARGV[1], with_times(ARGV[2], started, now))
return {redis.call('SISMEMBER', KEYS[2], ARGV[1]), again}

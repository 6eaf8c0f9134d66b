-- ARGV: stale after (ms). Deletes the records whose heartbeat is older (or that do not decode)
-- and returns the others, each followed by its stop flag: {json, 0|1, json, 0|1, ...}.
local oldest = now_ms() - tonumber(ARGV[1])
local all = redis.call('HGETALL', KEYS[1])
local live = {}
for i = 1, #all, 2 do
  local id, value = all[i], all[i + 1]
  local beat = field(value, 'last_heartbeat_ms')
  if beat == nil or beat < oldest then
    redis.call('HDEL', KEYS[1], id)
    redis.call('SREM', KEYS[2], id)
  else
    live[#live + 1] = value
    live[#live + 1] = redis.call('SISMEMBER', KEYS[2], id)
  end
end
return live

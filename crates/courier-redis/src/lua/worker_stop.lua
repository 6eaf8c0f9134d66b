-- ARGV: stale after (ms), a worker id or '' for every one. Flags the live workers asked to
-- stop; returns how many.
local oldest = now_ms() - tonumber(ARGV[1])
local asked = 0
local function ask(id, value)
  local beat = value and field(value, 'last_heartbeat_ms')
  if beat and beat >= oldest then
    redis.call('SADD', KEYS[2], id)
    asked = asked + 1
  end
end
if ARGV[2] ~= '' then
  ask(ARGV[2], redis.call('HGET', KEYS[1], ARGV[2]))
else
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    ask(all[i], all[i + 1])
  end
end
return asked

-- Records a fired tick, only by the live holder and only forward. ARGV: owner, tick ms.
-- Returns 1 when recorded (the caller fires the tick), else 0.
local owner, live = holder(KEYS[1], now_ms())
if owner ~= ARGV[1] or not live then
  return 0
end
local last = redis.call('HGET', KEYS[1], 'last')
if last and tonumber(last) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[1], 'last', ARGV[2])
return 1

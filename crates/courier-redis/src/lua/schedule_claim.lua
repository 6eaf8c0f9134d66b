-- Takes the lease when it is free, expired or ours (renewing it). ARGV: owner, lease ms.
-- Returns {1, last tick or ''} when held afterwards, {0, ''} when another worker holds it.
local now = now_ms()
local owner, live = holder(KEYS[1], now)
if owner and owner ~= ARGV[1] and live then
  return {0, ''}
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'until', string.format('%d', now + tonumber(ARGV[2])))
return {1, redis.call('HGET', KEYS[1], 'last') or ''}

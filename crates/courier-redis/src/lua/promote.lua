-- KEYS: stream, delayed zset, delayed data hash. ARGV: maxlen ('0' = none), limit.
-- Moves every due delayed entry (up to limit) to the stream atomically; returns the
-- milliseconds until the next one is due, or -1 when none is left.
local now = now_ms(false)
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(due) do
  local payload = redis.call('HGET', KEYS[3], id)
  if payload then
    local nl = string.find(payload, '\n', 1, true)
    if nl then
      xadd(KEYS[1], ARGV[1], string.sub(payload, nl + 1), string.sub(payload, 1, nl - 1))
    else
      xadd(KEYS[1], ARGV[1], payload, '')
    end
    redis.call('HDEL', KEYS[3], id)
  end
  redis.call('ZREM', KEYS[2], id)
end
local nxt = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if not nxt[2] then return -1 end
local wait = tonumber(nxt[2]) - now
if wait < 0 then return 0 end
return wait

-- Milliseconds on the server clock, rounded up (delays) or down (promotion).
local function now_ms(up)
  local t = redis.call('TIME')
  local us = tonumber(t[2])
  if up then return tonumber(t[1]) * 1000 + math.floor((us + 999) / 1000) end
  return tonumber(t[1]) * 1000 + math.floor(us / 1000)
end
-- Adds a delayed entry: payload = headers JSON, newline, body.
local function add_delayed(zset, data, delay, id, payload)
  local due = now_ms(true) + tonumber(delay)
  redis.call('HSET', data, id, payload)
  redis.call('ZADD', zset, due, id)
  return due
end
-- Appends an entry to the stream, trimmed to about maxlen entries when maxlen is not '0'.
local function xadd(stream, maxlen, body, headers)
  if maxlen ~= '0' then
    return redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'body', body, 'headers', headers)
  end
  return redis.call('XADD', stream, '*', 'body', body, 'headers', headers)
end

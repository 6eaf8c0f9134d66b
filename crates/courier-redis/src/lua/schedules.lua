-- The schedule store (shared by its scripts). KEYS[1]: the schedule's hash with `owner` (the
-- worker holding the lease), `until` (when the lease expires) and `last` (the last fired tick).
-- Times are epoch ms; the lease uses the server's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The lease holder and whether its lease is live at `now`.
local function holder(key, now)
  local owner = redis.call('HGET', key, 'owner')
  local untl = tonumber(redis.call('HGET', key, 'until') or '0') or 0
  return owner, untl >= now
end

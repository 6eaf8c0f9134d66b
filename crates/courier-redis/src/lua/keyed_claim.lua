-- ARGV: prefix, consumer, want, lease ms, max per key (0: none), fair (1/0).
-- Moves due delayed ids to their keys, delivers again the ids whose lease ended (they keep
-- their slot), then takes ready ids from the keys in turn: a key whose slots are all in use
-- is passed over, the unkeyed lane '' has no limit, and with fair one id per key per turn.
-- Returns {{{id, payload, delivery count}, ...}, ms until a delayed id is due or a lease ends
-- (-1: none), the last signal id (a consumer finding nothing waits for a later one)}.
local consumer, want, lease = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local max, fair = tonumber(ARGV[5]), ARGV[6] == '1'
local now = now_ms()
for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'delayed', '-inf', now, 'LIMIT', 0, 1000)) do
  redis.call('ZREM', P .. 'delayed', id)
  local key = redis.call('HGET', P .. 'key', id)
  if key then ready(key, id) end
end
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', now, 'LIMIT', 0, want)) do
  local o = redis.call('HGET', P .. 'owner', id) or ''
  local count = (tonumber(string.match(o, '\n(%d+)$')) or 0) + 1
  local payload = redis.call('HGET', P .. 'data', id)
  if payload then
    redis.call('HSET', P .. 'owner', id, consumer .. '\n' .. count)
    redis.call('ZADD', P .. 'leases', now + lease, id)
    out[#out + 1] = {id, payload, count}
  else
    settle(id)
  end
end
local ring = P .. 'ring'
local idle, steps = 0, 0
while #out < want and steps < 100000 do
  local n = redis.call('LLEN', ring)
  if n == 0 or idle >= n then break end
  local key = redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
  steps = steps + 1
  local q = P .. 'q:' .. key
  local take = want - #out
  if max > 0 and key ~= '' then
    take = math.min(take, max - tonumber(redis.call('HGET', P .. 'busy', key) or '0'))
  end
  if fair and take > 1 then take = 1 end
  local ids = false
  if take > 0 then ids = redis.call('LPOP', q, take) end
  if ids then
    idle = 0
    local owner = consumer .. '\n1'
    for _, id in ipairs(ids) do
      redis.call('HSET', P .. 'owner', id, owner)
      redis.call('ZADD', P .. 'leases', now + lease, id)
      out[#out + 1] = {id, redis.call('HGET', P .. 'data', id) or '', 1}
    end
    redis.call('HINCRBY', P .. 'busy', key, #ids)
  else
    idle = idle + 1
  end
  if redis.call('EXISTS', q) == 0 then
    -- The key just moved to the ring's tail: it leaves the turn until it has messages again.
    redis.call('RPOP', ring)
    redis.call('SREM', P .. 'ringset', key)
  end
end
local wait = -1
local d = redis.call('ZRANGE', P .. 'delayed', 0, 0, 'WITHSCORES')
if d[2] then wait = math.max(0, tonumber(d[2]) - now) end
local l = redis.call('ZRANGE', P .. 'leases', 0, 0, 'WITHSCORES')
if l[2] then
  local w = math.max(0, tonumber(l[2]) - now)
  if wait < 0 or w < wait then wait = w end
end
local s = redis.call('XREVRANGE', P .. 'signal', '+', '-', 'COUNT', 1)
local last = '0-0'
if s[1] then last = s[1][1] end
return {out, wait, last}

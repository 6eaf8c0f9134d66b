-- ARGV: prefix, consumer, want, lease ms, max per key (0: none), fair (1/0).
-- Moves due delayed ids to their keys, delivers again the ids whose lease ended (they keep
-- their slot), then takes ready ids from the keys in turn: a key whose slots are all in use
-- is passed over, the unkeyed lane '' has no limit, and with fair one id per key per turn.
-- Returns {{{id, payload, delivery count}, ...}, ms until a delayed id is due or a lease ends
-- (-1: none), the last signal id (a consumer finding nothing waits for a later one)}.
local consumer, want, lease = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local max, fair = tonumber(ARGV[5]), ARGV[6] == '1'
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', P .. 'delayed', '-inf', now, 'LIMIT', 0, 1000)
if #due > 0 then
  each_chunk('ZREM', P .. 'delayed', due)
  local due_keys, by_key, order = hmget(P .. 'key', due), {}, {}
  for i, id in ipairs(due) do
    local key = due_keys[i]
    if key then
      if not by_key[key] then
        by_key[key] = {}
        order[#order + 1] = key
      end
      local ids = by_key[key]
      ids[#ids + 1] = id
    end
  end
  for _, key in ipairs(order) do ready_all(key, by_key[key]) end
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
-- The new deliveries are written after the turn, one command per hash: nothing in the turn
-- reads them.
local ring = P .. 'ring'
local taken, owners, leases = {}, {}, {'+inf', PIN}
-- As a string once, rather than a number converted for each message.
local owner, until_ms = consumer .. '\n1', tostring(now + lease)
local idle, steps = 0, 0
local n = redis.call('LLEN', ring)
while #out + #taken < want and steps < 100000 do
  if n == 0 or idle >= n then break end
  local key = redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
  steps = steps + 1
  local q = P .. 'q:' .. key
  local take = want - #out - #taken
  if max > 0 and key ~= '' then
    take = math.min(take, max - tonumber(redis.call('HGET', P .. 'busy', key) or '0'))
  end
  if fair and take > 1 then take = 1 end
  local ids = false
  if take > 0 then ids = redis.call('LPOP', q, take) end
  local empty
  if ids then
    idle = 0
    for _, id in ipairs(ids) do
      taken[#taken + 1] = id
      owners[#owners + 1] = id
      owners[#owners + 1] = owner
      leases[#leases + 1] = until_ms
      leases[#leases + 1] = id
    end
    redis.call('HINCRBY', P .. 'busy', key, #ids)
    -- Fewer than asked: the list is gone.
    empty = #ids < take or redis.call('EXISTS', q) == 0
  else
    idle = idle + 1
    empty = redis.call('EXISTS', q) == 0
  end
  if empty then
    -- The key just moved to the ring's tail: it leaves the turn until it has messages again.
    redis.call('RPOP', ring)
    redis.call('SREM', P .. 'ringset', key)
    n = n - 1
  end
end
if #taken > 0 then
  each_chunk('HSET', P .. 'owner', owners)
  each_chunk('ZADD', P .. 'leases', leases)
  for i, payload in ipairs(hmget(P .. 'data', taken)) do
    out[#out + 1] = {taken[i], payload or '', 1}
  end
end
local wait = -1
local d = redis.call('ZRANGE', P .. 'delayed', 0, 0, 'WITHSCORES')
if d[2] then wait = math.max(0, tonumber(d[2]) - now) end
local l = redis.call('ZRANGE', P .. 'leases', 0, 0, 'WITHSCORES')
if l[2] and l[1] ~= PIN then
  local w = math.max(0, tonumber(l[2]) - now)
  if wait < 0 or w < wait then wait = w end
end
local s = redis.call('XREVRANGE', P .. 'signal', '+', '-', 'COUNT', 1)
local last = '0-0'
if s[1] then last = s[1][1] end
return {out, wait, last}

-- ARGV: prefix, want, lease ms, max per key (0: none), fair (1/0).
-- Moves due delayed ids to their keys, delivers again the ids whose lease ended (they keep
-- their slot), then takes ready ids from the keys in turn: a key whose slots are all in use
-- is passed over, the unkeyed lane '' has no limit, and with fair one id per key per turn.
-- Returns {ids, their payloads, their delivery tags as runs {tag, how many ids, ...}, ms until
-- a delayed id is due or a lease ends (-1: none), the last signal id (a consumer finding nothing
-- waits for a later one)}; a delivery tag is `count, newline, key`, alike for the ids one key
-- visit took.
local want, lease = tonumber(ARGV[2]), tonumber(ARGV[3])
local max, fair = tonumber(ARGV[4]), ARGV[5] == '1'
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', P .. 'delayed', '-inf', now, 'LIMIT', 0, 1000)
if #due > 0 then
  each_chunk('ZREM', P .. 'delayed', due)
  local due_keys, by_key, order = read_chunks('HMGET', P .. 'key', due), {}, {}
  each_chunk('HDEL', P .. 'key', due)
  for i, id in ipairs(due) do
    -- A delayed id always has its key; were it lost, the message goes unlimited rather than
    -- nowhere.
    local key = due_keys[i] or ''
    if not by_key[key] then
      by_key[key] = {}
      order[#order + 1] = key
    end
    local ids = by_key[key]
    ids[#ids + 1] = id
  end
  for _, key in ipairs(order) do ready_all(key, by_key[key]) end
end
local taken, runs = {}, {}
for _, member in ipairs(redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', now, 'LIMIT', 0, want)) do
  redis.call('ZREM', P .. 'leases', member)
  local id, count, key = parse_delivery(member)
  if not id and not string.find(member, '\n', 1, true) then
    -- A lease of the earlier layout: the bare id, its key and owner in hashes of their own.
    id, key = member, redis.call('HGET', P .. 'key', member) or ''
    count = string.match(redis.call('HGET', P .. 'owner', member) or '', '\n(%d+)$') or '0'
    redis.call('HDEL', P .. 'owner', member)
  end
  if id and redis.call('HEXISTS', P .. 'data', id) == 1 then
    local tag = (tonumber(count) + 1) .. '\n' .. key
    redis.call('ZADD', P .. 'leases', now + lease, id .. '\n' .. tag)
    taken[#taken + 1] = id
    runs[#runs + 1] = tag
    runs[#runs + 1] = 1
  elseif id then
    -- Its message is gone: the slot is free.
    settle_all({id}, {key})
  end
end
-- The new leases are written after the turn, in one command: nothing in the turn reads them.
local ring = P .. 'ring'
local leases = {'+inf', PIN}
-- As a string once, rather than a number converted for each message.
local until_ms = tostring(now + lease)
local idle, steps = 0, 0
local n = redis.call('LLEN', ring)
while #taken < want and steps < 100000 do
  if n == 0 or idle >= n then break end
  local key = redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
  steps = steps + 1
  local q = P .. 'q:' .. key
  local take = want - #taken
  if max > 0 and key ~= '' then
    take = math.min(take, max - tonumber(redis.call('HGET', P .. 'busy', key) or '0'))
  end
  if fair and take > 1 then take = 1 end
  local ids = false
  if take > 0 then ids = redis.call('LPOP', q, take) end
  local empty
  if ids then
    idle = 0
    local tag = '1\n' .. key
    local suffix = '\n' .. tag
    runs[#runs + 1] = tag
    runs[#runs + 1] = #ids
    for _, id in ipairs(ids) do
      taken[#taken + 1] = id
      leases[#leases + 1] = until_ms
      leases[#leases + 1] = id .. suffix
    end
    redis.call('HINCRBY', P .. 'busy', key, #ids)
    -- Fewer than asked: the list is gone. All that was asked: the list may be gone too, and
    -- the key then leaves the turn at its next visit (which finds nothing), not at the cost of
    -- an EXISTS at each visit.
    empty = #ids < take
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
if #leases > 2 then each_chunk('ZADD', P .. 'leases', leases) end
if #taken > 0 then
  -- A payload gone (false) is skipped by the consumer; its lease ends and frees the slot.
  return {taken, read_chunks('HMGET', P .. 'data', taken), runs, -1, '0-0'}
end
-- Nothing to deliver: how long the consumer may wait, and for which signal.
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
return {taken, {}, runs, wait, last}

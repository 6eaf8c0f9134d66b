-- A keyed queue (shared by its scripts). ARGV[1] is the prefix P (`<stream>:keyed:`) of its keys:
--   P..'data'     hash   id -> headers JSON, newline, body
--   P..'key'      hash   id -> concurrency key ('' for the unkeyed lane, which has no limit)
--   P..'q:'..key  list   ids ready to deliver, oldest first
--   P..'ring'     list   keys with ready ids, in turn order (P..'ringset': the same as a set)
--   P..'delayed'  zset   delayed ids by due time (ms, server clock)
--   P..'owner'    hash   id -> consumer, newline, delivery count (delivered ids only)
--   P..'leases'   zset   delivered ids by lease end (ms, server clock), and PIN at +inf
--   P..'busy'     hash   key -> delivered and not yet settled (a key's slots in use)
--   P..'signal'   stream one entry per change a waiting consumer may act on (capped)
-- A slot is a lease: taken with the delivery, released by ack, reject or retry in the same
-- script, and a lease that ends (no keepalive) is delivered again, holding the same slot.
local P = ARGV[1]

-- A member of P..'leases' that is never a delivery, scored +inf: longer than Redis's
-- `zset-max-listpack-value` (64 bytes by default), it keeps the set in its skiplist encoding. In
-- the small sets' listpack encoding (up to 128 members, where a worker's in-flight deliveries
-- are) every ZADD and ZREM scans the set: the claim cost about 3 µs more per message.
local PIN = 'courier: not a delivery; keeps this sorted set out of the listpack encoding (see keyed.lua)'

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Queues `id` under `key`, putting the key in turn when it had nothing ready.
local function ready(key, id)
  redis.call('RPUSH', P .. 'q:' .. key, id)
  if redis.call('SADD', P .. 'ringset', key) == 1 then
    redis.call('RPUSH', P .. 'ring', key)
  end
end

-- Stores a new message; `delay` in ms (0: ready now).
local function add(id, key, delay, payload, now)
  redis.call('HSET', P .. 'data', id, payload)
  redis.call('HSET', P .. 'key', id, key)
  if tonumber(delay) > 0 then
    redis.call('ZADD', P .. 'delayed', now + tonumber(delay), id)
  else
    ready(key, id)
  end
end

-- Wakes the consumers waiting for a change.
local function signal()
  redis.call('XADD', P .. 'signal', 'MAXLEN', 16, '*', 's', 1)
end

-- Whether `consumer` holds the delivery of `id` with delivery count `count` ('' for any).
local function owned(id, consumer, count)
  local o = redis.call('HGET', P .. 'owner', id)
  if not o then return false end
  if count == '' then return string.sub(o, 1, #consumer + 1) == consumer .. '\n' end
  return o == consumer .. '\n' .. count
end

-- The most arguments one command of a batch takes (Lua's stack holds 8,000): even, so pairs
-- stay whole.
local CHUNK = 4000

-- Runs `cmd` on `key` with `args` (a flat list), CHUNK at a time: one command per chunk rather
-- than one per message.
local function each_chunk(cmd, key, args)
  for i = 1, #args, CHUNK do
    redis.call(cmd, key, unpack(args, i, math.min(#args, i + CHUNK - 1)))
  end
end

-- HMGET of `ids` in `hash`, CHUNK at a time: the values in the order of `ids` (false where
-- missing).
local function hmget(hash, ids)
  local out = {}
  for i = 1, #ids, CHUNK do
    for _, v in ipairs(redis.call('HMGET', hash, unpack(ids, i, math.min(#ids, i + CHUNK - 1)))) do
      out[#out + 1] = v
    end
  end
  return out
end

-- Queues `ids` (in order) under `key`, putting the key in turn when it had nothing ready.
local function ready_all(key, ids)
  each_chunk('RPUSH', P .. 'q:' .. key, ids)
  if redis.call('SADD', P .. 'ringset', key) == 1 then
    redis.call('RPUSH', P .. 'ring', key)
  end
end

-- Forgets delivered messages (each at most once in `ids`) and frees their slots, one command
-- per hash and per key rather than per message; returns whether one of their keys has
-- messages waiting.
local function settle_all(ids)
  if #ids == 0 then return false end
  local keys = hmget(P .. 'key', ids)
  each_chunk('ZREM', P .. 'leases', ids)
  each_chunk('HDEL', P .. 'owner', ids)
  each_chunk('HDEL', P .. 'data', ids)
  each_chunk('HDEL', P .. 'key', ids)
  local freed, order = {}, {}
  for i = 1, #ids do
    local key = keys[i]
    if key then
      if not freed[key] then
        freed[key] = 0
        order[#order + 1] = key
      end
      freed[key] = freed[key] + 1
    end
  end
  local wake = false
  for _, key in ipairs(order) do
    if redis.call('HINCRBY', P .. 'busy', key, -freed[key]) <= 0 then
      redis.call('HDEL', P .. 'busy', key)
    end
    if not wake and redis.call('EXISTS', P .. 'q:' .. key) == 1 then wake = true end
  end
  return wake
end

-- Forgets a delivered message and frees its slot; returns whether its key has messages
-- waiting (a consumer may now take one).
local function settle(id)
  local key = redis.call('HGET', P .. 'key', id)
  redis.call('ZREM', P .. 'leases', id)
  redis.call('HDEL', P .. 'owner', id)
  redis.call('HDEL', P .. 'data', id)
  redis.call('HDEL', P .. 'key', id)
  if not key then return false end
  if redis.call('HINCRBY', P .. 'busy', key, -1) <= 0 then
    redis.call('HDEL', P .. 'busy', key)
  end
  return redis.call('EXISTS', P .. 'q:' .. key) == 1
end

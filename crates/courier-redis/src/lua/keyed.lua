-- A keyed queue (shared by its scripts). ARGV[1] is the prefix P (`<stream>:keyed:`) of its keys:
--   P..'data'     hash   id -> headers JSON, newline, body
--   P..'key'      hash   id -> concurrency key, of delayed ids only ('' for the unkeyed lane,
--                        which has no limit)
--   P..'q:'..key  list   ids ready to deliver, oldest first
--   P..'ring'     list   keys with ready ids, in turn order (P..'ringset': the same as a set); a
--                        key whose list a claim emptied leaves it at its next visit
--   P..'delayed'  zset   delayed ids by due time (ms, server clock)
--   P..'leases'   zset   deliveries by lease end (ms, server clock), and PIN at +inf; a
--                        delivery is `id, newline, delivery count, newline, key`
--   P..'busy'     hash   key -> delivered and not yet settled (a key's slots in use)
--   P..'signal'   stream one entry per change a waiting consumer may act on (capped)
-- A slot is a lease: taken with the delivery, released by ack, reject or retry in the same
-- script, and a lease that ends (no keepalive) is delivered again, holding the same slot. A
-- delivery names itself: its count goes up at each redelivery, so the late ack of a superseded
-- one finds no member and frees nothing, and its key tells which slot to free without a read.
-- The consumer gets the delivery's `count, newline, key` as its delivery tag.
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
  if tonumber(delay) > 0 then
    redis.call('HSET', P .. 'key', id, key)
    redis.call('ZADD', P .. 'delayed', now + tonumber(delay), id)
  else
    ready(key, id)
  end
end

-- Wakes the consumers waiting for a change.
local function signal()
  redis.call('XADD', P .. 'signal', 'MAXLEN', 16, '*', 's', 1)
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

-- The replies of `cmd` on `key` with `args` (a list of names: hash fields, set members), CHUNK
-- at a time, in the order of `args` (false where missing).
local function read_chunks(cmd, key, args)
  if #args == 0 then return {} end
  if #args <= CHUNK then return redis.call(cmd, key, unpack(args)) end
  local out = {}
  for i = 1, #args, CHUNK do
    for _, v in ipairs(redis.call(cmd, key, unpack(args, i, math.min(#args, i + CHUNK - 1)))) do
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

-- Forgets delivered messages whose leases are gone (removed by the caller) and frees their
-- slots: `ids` and their `keys`, one command for the payloads and one per key rather than per
-- message; returns whether one of their keys has messages waiting.
local function settle_all(ids, keys)
  if #ids == 0 then return false end
  each_chunk('HDEL', P .. 'data', ids)
  -- What an earlier layout kept for every message (its key); nothing in this one.
  each_chunk('HDEL', P .. 'key', ids)
  local freed, order = {}, {}
  for i = 1, #keys do
    local key = keys[i]
    if not freed[key] then
      freed[key] = 0
      order[#order + 1] = key
    end
    freed[key] = freed[key] + 1
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

-- Reads the id, delivery count and key of a delivery (nil for a member that is not one).
local function parse_delivery(member)
  return string.match(member, '^([^\n]*)\n(%d+)\n(.*)$')
end

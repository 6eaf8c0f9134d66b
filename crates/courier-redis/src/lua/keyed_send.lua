-- ARGV: prefix, then id, key, delay ms, payload for each message. Returns how many were stored.
-- One command per structure and per key for the whole batch (a key is stored for a delayed id
-- only: a ready id's list names it); each key's ids are queued in order, and
-- keys new to the turn join it in the order of their first message.
local now = now_ms()
local data, keys, delayed = {}, {}, {}
local by_key, order = {}, {}
local n = 0
for i = 2, #ARGV, 4 do
  local id, key, delay = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  data[#data + 1] = id
  data[#data + 1] = ARGV[i + 3]
  if delay > 0 then
    keys[#keys + 1] = id
    keys[#keys + 1] = key
    delayed[#delayed + 1] = now + delay
    delayed[#delayed + 1] = id
  else
    local ids = by_key[key]
    if not ids then
      ids = {}
      by_key[key] = ids
      order[#order + 1] = key
    end
    ids[#ids + 1] = id
  end
  n = n + 1
end
each_chunk('HSET', P .. 'data', data)
each_chunk('HSET', P .. 'key', keys)
each_chunk('ZADD', P .. 'delayed', delayed)
for _, key in ipairs(order) do
  ready_all(key, by_key[key])
end
signal()
return n

-- KEYS: stream. ARGV: group, consumer, min idle ms, cursor, count, reap idle ms.
-- Claims up to count deliveries idle longer than min idle (XAUTOCLAIM), returning
-- {next cursor, {{id, fields, delivery count}, ...}}, and removes consumers with no pending
-- entries that have been idle longer than reap idle.
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
local out = {}
for _, e in ipairs(r[2]) do
  if e[2] then
    local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
    local c = 1
    if p[1] then c = p[1][4] end
    out[#out + 1] = {e[1], e[2], c}
  end
end
local reap = tonumber(ARGV[6])
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local f = {}
  for j = 1, #c, 2 do f[c[j]] = c[j + 1] end
  if f['pending'] == 0 and f['idle'] and f['idle'] > reap and f['name'] ~= ARGV[2] then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f['name'])
  end
end
return {r[1], out}

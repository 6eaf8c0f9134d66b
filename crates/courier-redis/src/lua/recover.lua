-- KEYS: stream. ARGV: group, consumer, count, then ids to skip (deliveries still in flight).
-- Takes back this consumer's own pending entries (after a restart or a lost reply), counting
-- a new delivery for each; returns {{id, fields, delivery count}, ...}.
local skip = {}
for i = 4, #ARGV do skip[ARGV[i]] = true end
local ids = {}
for _, e in ipairs(redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', tonumber(ARGV[3]) + #ARGV - 3, ARGV[2])) do
  if not skip[e[1]] and #ids < tonumber(ARGV[3]) then ids[#ids + 1] = e[1] end
end
if #ids == 0 then return {} end
local out = {}
for _, e in ipairs(redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, unpack(ids))) do
  if e[2] then
    local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
    local c = 1
    if p[1] then c = p[1][4] end
    out[#out + 1] = {e[1], e[2], c}
  end
end
return out

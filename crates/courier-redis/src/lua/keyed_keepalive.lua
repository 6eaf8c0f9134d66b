-- ARGV: prefix, consumer, lease ms, then id, count pairs. Extends the leases the consumer
-- still holds; returns 1 or 0 per pair.
local until_ms = now_ms() + tonumber(ARGV[3])
local out = {}
for i = 4, #ARGV, 2 do
  if owned(ARGV[i], ARGV[2], ARGV[i + 1]) then
    redis.call('ZADD', P .. 'leases', 'XX', until_ms, ARGV[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
